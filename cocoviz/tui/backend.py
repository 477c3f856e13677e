"""What the TUI needs from the rest of cocoviz, in one place.

Parsing is always there. Schedule steps (`cocoviz.session`), the timeline simulator
(`cocoviz.sim.timeline`) and code generation (`cocoviz.emit`) are imported when first
used; when one is missing from this build, `Missing` says which, and the pane that
needs it shows that message instead of inventing data. No Textual here.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cocoviz.errors import CocovizError, ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program
from cocoviz.tui.timeline_rows import TimelineRows


@dataclass(frozen=True)
class PaletteEntry:
    """One step the palette offers: its text, whether it is legal, and why not."""

    step: str
    ok: bool
    reason: str = ""


class Missing(Exception):
    """A piece of cocoviz this build does not have yet; str() is the message to show."""


def _module(name: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and (name == err.name or name.startswith(err.name + ".")):
            raise Missing(f"not available yet: {what} ({name})") from None
        raise


def _attr(mod: ModuleType, name: str, what: str) -> Callable[..., Any]:
    fn = getattr(mod, name, None)
    if fn is None:
        raise Missing(f"not available yet: {what} ({mod.__name__}.{name})")
    return fn  # type: ignore[no-any-return]


def parse(text: str, path: str) -> Program:
    """Parse and lower a `.coco` text (raises CocovizError with diagnostics)."""
    return load_program(text, path)


# --- schedule steps ------------------------------------------------------------------------


class History:
    """The TUI's view of a `cocoviz.session.Session`: steps as text, a current index."""

    def __init__(self, program: Program) -> None:
        mod = _module("cocoviz.session", "schedule steps")
        self._mod = mod
        self.session = _attr(mod, "Session", "schedule steps")(program)

    # Every query goes through the Session; nothing is recorded twice.
    @property
    def steps(self) -> list[str]:
        return [str(h.step) for h in self.session.history]

    @property
    def index(self) -> int:
        return int(self.session.position)

    @property
    def current(self) -> Program:
        return self.session.program  # type: ignore[no-any-return]

    def program_at(self, i: int) -> Program:
        if i <= 0:
            return self.session.initial  # type: ignore[no-any-return]
        return self.session.history[i - 1].after  # type: ignore[no-any-return]

    def apply(self, step: str) -> None:
        """Apply a step written as text; a failure raises ScheduleError (or CocovizError)."""
        self.session.apply_or_raise(step)

    def undo(self) -> bool:
        return bool(self.session.undo())

    def redo(self) -> bool:
        return bool(self.session.redo())

    def jump(self, i: int) -> None:
        self.session.jump(i)

    def save(self, path: Path) -> None:
        self.session.save(path)

    def legal(self, stage: str) -> list[PaletteEntry]:
        fn = getattr(self._mod, "legal_steps", None)
        if fn is None:
            fn = _attr(
                _module("cocoviz.ir.transforms", "schedule steps"),
                "legal_steps",
                "the list of legal steps",
            )
        out = []
        for opt in fn(self.current, stage):
            out.append(PaletteEntry(str(opt.step), bool(opt.ok), str(opt.reason or "")))
        return out


def schedule_steps(program: Program, name: str | None) -> list[str]:
    """The steps of a schedule block (the last one when `name` is None)."""
    if not program.schedules:
        return []
    if name is None:
        block = program.schedules[-1]
    else:
        found = [b for b in program.schedules if b.name == name]
        if not found:
            names = ", ".join(b.name for b in program.schedules)
            raise ScheduleError(f"no schedule block named '{name}'", hint=f"blocks: {names}")
        block = found[0]
    return [str(s) for s in block.steps]


def read_sched_file(path: Path) -> list[str]:
    from cocoviz.ir.syntax import parse_steps

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise CocovizError(f"{path}: cannot read ({err.strerror})") from None
    return [str(s) for s in parse_steps(text, str(path))]


# --- timeline ------------------------------------------------------------------------------


def default_hw() -> str:
    try:
        from cocoviz.sim.hardware import DEFAULT_PROFILE

        return str(DEFAULT_PROFILE)
    except ImportError:
        return "h100-dgx"


def simulate(program: Program, hw: str) -> TimelineRows:
    mod = _module("cocoviz.sim.timeline", "the timeline simulator")
    sim = _attr(mod, "simulate", "the timeline simulator")
    from cocoviz.sim.hardware import load_profile

    return TimelineRows.from_timeline(sim(program, load_profile(hw)))


# --- code generation -----------------------------------------------------------------------


def _emit_fn() -> Callable[..., Any]:
    mod = _module("cocoviz.emit", "code generation")
    for name in ("emit_program", "emit"):
        fn = getattr(mod, name, None)
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    raise Missing("not available yet: code generation (cocoviz.emit)")


def emit_to(program: Program, directory: Path, target: str, force: bool = False) -> list[Path]:
    """Write the emitted tree; returns the files written."""
    fn = _emit_fn()
    fn(program, directory, target=target, force=force)
    return sorted(p for p in directory.rglob("*") if p.is_file())


def emitted_files(program: Program, target: str) -> dict[str, str]:
    """The emitted files as text, by relative path (written to a scratch directory)."""
    with tempfile.TemporaryDirectory(prefix="cocoviz-code-") as tmp:
        out = Path(tmp) / "out"
        files = emit_to(program, out, target)
        return {
            str(p.relative_to(out)): p.read_text(encoding="utf-8", errors="replace") for p in files
        }
