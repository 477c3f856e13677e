"""A Session: a program and the schedule steps applied to it, with undo and redo.

Shared by the CLI, the TUI's workbench and library callers. Programs are values, so the
history keeps every intermediate program and undo, redo and jumping are free. `apply`
returns a `StepFailure` value rather than raising, for the UI; `apply_or_raise` raises.
The session holds the hardware profile whose cost model resolves a step's defaults (the
chunk count of `overlap`); saved schedules record every step as resolved, so reapplying
a saved file gives the same program on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import CocovizError
from cocoviz.ir.nodes import Program, StepCall
from cocoviz.ir.transforms import StepLike
from cocoviz.schedule.files import format_sched, load_sched, save_sched
from cocoviz.schedule.steps import apply_step
from cocoviz.sim.hardware import Hardware, default_hardware


@dataclass(frozen=True)
class HistoryEntry:
    """One applied step: as resolved (`overlap` with its chunk count), and the programs
    before and after it."""

    step: StepCall
    before: Program
    after: Program


@dataclass(frozen=True)
class StepFailure:
    """A refused step, as a value: what was tried and why (the error to display)."""

    step: str
    error: CocovizError

    @property
    def message(self) -> str:
        return self.error.message

    def render(self) -> str:
        return self.error.render()


class Session:
    """A program and the steps applied to it, with undo, redo and jump."""

    def __init__(self, program: Program, hw: Hardware | None = None) -> None:
        self.initial = program
        self.hw = hw or default_hardware()
        """The profile whose cost model resolves step defaults (overlap's K)."""
        self._entries: list[HistoryEntry] = []
        self._pos = 0  # entries[:pos] are applied

    # --- state --------------------------------------------------------------------------
    @property
    def program(self) -> Program:
        """The current program (after the applied steps)."""
        return self._entries[self._pos - 1].after if self._pos else self.initial

    @property
    def history(self) -> list[HistoryEntry]:
        """Every recorded step, applied or undone (see `position`)."""
        return list(self._entries)

    @property
    def position(self) -> int:
        """How many of the recorded steps are applied."""
        return self._pos

    @property
    def steps(self) -> list[StepCall]:
        """The applied steps, as resolved."""
        return [e.step for e in self._entries[: self._pos]]

    @property
    def can_undo(self) -> bool:
        return self._pos > 0

    @property
    def can_redo(self) -> bool:
        return self._pos < len(self._entries)

    # --- editing ------------------------------------------------------------------------
    def apply_or_raise(self, step: StepLike) -> Program:
        """Apply a step after the current one (dropping any undone steps); raises
        ScheduleError when it is refused."""
        before = self.program
        after, resolved = apply_step(before, step, self.hw)
        del self._entries[self._pos :]
        self._entries.append(HistoryEntry(resolved, before, after))
        self._pos += 1
        return after

    def apply(self, step: StepLike) -> Program | StepFailure:
        """Like `apply_or_raise`, but a refused step is returned as a StepFailure and
        the session is unchanged."""
        try:
            return self.apply_or_raise(step)
        except CocovizError as err:
            text = step if isinstance(step, str) else str(step)
            return StepFailure(text, err)

    def apply_all(self, steps: Iterable[StepLike]) -> Program:
        for s in steps:
            self.apply_or_raise(s)
        return self.program

    def undo(self) -> bool:
        if not self.can_undo:
            return False
        self._pos -= 1
        return True

    def redo(self) -> bool:
        if not self.can_redo:
            return False
        self._pos += 1
        return True

    def program_at(self, n: int) -> Program:
        """The program after the first `n` recorded steps (0: the initial one)."""
        if not 0 <= n <= len(self._entries):
            raise IndexError(f"step {n} is out of range 0…{len(self._entries)}")
        return self._entries[n - 1].after if n else self.initial

    def jump(self, n: int) -> Program:
        """Go to the program after the first `n` recorded steps (0: the initial one)."""
        program = self.program_at(n)
        self._pos = n
        return program

    # --- files --------------------------------------------------------------------------
    def to_sched(self, comment: str | None = None) -> str:
        return format_sched(self.steps, comment)

    def save(self, path: str | Path, comment: str | None = None) -> None:
        """Write the applied steps as a `.sched` file, atomically."""
        save_sched(path, self.steps, comment)

    @classmethod
    def from_steps(
        cls, program: Program, steps: Iterable[StepLike], hw: Hardware | None = None
    ) -> Session:
        s = cls(program, hw)
        s.apply_all(steps)
        return s

    @classmethod
    def load(cls, program: Program, path: str | Path, hw: Hardware | None = None) -> Session:
        """A session with the steps of a `.sched` file applied."""
        return cls.from_steps(program, load_sched(path), hw)


__all__ = ["HistoryEntry", "Session", "StepFailure"]
