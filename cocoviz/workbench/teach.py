"""Teach mode's explanations: what a step changed in the graph and the timeline, and
why that is faster, in words a student follows. Built from the two programs and the
two predicted timelines, so the numbers are the model's, never made up. No Textual."""

from __future__ import annotations

from cocoviz.ir.nodes import COLLECTIVES, Group, Op, Program
from cocoviz.sim.timeline import Summary
from cocoviz.timefmt import format_time

WHY = {
    "split": (
        "An allreduce is really two halves: a reduce-scatter (every rank ends up with the "
        "sum of one 1/G slice) followed by an all-gather (every rank collects all the "
        "slices). The same bytes move either way, but the two calls each pay "
        "NCCL's latency, and NCCL may pick another algorithm for the allreduce than for "
        "its halves. What the split buys is a gap between the halves where work can be "
        "done on a slice instead of on the whole tensor."
    ),
    "reorder": (
        "The computation after the all-gather is elementwise, so each rank can do it on "
        "its own slice before gathering. Every rank now computes on 1/G of the data, and "
        "the all-gather moves the finished result instead of the raw sum."
    ),
    "reorder-alltoall": (
        "An all-to-all only re-slices a value: the same global tensor, sliced along another "
        "dimension afterwards. Elementwise work after it can run before it instead, on the "
        "old slicing, with the same result bit for bit. What changes is what travels (a "
        "cast to a narrower dtype moved ahead of the all-to-all halves its bytes) and "
        "which kernels can fuse."
    ),
    "asslice": (
        "This input is only ever read one slice at a time, so each rank can store just its "
        "slice: less memory, and no gather is needed to write it back."
    ),
    "dce": "Stages whose values nobody reads any more are removed.",
    "overlap": (
        "The producer is cut into chunks. As soon as the first chunk is computed, its "
        "communication starts while the next chunk computes, so the network and the GPU "
        "can work at the same time. Each chunk pays its own collective latency and runs a "
        "smaller kernel, which is what overlap has to win back."
    ),
    "decompose": (
        "The collective and its matmul are decomposed by shard around the ring of the G "
        "ranks. The network and the GPU work at the same time, and every value keeps its "
        "layout, so sliced values enter and leave the group freely. Each step is a "
        "point-to-point exchange and a GEMM of 1/G of the work."
    ),
}
"""What a step does, in general (`explain` adds what it did here, from the programs)."""

DECOMPOSE_HOW = {
    Op.ALLGATHER: (
        "In each of G steps every rank multiplies the one shard of the all-gather's input "
        "it holds while that shard moves on to its neighbour."
    ),
    Op.REDUCESCATTER: (
        "In each of G steps every rank adds its block of the product to the running sum "
        "its neighbour sent and passes it on, in place of the reduce-scatter."
    ),
}
"""How a decomposed group runs, by the collective it replaces."""

COLLECTIVE_WORDS = {
    Op.ALLREDUCE: "an allreduce",
    Op.REDUCESCATTER: "a reduce-scatter",
    Op.ALLGATHER: "an all-gather",
    Op.ALLTOALL: "an all-to-all",
    Op.BROADCAST: "a broadcast",
    Op.REDUCE: "a reduce",
    Op.SEND: "a point-to-point send",
}
"""How the texts name each collective (what the test of the texts reads back)."""


def _what(stage_op: Op) -> str:
    return COLLECTIVE_WORDS.get(stage_op, "computation")


def _fused(before: Program, after: Program) -> str:
    """What a fuse step made: its members, each named by what it does."""
    new = [g for g in after.groups if g not in before.groups]
    if not new:
        return "The stages now run as one fused group."
    g = new[-1]
    names = g.stages()
    parts = [f"{n} ({_what(after.stage(n).expr.op)})" for n in names if after.has_stage(n)]
    comm = any(after.stage(n).expr.op in COLLECTIVES for n in names if after.has_stage(n))
    kind = "fused collective" if comm else "fused kernel"
    return (
        f"{', '.join(parts)} now run as one {kind}: fewer launches, and the data stays in "
        "fast memory between them instead of being written out and read back."
    )


def _decomposed(before: Program, after: Program) -> str:
    new = [g for g in after.groups if g not in before.groups and g.by_shard]
    if not new:
        return ""
    ops = {after.stage(n).expr.op for n in new[-1].stages() if after.has_stage(n)}
    ops |= {before.stage(n).expr.op for n in new[-1].stages() if before.has_stage(n)}
    return " ".join(DECOMPOSE_HOW[o] for o in (Op.ALLGATHER, Op.REDUCESCATTER) if o in ops)


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
                out.append(f"{g.kind.value} group{_how_split(g)}: " + ", ".join(g.stages()))
    return out or ["the graph's shape is unchanged"]


def _how_split(g: Group) -> str:
    """How an overlapped group cuts its work: in K row chunks, or by shard over G ranks."""
    if not g.chunks:
        return ""
    if g.by_shard:
        return f" decomposed by shard over {g.chunks} ranks"
    return f" in {g.chunks} chunks"


STEADY = 0.005
"""A relative change below this is reported as no change."""


def direction(tb: Summary, ta: Summary) -> str:
    """What the model predicts for one step: "faster", "slower" or "same"."""
    delta = tb.makespan_s - ta.makespan_s
    pct = delta / tb.makespan_s if tb.makespan_s else 0.0
    if abs(pct) < STEADY:
        return "same"
    return "faster" if delta > 0 else "slower"


def _collectives(s: Summary) -> str:
    """The algorithms the communication of a timeline ran as (from the stage table)."""
    algos = {r.detail.split(",")[0] for r in s.stages if r.stream == "comm" and "/" in r.detail}
    return ", ".join(sorted(algos))


