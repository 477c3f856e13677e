"""`overlap(s1, s2, …, chunks=K)`: pipeline producer and consumers chunk by chunk."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from cocoviz.ir.collectives import COLLECTIVE_TABLE
from cocoviz.ir.nodes import (
    AXIS_REDUCTIONS,
    COLLECTIVES,
    PERMUTES,
    REDUCTIONS,
    ROUTING,
    ROWWISE,
    Group,
    GroupKind,
    Op,
    Program,
    Stage,
    StepCall,
)
from cocoviz.ir.transforms.base import (
    ChunkChooser,
    Edit,
    Index,
    cached_index,
    describe_stage,
    index,
)
from cocoviz.ir.transforms.decompose import decompose_hint
from cocoviz.ir.transforms.grouping import add_overlapped
from cocoviz.ir.transforms.step import Transformation
from cocoviz.ir.types import TensorType, block_dim, format_shape

DEFAULT_CHUNKS = 4
"""K when `chunks=` is omitted and no chooser is given, or the chooser (the cost model,
handed in from the schedule layer: `cocoviz.schedule.steps.chunk_chooser`) finds no legal count to
rank (the step's check then says why). The resolved K is written into printed and saved
schedules, so a schedule never depends on the default (docs/schedules.md, `overlap`)."""


CHUNKABLE_COLLECTIVES = tuple(Op(c.name) for c in COLLECTIVE_TABLE if c.chunkable)


def leading_chunks(program: Program, members: set[str] | tuple[str, ...]) -> bool:
    """Whether an overlapped group chunks dimension 0 of its values, each sliced value
    keeping its layout (a group with an alltoall), rather than rows with its sliced values
    laid out chunk by chunk (docs/schedules.md, overlap)."""
    idx = cached_index(program)
    if idx is not None:
        return any(idx.stage(n).expr.op is Op.ALLTOALL for n in members)
    names = set(members)  # one pass, not a search per member
    return any(s.expr.op is Op.ALLTOALL for s in program.stages if s.name in names)


def rows_of(stage: Stage) -> int:
    """Rows of a value: all dimensions but the last, flattened (1 for a vector)."""
    return math.prod(s.value for s in stage.ty.shape[:-1])


@dataclass(frozen=True, kw_only=True)
class Overlap(Transformation):
    """Overlap a producer with its consumers, K row chunks at a time.

    rewrite (megatron_mlp, after split, reorder and fuse(sum_rs, out)):
        layer = matmul(x, w)
        fused { sum_rs = reducescatter(+, layer); out_s = …; out = allgather(out_s) }
    becomes
        overlapped chunks=4 {
          layer = matmul(x, w)
          fused { sum_rs = reducescatter(+, layer); out_s = …; out = allgather(out_s) }
        }

    Items are stages or fused groups (named by any member), each consuming its
    predecessor's output chunk by chunk. Chunks are K equal contiguous blocks of rows
    (all dimensions but the last, flattened) of s1's output; in chunk k, rank r holds
    global elements from `k·numel/K + r·numel/(K·G)` on.

    A group with an alltoall chunks dimension 0 instead (`leading_chunks`): chunk k is
    block k of dimension 0 of every value, sliced values keep their layouts (and may
    leave the group), and the group is issued as a software pipeline.

    fails when: fewer than two items; an item is already overlapped, or named twice; an
    item does not read its predecessor; K < 2 or K does not divide the rows; a chunked
    reducescatter's numel/K, or rows/K with a row-wise op on slices, does not divide by G;
    a stage cannot run chunk by chunk (a whole-tensor reduction, broadcast or reduce, a
    matmul reading the chunked value as its right operand, a batched matmul, a reshape,
    a value with other rows); a
    sliced value made inside is read outside, is an output or an update; a value sliced
    by rows outside is read inside; a stage outside lies between items; it would close a
    cycle through a fused group. With an alltoall: K does not divide dimension 0; a
    member's value lacks that dimension or is sliced along it (an alltoall from or to
    dimension 0); a member is another collective, a reshape, reduces to a scalar or reads
    elements by global position (dropout, slice); a matmul's right operand has the
    chunked dimension; a member reads a value sliced along dimension 0.
    """

    name: ClassVar[str] = "overlap"
    makes_groups: ClassVar[bool] = True
    signature: ClassVar[str] = "overlap(ITEM, ITEM, …, chunks=K)  — ITEM: a stage or a fused group"
    items: tuple[str, ...]
    chunks: int | None = None

    @property
    def k(self) -> int:
        return self.chunks if self.chunks is not None else DEFAULT_CHUNKS

    def step(self) -> StepCall:
        return StepCall("overlap", self.items, (("chunks", self.k),))

    def resolve(self, program: Program, choose_chunks: ChunkChooser | None = None) -> Overlap:
        if self.chunks is not None or choose_chunks is None:
            return self
        if not all(program.has_stage(n) for n in self.items):
            return self  # unknown stages: the check reports them
        return dataclasses.replace(self, chunks=choose_chunks(program, self.items))

    def rewrite(self, program: Program) -> Edit:
        idx = index(program)
        if len(self.items) < 2:
            raise self.error(
                "name at least two items: a producer and its consumer", hint=self.signature_hint()
            )
        if self.k < 2:
            raise self.error(f"chunks must be at least 2, got {self.k}")
        items = self._items(idx)
        sets = [set(it.stages()) if isinstance(it, Group) else {it} for it in items]
        for i in range(1, len(items)):
            if not any(idx.reads(m) & sets[i - 1] for m in sets[i]):
                raise self.error(
                    f"'{self.items[i]}' does not read the output of '{self.items[i - 1]}': each "
                    "item consumes its predecessor's chunks",
                    arg=i,
                )
        members = set().union(*sets)
        out1 = min(
            (s for s in sets[0] if any(s in idx.reads(m) for m in sets[1])),
            key=idx.position,
        )
        first = idx.stage(out1)
        rows = rows_of(first) if first.ty.shape else 0
        K = self.k
        if rows == 0 or rows % K:
            divisors = [d for d in range(2, min(rows, 64) + 1) if rows % d == 0][:8]
            legal = f"legal: chunks={', '.join(map(str, divisors))}" if divisors else None
            raise self.error(
                f"chunks={K} does not divide the {rows} rows of '{out1}' "
                f"({format_shape(first.ty.shape)}; rows are all dimensions but the last)",
                stage=first,
                hint=legal or "its output has too few rows to chunk",
            )
        order = sorted(members, key=idx.position)
        if leading_chunks(idx.program, members):
            self._leading(idx, order, members, first)
        else:
            for n in order:
                self._chunkable(idx, idx.stage(n), members, rows, n in sets[0])
            self._sliced_escapes(idx, order, members)
            self._divisible(idx, order, rows)
        group = Group(GroupKind.OVERLAPPED, tuple(items), K)
        return add_overlapped(
            self,
            program,
            idx,
            members,
            group,
            "lies between items but is not in the overlapped group",
            "fuse it into one of the items, or list it as an item",
        )

    def _items(self, idx: Index) -> list[str | Group]:
        items: list[str | Group] = []
        owners: dict[int, str] = {}  # by the group's id
        for k, n in enumerate(self.items):
            s = self.lookup_stage(idx.program, n, k)
            g = idx.group_of(n)
            if g is None:
                if n in items:
                    raise self.error(f"'{n}' is listed twice", arg=k)
                items.append(n)
                continue
            if g.kind is GroupKind.OVERLAPPED:
                raise self.error(f"'{n}' is already in an overlapped group", stage=s, arg=k)
            if id(g) in owners:
                raise self.error(
                    f"'{owners[id(g)]}' and '{n}' name the same fused group", stage=s, arg=k
                )
            owners[id(g)] = n
            items.append(g)
        return items

    def _chunkable(self, idx: Index, s: Stage, members: set[str], rows: int, first: bool) -> None:
        op = s.expr.op

        def refuse(why: str) -> None:
            raise self.error(
                f"{describe_stage(s)} cannot run chunk by chunk: {why}",
                stage=s,
                hint="leave it out of the overlapped group",
            )

        if op in COLLECTIVES and op not in CHUNKABLE_COLLECTIVES:
            refuse(f"overlap chunks only {', '.join(o.value for o in CHUNKABLE_COLLECTIVES)}")
        if op is Op.MATMUL and len(s.expr.args[1].type.shape) > 2:
            refuse(
                "it is a batched matmul (its right operand has rank "
                f"{len(s.expr.args[1].type.shape)}); overlap chunks a matmul by rows of a "
                "right operand of rank 2 only"
            )
        if op is Op.RESHAPE:
            refuse("reshape regroups the elements, so its chunks are not the rows being chunked")
        if op in ROUTING:
            refuse(f"{op.value} routes by index; chunking it is not supported yet "
                   "(docs/schedules.md, routing)")
        nodes = list(s.expr.walk())
        if any(e.op is Op.IOTA for e in nodes):
            refuse("iota counts along its whole shape, not along a chunk")
        if any(e.op in AXIS_REDUCTIONS for e in nodes):
            refuse(
                "it reduces along a dimension, and chunks of rows are not whole lines of "
                "every dimension"
            )
        if any(e.op in PERMUTES for e in nodes):
            refuse("a transpose or permute moves elements between rows, so chunk k of its "
                   "value is not made from chunk k of its operand")
        if any(e.op in REDUCTIONS for e in nodes):
            refuse("it reduces a whole tensor to a scalar, which needs every chunk")
        if not s.ty.shape or rows_of(s) != rows:
            refuse(
                f"its value {format_shape(s.ty.shape)} has {rows_of(s) if s.ty.shape else 0} "
                f"rows, not the {rows} rows being chunked"
            )
        if op is Op.MATMUL and not first:
            right = s.expr.args[1]
            if any(r in members for r in right.refs()):
                refuse("it reads the chunked value as its right operand")
        G = idx.program.grid.group
        operands = [s.expr.args[0]] if op is Op.MATMUL else nodes
        for e in operands:
            if e.op is not Op.REF or e.name in members or e.name in idx.params:
                continue
            t = e.type
            if (
                t.layout.is_sliced
                and t.shape
                and math.prod(x.value for x in t.shape[:-1]) == rows
                and block_dim(t.layout, t.shape, G) != len(t.shape) - 1
            ):
                raise self.error(
                    f"{describe_stage(s)} cannot run chunk by chunk: it reads '{e.name}', "
                    f"sliced by rows outside the group ({t.layout}); inside an overlapped "
                    "group each rank holds a part of every chunk instead",
                    stage=s,
                    hint=decompose_hint(idx.program, self.items)
                    or "leave it out of the overlapped group",
                )

    def _leading(self, idx: Index, order: list[str], members: set[str], first: Stage) -> None:
        """A group with an alltoall chunks its first dimension: chunk k is block k of
        dimension 0 of every value in it, and every sliced value keeps its layout (it is
        sliced along another dimension, so chunk k of a rank's part is block k of the
        rank's array). Such values may leave the group."""
        K = self.k
        lead = first.ty.shape[0].value if first.ty.shape else 0
        G = idx.program.grid.group

        def refuse(s: Stage, why: str) -> None:
            raise self.error(
                f"{describe_stage(s)} cannot run chunk by chunk in a group with an alltoall, "
                f"which chunks dimension 0: {why}",
                stage=s,
                hint="leave it out of the overlapped group",
            )

        if lead % K:
            divisors = [d for d in range(2, min(lead, 64) + 1) if lead % d == 0][:8]
            raise self.error(
                f"chunks={K} does not divide dimension 0 of '{first.name}' "
                f"({format_shape(first.ty.shape)}): a group with an alltoall chunks dimension 0",
                stage=first,
                hint=f"legal: chunks={', '.join(map(str, divisors))}" if divisors else None,
            )

        def chunked(t: TensorType) -> bool:
            return len(t.shape) >= 2 and t.shape[0].value == lead

        for n in order:
            s = idx.stage(n)
            op = s.expr.op
            t = s.ty
            if not chunked(t):
                refuse(s, f"its value {format_shape(t.shape)} does not have dimension 0 = {lead}")
            if t.layout.is_sliced and block_dim(t.layout, t.shape, G) in (None, 0):
                refuse(s, f"it is {t.layout}, sliced along the dimension being chunked")
            if op in COLLECTIVES and op is not Op.ALLTOALL:
                refuse(s, "only alltoall runs chunk by chunk along dimension 0")
            if op is Op.ALLTOALL and 0 in (int(s.expr.tag or 0), int(s.expr.value or 0)):
                refuse(s, "it re-slices dimension 0, the one being chunked")
            if op is Op.RESHAPE:
                refuse(s, "reshape regroups the elements")
            if op in ROUTING:
                refuse(s, f"{op.value} routes by index; chunking it is not supported yet "
                       "(docs/schedules.md, routing)")
            if op is Op.MATMUL:
                a, b = s.expr.args
                if not chunked(a.type):
                    refuse(s, "its left operand does not have the chunked dimension 0")
                if len(b.type.shape) == len(t.shape) and b.type.shape[0].value != 1:
                    refuse(s, "its right operand has the chunked dimension 0 too")
            for e in s.expr.walk():
                if e.op in PERMUTES:
                    refuse(s, f"{e.op.value} moves elements between the chunks of dimension 0")
                if e.op in AXIS_REDUCTIONS:
                    refuse(s, "a reduction along a dimension is not split by chunks of dimension 0")
                if e.op is Op.IOTA:
                    refuse(s, "iota counts along its whole shape, not along a chunk")
                if e.op in REDUCTIONS:
                    refuse(s, "it reduces a whole tensor to a scalar, which needs every chunk")
                if e.op in (Op.DROPOUT, Op.SLICE):
                    refuse(s, f"{e.op.value} reads elements by global position")
                if e.op is Op.REF and e.name not in members and e.name not in idx.params:
                    rt = e.type
                    full = len(rt.shape) == len(t.shape) and rt.shape and rt.shape[0].value != 1
                    if full and rt.layout.is_sliced and block_dim(rt.layout, rt.shape, G) in (None, 0):
                        refuse(s, f"it reads '{e.name}', sliced along the chunked dimension 0")

    def _sliced_escapes(self, idx: Index, order: list[str], members: set[str]) -> None:
        for n in order:
            s = idx.stage(n)
            if not s.ty.layout.is_sliced:
                continue
            outside = [u for u in idx.users(n) if u not in members]
            why = None
            if outside:
                why = f"read by '{outside[0]}' outside the group"
            elif n in idx.outputs:
                why = "an output"
            elif n in idx.update_target:
                why = f"the new value of input '{idx.update_target[n]}'"
            if why is not None:
                raise self.error(
                    f"'{n}' is {s.ty.layout} and {why}; inside an overlapped group "
                    "slices are laid out chunk by chunk, so no slice may leave it",
                    stage=s,
                    hint=decompose_hint(idx.program, self.items)
                    or "include its readers, or gather it inside the group",
                )

    def _divisible(self, idx: Index, order: list[str], rows: int) -> None:
        K, G = self.k, idx.program.grid.group
        for n in order:
            s = idx.stage(n)
            if s.expr.op is Op.REDUCESCATTER and (s.ty.numel // K) % G:
                raise self.error(
                    f"each chunk of the reducescatter '{n}' has {s.ty.numel // K} elements, "
                    f"which do not divide by the {G} ranks (chunks={K})",
                    stage=s,
                    hint="use fewer chunks",
                )
            rowwise = any(e.op in ROWWISE for e in s.expr.walk())
            if rowwise and s.ty.layout.is_sliced and (rows // K) % G:
                raise self.error(
                    f"'{n}' works on whole rows, but each chunk's {rows // K} rows do not divide "
                    f"by the {G} ranks (chunks={K})",
                    stage=s,
                    hint="use fewer chunks",
                )
