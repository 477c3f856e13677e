"""The event simulator: a scheduled Program on a Hardware profile → a per-rank Timeline.

Every world rank has a compute stream and a communication stream. The host issues the
program's stages and groups in their (contracted) topological order; each stream runs
what it is given in issue order (FIFO, as a CUDA stream does), and an operation starts
when its stream is free and every value it needs is ready on that rank:

- data edges and the ordering edges of ``update`` (a read of ``t`` before its write);
- a collective starts on all ranks of its tp group at once, when the last one is ready;
- a ``send`` occupies the communication streams of both ranks of a pair, which may sit
  on different nodes (world rank r on node ⌊r / gpus_per_node⌋, r = pp·T + tp);
- an overlapped group issues its items chunk by chunk (chunk-major: s1₀ s2₀ s1₁ s2₁ …),
  so computation of chunk k+1 overlaps communication of chunk k;
- a group decomposed by shard runs its G ring steps (`lower_decomposed`): each step's
  GEMM on the compute stream, its exchange with the ring neighbours on the communication
  stream, chained by what each step hands the next; events are labelled by step
  (``h[3/8]``);
- a compute kernel that runs while the communication stream is busy is slowed by the
  collective's contention (SMs held by its channels, HBM it consumes, interference),
  piece by piece over the overlapping intervals.

Kernel times include their launch (``kernel_time``/``matmul_time`` with launch); NCCL's
base latency includes its own.

Ranks of a program are symmetric within a tp group; the simulator runs one *lane* per
class of identical ranks (per pipeline stage, and per pattern of node crossings of its
pipeline column) and replicates the lane's events for each of its ranks on output, so a
1-D program of any size costs one lane. ``Timeline.events`` and ``events_of(rank)`` give
faithful per-rank events.

Use: ``makespan(program, hw)`` for the predicted time alone; ``simulate`` (in
``cocoviz.sim.predict``, above this module and ``cocoviz.sim.warnings``) for a whole
``Timeline``, whose summary has the makespan, communication left exposed, the overlap
fraction, the speedup over a baseline and a per-stage table, and whose ``warnings`` list
schedule steps the model predicts to make things slower.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cocoviz.ir.graph import contracted_order
from cocoviz.ir.nodes import Group, GroupKind, Program, unscheduled
from cocoviz.sim.compute import NO_CONTENTION, Contention
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.workload import (
    COMM,
    COMPUTE,
    STREAMS,
    Context,
    Kind,
    Operation,
    batch_reductions,
    comm_contention_of,
    duration,
    is_compute,
    lower_decomposed,
    lower_item,
    overlap_order,
    p2p_duration,
)

_COMM_KINDS = frozenset(k for k in Kind if k.is_comm)
_KIND_NAME = {k: k.value for k in Kind}  # (`.value` of a member is a Python-level property)

__all__ = [
    "Event",
    "Lane",
    "SimWarning",
    "StageRow",
    "Summary",
    "Timeline",
    "ProgramRun",
    "makespan",
    "simulate_decomposed",
    "simulate_group",
    "simulate_ops",
    "summarize",
    "unscheduled",
]


class Event(NamedTuple):
    """One slice of a stream: times in seconds from the start of the program.

    A named tuple (immutable, compared and hashed by its fields like a frozen
    dataclass): a simulation makes one per operation and rank class, and a tuple is made
    at a fraction of the cost of a frozen dataclass's per-field ``object.__setattr__``."""

    rank: int
    stream: str
    stage: str
    kind: Kind
    start: float
    end: float
    bytes: float
    flops: float
    name: str
    members: tuple[str, ...] = ()
    chunk: int | None = None
    chunks: int = 1
    detail: str = ""
    peer: int | None = None
    """For p2p: the other rank of the pair."""
    slowdown: float = 1.0
    """Duration over the duration without contention (> 1: overlapping communication)."""

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        return self.name if self.chunk is None else f"{self.name}[{self.chunk + 1}/{self.chunks}]"

    @property
    def is_comm(self) -> bool:
        return self.kind in _COMM_KINDS


@dataclass(frozen=True)
class Lane:
    """Ranks that behave identically: the events (with ``rank = ranks[0]``) and the
    dependencies between them that cross streams (pairs of event indices)."""

    index: int
    pstage: int
    ranks: tuple[int, ...]
    events: tuple[Event, ...]
    flows: tuple[tuple[int, int], ...]

    @property
    def end(self) -> float:
        return max((e.end for e in self.events), default=0.0)


