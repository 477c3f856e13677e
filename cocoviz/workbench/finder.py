"""What the command palette finds beside the app's actions: the steps legal on the
current program (every stage's palette, docs/schedules.md) with the time the model
predicts after each, the program's schedule blocks with theirs, and the samples.

Worker-safe: each function reads only its arguments (a program is immutable) and
changes nothing, so a UI runs it in a thread. No Textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from cocoviz import samples
from cocoviz.errors import CocovizError
from cocoviz.ir.nodes import Program
from cocoviz.schedule import apply_steps, block_steps, palette
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.timeline import makespan

__all__ = [
    "MAX_PREDICTED",
    "ScheduleChoice",
    "StepChoice",
    "sample_choices",
    "schedule_choices",
    "step_choices",
]

MAX_PREDICTED = 48
"""The most steps whose time is predicted (a large program's further steps are offered
without one, so the palette opens at once)."""


@dataclass(frozen=True)
class StepChoice:
    """A legal step of the current program, and the predicted time after it."""

    step: str
    stage: str
    """The stage whose palette offers it (the first one, for a step offered by several)."""
    note: str = ""
    """What the step palette shows after the step (how `overlap` picks K)."""
    makespan_s: float | None = None
    """The predicted time of the program after the step (None: not predicted)."""


@dataclass(frozen=True)
class ScheduleChoice:
    """A schedule block of the program: its steps and the predicted time after them."""

    name: str
    steps: tuple[str, ...]
    makespan_s: float | None
    """None: a step of the block is refused on the current program."""


def predicted(program: Program, steps: list[str] | tuple[str, ...], hw: Hardware) -> float | None:
    """The model's time of `program` after `steps` on `hw`; None when a step is refused
    or the simulator refuses the program."""
    try:
        return makespan(apply_steps(program, list(steps), hw), hw)
    except CocovizError:
        return None


def step_choices(program: Program, hw: Hardware, limit: int = MAX_PREDICTED) -> list[StepChoice]:
    """Every legal step the step palette offers for some stage of `program`, in program
    order, each once; the first `limit` with the predicted time after it."""
    out: list[StepChoice] = []
    seen: set[str] = set()
    for stage in program.stages:
        try:
            entries = palette(program, stage.name, hw)
        except CocovizError:
            continue
        for e in entries:
            if not e.ok or e.step in seen:
                continue
            seen.add(e.step)
            note = e.label[len(e.step) :].strip() if e.label.startswith(e.step) else ""
            time_s = predicted(program, [e.step], hw) if len(out) < limit else None
            out.append(StepChoice(e.step, stage.name, note, time_s))
    return out


def schedule_choices(program: Program, hw: Hardware) -> list[ScheduleChoice]:
    """The program's schedule blocks, each with its predicted time from the program as
    written (unscheduled)."""
    out = []
    for block in program.schedules:
        steps = tuple(str(s) for s in block_steps(program, block.name))
        out.append(ScheduleChoice(block.name, steps, predicted(program, steps, hw)))
    return out


def sample_choices() -> list[tuple[str, str]]:
    """(name, first comment line) of every sample."""
    out = []
    for name in samples.names():
        first = next(
            (line.lstrip("# ").strip() for line in samples.text(name).splitlines() if line),
            "",
        )
        out.append((name, first))
    return out
