"""Warnings for schedule steps the model predicts to make a program slower.

Each check compares a step with its alternative on the same operations, simulated alone
(fresh streams, every outside value ready), so it names the step that loses:

- ``overlap-slower``: an overlapped group is slower than running its items one after the
  other (per-chunk latency and smaller GEMMs cost more than the overlap hides);
- ``overlap-chunks``: another chunk count is predicted at least 5% faster;
- ``overlap-decompose``: the items of a row-chunked group are an allgather and its
  matmul (or a matmul and its reducescatter), and ``decompose(…)`` of them is predicted
  at least 5% faster;
- ``decompose-slower``: a group decomposed by shard is slower than its items one after
  the other (a group decomposed by shard is never offered row chunks instead: its
  sliced values cannot enter a row-chunked group);
- ``rs-c-ag-slower``: reducescatter → computation on 1/G → allgather (fused or not) is
  slower than allreduce → computation on the whole tensor (AR-C), as for a tiny tensor
  where collective latency dominates; ``split-alone`` when nothing moved between them;
- ``schedule-slower``: the whole schedule is slower than the baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

from cocoviz.errors import ScheduleError
from cocoviz.ir.nodes import COLLECTIVES, Group, GroupKind, Op
from cocoviz.ir.transforms.decompose import Decompose
from cocoviz.ir.types import dp_view
from cocoviz.sim.collectives import Coll
from cocoviz.sim.compute import NO_CONTENTION
from cocoviz.sim.timeline import (
    SimWarning,
    Summary,
    simulate_decomposed,
    simulate_group,
    simulate_ops,
)
from cocoviz.sim.workload import (
    CollSpec,
    Context,
    KernelSpec,
    Operation,
    chunks_legal,
    duration,
    lower_decomposed,
    lower_item,
    lower_overlap,
)
from cocoviz.timefmt import format_time

_T = TypeVar("_T")

CHUNK_CANDIDATES = (1, 2, 4, 8, 16)
_MARGIN = 1.02  # a step must lose by more than 2% to be reported


def item_name(item: str | Group) -> str:
    return item if isinstance(item, str) else next(iter(item.stages()))


def overlap_step(g: Group, chunks: int | None = None) -> str:
    names = ", ".join(item_name(it) for it in g.items)
    return f"overlap({names}, chunks={chunks if chunks is not None else g.chunks})"


def decompose_step(g: Group) -> str:
    return f"decompose({', '.join(item_name(it) for it in g.items)})"


def chunk_times(
    ctx: Context, g: Group, candidates: Sequence[int] = CHUNK_CANDIDATES
) -> dict[int, float]:
    """Predicted time of an overlapped group alone for each legal chunk count (1 = no
    overlap: the items one after the other). A group decomposed by shard has no row
    chunks: only 1 is offered."""
    out: dict[int, float] = {}
    for k in sorted(set(candidates)):
        if (k == 1 or not g.by_shard) and chunks_legal(ctx, g, k):
            out[k] = simulate_group(ctx, g, k)
    return out


def decomposition_of(ctx: Context, g: Group) -> Group | None:
    """The group `decompose` would make of a row-chunked group's items, when it accepts
    them (an allgather and the matmul reading it, a matmul and the reducescatter of its
    result, possibly starting a fused group); else None."""
    if g.by_shard or len(g.items) != 2:
        return None
    names = tuple(item_name(it) for it in g.items)
    ops = tuple(ctx.by_name[n].expr.op for n in names)
    if ops not in ((Op.ALLGATHER, Op.MATMUL), (Op.MATMUL, Op.REDUCESCATTER)):
        return None
    without = dataclasses.replace(
        ctx.program, groups=tuple(x for x in ctx.program.groups if x is not g)
    )
    try:
        Decompose(items=names).check(without)
    except ScheduleError:
        return None
    return Group(GroupKind.OVERLAPPED, g.items, ctx.group, by_shard=True)


def _decompose_warnings(ctx: Context, g: Group) -> list[SimWarning]:
    """A group decomposed by shard against its items one after the other (the only
    alternative offered: its values keep their layouts, which row chunks refuse)."""
    key = (
        ctx.hw,
        ctx.collectives,
        tuple((step, op.spec, op.stream, op.kind) for step, op in lower_decomposed(ctx, g)),
    )
    hit = _DECOMPOSED.get(key)
    if hit is None:
        hit = (simulate_decomposed(ctx, g), simulate_group(ctx, g, 1))
        _keep(_DECOMPOSED, key, hit)
    mine, plain = hit
    if mine <= plain * _MARGIN:
        return []
    return [
        SimWarning(
            "decompose-slower",
            f"{decompose_step(g)} is predicted slower than no overlap: {format_time(mine)} vs "
            f"{format_time(plain)} (each ring step's GEMM of 1/{ctx.group} of the work, slowed "
            "by the exchange beside it, and the exchanges' latency cost more than the overlap "
            "hides)",
            tuple(g.stages()),
            mine,
            plain,
            "leave these stages without decompose",
        )
    ]


# The chunk times of overlapped groups, by what decides them (hardware, collectives mode,
# the group's operations, its chunk count): the same group in the next step of a schedule,
# or in another layer of a stack, is not simulated again.
_CHUNK_TIMES: dict[object, dict[int, float]] = {}
_CHUNK_TIMES_KEPT = 4096
_DECOMPOSED: dict[object, tuple[float, float]] = {}
"""By the same kind of key, a decomposed group's time and its items' one after the other."""
_DECOMPOSITIONS: dict[object, float | None] = {}
"""By a row-chunked group's key, the time of `decompose` of its items (None: refused)."""