@dataclass(frozen=True)
class CrossFlow:
    """A dependency between lanes (a send and its receive): rank r of ``src_lane`` → rank
    r + ``rank_offset`` of ``dst_lane``."""

    src_lane: int
    src: int
    dst_lane: int
    dst: int
    rank_offset: int


class StageRow(NamedTuple):
    """One line of the per-stage table (a stage, a fused kernel, a collective); a named
    tuple, as `Event` (a simulation makes one per stage)."""

    name: str
    pstage: int
    kind: str
    stream: str
    calls: int
    busy_s: float
    start_s: float
    end_s: float
    bytes: float
    flops: float
    detail: str


@dataclass(frozen=True)
class SimWarning:
    """A schedule step the model predicts to make things slower."""

    code: str
    message: str
    stages: tuple[str, ...] = ()
    predicted_s: float | None = None
    alternative_s: float | None = None
    suggestion: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Summary:
    """The figures of a simulation on its critical rank, and the per-stage table."""

    makespan_s: float
    compute_s: float
    """Busy time of computation on the critical rank (union of its kernels)."""
    comm_s: float
    """Busy time of communication on the critical rank."""
    exposed_comm_s: float
    """Communication time on the critical rank with no computation running."""
    overlap_fraction: float
    """Share of communication hidden under computation (0 when there is none)."""
    critical_rank: int
    baseline_s: float | None
    speedup: float | None
    stages: tuple[StageRow, ...]


@dataclass(frozen=True)
class Timeline:
    """A simulated run: the lanes of identical ranks, their events, the summary."""

    program: str
    hardware: str
    collectives: str
    tp: int
    pp: int
    lanes: tuple[Lane, ...]
    cross: tuple[CrossFlow, ...]
    summary: Summary
    warnings: tuple[SimWarning, ...] = ()
    dp: int = 1
    """The grid's dp size: the lanes are dp replica 0's ranks (every replica does the
    same work; docs/language.md, rank grids), numbered pp·T + tp as without dp."""

    @property
    def world(self) -> int:
        """The ranks the timeline shows (one dp replica's)."""
        return self.tp * self.pp

    @property
    def makespan(self) -> float:
        return self.summary.makespan_s

    def lane_of(self, rank: int) -> Lane:
        for lane in self.lanes:
            if rank in lane.ranks:
                return lane
        raise KeyError(f"no rank {rank} in a world of {self.world}")

    def events_of(self, rank: int) -> list[Event]:
        lane = self.lane_of(rank)
        if rank == lane.ranks[0]:
            return list(lane.events)
        return [_moved(e, rank, self.tp) for e in lane.events]

    @property
    def events(self) -> list[Event]:
        """Every event of every rank, rank by rank."""
        out: list[Event] = []
        for rank in range(self.world):
            out += self.events_of(rank)
        return out

    def flows(
        self, ranks: Collection[int] | None = None
    ) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
        """Dependencies across streams or ranks as ((rank, i), (rank, j)), where i and j
        index ``events_of(rank)``; given `ranks`, only those between two of them."""

        def chosen(lane: Lane) -> Iterable[int]:
            if ranks is None:
                return lane.ranks
            return [r for r in lane.ranks if r in ranks]

        for lane in self.lanes:
            for r in chosen(lane):
                for a, b in lane.flows:
                    yield (r, a), (r, b)
        for c in self.cross:
            for r in chosen(self.lanes[c.src_lane]):
                if ranks is None or r + c.rank_offset in ranks:
                    yield (r, c.src), (r + c.rank_offset, c.dst)


def _moved(e: Event, rank: int, tp: int) -> Event:
    peer = None if e.peer is None else e.peer + (rank - e.rank)
    return e._replace(rank=rank, peer=peer)


# ---------------------------------------------------------------------------------------
# The engine


