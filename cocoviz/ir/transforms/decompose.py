"""`decompose(a, b)`: overlap an allgather with the matmul it feeds, or a matmul with the
reducescatter of its result, shard by shard around the ring."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from cocoviz.errors import ScheduleError
from cocoviz.ir.nodes import PERMUTES, Group, GroupKind, Op, Program, Stage, StepCall
from cocoviz.ir.shards import gather_split
from cocoviz.ir.transforms.base import Edit, Index, describe_stage, index
from cocoviz.ir.transforms.grouping import add_overlapped
from cocoviz.ir.transforms.step import Transformation
from cocoviz.ir.types import format_shape

PATTERNS = "allgather → matmul, or matmul → reducescatter"


@dataclass(frozen=True, kw_only=True)
class Decompose(Transformation):
    """Overlap a collective with the matmul next to it by decomposing both by shard.

    rewrite (sequence parallelism's column-parallel GEMM):
        xg = allgather(x)            # x sliced by rows (sequence)
        h = matmul(xg, w1)
    becomes
        overlapped shards=G {
          xg = allgather(x)
          h = matmul(xg, w1)
        }

    At step s of G, rank r multiplies the shard it holds, (r + s) mod G, while that shard
    moves one hop (to rank r − 1) and the next arrives (allgather → matmul); or computes
    the partial product of block (r − s − 1) mod G, adds the accumulator rank r − 1 sent,
    and passes it on to rank r + 1 (matmul → reducescatter). Each step is one
    point-to-point exchange and one GEMM of 1/G of the work, and every value keeps its
    ordinary layout, so sliced values enter and leave the group freely. The geometry is
    `cocoviz.ir.shards.shard_plan`.

    The gathered value may be the matmul's left operand (its shards are blocks of rows,
    or of the contraction, of the result) or its right operand (blocks of columns, or of
    the contraction). The reducescatter may be the first stage of a fused group
    (reducescatter → computation → allgathers), which then runs on the scattered result.

    fails when: the items are not two; they are not an allgather and a matmul that reads
    it, or a matmul and a reducescatter of its result (or a fused group starting with
    one); an item is already in a group (other than that fused group), or is an
    allgather inside a fused group; the matmul is batched (its right operand has rank
    > 2), reads the gathered value as both operands, or its result is sliced; the shards
    of the gathered value are not blocks of rows, columns or the contraction; the rows of
    the matmul's result do not divide by G (scatter); the matmul's result is read other
    than by the reducescatter, or is an output (scatter); a stage
    outside lies between the items; it would close a cycle through a fused group.
    """

    name: ClassVar[str] = "decompose"
    makes_groups: ClassVar[bool] = True
    signature: ClassVar[str] = "decompose(ALLGATHER, MATMUL) or decompose(MATMUL, REDUCESCATTER)"
    items: tuple[str, ...]

    def step(self) -> StepCall:
        return StepCall("decompose", self.items)

    def rewrite(self, program: Program) -> Edit:
        idx = index(program)
        if len(self.items) != 2:
            raise self.error(
                f"name two items, {PATTERNS}, got {len(self.items)}", hint=self.signature_hint()
            )
        first = self.lookup_stage(program, self.items[0], 0)
        second = self.lookup_stage(program, self.items[1], 1)
        G = program.grid.group  # on one rank: one step, its whole GEMM, no exchange
        for k, s in enumerate((first, second)):
            if s.expr.tag == "dp" and s.expr.op in (Op.ALLGATHER, Op.REDUCESCATTER):
                raise self.error(
                    f"decompose of {describe_stage(s)}, a collective over dp, is not "
                    "supported yet (schedule layer: its ring runs over the tp group)",
                    stage=s,
                    arg=k,
                    hint="overlap it with chunks instead: overlap(…, chunks=K)",
                )
        if first.expr.op is Op.ALLGATHER:
            members = self._gather(idx, first, second, G)
            items: tuple[str | Group, ...] = (first.name, second.name)
        elif first.expr.op is Op.MATMUL:
            members, items = self._scatter(idx, first, second, G)
        else:
            raise self.error(
                f"{describe_stage(first)} is neither an allgather nor a matmul; decompose "
                f"pipelines {PATTERNS}",
                stage=first,
                arg=0,
                hint=self.signature_hint(),
            )
        group = Group(GroupKind.OVERLAPPED, items, G, by_shard=True)
        return add_overlapped(
            self,
            program,
            idx,
            members,
            group,
            "lies between the items",
            "move it out of the way first, or decompose other stages",
        )

    # --- the two patterns ---------------------------------------------------------------
    def _ungrouped(self, idx: Index, s: Stage, arg: int) -> None:
        g = idx.group_of(s.name)
        if g is None:
            return
        if g.kind is GroupKind.OVERLAPPED:
            raise self.error(f"'{s.name}' is already in an overlapped group", stage=s, arg=arg)
        raise self.error(
            f"'{s.name}' is in the fused group {{{', '.join(g.stages())}}}",
            stage=s,
            arg=arg,
            hint="decompose before fusing: the fused collective would gather or scatter the "
            "value whole",
        )

    def _matmul(self, s: Stage, arg: int) -> None:
        if s.expr.op is not Op.MATMUL:
            raise self.error(
                f"{describe_stage(s)} is not a matmul; decompose pipelines {PATTERNS}",
                stage=s,
                arg=arg,
            )
        for a in s.expr.args:
            if a.op in PERMUTES:
                raise self.error(
                    f"'{s.name}' multiplies a {a.op.value} of its operand; decompose computes "
                    "the matmul shard by shard from stored operands",
                    stage=s,
                    arg=arg,
                    hint=f"make the {a.op.value} a stage of its own (t = {a.op.value}(…)), then "
                    f"matmul(t, …)",
                )
        right = s.expr.args[1].type
        if len(right.shape) > 2:
            raise self.error(
                f"'{s.name}' is a batched matmul (its right operand has rank "
                f"{len(right.shape)}); decompose splits a matmul by a right operand of rank 2",
                stage=s,
                arg=arg,
            )

    def _gather(self, idx: Index, ag: Stage, mm: Stage, G: int) -> set[str]:
        self._ungrouped(idx, ag, 0)
        self._ungrouped(idx, mm, 1)
        self._matmul(mm, 1)
        a, b = mm.expr.args
        reads = [a.op is Op.REF and a.name == ag.name, b.op is Op.REF and b.name == ag.name]
        if not any(reads):
            raise self.error(
                f"'{mm.name}' does not read '{ag.name}' as an operand: the matmul must "
                "multiply the gathered value",
                stage=mm,
                arg=1,
            )
        if all(reads):
            raise self.error(
                f"'{mm.name}' reads '{ag.name}' as both operands; decompose splits one",
                stage=mm,
                arg=1,
            )
        if mm.ty.layout.is_sliced and not _column_sliced(mm):
            raise self.error(
                f"'{mm.name}' is {mm.ty.layout}; decompose writes each shard's product into "
                "a result whose rows every rank holds (replicated, local or sliced along its "
                "columns)",
                stage=mm,
                arg=1,
            )
        operand = 0 if reads[0] else 1
        x = ag.expr.args[0].type
        split = gather_split(x, operand, G)
        if isinstance(split, str):
            side = "left" if operand == 0 else "right"
            raise self.error(
                f"the shards of '{ag.name}' ({format_shape(x.shape)} {x.layout}) cannot split "
                f"the {side} operand of '{mm.name}': {split}",
                stage=ag,
                arg=0,
            )
        return {ag.name, mm.name}

    def _scatter(
        self, idx: Index, mm: Stage, second: Stage, G: int
    ) -> tuple[set[str], tuple[str | Group, ...]]:
        self._ungrouped(idx, mm, 0)
        self._matmul(mm, 0)
        if second.expr.op is not Op.REDUCESCATTER:
            raise self.error(
                f"{describe_stage(second)} is not a reducescatter; decompose pipelines {PATTERNS}",
                stage=second,
                arg=1,
            )
        arg = second.expr.args[0]
        if arg.op is not Op.REF or arg.name != mm.name:
            raise self.error(
                f"'{second.name}' does not reduce '{mm.name}' itself",
                stage=second,
                arg=1,
                hint="the reducescatter's operand must be the matmul's result",
            )
        if mm.ty.layout.is_sliced:
            raise self.error(f"'{mm.name}' is {mm.ty.layout}, not partial sums", stage=mm, arg=0)
        others = [u for u in idx.users(mm.name) if u != second.name]
        if others or mm.name in idx.outputs:
            why = f"read by '{others[0]}'" if others else "an output"
            raise self.error(
                f"'{mm.name}' is {why}; the decomposed reducescatter never holds it whole "
                "(each step computes one block)",
                stage=mm,
                arg=0,
            )
        rows = math.prod(s.value for s in mm.ty.shape[:-1])
        if len(mm.ty.shape) < 2 or rows % G:
            raise self.error(
                f"the {rows} rows of '{mm.name}' ({format_shape(mm.ty.shape)}) do not divide by "
                f"the {G} ranks: each rank's part of '{second.name}' must be whole rows",
                stage=mm,
                arg=0,
            )
        g = idx.group_of(second.name)
        if g is None:
            return {mm.name, second.name}, (mm.name, second.name)
        if g.kind is GroupKind.OVERLAPPED:
            raise self.error(
                f"'{second.name}' is already in an overlapped group", stage=second, arg=1
            )
        if next(g.stages()) != second.name:
            raise self.error(
                f"'{second.name}' is not the first stage of its fused group", stage=second, arg=1
            )
        return {mm.name, *g.stages()}, (mm.name, g)


def _column_sliced(mm: Stage) -> bool:
    t = mm.ty
    return t.layout.is_sliced and t.layout.dim is not None and t.layout.dim == len(t.shape) - 1


def decompose_hint(program: Program, items: tuple[str, ...]) -> str | None:
    """`decompose(a, b)` when a refused `overlap` of these items is a pattern that
    decompose accepts (the hint of overlap's refusals for sliced values); else None."""
    if len(items) != 2:
        return None
    try:
        Decompose(items=items).check(program)
    except ScheduleError:
        return None
    return (
        f"decompose({', '.join(items)}) overlaps them shard by shard, keeping every value's layout"
    )