def _keep(cache: dict[object, _T], key: object, value: _T) -> None:
    while len(cache) >= _CHUNK_TIMES_KEPT:
        cache.pop(next(iter(cache)), None)
    cache[key] = value


def _overlap_warnings(ctx: Context, g: Group) -> list[SimWarning]:
    if g.by_shard:
        return _decompose_warnings(ctx, g)
    k = g.chunks or 1
    key = (
        ctx.hw,
        ctx.collectives,
        tuple(
            (op.spec, op.stream, op.kind, op.pstage, op.dest) for op in lower_overlap(ctx, g, 1)[0]
        ),
        k,
    )
    times = _CHUNK_TIMES.get(key)
    if times is None:
        times = chunk_times(ctx, g, (*CHUNK_CANDIDATES, k))
        _keep(_CHUNK_TIMES, key, times)
    if k not in times or 1 not in times:
        return []
    step = overlap_step(g)
    stages = tuple(g.stages())
    best = min(times, key=lambda c: (times[c], c))
    if key in _DECOMPOSITIONS:
        dec_s = _DECOMPOSITIONS[key]
    else:
        found = decomposition_of(ctx, g)
        dec_s = simulate_decomposed(ctx, found) if found is not None else None
        _keep(_DECOMPOSITIONS, key, dec_s)
    # (alike groups share the time; whether decompose takes this one is asked only when
    # it would be suggested)
    slower = k > 1 and times[k] > times[1] * _MARGIN
    dec_wins = dec_s is not None and dec_s * 1.05 < min(times[k], times[best])
    dec_better = dec_s is not None and dec_s < min(times.values())
    dec = decomposition_of(ctx, g) if dec_wins or (slower and dec_better) else None
    if slower:
        better = [c for c in times if c > 1 and times[c] < times[1]]
        hint = (
            f"chunks={min(better, key=lambda c: times[c])} is predicted to win"
            if better
            else "leave these stages without overlap"
        )
        if dec is not None and dec_s is not None and dec_better:
            hint = f"{decompose_step(dec)} is predicted to win ({format_time(dec_s)})"
        return [
            SimWarning(
                "overlap-slower",
                f"{step} is predicted slower than no overlap: {format_time(times[k])} vs "
                f"{format_time(times[1])} (per-chunk latency and smaller GEMMs cost more than the "
                "overlap hides)",
                stages,
                times[k],
                times[1],
                hint,
            )
        ]
    if dec_wins and dec is not None and dec_s is not None:
        return [
            SimWarning(
                "overlap-decompose",
                f"{step}: {decompose_step(dec)} is predicted faster ({format_time(dec_s)} vs "
                f"{format_time(times[k])}): shard by shard around the ring, without row chunks",
                stages,
                times[k],
                dec_s,
                f"use {decompose_step(dec)}",
            )
        ]
    if best != k and best > 1 and times[best] * 1.05 < times[k]:
        return [
            SimWarning(
                "overlap-chunks",
                f"{step}: chunks={best} is predicted faster ({format_time(times[best])} vs "
                f"{format_time(times[k])})",
                stages,
                times[k],
                times[best],
                f"use {overlap_step(g, best)}",
            )
        ]
    return []


