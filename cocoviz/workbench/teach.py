"""Teach mode's explanations: what a step changed in the graph and the timeline, and
why that is faster, in words a student follows. Built from the two programs and the
two predicted timelines, so the numbers are the model's, never made up. No Textual."""

from __future__ import annotations

from cocoviz.ir.nodes import Program
from cocoviz.sim.timeline import Summary
from cocoviz.timefmt import format_time

WHY = {
    "split": (
        "An allreduce is really two halves: a reduce-scatter (every rank ends up with the "
        "sum of one 1/G slice) followed by an all-gather (every rank collects all the "
        "slices). Splitting it costs nothing by itself — the bytes moved are the same — "
        "but it opens a gap between the halves where work can be done on a slice instead "
        "of on the whole tensor."
    ),
    "reorder": (
        "The computation after the all-gather is elementwise, so each rank can do it on "
        "its own slice before gathering. Every rank now computes on 1/G of the data, and "
        "the all-gather moves the finished result instead of the raw sum."
    ),
    "asslice": (
        "This input is only ever read one slice at a time, so each rank can store just its "
        "slice: less memory, and no gather is needed to write it back."
    ),
    "dce": "Stages whose values nobody reads any more are removed.",
    "fuse": (
        "The reduce-scatter, the computation on the slice and the all-gather now run as one "
        "fused collective: one launch instead of three, and the slice stays in fast memory "
        "between the phases instead of being written out and read back."
    ),
    "overlap": (
        "The producer is cut into chunks. As soon as the first chunk is computed, its "
        "communication starts while the next chunk computes, so the network and the GPU "
        "work at the same time instead of taking turns."
    ),
}


def _graph_change(before: Program, after: Program) -> list[str]:
    b = {s.name: s for s in before.stages}
    a = {s.name: s for s in after.stages}
    out: list[str] = []
    added = [n for n in a if n not in b]
    removed = [n for n in b if n not in a]
    if added:
        out.append(
            "new: " + ", ".join(f"{n} = {a[n].expr.op.value} ({a[n].ty.layout})" for n in added)
        )
    if removed:
        out.append("gone: " + ", ".join(removed))
    relaid = [n for n in a if n in b and a[n].ty.layout != b[n].ty.layout]
    if relaid:
        out.append(
            "now " + ", ".join(f"{n} is {b[n].ty.layout} → {a[n].ty.layout}" for n in relaid)
        )
    if len(after.groups) != len(before.groups) or after.groups != before.groups:
        for g in after.groups:
            if g not in before.groups:
                chunks = f" in {g.chunks} chunks" if g.chunks else ""
                out.append(f"{g.kind.value} group{chunks}: " + ", ".join(g.stages()))
    return out or ["the graph's shape is unchanged"]


def _timeline_change(tb: Summary | None, ta: Summary | None) -> str:
    if tb is None or ta is None:
        return "The timeline is not available, so there is no predicted time to compare."
    delta = tb.makespan_s - ta.makespan_s
    pct = delta / tb.makespan_s if tb.makespan_s else 0.0
    if abs(pct) < 0.005:
        head = f"Predicted time stays at {format_time(ta.makespan_s)}."
    elif delta > 0:
        head = (
            f"Predicted time falls from {format_time(tb.makespan_s)} to "
            f"{format_time(ta.makespan_s)} ({pct:.0%} faster)."
        )
    else:
        head = (
            f"Predicted time rises from {format_time(tb.makespan_s)} to "
            f"{format_time(ta.makespan_s)} ({-pct:.0%} slower) — a step can lose, and the "
            "model says so."
        )
    return head + (
        f" Communication nobody waits behind: exposed time "
        f"{format_time(tb.exposed_comm_s)} → {format_time(ta.exposed_comm_s)}."
    )


def explain(
    step: str,
    before: Program,
    after: Program,
    tb: Summary | None,
    ta: Summary | None,
) -> str:
    """A few sentences for one teach-mode step."""
    name = step.split("(", 1)[0].strip()
    why = WHY.get(name, "")
    graph = "; ".join(_graph_change(before, after))
    return f"{why}\n\nIn the graph — {graph}.\n\n{_timeline_change(tb, ta)}"


INTRO = (
    "Teach mode walks through this sample's schedule one step at a time. Each step "
    "rewrites the program without changing its result; watch the graph (what runs) and "
    "the timeline (when it runs, on every rank) change. Press n for the next step, p to "
    "go back, t to leave."
)
