"""The TUI's memory over a long session (issue 31, item 7).

    python bench/bench_tui_rss.py [--keys 2000] [--sample megatron_mlp]

Part 1 drives the app (Pilot, 160x50) on a sample with a cycle of keys a user presses
in a long session (palette steps, undo, redo, before/after, pane focus, view switches,
zoom, scrolling), waiting for the simulation workers after each, and prints the
resident set size (RSS, from /proc/self/statm) every 100 keys: the goal is less than
5 MB of growth from key 200 to the last. The answer to keys on a huge program is
`bench/bench_tui_huge.py`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

KEYS = [
    "1",
    "u",
    "U",
    "2",
    "b",
    "b",
    "tab",
    "down",
    "down",
    "up",
    "u",
    "ctrl+l",
    "ctrl+o",
    "z",
    "z",
    "shift+tab",
    "u",
    "3",
    "u",
    "s",
    "s",
    "g",
    "right",
    "left",
]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


async def settle(pilot) -> None:  # type: ignore[no-untyped-def]
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def session(sample: str, keys: int, state: Path) -> list[tuple[int, float]]:
    from cocoviz.tui.app import create_app

    app = create_app(sample, state_root=state)
    points: list[tuple[int, float]] = []
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        for i in range(keys):
            await pilot.press(KEYS[i % len(KEYS)])
            if app.screen is not app.screen_stack[0]:  # a dialog opened: close it
                await pilot.press("escape")
            await settle(pilot)
            if (i + 1) % 100 == 0:
                points.append((i + 1, rss_mb()))
                print(f"  key {i + 1:>5}: RSS {points[-1][1]:7.1f} MB", flush=True)
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--sample", default="megatron_mlp")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{args.sample}: {args.keys} keys")
        points = asyncio.run(session(args.sample, args.keys, Path(tmp)))
        base = next((mb for k, mb in points if k >= 200), points[0][1])
        growth = points[-1][1] - base
        print(
            f"RSS growth from key 200 to key {points[-1][0]}: {growth:+.1f} MB "
            f"({'ok' if growth < 5 else 'over the 5 MB goal'})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
