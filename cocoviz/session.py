"""A Session: a program and the schedule steps applied to it, with undo and redo.

Shared by the CLI and the TUI. Programs are values, so the history keeps every
intermediate program and undo, redo and jumping are free. `apply` returns a
`StepFailure` value rather than raising, for the UI; `apply_or_raise` raises.
Saved schedules (`.sched` text) record every step as applied, with defaults resolved
(the chunk count of `overlap`), so reapplying a saved file gives the same program.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import (
    CocovizError,
    InputError,
    ScheduleError,
    Source,
    Span,
    UsageError,
    did_you_mean,
)
from cocoviz.ir.nodes import Program, ScheduleBlock, StepCall
from cocoviz.ir.transforms import StepLike, as_transformation
from cocoviz.ir.transforms.base import Transformation

SCHED_VERSION = 1
SCHED_MAGIC = "# cocoviz schedule"
"""Start of the first line of a `.sched` file written by cocoviz (`apply -o` and
`tune -o` overwrite only these); older cocoviz wrote exactly this line (no version)."""
SCHED_HEADER = f"{SCHED_MAGIC} v{SCHED_VERSION}"
"""First line of a `.sched` file written by this cocoviz. The second line is
``# steps: N``, so a truncated file is detected instead of applying fewer steps."""
_VERSIONED = re.compile(re.escape(SCHED_MAGIC) + r" v(\d+)")
_COUNT = re.compile(r"# steps: (\d+)")


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


_HARDWARE: ContextVar[str | None] = ContextVar("cocoviz_schedule_hardware", default=None)


def use_hardware(name_or_path: str | None) -> None:
    """The hardware profile (a name or a TOML path) whose cost model picks the chunk
    count of an `overlap` written without `chunks=`; None: the default profile."""
    _HARDWARE.set(name_or_path)


def model_chunks(program: Program, items: tuple[str, ...]) -> int:
    """The cost model's best K for `overlap(*items)` on the chosen hardware (the chooser
    the schedule layer hands to `Transformation.resolve`)."""
    from cocoviz.ir.transforms.overlap import DEFAULT_CHUNKS
    from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile
    from cocoviz.sim.tune import best_chunks

    hw = load_profile(_HARDWARE.get() or DEFAULT_PROFILE)
    try:
        return best_chunks(program, items, hw)
    except ValueError:
        return DEFAULT_CHUNKS


def apply_step(program: Program, step: StepLike) -> tuple[Program, StepCall]:
    """Apply one step; returns the new program and the step as resolved."""
    t = as_transformation(step).resolve(program, model_chunks)
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
    from cocoviz.ir.lower import read_source
    from cocoviz.ir.syntax import parse_steps

    p = Path(path)
    if not p.exists():
        hint = None
        if p.parent.is_dir():
            hint = did_you_mean(p.name, [q.name for q in p.parent.glob("*.sched")])
        raise InputError(f"{p}: no such schedule file", hint=hint)
    text = read_source(p, "schedule")
    steps = parse_steps(text, str(p))
    _check_complete(p, text, len(steps))
    return steps


def _check_complete(path: Path, text: str, count: int) -> None:
    """A versioned `.sched` file must hold as many steps as its ``# steps: N`` line says
    (a file without the version, hand-written or from an older cocoviz, is read as it
    is)."""
    source = Source(str(path), text)
    lines = source.lines
    first = lines[0].strip()

    def line(n: int) -> Span:
        return Span(source, n, 1, n, len(source.line(n)) + 1)

    start = text.strip()
    if start and start != SCHED_MAGIC and f"{SCHED_HEADER}\n# steps: ".startswith(start):
        raise InputError(
            f"{path}: the schedule file is truncated (it ends inside its header)",
            hint="save the schedule again",
        )
    m = _VERSIONED.fullmatch(first)
    if m is None:
        if first.startswith(SCHED_MAGIC) and first != SCHED_MAGIC:
            raise InputError(
                f"unrecognized schedule header '{first}'",
                line(1),
                hint=f"cocoviz writes '{SCHED_HEADER}'; a hand-written file may omit the line",
            )
        return
    version = int(m.group(1))
    if version > SCHED_VERSION:
        raise InputError(
            f"schedule file version {version} was written by a newer cocoviz "
            f"(this one reads version {SCHED_VERSION} and older)",
            line(1),
            hint="upgrade cocoviz",
        )
    said = _COUNT.fullmatch(lines[1].strip()) if len(lines) > 1 else None
    if said is None:
        raise InputError(
            f"{path}: the schedule file has no '# steps: N' line after its header "
            "(truncated, or edited by hand)",
            hint=f"save the schedule again, or remove the '{first}' line to read the file as it is",
        )
    expected = int(said.group(1))
    if count != expected:
        held = f"{count} step{'s' if count != 1 else ''}"
        raise InputError(
            f"the schedule file holds {held} but its header says {expected}: "
            "it is truncated or was edited",
            line(2),
            hint="save the schedule again, or correct the '# steps:' line if you edited it",
        )


def written_by_cocoviz(path: Path) -> bool:
    """Whether `path` is a `.sched` file cocoviz wrote (any version)."""
    from cocoviz import fsio

    raw = fsio.read_regular(path)
    if raw is None:
        return False
    first = raw.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    return first == SCHED_MAGIC or _VERSIONED.fullmatch(first) is not None


def check_sched_output(path: Path, force: bool, option: str = "-o") -> None:
    """`-o FILE.sched` writes a new file or replaces one cocoviz wrote; anything else
    needs --force. Checked before any work, so a refusal costs nothing."""
    from cocoviz import fsio

    if path.suffix != ".sched":
        raise UsageError(
            f"{option} {path}: a schedule file must end in .sched",
            hint="--schedule treats a name ending in .sched as a file, anything else as a block",
        )
    st = fsio.lstat(path, "write")
    if st is not None and path.is_dir():
        raise UsageError(f"{option} {path}: is a directory", hint="name a file instead")
    if st is not None and not force and not written_by_cocoviz(path):
        raise UsageError(
            f"{option} {path}: the file exists and was not written by cocoviz",
            hint="pass --force to overwrite it, or choose another name",
        )
    if fsio.lstat(path.parent, "write") is None:
        raise fsio.OutputError(
            f"cannot write '{path}': the directory '{path.parent}' does not exist",
            hint="create it first, or choose another path",
        )


def save_sched(
    path: str | Path, steps: Iterable[StepCall | str], comment: str | None = None
) -> None:
    """Write a `.sched` file atomically (an OutputError when the system refuses)."""
    from cocoviz import fsio

    fsio.write_file(path, format_sched(steps, comment))


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


def format_sched(steps: Iterable[StepCall | str], comment: str | None = None) -> str:
    """`.sched` text: the versioned header, ``# steps: N``, an optional comment, one step
    per line."""
    shown = [str(s) for s in steps]
    lines = [SCHED_HEADER, f"# steps: {len(shown)}"]
    if comment:
        lines += [f"# {c}" if c else "#" for c in comment.splitlines()]
    lines += shown
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
        """Write the applied steps as a `.sched` file, atomically."""
        save_sched(path, self.steps, comment)

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
    "check_sched_output",
    "find_block",
    "format_sched",
    "load_sched",
    "save_sched",
    "written_by_cocoviz",
]
