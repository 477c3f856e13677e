"""Shared helpers of the TUI tests (the app factory with an isolated state directory)."""

from __future__ import annotations

from pathlib import Path

from textual.pilot import Pilot

from cocoviz.tui.app import CocovizApp, create_app


def make_app(tmp_path: Path, file: str | None = None, **kwargs: object) -> CocovizApp:
    """The app as the CLI builds it, autosaving under tmp_path."""
    return create_app(file, state_root=tmp_path / "state", **kwargs)  # type: ignore[arg-type]


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
