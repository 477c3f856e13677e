"""The chunk count of an `overlap`: the K the cost model predicts fastest on a hardware
profile, among the legal counts (docs/schedules.md, `overlap`; docs/cost-model.md)."""

from __future__ import annotations

from collections.abc import Sequence

from cocoviz.ir.nodes import Group, GroupKind, Program
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.warnings import chunk_times
from cocoviz.sim.workload import Context

__all__ = ["CHUNK_CHOICES", "best_chunks"]

CHUNK_CHOICES = (2, 4, 8, 16)


def best_chunks(
    program: Program,
    stages: Sequence[str],
    hw: Hardware,
    *,
    collectives: str = "nccl",
    candidates: Sequence[int] = CHUNK_CHOICES,
) -> int:
    """The chunk count the model predicts fastest for ``overlap(*stages)`` on ``hw``.

    ``stages`` name the items (a member of a fused group stands for the group). Only
    legal counts (dividing the rows, and so on) are tried; ValueError when none is.
    """
    items: list[str | Group] = []
    for n in stages:
        g = program.group_of(n)
        item: str | Group = g if g is not None and g.kind is GroupKind.FUSED else n
        if item not in items:
            items.append(item)
    ctx = Context(program, hw, collectives)
    group = Group(GroupKind.OVERLAPPED, tuple(items), None)
    times = chunk_times(ctx, group, [k for k in candidates if k >= 2])
    if not times:
        raise ValueError(
            f"no chunk count among {', '.join(map(str, candidates))} is legal for "
            f"overlap({', '.join(stages)})"
        )
    return min(times, key=lambda k: (times[k], k))
