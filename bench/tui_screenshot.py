"""Write the README's TUI screenshot (docs/tui.svg): megatron_mlp after `split(sum)` and
`reorder(sum)`, the timeline compared with the unscheduled program, 140×42.

    python bench/tui_screenshot.py [OUT.svg]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from cocoviz.tui.app import create_app


async def _shoot(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app("megatron_mlp", state_root=Path(tmp))
        async with app.run_test(size=(140, 42)) as pilot:

            async def settle() -> None:
                for _ in range(4):
                    await pilot.pause()
                    await app.workers.wait_for_complete()
                await pilot.pause()

            await settle()
            for step in ("split(sum)", "reorder(sum)"):
                if not app.apply_step(step):
                    raise SystemExit(f"{step} was refused")
                await settle()
            while app.wb.compare_mode != "unscheduled":
                await pilot.press("b")
                await settle()
            out.write_text(app.export_screenshot(), encoding="utf-8")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/tui.svg")
    asyncio.run(_shoot(out))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