class _LaneState:
    def __init__(
        self,
        index: int,
        pstage: int,
        ranks: tuple[int, ...],
        column: int,
        record: bool = True,
        serial: bool = False,
    ) -> None:
        self.index = index
        self.pstage = pstage
        self.ranks = ranks
        self.column = column
        self.record = record
        """Whether events are kept (a makespan-only run keeps only the times)."""
        self.serial = serial
        """The rank is one thread (a CPU rank): its streams run one operation at a time,
        in issue order, so an operation on any stream waits for every stream."""
        self.free = {s: 0.0 for s in STREAMS}
        self.ready: dict[str, tuple[float, int]] = {}
        """When each value is ready on this lane (whole values: every chunk of a chunked
        group's value once the group is done), with the index of the event that made it."""
        self.ready_chunk: dict[tuple[str, int], tuple[float, int]] = {}
        """The same for one chunk of a value made inside a chunked group."""
        self.events: list[Event] = []
        self.flows: list[tuple[int, int]] = []
        self.streams: list[str] = []
        """The stream of each event index (also in a makespan-only run)."""
        self.comm_iv: list[tuple[float, float, Contention]] = []
        self.comm_ends: list[float] = []
        self.end = 0.0
        self.nccl_start = 0.0
        """Start of the last NCCL operation: NCCL starts its kernels in host issue order
        across communicators (NCCL_LAUNCH_ORDER_IMPLICIT, which the emitted launcher sets)."""

    def need(self, needs: Iterable[str], chunk: int) -> tuple[float, list[int]]:
        """When the values ``needs`` are all ready (a chunk's own value first, else the
        whole value), and the events that made them."""
        t = 0.0
        srcs: list[int] = []
        ready = self.ready
        by_chunk = self.ready_chunk if chunk >= 0 and self.ready_chunk else None
        for key in needs:
            hit = None if by_chunk is None else by_chunk.get((key, chunk))
            if hit is None:
                hit = ready.get(key)
                if hit is None:
                    continue
            if hit[0] > t:
                t = hit[0]
            if hit[1] >= 0:
                srcs.append(hit[1])
        return t, srcs

    def add(
        self,
        stream: str,
        end: float,
        event: Event | None,
        srcs: Sequence[int],
        makes: Iterable[str],
        chunk: int,
    ) -> int:
        """Record an operation of this lane that ends at ``end`` on ``stream``, with its
        event when the lane keeps events (None in a makespan-only run)."""
        idx = len(self.streams)
        self.streams.append(stream)
        if event is not None:
            self.events.append(event)
            streams = self.streams
            for s in srcs:
                if streams[s] != stream:
                    self.flows.append((s, idx))
        free = self.free
        if self.serial:
            for name in STREAMS:
                if end > free[name]:
                    free[name] = end
        elif end > free[stream]:
            free[stream] = end
        if end > self.end:
            self.end = end
        made = (end, idx)
        if chunk >= 0:
            by_chunk = self.ready_chunk
            for key in makes:
                by_chunk[(key, chunk)] = made
        else:
            ready = self.ready
            for key in makes:
                ready[key] = made
        return idx

    def add_comm_interval(self, start: float, end: float, c: Contention) -> None:
        if end > start:
            self.comm_iv.append((start, end, c))
            self.comm_ends.append(end)


_COST_ATTR = "_cocoviz_cost"


