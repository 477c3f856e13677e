"""What the TUI needs from the rest of cocoviz, in one place: parsing, the step
history (`cocoviz.session`), the timeline simulator (`cocoviz.sim.timeline`) and code
generation (`cocoviz.emit`). No Textual here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cocoviz.emit.emitter import Emitted, Target, build, emit
from cocoviz.emit.lower import strip_schedule
from cocoviz.emit.toolchain import Toolchain, find_toolchain
from cocoviz.emit.writer import WriteResult, write_tree
from cocoviz.errors import CocovizError, ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program, StepCall
from cocoviz.ir.transforms import as_transformation, legal_steps
from cocoviz.ir.transforms.overlap import Overlap
from cocoviz.session import Session, model_chunks, use_hardware
from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile
from cocoviz.sim.timeline import simulate as simulate_timeline
from cocoviz.tui.timeline_rows import TimelineRows

__all__ = [
    "Emitted",
    "History",
    "PaletteEntry",
    "WriteResult",
    "build",
    "default_hw",
    "emit_to",
    "emitted_files",
    "parse",
    "read_sched_file",
    "schedule_steps",
    "simulate",
]


@dataclass(frozen=True)
class PaletteEntry:
    """One step the palette offers: the step applied, whether it is legal and why not,
    and the text shown (`label`, when it differs from the step)."""

    step: str
    ok: bool
    reason: str = ""
    label: str = ""

    @property
    def shown(self) -> str:
        return self.label or self.step


def parse(text: str, path: str) -> Program:
    """Parse and lower a `.coco` text (raises CocovizError with diagnostics)."""
    return load_program(text, path)


# --- schedule steps ------------------------------------------------------------------------


class History:
    """The TUI's view of a `cocoviz.session.Session`: steps as text, a current index.

    `hw` is the hardware profile whose cost model picks the chunk count of an `overlap`
    written without `chunks=` (set before every step, in whichever thread applies it).
    """

    def __init__(self, program: Program, hw: str | None = None) -> None:
        self.session = Session(program)
        self.hw = hw
        self._legal: tuple[Program, dict[str, list[PaletteEntry]]] | None = None

    # Every query goes through the Session; nothing is recorded twice.
    @property
    def steps(self) -> list[str]:
        return [str(h.step) for h in self.session.history]

    @property
    def index(self) -> int:
        return self.session.position

    @property
    def current(self) -> Program:
        return self.session.program

    def program_at(self, i: int) -> Program:
        if i <= 0:
            return self.session.initial
        return self.session.history[i - 1].after

    def apply(self, step: str) -> None:
        """Apply a step written as text; a failure raises ScheduleError (or CocovizError)."""
        use_hardware(self.hw)
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
        """The palette for `stage` at the current step (cached per program)."""
        program = self.current
        if self._legal is None or self._legal[0] is not program:
            self._legal = (program, {})
        cache = self._legal[1]
        if stage not in cache:
            use_hardware(self.hw)
            cache[stage] = [
                self._entry(program, o.step, o.ok, o.reason) for o in legal_steps(program, stage)
            ]
        return cache[stage]

    @staticmethod
    def _entry(program: Program, step: str, ok: bool, reason: str | None) -> PaletteEntry:
        t = as_transformation(step)
        if not isinstance(t, Overlap):
            return PaletteEntry(step, ok, reason or "")
        # An overlap is applied without `chunks=`, so the cost model picks K for the
        # hardware (the history shows the K it chose); it is checked with that K.
        auto = Overlap(items=t.items)
        shown = str(StepCall(t.name, t.items, ()))
        resolved = auto.resolve(program, model_chunks)
        try:
            resolved.check(program)
        except CocovizError as err:
            why = err.message.removeprefix("overlap: ")
            if err.hint:
                why += f" ({err.hint})"
            return PaletteEntry(shown, False, why)
        return PaletteEntry(shown, True, "", f"{shown}  model: K={resolved.k}")


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
    from cocoviz.session import load_sched

    return [str(s) for s in load_sched(path)]


# --- timeline ------------------------------------------------------------------------------


def default_hw() -> str:
    return str(DEFAULT_PROFILE)


def simulate(program: Program, hw: str) -> TimelineRows:
    return TimelineRows.from_timeline(simulate_timeline(program, load_profile(hw)))


# --- code generation -----------------------------------------------------------------------


@functools.cache
def _toolchain() -> Toolchain:
    """Where nvcc, NCCL and MPI are (the Makefile's defaults); looked up once."""
    return find_toolchain()


def emitted_files(
    program: Program,
    unscheduled: Program,
    target: Target,
    steps: Sequence[str] = (),
    hw: str | None = None,
) -> Emitted:
    """The files `cocoviz emit` writes for `program` (the current step of `unscheduled`),
    in memory. Raises EmitError (a CocovizError) for what the emitter cannot lower."""
    return emit(
        program,
        strip_schedule(unscheduled),
        target=target,
        schedule_steps=tuple(steps),
        toolchain=_toolchain(),
        hw=hw,
    )


def emit_to(
    directory: Path,
    program: Program,
    unscheduled: Program,
    target: Target,
    steps: Sequence[str] = (),
    hw: str | None = None,
    force: bool = False,
) -> tuple[Emitted, WriteResult]:
    """Emit and write the tree atomically; the writer refuses (UsageError) a non-empty
    directory that cocoviz did not write, unless `force`."""
    out = emitted_files(program, unscheduled, target, steps, hw)
    return out, write_tree(directory, out.files, force=force)
