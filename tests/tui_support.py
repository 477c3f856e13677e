"""Shared helpers of the TUI tests (the app factory with an isolated state directory)."""

from __future__ import annotations

import re
from pathlib import Path

from textual.pilot import Pilot

from cocoviz import samples
from cocoviz.tui.app import CocovizApp, create_app


def make_app(tmp_path: Path, file: str | None = None, **kwargs: object) -> CocovizApp:
    """The app as the CLI builds it, autosaving under tmp_path."""
    return create_app(file, state_root=tmp_path / "state", **kwargs)  # type: ignore[arg-type]


def coconet_app(tmp_path: Path, name: str, **kwargs: object) -> CocovizApp:
    """The app on a sample at CoCoNet's own configuration and hardware (the `-D`,
    `--ranks` and `--hw` its comments give), written into the text: the TUI has no -D."""
    defines, ranks, hw = samples.coconet_config(name)
    lines = []
    for line in samples.text(name).splitlines():
        if line.startswith("ranks ") and ranks is not None:
            line = f"ranks {ranks}"
        elif line.startswith("dim "):
            for dim, value in defines.items():
                line = re.sub(rf"\b{dim} = \d+", f"{dim} = {value}", line)
        lines.append(line)
    return make_app(tmp_path, name, text="\n".join(lines) + "\n", hw=hw, **kwargs)


async def settle(pilot: Pilot) -> None:
    """Wait until parsing, simulation and code generation have finished and the screen
    has caught up."""
    for _ in range(4):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def run_async(fn):  # type: ignore[no-untyped-def]
    """Run an async test body with asyncio (the suite has no async test plugin)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        return asyncio.run(fn(*args, **kwargs))

    return wrapper