def _full_size_compute(ctx: Context, ops: Sequence[Operation], fused: bool, g: int) -> float:
    """The compute of ``ops`` on the whole tensor instead of 1/G (as in AR-C)."""
    kernels = [op.spec for op in ops if isinstance(op.spec, KernelSpec)]
    if not kernels:
        return 0.0
    if fused:
        flops = sum(k.flops for k in kernels) * g
        nbytes = sum(k.nbytes for k in kernels) * g
        return KernelSpec(flops, nbytes, kernels[0].dtype).time(ctx.hw, NO_CONTENTION)
    return sum(
        KernelSpec(k.flops * g, k.nbytes * g, k.dtype).time(ctx.hw, NO_CONTENTION) for k in kernels
    )


def _group_of(ctx: Context, rs: str) -> int:
    """The ranks the reducescatter `rs` runs over: tp's, or dp's (docs/language.md, rank
    grids)."""
    return ctx.program.grid.dp if ctx.stage(rs).expr.tag == "dp" else ctx.group


def _allreduce_time(ctx: Context, rs: str) -> float:
    e = ctx.stage(rs).expr
    x = e.args[0].type
    if e.tag == "dp":  # over dp: a tp rank's part over the dp group
        n, rpn = dp_view(x, ctx.group).numel, ctx.ranks_per_node(ctx.pstage_of(rs), "dp")
    else:
        n, rpn = x.numel, ctx.ranks_per_node(ctx.pstage_of(rs))
    spec = CollSpec(
        Coll.ALLREDUCE, n * x.dtype.itemsize, _group_of(ctx, rs), rpn, dtype=x.dtype.value
    )
    return spec.cost(ctx.hw).time_s


def _region(ctx: Context, rs: str) -> tuple[list[str], list[str]] | None:
    """Compute stages between a reducescatter and the allgathers it feeds, and those
    allgathers; None when its value leaves through anything else."""
    region: list[str] = []
    ags: list[str] = []
    todo = [rs]
    seen = {rs}
    while todo:
        n = todo.pop()
        for u in ctx.users.get(n, ()):
            if u in seen:
                continue
            seen.add(u)
            op = ctx.stage(u).expr.op
            if op is Op.ALLGATHER:
                ags.append(u)
            elif op in COLLECTIVES or op is Op.MATMUL:
                return None
            else:
                region.append(u)
                todo.append(u)
    if not ags:
        return None
    order = {s.name: i for i, s in enumerate(ctx.program.stages)}
    return sorted(region, key=order.__getitem__), sorted(ags, key=order.__getitem__)


