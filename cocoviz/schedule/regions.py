"""Regions: the parts of a program whose schedule choices do not interact in the cost
model, and the structure keys that say when two of them are the same up to renaming
(docs/cost-model.md, The tuner: regions).

A **clean cut** after stage ``c`` (in program order) is a point where

- every stage up to ``c`` is an ancestor of ``c`` (``c`` is the one stage of that prefix
  that no later stage of the prefix reads), and
- every stage after ``c`` is a descendant of ``c`` (each reads ``c``, or a stage that
  does, …; nothing after the cut reads only inputs and params),

with the ordering edges of ``update`` counted as edges. In the simulator nothing after
such a cut starts before ``c`` ends and everything before it has ended by then, on every
rank and stream: the streams are idle, the last NCCL call has started, no communication
interval is left to slow a kernel, a scalar reduction cannot wait past it to batch with
a later one. The time after the cut is the time of the part after it simulated alone,
with what it reads from before ready at zero: the program's time is the sum of its
parts' times (to rounding).

The **footprint** of a collective the tuner tries steps for (an allreduce, allgather or
reducescatter) is the span of stages its candidate steps may name: from the matmul
making its operand (``overlap``/``decompose`` of the pair) to the last stage of its
downstream computation — eligible compute stages (and sends and allgathers) that read
only it, each other and values made before it, the stages a ``fuse``, ``reorder`` or
chained ``overlap`` takes — and the allgather's matmul reader for ``decompose``.

**Regions** are the stretches between the clean cuts that lie inside no footprint. A
region's steps never name a stage of another region (its candidates are built on the
region alone), so the choices of different regions do not interact, and the best
schedule of the program is the best schedule of each region put together.

Two regions are the same **up to renaming** when their sub-programs are equal once every
name is replaced by ``v<i>`` in the order the stages first mention it (`canonical_form`):
the same operations, shapes, layouts, dtypes and attributes, the same inputs (the values
they read from before the region, with their types) and the same outputs (the values a
later region or the program's outputs read: what the model writes to memory).
"""

from __future__ import annotations

import dataclasses
import heapq
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cocoviz.ir.graph import dataflow
from cocoviz.ir.nodes import (
    ELEMENTWISE,
    REDUCTIONS,
    ROWWISE,
    Expr,
    Group,
    Input,
    Op,
    Param,
    Program,
    Stage,
    expr_reads,
)

__all__ = [
    "TUNED_OPS",
    "Region",
    "RegionClass",
    "canonical_form",
    "classes_of",
    "clean_cuts",
    "find_regions",
    "footprints",
    "renamed",
    "stretches",
    "sub_program",
]

TUNED_OPS = frozenset({Op.ALLREDUCE, Op.ALLGATHER, Op.REDUCESCATTER})
"""The collectives the tuner tries steps for."""

_WALKED = ELEMENTWISE | ROWWISE | REDUCTIONS | {Op.UPDATE, Op.SEND, Op.REF, Op.CONST}
"""Stages a footprint extends through (the tuner's fusable computation, sends)."""

_CHAIN_ITEMS = 5
"""The longest chain an `overlap` candidate takes (`tune._chain`)."""

CANONICAL = re.compile(r"\bv(\d+)((?:_\w*)?)\b")
"""A canonical name in a step (``v12``), with the suffix a step gave a stage it made
(``v12_rs``, ``v12_s``)."""


@dataclass(frozen=True)
class Region:
    """A stretch of the program between two boundaries, as the tuner tunes it."""

    index: int
    stages: tuple[str, ...]
    """Its stages, in program order."""
    names: tuple[str, ...]
    """``names[i]`` is the program's name for ``v<i>`` of `key`."""
    key: Program
    """The region alone with canonical names (`canonical_form`): equal keys, equal
    regions up to renaming."""
    tuned: int
    """How many collectives the tuner tries steps for (0: nothing to choose)."""

    @property
    def last(self) -> str:
        """The stage the boundary after this region follows."""
        return self.stages[-1]

    def real(self, canonical: str) -> str:
        """The program's name for a canonical name: ``v12`` → ``l3_ys``; a name a step
        made keeps its suffix (``v12_rs`` → ``l3_ys_rs``)."""
        m = CANONICAL.fullmatch(canonical)
        if m is None:
            return canonical
        return self.names[int(m.group(1))] + m.group(2)


@dataclass(frozen=True)
class RegionClass:
    """Regions that are the same up to renaming: tuned once."""

    key: Program
    members: tuple[Region, ...]

    @property
    def tuned(self) -> int:
        return self.members[0].tuned


# ---------------------------------------------------------------------------------------
# Cuts and footprints