def _algorithms(tb: Summary | None, ta: Summary | None) -> str:
    """How the model ran the collectives before and after, when that changed (its own
    words: `allreduce symmetric/Simple`), so that no text claims another algorithm."""
    if tb is None or ta is None:
        return ""
    before, after = _collectives(tb), _collectives(ta)
    if before == after or not (before or after):
        return ""
    return f" The model's collectives were {before or 'none'}; now {after or 'none'}."


WIN_WHERE = {
    "split": (
        "A split alone never pays in this model (two calls where there was one); it sets "
        "up the steps after it, which move work onto the slices."
    ),
    "reorder": (
        "Computing on slices pays once the inputs it reads are slices too (asslice) and "
        "when that computation is large next to the collectives."
    ),
    "reorder-alltoall": (
        "Moving work ahead of an all-to-all pays when it makes what is sent smaller (a "
        "cast to bf16 or f16) or fuses with the work before it; otherwise the work is the "
        "same on either side."
    ),
    "asslice": "Keeping inputs as slices pays when they are large next to the collectives.",
    "fuse": (
        "Fusing pays when the launches and memory round trips it saves are a visible part "
        "of the time: small tensors, or many kernels."
    ),
    "overlap": (
        "Overlap pays when each chunk's computation outlasts its collective's latency: "
        "larger matrices, fewer chunks, or in-kernel collectives (--collectives "
        "nccl-device)."
    ),
    "decompose": (
        "Decomposing pays when each shard's GEMM outlasts its point-to-point exchange: "
        "larger matrices or fewer ranks; with many small shards the per-step latency "
        "dominates."
    ),
}
"""Where a step that loses here would win, by step."""


def _why_slower(step: str, tb: Summary, ta: Summary, hardware: str) -> str:
    """Why a step loses here, from the two summaries, and where it would win."""
    comm = ta.comm_s - tb.comm_s
    comp = ta.compute_s - tb.compute_s
    exposed = ta.exposed_comm_s - tb.exposed_comm_s
    parts = []
    if comm > 0:
        parts.append(
            f"communication takes {format_time(comm)} longer "
            f"({format_time(tb.comm_s)} → {format_time(ta.comm_s)})"
        )
    if comp > 0:
        parts.append(
            f"computation takes {format_time(comp)} longer "
            f"({format_time(tb.compute_s)} → {format_time(ta.compute_s)})"
        )
    if not parts and exposed > 0:
        parts.append(f"more communication is left exposed (+{format_time(exposed)})")
    reason = "; ".join(parts) or "the operations line up worse on the timeline"
    text = f" Why it loses on {hardware} at this size: {reason}."
    before, after = _collectives(tb), _collectives(ta)
    if comm > 0 and before != after and "nvls" in before and "nvls" not in after:
        text += (
            f" The collectives ran as {before} and now run as {after}: NVLink SHARP "
            "speeds up the allreduce but not its halves, so on a machine without it "
            "(a100-dgx, v100-dgx2) the halves cost what the allreduce costs."
        )
    where = WIN_WHERE.get(step)
    if where:
        text += " " + where
    return text + " `cocoviz tune FILE --sweep DIM=LO..HI` shows from which size a schedule wins."


def _timeline_change(
    tb: Summary | None, ta: Summary | None, hardware: str = "", step: str = ""
) -> str:
    if tb is None or ta is None:
        return "The timeline is not available, so there is no predicted time to compare."
    way = direction(tb, ta)
    delta = tb.makespan_s - ta.makespan_s
    pct = delta / tb.makespan_s if tb.makespan_s else 0.0
    if way == "same":
        head = f"Predicted time stays at {format_time(ta.makespan_s)}."
    elif way == "faster":
        head = (
            f"Predicted time falls from {format_time(tb.makespan_s)} to "
            f"{format_time(ta.makespan_s)} ({pct:.0%} faster)."
        )
    else:
        head = (
            f"Predicted time rises from {format_time(tb.makespan_s)} to "
            f"{format_time(ta.makespan_s)} ({-pct:.0%} slower)."
        ) + _why_slower(step, tb, ta, hardware or "this machine")
    return head + (
        f" Communication the computation does not hide (exposed): "
        f"{format_time(tb.exposed_comm_s)} → {format_time(ta.exposed_comm_s)}."
    )


def explain(
    step: str,
    before: Program,
    after: Program,
    tb: Summary | None,
    ta: Summary | None,
    hardware: str = "",
) -> str:
    """A few sentences for one teach-mode step: what it does (no claim about its speed),
    what it changed in the graph, and what the model predicts for it on ``hardware``."""
    name = _kind(step, before)
    if name == "fuse":
        why = _fused(before, after)
    elif name == "decompose":
        why = f"{WHY[name]} {_decomposed(before, after)}".strip()
    else:
        why = WHY.get(name, "")
    graph = "; ".join(_graph_change(before, after))
    timeline = _timeline_change(tb, ta, hardware, name) + _algorithms(tb, ta)
    return f"{why}\n\nIn the graph — {graph}.\n\n{timeline}"


def _kind(step: str, before: Program) -> str:
    """The step's name, or ``reorder-alltoall`` for a reorder across an alltoall (its
    story differs from the allgather's)."""
    name, _, rest = step.partition("(")
    name = name.strip()
    first = rest.split(",", 1)[0].split(")", 1)[0].strip()
    if name == "reorder" and before.has_stage(first):
        if before.stage(first).expr.op is Op.ALLTOALL:
            return "reorder-alltoall"
    return name


INTRO = (
    "Teach mode walks through this sample's schedule one step at a time. Each step "
    "rewrites the program without changing its result; watch the graph (what runs) and "
    "the timeline (when it runs, on every rank) change. Press n for the next step, p to "
    "go back, t to leave."
)