class _Engine:
    def __init__(self, ctx: Context, record: bool = True) -> None:
        """``record=False``: a makespan-only run (no events, no flows), for baselines
        and the alternatives a warning compares."""
        self.ctx = ctx
        self.hw = ctx.hw
        self.record = record
        grid = ctx.program.grid
        self.tp, self.pp = grid.tp, grid.pp
        gpn = ctx.hw.gpus_per_node
        # On a grid with dp the lanes are dp replica 0's (every replica does the same
        # work); its world ranks are p·D·T + t (docs/language.md, rank grids).
        stride = grid.tp * grid.dp
        # Column classes: tp indices whose pipeline hops cross nodes in the same pattern.
        classes: dict[tuple[bool, ...], list[int]] = {}
        for t in range(self.tp):
            sig = tuple(
                (p * stride + t) // gpn != ((p + 1) * stride + t) // gpn
                for p in range(self.pp - 1)
            )
            classes.setdefault(sig, []).append(t)
        self.crossings = list(classes)
        # a CPU rank is one thread: its kernels, collectives and sends run one at a time
        # in issue order (docs/cost-model.md, the timeline simulator)
        serial = ctx.hw.gpu.arch == "cpu"
        self.lanes: list[_LaneState] = []
        self.by_pstage: dict[int, list[_LaneState]] = {}
        self.by_key: dict[tuple[int, int], _LaneState] = {}
        for p in range(self.pp):
            for c, (_sig, cols) in enumerate(classes.items()):
                ranks = tuple(p * self.tp + t for t in cols)
                lane = _LaneState(len(self.lanes), p, ranks, c, record, serial)
                self.lanes.append(lane)
                self.by_pstage.setdefault(p, []).append(lane)
                self.by_key[(p, c)] = lane
        self.cross: list[CrossFlow] = []

    def lanes_for(self, pstage: int | None) -> list[_LaneState]:
        if pstage is None:
            return self.lanes
        return self.by_pstage.get(pstage, [])

    def _cost(self, op: Operation) -> list[Any]:
        """The time of an operation without contention and the contention it causes,
        kept on its spec for the hardware last asked about (in the spec's __dict__,
        outside its fields). Lowered operations are shared (`lower_stage`'s memo on the
        stage, a fused group per chunk count), so most specs repeat: across the chunks of
        a group, and across runs, as the baseline's and the warnings' of a simulation."""
        d = op.spec.__dict__
        hit: list[Any] | None = d.get(_COST_ATTR)
        if hit is None or hit[0] is not self.hw:
            # (a send's spec is priced per pair, by `p2p_duration`)
            hit = d[_COST_ATTR] = [self.hw, duration(self.hw, op) if op.dest is None else 0.0, None]
        return hit

    def _duration(self, op: Operation) -> float:
        """``duration(hw, op)`` (no contention), once per spec."""
        return self._cost(op)[1]  # type: ignore[no-any-return]

    def _contention_of(self, op: Operation) -> Contention:
        hit = self._cost(op)
        if hit[2] is None:
            hit[2] = comm_contention_of(self.hw, op)
        return hit[2]  # type: ignore[no-any-return]

    def _event(
        self,
        lane: _LaneState,
        op: Operation,
        start: float,
        end: float,
        chunk: int,
        chunks: int,
        detail: str | None = None,
        peer: int | None = None,
        slowdown: float = 1.0,
    ) -> Event | None:
        if not self.record:
            return None
        return Event(
            lane.ranks[0],
            op.stream,
            op.stage,
            op.kind,
            start,
            end,
            op.nbytes,
            op.flops,
            op.name,
            op.members,
            chunk if chunk >= 0 else None,
            chunks,
            op.detail if detail is None else detail,
            peer,
            slowdown,
        )

    def place(self, op: Operation, chunk: int = -1, chunks: int = 1, step: int = -1) -> None:
        """Place an operation (of chunk ``chunk`` of a chunked group, whose values are
        ready chunk by chunk; or of step ``step`` of a decomposed group, whose values are
        keyed by step already: the step only labels its events)."""
        if op.dest is not None:
            self._place_p2p(op, chunk, chunks)
            return
        label = chunk if chunk >= 0 else step
        lanes = self.lanes_for(op.pstage)
        stream = op.stream
        if op.sync:
            needs = [lane.need(op.needs, chunk) for lane in lanes]
            start = max(
                (max(t, lane.free[stream]) for lane, (t, _) in zip(lanes, needs, strict=True)),
                default=0.0,
            )
            if op.kind is not Kind.DEVICE:  # an NCCL kernel: after the one issued before it
                start = max([start] + [lane.nccl_start for lane in lanes])
                for lane in lanes:
                    lane.nccl_start = start
            end = start + self._duration(op)
            c = self._contention_of(op)
            for lane, (_, srcs) in zip(lanes, needs, strict=True):
                e = self._event(lane, op, start, end, label, chunks)
                lane.add(stream, end, e, srcs, op.makes, chunk)
                lane.add_comm_interval(start, end, c)
            return
        base = self._duration(op)
        slowed = stream == COMPUTE and is_compute(op)  # by communication running beside it
        for lane in lanes:
            t, srcs = lane.need(op.needs, chunk)
            free = lane.free[stream]
            start = t if t > free else free
            if slowed and bisect.bisect_right(lane.comm_ends, start) < len(lane.comm_ends):
                end = self._run_compute(lane, op, start, base)
            else:
                end = start + base
            e = None
            if self.record:
                slowdown = (end - start) / base if slowed and base > 0 else 1.0
                e = self._event(lane, op, start, end, label, chunks, slowdown=slowdown)
            lane.add(stream, end, e, srcs, op.makes, chunk)
            if stream == COMM:
                lane.add_comm_interval(start, end, self._contention_of(op))

    def _run_compute(self, lane: _LaneState, op: Operation, start: float, d0: float) -> float:
        """End of a compute op started at ``start``: slower while communication runs."""
        i = bisect.bisect_right(lane.comm_ends, start)
        t, rem = start, 1.0
        for a, b, c in lane.comm_iv[i:]:
            if a > t:
                fast = (a - t) / d0 if d0 > 0 else float("inf")
                if rem <= fast:
                    return t + rem * d0
                rem -= fast
                t = a
            d1 = duration(self.hw, op, c) if c != NO_CONTENTION else d0
            slow = (b - t) / d1 if d1 > 0 else float("inf")
            if rem <= slow:
                return t + rem * d1
            rem -= slow
            t = b
        return t + rem * d0

    def _place_p2p(self, op: Operation, chunk: int, chunks: int) -> None:
        assert op.pstage is not None and op.dest is not None
        for src in self.lanes_for(op.pstage):
            dst = self.by_key[(op.dest, src.column)]
            crosses = self.crossings[src.column][op.pstage] if self.pp > 1 else False
            cost = p2p_duration(self.hw, op, same_node=not crosses)
            t, srcs = src.need(op.needs, chunk)
            # its stream (COMM, or P2P inside an overlapped group) on both ends, after the
            # NCCL operations issued before it there
            stream = op.stream
            start = max(t, src.free[stream], dst.free[stream], src.nccl_start, dst.nccl_start)
            src.nccl_start = dst.nccl_start = start
            end = start + cost.time_s
            where = "network" if crosses else "NVLink"
            offset = (op.dest - op.pstage) * self.tp
            e_send = self._event(
                src, op, start, end, chunk, chunks,
                peer=src.ranks[0] + offset, detail=f"send to pp {op.dest} over {where}",
            )  # fmt: skip
            i_send = src.add(stream, end, e_send, srcs, (), chunk)
            e_recv = self._event(
                dst, op, start, end, chunk, chunks,
                peer=dst.ranks[0] - offset, detail=f"recv from pp {op.pstage} over {where}",
            )  # fmt: skip
            i_recv = dst.add(stream, end, e_recv, (), op.makes, chunk)
            c = self._contention_of(op)
            src.add_comm_interval(start, end, c)
            dst.add_comm_interval(start, end, c)
            if self.record:
                self.cross.append(CrossFlow(src.index, i_send, dst.index, i_recv, offset))

    def run_item(self, item: str | Group) -> None:
        if isinstance(item, Group) and item.kind is GroupKind.OVERLAPPED:
            if item.by_shard:
                self.run_decomposed(item)
            else:
                self.run_ordered(overlap_order(self.ctx, item), item.chunks or 1)
            return
        for op in lower_item(self.ctx, item):
            self.place(op)

    def run_chunks(self, per_chunk: Sequence[Sequence[Operation]]) -> None:
        self.run_ordered([(c, op) for c, ops in enumerate(per_chunk) for op in ops], len(per_chunk))

    def run_ordered(self, ordered: Sequence[tuple[int, Operation]], k: int) -> None:
        """Operations of a chunked group, each with its chunk, in issue order."""
        made: set[str] = set()
        for c, op in ordered:
            self.place(op, c if k > 1 else -1, k)
            made.update(op.makes)
        if k > 1:
            self._merge_chunks(made, k)

    def run_decomposed(self, g: Group) -> None:
        """A group decomposed by shard: its ring steps in order (`lower_decomposed`)."""
        steps = g.chunks or self.ctx.group
        for step, op in lower_decomposed(self.ctx, g):
            self.place(op, chunks=steps, step=step)

    def _merge_chunks(self, made: set[str], k: int) -> None:
        """After a chunked group: a value is ready when its last chunk is."""
        for lane in self.lanes:
            by_chunk = lane.ready_chunk
            for key in made:
                best: tuple[float, int] | None = None
                for c in range(k):
                    hit = by_chunk.get((key, c))
                    if hit is not None and (best is None or hit[0] >= best[0]):
                        best = hit
                if best is not None:
                    lane.ready[key] = best

    def lanes_out(self) -> tuple[Lane, ...]:
        return tuple(
            Lane(ls.index, ls.pstage, ls.ranks, tuple(ls.events), tuple(ls.flows))
            for ls in self.lanes
        )

    @property
    def end(self) -> float:
        return max((ls.end for ls in self.lanes), default=0.0)