def clean_cuts(program: Program, deps: dict[str, set[str]] | None = None) -> list[bool]:
    """For each position i, whether the cut after stage i is clean (module docstring):
    the prefix's only sink is stage i, and every later stage that reads no later stage
    reads stage i. Linear in the stages and edges."""
    stages = program.stages
    n = len(stages)
    if deps is None:
        deps = dataflow(program)[0]
    pos = {s.name: i for i, s in enumerate(stages)}
    # (1) the prefix has one sink: count the stages not yet read within the prefix
    unread: set[str] = set()
    one_sink = [False] * n
    # (2) no stage after the cut depends only on stages strictly before it: a stage at
    # q whose latest dependency is at p blocks every cut i with p < i < q
    blocked = [0] * (n + 1)
    for i, s in enumerate(stages):
        ds = deps.get(s.name, ())
        unread.difference_update(ds)
        unread.add(s.name)
        one_sink[i] = len(unread) == 1
        last = max((pos[d] for d in ds), default=-1)
        if last + 1 <= i - 1:
            blocked[last + 1] += 1
            blocked[i] -= 1
    out = [False] * n
    run = 0
    for i in range(n):
        run += blocked[i]
        out[i] = one_sink[i] and run == 0
    return out


def footprints(
    program: Program,
    deps: dict[str, set[str]] | None = None,
    read_by: dict[str, list[str]] | None = None,
) -> list[tuple[int, int]]:
    """The footprint ``(first, last)`` position of each collective the tuner tries steps
    for (module docstring), in program order."""
    if deps is None or read_by is None:
        deps, read_by = dataflow(program)
    stages = program.stages
    pos = {s.name: i for i, s in enumerate(stages)}
    by_name = {s.name: s for s in stages}
    out: list[tuple[int, int]] = []
    for p, s in enumerate(stages):
        op = s.expr.op
        if op not in TUNED_OPS:
            continue
        lo = hi = p
        arg = s.expr.args[0] if s.expr.args else None
        if arg is not None and arg.op is Op.REF and arg.name in by_name:
            if by_name[arg.name].expr.op is Op.MATMUL:
                lo = pos[arg.name]
        # the downstream computation: read only from it, each other and the past
        taken = {s.name}
        todo = [(pos[u], u) for u in set(read_by.get(s.name, ()))]
        heapq.heapify(todo)
        while todo:
            q, u = heapq.heappop(todo)
            if u in taken:
                continue
            uop = by_name[u].expr.op
            pair = uop is Op.MATMUL and op is Op.ALLGATHER and s.name in deps.get(u, ())
            if not (uop in _WALKED or uop is Op.ALLGATHER or pair):
                continue
            if not all(d in taken or pos[d] < p for d in deps.get(u, ())):
                continue
            taken.add(u)
            hi = max(hi, q)
            if not pair:
                for w in set(read_by.get(u, ())):
                    if w not in taken:
                        heapq.heappush(todo, (pos[w], w))
        # the chain an overlap takes: each item the one reader of the last
        item = stages[lo].name
        for _ in range(_CHAIN_ITEMS - 1):
            readers = {w for w in read_by.get(item, ()) if w != item}
            if len(readers) != 1:
                break
            (item,) = readers
            if by_name[item].expr.op is Op.MATMUL:
                break
            hi = max(hi, pos[item])
        out.append((lo, hi))
    return out


def find_regions(program: Program) -> list[Region]:
    """The program's regions, in program order (one region holding every stage when the
    program already has groups: a boundary must not cut one)."""
    stages = program.stages
    if not stages:
        return []
    deps, read_by = dataflow(program)
    if program.groups:
        ends = [len(stages) - 1]
    else:
        clean = clean_cuts(program, deps)
        covered = [0] * (len(stages) + 1)
        for lo, hi in footprints(program, deps, read_by):
            covered[lo] += 1
            covered[hi] -= 1
        ends = []
        run = 0
        for i in range(len(stages)):
            run += covered[i]
            if clean[i] and run == 0:
                ends.append(i)
        if not ends or ends[-1] != len(stages) - 1:
            ends.append(len(stages) - 1)
    extract = _Extractor(program, read_by)
    regions: list[Region] = []
    start = 0
    for end in ends:
        names = tuple(s.name for s in stages[start : end + 1])
        sub = extract.sub(names)
        key, canon = canonical_form(sub)
        tuned = sum(1 for s in sub.stages if s.expr.op in TUNED_OPS)
        regions.append(Region(len(regions), names, canon, key, tuned))
        start = end + 1
    return regions


def classes_of(regions: Iterable[Region]) -> list[RegionClass]:
    """Regions grouped by key, in the order of their first member."""
    found: dict[Program, list[Region]] = {}
    for r in regions:
        found.setdefault(r.key, []).append(r)
    return [RegionClass(k, tuple(ms)) for k, ms in found.items()]


# ---------------------------------------------------------------------------------------
# Sub-programs and canonical names


def sub_program(program: Program, names: Sequence[str]) -> Program:
    """The stages ``names`` (a stretch of ``program``, in its order) as a program of
    their own: what they read from outside becomes an input (a param stays a param),
    what is read outside or is an output of ``program`` is an output, and the groups
    wholly inside come along (a group partly inside is a ValueError)."""
    return _Extractor(program).sub(names)


