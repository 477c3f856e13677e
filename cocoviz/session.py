"""A Session: a program and the schedule steps applied to it, with undo and redo.

Shared by the CLI and the TUI. Programs are values, so the history keeps every
intermediate program and undo, redo and jumping are free. `apply` returns a
`StepFailure` value rather than raising, for the UI; `apply_or_raise` raises.
Saved schedules (`.sched` text) record every step as applied, with defaults resolved
(the chunk count of `overlap`), so reapplying a saved file gives the same program.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import CocovizError, InputError, ScheduleError, did_you_mean
from cocoviz.ir.nodes import Program, ScheduleBlock, StepCall
from cocoviz.ir.transforms import StepLike, as_transformation
from cocoviz.ir.transforms.base import Transformation

SCHED_HEADER = "# cocoviz schedule"
"""First line of a `.sched` file written by cocoviz (`apply -o` overwrites only these)."""


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


def apply_step(program: Program, step: StepLike) -> tuple[Program, StepCall]:
    """Apply one step; returns the new program and the step as resolved."""
    t = as_transformation(step).resolve(program)
    after = t.apply(program)
    resolved = t.step()
    if t.call is not None:
        resolved = StepCall(
            resolved.name, resolved.args, resolved.kwargs, t.call.span, t.call.arg_spans
        )
    return after, resolved


def apply_steps(program: Program, steps: Iterable[StepLike]) -> Program:
    """Apply steps in order; raises ScheduleError at the first refused step."""
    for step in steps:
        program, _ = apply_step(program, step)
    return program


def apply_block(program: Program, block: ScheduleBlock) -> Program:
    """Apply a `schedule NAME { … }` block of the program's source."""
    return apply_steps(program, block.steps)


def load_sched(path: str | Path) -> tuple[StepCall, ...]:
    """The steps of a `.sched` file."""
    from cocoviz.ir.syntax import parse_steps

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        hint = None
        if p.parent.is_dir():
            hint = did_you_mean(p.name, [q.name for q in p.parent.glob("*.sched")])
        raise InputError(f"{p}: no such schedule file", hint=hint) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{p}: cannot read the schedule file ({err})") from None
    return parse_steps(text, str(p))


def find_block(program: Program, name: str) -> ScheduleBlock:
    for b in program.schedules:
        if b.name == name:
            return b
    names = [b.name for b in program.schedules]
    hint = did_you_mean(name, names)
    if hint is None:
        hint = f"its schedules are {', '.join(names)}" if names else "it has no schedule blocks"
        hint += "; a schedule file must end in .sched"
    raise ScheduleError(f"{program.name}: no schedule named '{name}'", hint=hint)


def apply_schedule_arg(program: Program, name: str) -> Program:
    """`--schedule S`: a `.sched` file when S ends in `.sched`, else a block name."""
    if name.endswith(".sched"):
        return apply_steps(program, load_sched(name))
    return apply_block(program, find_block(program, name))


def format_sched(steps: Iterable[StepCall], comment: str | None = None) -> str:
    """`.sched` text: a header line, an optional comment, one step per line."""
    lines = [SCHED_HEADER]
    if comment:
        lines += [f"# {c}" if c else "#" for c in comment.splitlines()]
    lines += [str(s) for s in steps]
    return "\n".join(lines) + "\n"


class Session:
    """A program and the steps applied to it, with undo, redo and jump."""

    def __init__(self, program: Program) -> None:
        self.initial = program
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
        after, resolved = apply_step(before, step)
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

    def jump(self, n: int) -> Program:
        """Go to the program after the first `n` recorded steps (0: the initial one)."""
        if not 0 <= n <= len(self._entries):
            raise IndexError(f"step {n} is out of range 0…{len(self._entries)}")
        self._pos = n
        return self.program

    # --- files --------------------------------------------------------------------------
    def to_sched(self, comment: str | None = None) -> str:
        return format_sched(self.steps, comment)

    def save(self, path: str | Path, comment: str | None = None) -> None:
        Path(path).write_text(self.to_sched(comment), encoding="utf-8")

    @classmethod
    def from_steps(cls, program: Program, steps: Iterable[StepLike]) -> Session:
        s = cls(program)
        s.apply_all(steps)
        return s

    @classmethod
    def load(cls, program: Program, path: str | Path) -> Session:
        """A session with the steps of a `.sched` file applied."""
        return cls.from_steps(program, load_sched(path))


__all__ = [
    "HistoryEntry",
    "Session",
    "StepFailure",
    "Transformation",
    "apply_block",
    "apply_schedule_arg",
    "apply_step",
    "apply_steps",
    "find_block",
    "format_sched",
    "load_sched",
]