def _rs_warning(ctx: Context, group: Group | None, rs: str) -> list[SimWarning]:
    if group is not None:
        ops = lower_item(ctx, group)
        compute_ops = [op for op in ops if isinstance(op.spec, KernelSpec)]
        full = _full_size_compute(ctx, compute_ops, True, _group_of(ctx, rs))
        stages = tuple(group.stages())
        step = f"fuse({', '.join(stages)})"
        what = "the fused reducescatter → compute → allgather"
        ops_seq = ops
    else:
        found = _region(ctx, rs)
        if found is None:
            return []
        region, ags = found
        ops_seq = []
        for n in [rs, *region, *ags]:
            ops_seq += lower_item(ctx, n)
        compute_ops = [op for op in ops_seq if isinstance(op.spec, KernelSpec)]
        full = _full_size_compute(ctx, compute_ops, False, _group_of(ctx, rs))
        stages = (rs, *region, *ags)
        step = f"split({ags[0] if not region else rs})"
        what = "reducescatter → compute on 1/G → allgather"
        if not region:
            what = "reducescatter → allgather"
    mine = simulate_ops(ctx, [ops_seq])
    ar = _allreduce_time(ctx, rs)
    alternative = ar + full
    if mine <= alternative * _MARGIN:
        return []
    shard = sum(duration(ctx.hw, op) for op in compute_ops)
    comm = mine - shard
    if group is None and len(stages) == 2:
        return [
            SimWarning(
                "split-alone",
                f"{step} alone is predicted slower than the allreduce it replaces: "
                f"{format_time(mine)} vs {format_time(alternative)} (two collectives, nothing computed on "
                "the shard)",
                stages,
                mine,
                alternative,
                "reorder computation across the allgather, or do not split",
            )
        ]
    return [
        SimWarning(
            "rs-c-ag-slower",
            f"{step}: {what} is predicted slower than allreduce → compute (AR-C): "
            f"{format_time(mine)} vs {format_time(alternative)}; the collectives cost {format_time(comm - ar)} "
            f"more than one allreduce, computing on 1/{_group_of(ctx, rs)} of the data saves only "
            f"{format_time(max(0.0, full - shard))}",
            stages,
            mine,
            alternative,
            "keep the allreduce (AR-C) here",
        )
    ]


def _merge_alike(found: list[SimWarning]) -> list[SimWarning]:
    """One warning for the same finding on identical groups (the layers of a stack)."""
    merged: dict[tuple[object, ...], list[SimWarning]] = {}
    for w in found:
        key = (
            w.code,
            None if w.predicted_s is None else round(w.predicted_s, 12),
            None if w.alternative_s is None else round(w.alternative_s, 12),
        )
        merged.setdefault(key, []).append(w)
    out: list[SimWarning] = []
    for ws in merged.values():
        first = ws[0]
        if len(ws) == 1:
            out.append(first)
            continue
        stages = tuple(n for w in ws for n in w.stages)
        out.append(
            SimWarning(
                first.code,
                f"{first.message}; the same holds for {len(ws) - 1} more alike",
                stages,
                first.predicted_s,
                first.alternative_s,
                first.suggestion,
            )
        )
    return out


def schedule_warnings(ctx: Context, summary: Summary) -> list[SimWarning]:
    """Every warning for a simulated program."""
    out: list[SimWarning] = []
    rs_cache: dict[object, list[SimWarning]] = {}
    grouped: dict[str, Group] = {}
    for g in ctx.program.groups:
        if g.kind is GroupKind.OVERLAPPED:
            out += _overlap_warnings(ctx, g)
            for it in g.items:
                if isinstance(it, Group):
                    for n in it.stages():
                        grouped[n] = it
        else:
            for n in g.stages():
                grouped[n] = g
    for s in ctx.program.stages:
        if s.expr.op is not Op.REDUCESCATTER:
            continue
        gs = grouped.get(s.name)
        if gs is not None and not any(ctx.stage(n).expr.op is Op.ALLGATHER for n in gs.stages()):
            continue
        x = s.expr.args[0].type
        key = (gs is None, tuple(ctx.stage(n).ty for n in (gs.stages() if gs else [s.name])), x)
        if key in rs_cache and rs_cache[key] == []:
            continue
        found = _rs_warning(ctx, gs, s.name)
        rs_cache[key] = found
        out += found
    out = _merge_alike(out)
    if summary.speedup is not None and summary.speedup < 1 / _MARGIN:
        out.append(
            SimWarning(
                "schedule-slower",
                f"this schedule is predicted slower than the baseline: "
                f"{format_time(summary.makespan_s)} vs {format_time(summary.baseline_s or 0.0)} "
                f"({summary.speedup:.2f}x)",
                (),
                summary.makespan_s,
                summary.baseline_s,
            )
        )
    return out