class _Extractor:
    """`sub_program` for many stretches of one program (its lookups made once)."""

    def __init__(self, program: Program, read_by: dict[str, list[str]] | None = None) -> None:
        self.program = program
        self.read_by = dataflow(program)[1] if read_by is None else read_by
        self.outputs = set(program.outputs)
        self.by_name = {s.name: s for s in program.stages}
        self.params = {p.name: p for p in program.params}
        self.inputs = {i.name: i.ty for i in program.inputs}
        self.groups = [set(g.stages()) for g in program.groups]
        self.group_of = {n: gi for gi, members in enumerate(self.groups) for n in members}

    def sub(self, names: Sequence[str]) -> Program:
        program, read_by, outputs = self.program, self.read_by, self.outputs
        inside = set(names)
        stages = tuple(self.by_name[n] for n in names)
        outer: dict[str, None] = {}
        for s in stages:
            for r in sorted(expr_reads(s.expr)):
                if r not in inside:
                    outer.setdefault(r)
        params = tuple(self.params[n] for n in outer if n in self.params)
        inputs = tuple(
            Input(n, self.inputs[n] if n in self.inputs else self.by_name[n].expr.type)
            for n in outer
            if n not in self.params
        )
        outs = tuple(
            n for n in names if n in outputs or any(u not in inside for u in read_by.get(n, ()))
        )
        held = sorted({self.group_of[n] for n in names if n in self.group_of})
        for gi in held:
            if not self.groups[gi] <= inside:
                cut = self.groups[gi] & inside
                raise ValueError(f"a group holds {', '.join(sorted(cut))} and more")
        groups = [program.groups[gi] for gi in held]
        return Program(
            name=program.name,
            grid=program.grid,
            dims=program.dims,
            params=params,
            inputs=inputs,
            stages=stages,
            outputs=outs,
            groups=tuple(groups),
            source_names=program.source_names,
        )


def canonical_form(program: Program) -> tuple[Program, tuple[str, ...]]:
    """``program`` with every name (params, inputs, stages) replaced by ``v<i>``, numbered
    in the order the stages first mention them (a declaration nothing reads comes after,
    in declaration order), and the names in that order: equal results, equal programs up
    to renaming. Dropout ids (``stage#k``) follow their stage's name; the program is
    named ``region``; spans and schedule blocks are dropped."""
    index: dict[str, str] = {}

    def name(n: str) -> str:
        got = index.get(n)
        if got is None:
            got = index[n] = f"v{len(index)}"
        return got

    for s in program.stages:
        for e in s.expr.walk():
            if e.op is Op.REF and e.name is not None:
                name(e.name)
        name(s.name)
    for p in program.params:
        name(p.name)
    for i in program.inputs:
        name(i.name)
    order = {v: i for i, v in enumerate(index.values())}
    canon = renamed(program, index, "region")
    canon = dataclasses.replace(
        canon,
        params=tuple(sorted(canon.params, key=lambda p: order[p.name])),
        inputs=tuple(sorted(canon.inputs, key=lambda i: order[i.name])),
    )
    by_index = {v: k for k, v in index.items()}
    return canon, tuple(by_index[f"v{i}"] for i in range(len(index)))


def renamed(program: Program, names: dict[str, str], title: str) -> Program:
    """``program`` with each name ``n`` replaced by ``names[n]`` (every name it binds or
    reads must be there), dropout ids following their stage, named ``title``, without
    spans, schedule blocks or source names."""

    def rename(e: Expr) -> Expr:
        if e.op is Op.REF:
            return Expr(Op.REF, name=names[e.name] if e.name else None, ty=e.ty)
        tag = e.tag
        if e.op is Op.DROPOUT and tag is not None:
            stage, sep, k = tag.rpartition("#")
            if sep and stage in names:
                tag = f"{names[stage]}#{k}"
        return Expr(
            e.op,
            tuple(rename(a) for a in e.args),
            e.name,
            e.value,
            e.rop,
            e.dtype_arg,
            tag,
            e.shape_arg,
            e.ty,
        )

    def group(g: Group) -> Group:
        items = tuple(group(it) if isinstance(it, Group) else names[it] for it in g.items)
        return Group(g.kind, items, g.chunks, g.by_shard)

    return Program(
        name=title,
        grid=program.grid,
        dims=program.dims,
        params=tuple(Param(names[p.name], p.dtype, p.default) for p in program.params),
        inputs=tuple(Input(names[i.name], i.ty) for i in program.inputs),
        stages=tuple(Stage(names[s.name], rename(s.expr)) for s in program.stages),
        outputs=tuple(names[n] for n in program.outputs),
        groups=tuple(group(g) for g in program.groups),
    )


def stretches(program: Program, lasts: Sequence[str]) -> list[Program] | None:
    """A (scheduled) program cut after the stages ``lasts`` (the last stage of each
    region, `Region.last`), each stretch as a program of its own (`sub_program`); None
    when one of them is missing or out of order, the program does not end at the last of
    them, or a group spans two stretches."""
    pos = {s.name: i for i, s in enumerate(program.stages)}
    extract = _Extractor(program)
    out: list[Program] = []
    start = 0
    for last in lasts:
        end = pos.get(last)
        if end is None or end < start:
            return None
        try:
            out.append(extract.sub([s.name for s in program.stages[start : end + 1]]))
        except ValueError:
            return None
        start = end + 1
    if start != len(program.stages):
        return None
    return out
