"""Applying schedule steps: one path for every caller (CLI, tuner, TUI, emit).

A step's defaults are resolved before it is applied: `overlap` written without
`chunks=` gets the chunk count the cost model predicts fastest on the hardware the
caller passes down (docs/schedules.md, `overlap`). The transformations themselves
(`cocoviz.ir.transforms`) stay pure values that never see the model; this layer hands
them the chooser.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from cocoviz.errors import ScheduleError, did_you_mean
from cocoviz.ir.nodes import Program, ScheduleBlock, StepCall
from cocoviz.ir.transforms import StepLike, as_transformation
from cocoviz.ir.transforms.base import ChunkChooser
from cocoviz.ir.transforms.overlap import DEFAULT_CHUNKS
from cocoviz.schedule.files import load_sched
from cocoviz.sim.hardware import Hardware, default_hardware

__all__ = [
    "apply_block",
    "apply_schedule_arg",
    "apply_step",
    "apply_steps",
    "block_steps",
    "chunk_chooser",
    "find_block",
    "resolve_schedule",
    "schedule_arg_steps",
]


@functools.cache
def chunk_chooser(hw: Hardware) -> ChunkChooser:
    """The chooser of `overlap`'s K on `hw`: the model's fastest legal count, or the
    default when none is legal (the step's own check then says why)."""
    def choose(program: Program, items: tuple[str, ...]) -> int:
        # the simulator is imported only when a step needs the model: most commands
        # apply schedules whose overlaps name their K, and start faster without it
        from cocoviz.schedule.chunks import best_chunks

        try:
            return best_chunks(program, items, hw)
        except ValueError:
            return DEFAULT_CHUNKS

    return choose


def apply_step(
    program: Program, step: StepLike, hw: Hardware | None = None
) -> tuple[Program, StepCall]:
    """Apply one step with its defaults resolved for `hw` (None: the default profile);
    returns the new program and the step as resolved. Raises ScheduleError (or another
    CocovizError) when the step is refused."""
    t = as_transformation(step).resolve(program, chunk_chooser(hw or default_hardware()))
    after = t.apply(program)
    resolved = t.step()
    if t.call is not None:
        resolved = StepCall(
            resolved.name, resolved.args, resolved.kwargs, t.call.span, t.call.arg_spans
        )
    return after, resolved


def apply_steps(
    program: Program, steps: Iterable[StepLike], hw: Hardware | None = None
) -> Program:
    """Apply steps in order; raises at the first refused step."""
    for step in steps:
        program, _ = apply_step(program, step, hw)
    return program


def apply_block(program: Program, block: ScheduleBlock, hw: Hardware | None = None) -> Program:
    """Apply a `schedule NAME { … }` block of the program's source."""
    return apply_steps(program, block.steps, hw)


def find_block(program: Program, name: str) -> ScheduleBlock:
    """The program's schedule block `name` (a ScheduleError naming the others if none)."""
    for b in program.schedules:
        if b.name == name:
            return b
    names = [b.name for b in program.schedules]
    hint = did_you_mean(name, names)
    if hint is None:
        hint = f"its schedules are {', '.join(names)}" if names else "it has no schedule blocks"
        hint += "; a schedule file must end in .sched"
    raise ScheduleError(f"{program.name}: no schedule named '{name}'", hint=hint)


def block_steps(program: Program, name: str | None) -> tuple[StepCall, ...]:
    """The steps of a schedule block (the last block when `name` is None; none when the
    program has no blocks and `name` is None)."""
    if name is None:
        return program.schedules[-1].steps if program.schedules else ()
    return find_block(program, name).steps


def schedule_arg_steps(program: Program, name: str) -> tuple[StepCall, ...]:
    """`--schedule S`'s steps: a `.sched` file when S ends in `.sched`, else a block."""
    if name.endswith(".sched"):
        return load_sched(name)
    return find_block(program, name).steps


def resolve_schedule(
    program: Program, steps: Sequence[StepLike], hw: Hardware | None = None
) -> tuple[Program, tuple[StepCall, ...]]:
    """Apply `steps`; returns the scheduled program and the steps as resolved (what a
    manifest or a saved file records)."""
    resolved: list[StepCall] = []
    for step in steps:
        program, done = apply_step(program, step, hw)
        resolved.append(done)
    return program, tuple(resolved)


def apply_schedule_arg(program: Program, name: str, hw: Hardware | None = None) -> Program:
    """`--schedule S`: a `.sched` file when S ends in `.sched`, else a block name."""
    return apply_steps(program, schedule_arg_steps(program, name), hw)
