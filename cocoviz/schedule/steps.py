"""Applying schedule steps: one path for every caller (CLI, tuner, TUI, emit).

A step's defaults are resolved before it is applied: `overlap` written without
`chunks=` gets the chunk count the cost model predicts fastest on the hardware the
caller passes down (docs/schedules.md, `overlap`). The transformations themselves
(`cocoviz.ir.transforms`) stay pure values that never see the model; this layer hands
them the chooser.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Iterable, Iterator, Sequence

from cocoviz.errors import ScheduleError, did_you_mean
from cocoviz.ir.nodes import Program, ScheduleBlock, StepCall
from cocoviz.ir.transforms import StepLike, as_transformation
from cocoviz.ir.transforms.base import ChunkChooser
from cocoviz.ir.transforms.overlap import DEFAULT_CHUNKS
from cocoviz.schedule.files import load_sched
from cocoviz.sim.hardware import Hardware, default_hardware

__all__ = [
    "apply_block",
    "apply_blocks",
    "apply_schedule_arg",
    "apply_step",
    "apply_steps",
    "block_steps",
    "chunk_chooser",
    "common_prefix",
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


@contextlib.contextmanager
def _collector_skips_the_program() -> Iterator[None]:
    """While a schedule is applied, the cyclic garbage collector leaves alone the objects
    that existed before it (`gc.freeze`), the program among them.

    A freshly loaded deep program is tens of thousands of objects in the collector's
    middle generation, and the objects a schedule makes soon trigger a collection of
    that generation, which walks them all: on a 96-layer GPT stack that walk cost more
    than the 384 steps. There is nothing for it to find there (a program and its index
    form no cycle), and afterwards they are handed to the oldest generation, where that
    collection would have moved them anyway. Skipped when something else froze objects
    (their owner decides when to unfreeze) or the collector is off."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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


def apply_steps(program: Program, steps: Iterable[StepLike], hw: Hardware | None = None) -> Program:
    """Apply steps in order; raises at the first refused step."""
    return resolve_schedule(program, tuple(steps), hw)[0]


def apply_block(program: Program, block: ScheduleBlock, hw: Hardware | None = None) -> Program:
    """Apply a `schedule NAME { … }` block of the program's source."""
    return apply_steps(program, block.steps, hw)


def apply_blocks(program: Program, hw: Hardware | None = None) -> list[tuple[str, Program]]:
    """Every schedule block of `program` applied, in order: (name, scheduled program).
    Raises at the first refused step, as applying the blocks one by one would.

    Blocks often begin with the same steps; a prefix a block shares with an earlier
    block is applied once. Programs are values and a step's result does not depend on
    where it is written (its position only shapes the diagnostic of a refused step, and
    a shared step was applied without error in the earlier block). Each block starts
    from the program after the longest prefix it shares with an earlier block; only
    those programs are kept.
    """
    blocks = [b.steps for b in program.schedules]
    source: list[tuple[int, int]] = []  # (earlier block, shared steps); (-1, 0): none
    for k, steps in enumerate(blocks):
        best = (-1, 0)
        for j in range(k):
            n = common_prefix(blocks[j], steps)
            if n > best[1]:
                best = (j, n)
        source.append(best)
    wanted = {(j, n) for j, n in source if j >= 0}  # (block, steps applied)
    saved: dict[tuple[int, int], Program] = {}
    done: list[tuple[str, Program]] = []
    with _collector_skips_the_program():
        for k, steps in enumerate(blocks):
            j, start = source[k]
            current = saved[(j, start)] if j >= 0 else program
            for pos in range(start, len(steps) + 1):
                if (k, pos) in wanted:
                    saved[(k, pos)] = current
                if pos < len(steps):
                    current, _ = apply_step(current, steps[pos], hw)
            done.append((program.schedules[k].name, current))
    return done


def common_prefix(a: Sequence[StepCall], b: Sequence[StepCall]) -> int:
    """How many first steps `a` and `b` share (steps compare by name and arguments, not
    by where they are written)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


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
    with _collector_skips_the_program():
        for step in steps:
            program, done = apply_step(program, step, hw)
            resolved.append(done)
    return program, tuple(resolved)


def apply_schedule_arg(program: Program, name: str, hw: Hardware | None = None) -> Program:
    """`--schedule S`: a `.sched` file when S ends in `.sched`, else a block name."""
    return apply_steps(program, schedule_arg_steps(program, name), hw)