def simulate_group(ctx: Context, g: Group, chunks: int) -> float:
    """Makespan of an overlapped group alone in `chunks` chunks, issued as the emitted
    program issues it (`overlap_order`), on fresh streams."""
    engine = _Engine(ctx, record=False)
    engine.run_ordered(overlap_order(ctx, g, chunks), chunks)
    return engine.end


def simulate_decomposed(ctx: Context, g: Group) -> float:
    """Makespan of a group decomposed by shard alone, on fresh streams (every outside
    value ready); ``g`` need not be one of the program's groups (a warning prices the
    decomposition of a row-chunked group's items)."""
    engine = _Engine(ctx, record=False)
    engine.run_decomposed(g)
    return engine.end


def simulate_ops(ctx: Context, per_chunk: Sequence[Sequence[Operation]]) -> float:
    """Makespan of operations alone, on fresh streams with every outside value ready
    (for comparing alternatives of one step: chunk counts, fused or not)."""
    engine = _Engine(ctx, record=False)
    engine.run_chunks(per_chunk)
    return engine.end


# ---------------------------------------------------------------------------------------
# Summary


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _measure(iv: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _minus(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Measure of a \\ b for two sorted unions."""
    total = 0.0
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


def _stage_rows(lanes: Sequence[Lane]) -> tuple[StageRow, ...]:
    """Per stage, from the lane that finishes last on each pipeline stage: the summary's
    critical lane on its own stage, so the table and the summary describe the same rank
    (a measured run's ranks differ; a simulated stage's lanes usually agree)."""
    # each row as a list of StageRow's fields, in their order
    rows: dict[tuple[str, int], list[Any]] = {}
    slowest: dict[int, Lane] = {}
    for lane in lanes:
        best = slowest.get(lane.pstage)
        if best is None or (lane.end, -lane.index) > (best.end, -best.index):
            slowest[lane.pstage] = lane
    for lane in sorted(slowest.values(), key=lambda ln: ln.index):
        p = lane.pstage
        for e in lane.events:
            key = (e.name, p)
            r = rows.get(key)
            if r is None:
                rows[key] = [
                    e.name, p, _KIND_NAME[e.kind], e.stream, 1, e.end - e.start, e.start, e.end,
                    e.bytes, e.flops, e.detail,
                ]  # fmt: skip
            else:
                r[4] += 1
                r[5] += e.end - e.start
                r[6] = min(r[6], e.start)
                r[7] = max(r[7], e.end)
                r[8] += e.bytes
                r[9] += e.flops
    out = [StageRow(*r) for r in rows.values()]
    out.sort(key=lambda r: (r.start_s, r.pstage, r.name))
    return tuple(out)


def summarize(lanes: Sequence[Lane], baseline_s: float | None = None) -> Summary:
    """Makespan, exposed communication and overlap of the lane that finishes last."""
    if not lanes or not any(lane.events for lane in lanes):
        return Summary(0.0, 0.0, 0.0, 0.0, 0.0, 0, baseline_s, None, ())
    crit = max(lanes, key=lambda lane: (lane.end, -lane.index))
    comm = _union((e.start, e.end) for e in crit.events if e.is_comm)
    comp = _union((e.start, e.end) for e in crit.events if not e.is_comm)
    comm_s = _measure(comm)
    exposed = _minus(comm, comp)
    makespan = max(lane.end for lane in lanes)
    speedup = baseline_s / makespan if baseline_s and makespan > 0 else None
    return Summary(
        makespan_s=makespan,
        compute_s=_measure(comp),
        comm_s=comm_s,
        exposed_comm_s=exposed,
        overlap_fraction=(1.0 - exposed / comm_s) if comm_s > 0 else 0.0,
        critical_rank=crit.ranks[0],
        baseline_s=baseline_s,
        speedup=speedup,
        stages=_stage_rows(lanes),
    )


# ---------------------------------------------------------------------------------------
# Entry point


@dataclass
class ProgramRun:
    """One simulation of a program: its items issued in order on an engine."""

    ctx: Context
    record: bool = True
    engine: _Engine = field(init=False)

    def __post_init__(self) -> None:
        self.engine = _Engine(self.ctx, self.record)
        order = contracted_order(self.ctx.program, self.ctx.program.groups, self.ctx.deps)
        if order is None:
            from cocoviz.errors import InternalError

            raise InternalError(f"{self.ctx.program.name}: the grouped graph has a cycle")
        # Consecutive items are lowered together so that their scalar reductions batch
        # as the emitter batches them (`batch_reductions`); an overlapped group places
        # its chunks itself.
        pending: list[Operation] = []
        for item in order:
            if isinstance(item, Group) and item.kind is GroupKind.OVERLAPPED:
                self._place(pending)
                pending = []
                self.engine.run_item(item)
            else:
                pending += lower_item(self.ctx, item)
        self._place(pending)

    def _place(self, ops: list[Operation]) -> None:
        for op in batch_reductions(self.ctx, ops):
            self.engine.place(op)


def makespan(program: Program, hw: Hardware, collectives: str = "nccl") -> float:
    """Only the predicted time of a program (what the tuner ranks by)."""
    return ProgramRun(Context(program, hw, collectives), record=False).engine.end
