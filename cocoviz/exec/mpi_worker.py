"""One rank of `cocoviz run --mpi`: a real process holding only its per-rank storage.

Started by `cocoviz.exec.mpi_run` as ``mpiexec -n N python -m cocoviz.exec.mpi_worker
SPEC.json``. The per-op semantics are `cocoviz.exec.ops` (the same definitions as the
reference); collectives go through mpi4py on numpy buffers:

- reductions (allreduce, reducescatter, reduce and the implicit scalar reductions) run
  in the compute type (f32 for f16/bf16/f32, f64, int64) with MPI's SUM/PROD/MAX/MIN and
  are rounded once to the stored dtype, as the reference does; `avg` is a sum divided by
  G. Implicit scalar reductions gather the partials and combine them in rank order
  through `ops.combine_ranks`, exactly as the reference.
- `send` is MPI Send/Recv between the same tp index of consecutive pipeline stages.
- a shard-decomposed group (`decompose`) runs as G steps of Isend/Irecv with the ring
  neighbours around one GEMM each (`cocoviz.exec.shard_pipeline`).
- an overlapped group runs as a K-chunk pipeline of non-blocking collectives
  (Ireduce_scatter_block, Iallgather, Iallreduce, Isend/Irecv) issued in the same
  deterministic chunk-major order on every rank, so that chunk k+1's matmul runs while
  chunk k's collectives are in flight. Chunk k of a value on a rank is laid out as the
  emitter lays it out (`layout.chunk_positions`): the k-th 1/K of the rank's storage
  (rows of a whole value, of the rank's block of a `sliced(d)` one), except that of a
  value sliced flat inside the group rank r holds global elements ``k·n/K + r·n/(K·G) +
  i``. Each stage reads its operands at the positions of its chunk's elements
  (`ChunkPipeline`). A group with an alltoall chunks dimension 0 instead
  (`LeadingChunkPipeline`).

Timed iterations reuse memory: a stage's expression is evaluated by
`ops.stage_value_pooled` (the same bits as `ops.stage_value`, with `out=` buffers and
temporaries recycled through a `ops.BufferPool`), collectives widen, receive and round
into persistent per-stage buffers, and an allgather of a flat-chunked value is its
receive buffer.

Each rank writes `status.<rank>` (started / done / error: … / internal: …) and `result.<rank>.json`
(the makespan and events of the median-makespan iteration, `iteration_report`) into the
job directory; rank 0 writes the global outputs as `.npy`.
Any exception is reported with the rank and ends the job with MPI_Abort: one of the
user's or the machine's as ``error: …``, a failure of the executor itself as
``internal: …`` (`is_internal`), which the launcher reports as an internal error.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cocoviz import numerics as nx
from cocoviz.exec import ops
from cocoviz.exec.layout import (
    alltoall_pack,
    alltoall_unpack,
    chunk_positions,
    chunk_range,
    chunked_slices,
    global_flat_index,
    global_shape,
    is_contiguous_chunk,
    join_global,
    join_grid,
    locate,
    rank_positions,
    rank_shape,
    split_grid,
    take_rank_part,
)
from cocoviz.exec.shard_pipeline import ShardPipeline
from cocoviz.ir.graph import ordered_items
from cocoviz.ir.nodes import (
    AXIS_REDUCTIONS,
    COLLECTIVES,
    PERMUTES,
    REDUCTIONS,
    ROUTING,
    Expr,
    Group,
    GroupKind,
    Op,
    Program,
    ReduceOp,
    Stage,
    fill_value,
)
from cocoviz.ir.transforms.overlap import leading_chunks
from cocoviz.ir.types import REPLICATED, DType, Size, TensorType, dp_view, shape_values

Array = npt.NDArray[Any]


def generate_rank_input(name: str, ty: TensorType, group: int, rank: int, seed: int) -> Array:
    """The part of generated input `name` that `rank` stores (shared generator, §2.5)."""
    dt = ty.dtype.value
    shape = rank_shape(ty, group)
    if ty.layout.is_replicated:
        return nx.generate_input(name, dt, ty.numel, seed).reshape(shape)
    if ty.layout.is_local:
        n = ty.numel
        return nx.generate_input(name, dt, group * n, seed, rank * n, n).reshape(shape)
    if is_contiguous_chunk(ty, group):
        lo, hi = chunk_range(ty, group, rank)
        return nx.generate_input(name, dt, ty.numel, seed, lo, hi - lo).reshape(shape)
    return nx.generate_input_at(name, dt, seed, global_flat_index(ty, group, rank)).reshape(shape)


@dataclass
class Event:
    stage: str
    stream: str  # "compute" or "comm"
    kind: str
    start: float
    end: float
    nbytes: int = 0
    chunk: int | None = None


@dataclass
class _Ctx:
    """`ops.RankContext` of this process; `extra` binds the arrays a stage of an overlapped
    group reads in one chunk."""

    values: dict[str, Array]
    rank_: int
    group_: int
    seed_: int
    comm: Any
    comm_group: int
    extra: dict[str, Array] = field(default_factory=dict)
    dp: int = 1
    """Ranks of the grid's dp axis (docs/language.md, rank grids), and this rank's index
    on it: `ops` reads them for values laid out over dp."""
    dp_rank: int = 0

    @property
    def rank(self) -> int:
        return self.rank_

    @property
    def group(self) -> int:
        return self.group_

    @property
    def seed(self) -> int:
        return self.seed_

    def lookup(self, name: str) -> Array:
        if name in self.extra:
            return self.extra[name]
        return self.values[name]

    def combine(self, e: Expr, partial: Array) -> Array:
        if self.group_ != self.comm_group:
            raise RuntimeError(
                f"a whole-tensor reduction ({e.op.value}) inside an overlapped group cannot "
                "be evaluated chunk by chunk"
            )
        parts = self.comm.allgather(np.asarray(partial))
        x = e.args[0]
        return ops.combine_ranks(parts, ops.partial_rop(e.op), ops.accumulation_dtype(x.type.dtype))


class Worker:
    def __init__(self, spec: dict[str, Any], program: Program, world: Any) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.spec = spec
        self.program = program
        self.world = world
        self.T = program.grid.tp
        self.P = program.grid.pp
        self.D = program.grid.dp
        self.wrank = world.Get_rank()
        # world rank = (pp·D + dp)·T + tp (docs/language.md, rank grids)
        self.pp, self.dp, self.tp = program.grid.coords(self.wrank)
        self.comm = world.Split(color=self.pp * self.D + self.dp, key=self.tp)
        """The tp group: the T ranks of this rank's pipeline stage and dp replica."""
        self.dp_comm = (
            world.Split(color=self.pp * self.T + self.tp, key=self.dp)
            if program.grid.has_dp
            else None
        )
        """The dp group: the D ranks with this rank's pp and tp index (a grid with dp)."""
        self.seed = int(spec.get("seed", 0))
        self.values: dict[str, Array] = {}
        self.buffers: dict[str, Array] = {}
        # temporaries recycled across stages and iterations; `stage_bufs` are the pooled
        # buffers holding this iteration's stage values, given back when the next begins
        self.pool = ops.BufferPool()
        self.stage_bufs: list[Array] = []
        self.items = ordered_items(program)
        # how each stage of a chunk pipeline reads its operands in chunk k, planned on the
        # first iteration (`ChunkPipeline.plan`)
        self.chunk_plans: dict[tuple[str, int], Any] = {}
        self.events: list[Event] = []
        self.t0 = 0.0

    # --- setup ------------------------------------------------------------------------
    def on_my_stage(self, ty: TensorType) -> bool:
        return ty.pstage is None or ty.pstage == self.pp

    def load_inputs(self) -> None:
        from cocoviz.exec.mpi_run import read_input

        files: dict[str, str] = self.spec.get("input_files") or {}
        for p in self.program.params:
            self.values[p.name] = ops.round_to(np.asarray(p.default), p.dtype)
        for i in self.program.inputs:
            if not self.on_my_stage(i.ty):
                continue
            if self.program.grid.has_dp:
                self.values[i.name] = self.grid_input(i.name, i.ty, files.get(i.name))
                continue
            if i.name in files:  # validated by the launcher; checked again as it is opened
                full = read_input(Path(files[i.name]), i.name, i.ty, self.T)
                if i.ty.dtype.value == "bf16":
                    full = nx.round_bf16(np.asarray(full))
                part = take_rank_part(full, i.ty, self.T, self.tp)
                self.values[i.name] = np.array(part).reshape(rank_shape(i.ty, self.T))
            else:
                self.values[i.name] = generate_rank_input(i.name, i.ty, self.T, self.tp, self.seed)

    def grid_input(self, name: str, ty: TensorType, file: str | None) -> Array:
        """This rank's part of an input on a grid with dp, as the reference makes it
        (`reference._grid_input`): a file holds the global form (`[D, …]` for a value
        local over dp)."""
        T, D = self.T, self.D
        if file is not None:
            from cocoviz.exec.mpi_run import read_input

            full = np.asarray(read_input(Path(file), name, ty, T, D))
            if ty.dtype.value == "bf16":
                full = nx.round_bf16(full)
            return split_grid(full, ty, T, D)[self.dp * T + self.tp]
        if ty.dp.is_local:
            # replica d's global value is elements [d·N, (d+1)·N) of the [D, …] stack
            shape = global_shape(ty, T)
            n = int(np.prod(shape, dtype=np.int64))
            dt = ty.dtype.value
            mine = nx.generate_input(name, dt, D * n, self.seed, self.dp * n, n).reshape(shape)
            return np.array(take_rank_part(mine, ty, T, self.tp)).reshape(rank_shape(ty, T))
        part = generate_rank_input(name, ty, T, self.tp, self.seed)
        if ty.dp.is_replicated:
            return part
        view = dp_view(ty, T)
        return np.array(take_rank_part(part, view, D, self.dp)).reshape(rank_shape(view, D))

    def ctx(self) -> _Ctx:
        return _Ctx(
            self.values, self.tp, self.T, self.seed, self.comm, self.T, dp=self.D, dp_rank=self.dp
        )

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def record(
        self,
        stage: str,
        stream: str,
        kind: str,
        start: float,
        nbytes: int = 0,
        chunk: int | None = None,
    ) -> None:
        self.events.append(Event(stage, stream, kind, start, self.now(), nbytes, chunk))

    # --- MPI reductions in the compute type --------------------------------------------
    def mpi_op(self, rop: ReduceOp) -> Any:
        M = self.MPI
        return {
            ReduceOp.SUM: M.SUM,
            ReduceOp.AVG: M.SUM,
            ReduceOp.PROD: M.PROD,
            ReduceOp.MAX: M.MAX,
            ReduceOp.MIN: M.MIN,
        }[rop]

    def finish(
        self, acc: Array, rop: ReduceOp, dtype: Any, group: int, name: str | None = None
    ) -> Array:
        """The reduced values `acc` (in the compute type, a buffer this rank may
        overwrite) as stored values of `dtype`; with `name`, rounded into that stage's
        persistent buffer."""
        if rop is ReduceOp.AVG:
            n = acc.dtype.type(group)
            if acc.dtype.kind == "f":
                np.divide(acc, n, out=acc)
            else:
                acc = ops.trunc_div(acc, np.asarray(n))
        store = ops.storage_dtype(dtype)
        if acc.dtype == store:
            return acc  # computed in the stored type already (f32, f64): nothing to round
        if name is not None and store.kind == "f" and acc.dtype.kind == "f" and store != acc.dtype:
            if dtype.value != "bf16":  # f16: one rounding cast, as `ops.round_to`
                out = self.buffer(name + "/stored", np.empty(0, store), acc.size)
                out = out.reshape(acc.shape)
                with np.errstate(over="ignore", invalid="ignore"):
                    np.copyto(out, acc, casting="unsafe")
                return out
        return ops.round_to(acc, dtype)

    def buffer(self, name: str, like: Array, size: int | None = None) -> Array:
        """A receive buffer for stage `name`, reused across iterations (fresh memory would
        be paid for in page faults on every timed iteration)."""
        n = like.size if size is None else size
        buf = self.buffers.get(name)
        if buf is None or buf.size != n or buf.dtype != like.dtype:
            buf = np.empty(n, dtype=like.dtype)
            self.buffers[name] = buf
        return buf

    def compute_buffer(self, x: Array, dtype: Any, name: str | None = None) -> Array:
        """`x` widened to the compute type of `dtype` (a contiguous array); with `name`,
        widened into that stage's persistent send buffer."""
        ct = ops.accumulation_dtype(dtype)
        if name is None or x.dtype == ct or x.ndim == 0:
            return np.ascontiguousarray(ops.to_compute(x, dtype))
        buf = self.buffer(name + "/send", np.empty(0, ct), x.size).reshape(x.shape)
        np.copyto(buf, x, casting="unsafe")  # widening: exact, as `astype`
        return buf

    # --- stages -----------------------------------------------------------------------
    def operand(self, x: Expr) -> Array:
        if x.op is Op.REF:
            assert x.name is not None
            return self.values[x.name]
        return ops.stage_value(x, self.ctx())

    def run_stage(self, s: Stage) -> None:
        e = s.expr
        if e.op is Op.SEND:
            self.run_send(s)
            return
        if not self.on_my_stage(s.ty):
            return
        start = self.now()
        if e.op in COLLECTIVES:
            out, nbytes = self.run_collective(s)
            self.values[s.name] = out
            self.record(s.name, "comm", e.op.value, start, nbytes)
            return
        value, base = ops.stage_value_pooled(e, self.ctx(), self.pool)
        self.values[s.name] = value
        if base is not None:
            self.stage_bufs.append(base)
        kind = "matmul" if e.op is Op.MATMUL else "compute"
        self.record(s.name, "compute", kind, start)

    def run_collective(self, s: Stage) -> tuple[Array, int]:
        e = s.expr
        (x,) = e.args
        xt, sty = x.type, s.ty
        dtype = xt.dtype
        G, comm, me = self.T, self.comm, self.tp
        data = self.operand(x)
        if e.tag == "dp":
            # over the dp group, on this rank's tp part (docs/language.md, rank grids)
            G, comm, me = self.D, self.dp_comm, self.dp
            xt, sty = dp_view(xt, self.T), dp_view(sty, self.T)
        elif sty.dp.is_sliced:
            # over tp of a value sliced over dp: allreduce, broadcast and reduce keep
            # the part's shape (inference refuses the others)
            shape = tuple(Size(str(n), n) for n in ops.stored_shape(s.ty, self.ctx()))
            sty = TensorType(sty.dtype, shape, REPLICATED, sty.pstage)
        if e.op is Op.ALLGATHER:
            send = np.ascontiguousarray(data).reshape(-1)
            recv = self.buffer(s.name, send, send.size * G)
            comm.Allgather(send, recv)
            if xt.layout.is_sliced and is_contiguous_chunk(xt, G):
                # rank r's elements are the r-th run of global flat indices: the
                # receive buffer in rank order is the global value (reused next iteration)
                return recv.reshape(shape_values(xt.shape)), send.nbytes * (G - 1)
            parts = [
                recv[r * send.size : (r + 1) * send.size].reshape(data.shape) for r in range(G)
            ]
            out = np.ascontiguousarray(join_global(parts, xt, G)).reshape(shape_values(xt.shape))
            return out, send.nbytes * (G - 1)
        if e.op is Op.ALLTOALL:
            send = alltoall_pack(data.reshape(rank_shape(xt, G)), int(e.value or 0), G)
            recv = self.buffer(s.name, send)
            comm.Alltoall(send, recv)
            out = alltoall_unpack(recv, rank_shape(sty, G), int(e.tag or 0), G)
            return out, send.nbytes * (G - 1) // G
        if e.op is Op.BROADCAST:
            buf = np.array(data, copy=True)
            comm.Bcast(buf, root=int(e.value or 0))
            return buf, buf.nbytes
        assert e.rop is not None
        c = self.compute_buffer(data, dtype, s.name)
        op = self.mpi_op(e.rop)
        if e.op is Op.ALLREDUCE:
            acc = self.buffer(s.name, c).reshape(c.shape)
            comm.Allreduce(c, acc, op=op)
            out = self.finish(acc, e.rop, dtype, G, s.name)
            return out.reshape(rank_shape(sty, G)), 2 * c.nbytes * (G - 1) // G
        if e.op is Op.REDUCESCATTER:
            flat = c.reshape(-1)
            acc = self.buffer(s.name, flat, flat.size // G)
            comm.Reduce_scatter_block(flat, acc, op=op)
            out = self.finish(acc, e.rop, dtype, G, s.name)
            return out.reshape(rank_shape(sty, G)), c.nbytes * (G - 1) // G
        assert e.op is Op.REDUCE
        root = int(e.value or 0)
        acc = self.buffer(s.name, c).reshape(c.shape)
        comm.Reduce(c, acc if me == root else None, op=op, root=root)
        if me == root:
            out = self.finish(acc, e.rop, dtype, G, s.name)
            return out.reshape(rank_shape(sty, G)), c.nbytes
        return np.zeros(rank_shape(sty, G), dtype=ops.storage_dtype(dtype)), c.nbytes

    def run_send(self, s: Stage) -> None:
        (x,) = s.expr.args
        src_stage = x.type.pstage if x.type.pstage is not None else 0
        start = self.now()
        stride = self.T * self.D  # the same dp and tp index on the next pipeline stage
        if self.pp == src_stage:
            data = np.ascontiguousarray(self.operand(x))
            self.world.Send(data, dest=self.wrank + stride, tag=1)
            self.record(s.name, "comm", "send", start, data.nbytes)
        elif self.pp == src_stage + 1:
            shape = ops.stored_shape(s.ty, self.ctx())
            buf = np.empty(shape, dtype=ops.storage_dtype(s.ty.dtype))
            self.world.Recv(buf, source=self.wrank - stride, tag=1)
            self.values[s.name] = buf
            self.record(s.name, "comm", "recv", start, buf.nbytes)

    # --- overlapped groups ------------------------------------------------------------
    def run_overlapped(self, g: Group) -> None:
        if g.by_shard:
            ShardPipeline(self, g).run()
        elif leading_chunks(self.program, tuple(g.stages())):
            LeadingChunkPipeline(self, g).run()
        else:
            ChunkPipeline(self, g).run()

    def run(self, iters: int = 1, warmup: int = 0) -> None:
        """Run the program `warmup + iters` times from the same inputs, keeping every
        timed iteration's makespan (`makespans`) and events (`iteration_events`)."""
        self.makespans: list[float] = []
        self.iteration_events: list[list[Event]] = []
        for it in range(warmup + iters):
            self.events = []
            self.run_once()
            if it >= warmup:
                self.makespans.append(self.makespan)
                self.iteration_events.append(self.events)

    def reported_iteration(self) -> int:
        """The timed iteration the summary reports, the same on every rank: the one whose
        makespan (slowest rank's) is the median (`median_iteration`). Collective."""
        return median_iteration(self.world.allgather(self.makespans))

    def run_once(self) -> None:
        for buf in self.stage_bufs:  # last iteration's stage values: all recomputed
            self.pool.give(buf)
        self.stage_bufs = []
        self.world.Barrier()
        self.t0 = time.perf_counter()
        for item in self.items:
            if isinstance(item, Group) and item.kind is GroupKind.OVERLAPPED:
                self.run_overlapped(item)
            elif isinstance(item, Group):
                for name in item.stages():
                    self.run_stage(self.program.stage(name))
            else:
                self.run_stage(self.program.stage(item))
        self.world.Barrier()
        self.makespan = self.now()

    # --- results ----------------------------------------------------------------------
    def gather_globals(self, names: list[str]) -> dict[str, Array]:
        """Global values of `names` on world rank 0 (replicated: the first rank of the
        value's pipeline stage; sliced: joined; local: stacked)."""
        out: dict[str, Array] = {}
        for name in names:
            ty = self.type_of(name)
            owner_stage = ty.pstage if ty.pstage is not None else 0
            mine = self.values.get(name) if self.pp == owner_stage else None
            parts = self.world.gather(mine if mine is not None else None, root=0)
            if self.wrank == 0:
                n = self.T * self.D  # a pipeline stage's ranks, dp·T + tp
                stage_parts = parts[owner_stage * n : (owner_stage + 1) * n]
                if self.program.grid.has_dp:
                    out[name] = np.asarray(join_grid(stage_parts, ty, self.T, self.D))
                else:
                    out[name] = np.asarray(join_global(stage_parts, ty, self.T))
        return out

    def type_of(self, name: str) -> TensorType:
        return self.program.type_of(name)


def median_iteration(makespans: list[list[float]]) -> int:
    """Of iterations timed on every rank (``makespans[rank][i]``), the index whose
    makespan, the slowest rank's, is the median (the upper one of an even count, as
    ``sorted(x)[len(x) // 2]``; the earliest of equal ones)."""
    per_iter = [max(col) for col in zip(*makespans, strict=True)]
    if not per_iter:
        raise ValueError("no timed iteration")
    order = sorted(range(len(per_iter)), key=lambda i: (per_iter[i], i))
    return order[len(order) // 2]


def iteration_report(
    makespans: list[float], iteration_events: list[list[Event]], it: int
) -> dict[str, Any]:
    """What a rank reports of its timed iterations: iteration `it`'s makespan and events
    (every timed makespan too); `mpi_run.measured_iteration` reads it."""
    return {
        "iteration": it,
        "makespan": makespans[it],
        "makespans": makespans,
        "events": [dataclasses.asdict(ev) for ev in iteration_events[it]],
    }


class _Pipeline(abc.ABC):
    """The issue loop of an overlapped group: K chunks through the group's stages.

    At tick t chunk k runs step t − k, chunks in increasing order; every rank issues the
    same collectives in the same order (chunk-major), so non-blocking collectives match.
    A step that needs a previous step's collective waits for it first; the next chunk's
    matmul meanwhile overlaps it."""

    def __init__(self, w: Worker, g: Group) -> None:
        self.w = w
        assert g.chunks is not None
        self.K = g.chunks
        members = set(g.stages())
        self.stages = [s for s in w.program.stages if s.name in members]
        self.names = {s.name for s in self.stages}
        self.pieces: list[dict[str, Array]] = [{} for _ in range(self.K)]
        self.pending: list[dict[str, tuple[Any, Any, float]]] = [{} for _ in range(self.K)]

    def run(self) -> None:
        n = len(self.stages)
        for t in range(self.K + n - 1):
            for k in range(self.K):
                if 0 <= t - k < n:
                    self.step(k, self.stages[t - k])
        for k in range(self.K):
            for name in list(self.pending[k]):
                self.complete(k, name)
        self.join()

    @abc.abstractmethod
    def step(self, k: int, s: Stage) -> None:
        """Run stage `s` for chunk `k` (each pipeline lays its chunks out its own way)."""

    @abc.abstractmethod
    def join(self) -> None:
        """Put the values whole on a rank back together from their chunks."""

    def value(self, k: int, name: str) -> Array:
        if name in self.pending[k]:
            self.complete(k, name)
        return self.pieces[k][name]

    def complete(self, k: int, name: str) -> None:
        req, finish, start = self.pending[k].pop(name)
        req.Wait()
        self.pieces[k][name] = finish()
        self.w.record(name, "comm", self.w.program.stage(name).expr.op.value, start, chunk=k)


@dataclass(frozen=True)
class _Read:
    """A value read in chunk k: the elements `index` of its flat storage on this rank (of
    its chunk piece, for a member of the group; None: all of it), shaped `shape`."""

    source: str
    member: bool
    index: slice | npt.NDArray[np.int64] | None
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Dropout:
    """A dropout of a chunk expression, drawn at the generator indices `where`."""

    key: str
    arg: Expr
    tag: str
    p: float
    dtype: DType
    where: npt.NDArray[np.int64]


@dataclass(frozen=True)
class _ChunkExpr:
    """A stage's expression over one chunk: every tensor it reads is a `_Read` (bound to
    its key in the context), every dropout a `_Dropout`; what is left is elementwise and
    row-wise arithmetic on arrays of the chunk's shape, all typed replicated, so that
    `ops` evaluates it exactly as the reference evaluates each element."""

    expr: Expr
    reads: tuple[tuple[str, _Read], ...]
    dropouts: tuple[_Dropout, ...]


@dataclass(frozen=True)
class _CollPlan:
    """A collective or send of chunk k: its operand, the elements of the chunk it
    receives (`count`) and where each element of the result's piece is among them
    (`order`, as `locate`)."""

    operand: _Read
    count: int
    order: slice | npt.NDArray[np.int64] | None = None


_NOT_IN_CHUNKS = frozenset(
    {Op.MATMUL, Op.RESHAPE, Op.IOTA, *PERMUTES, *ROUTING, *AXIS_REDUCTIONS, *REDUCTIONS, *COLLECTIVES}
)
"""Operations a chunk expression cannot hold: a matmul is a stage of its own, the rest
the `overlap` step refuses (docs/schedules.md)."""


class ChunkPipeline(_Pipeline):
    """An overlapped group that chunks rows (docs/schedules.md, overlap) as a K-chunk
    software pipeline of non-blocking collectives.

    Chunk k of every value on a rank is laid out as the emitter lays it out
    (`layout.chunk_positions`): the k-th 1/K of the rank's storage, except for values
    sliced flat inside the group, of which rank r holds global elements
    ``k·n/K + r·n/(K·G) + i``. Every read of a stage in chunk k is planned once from those
    positions (`_Read`: a view, a slice or a gather of the piece or of the stored value;
    a replicated operand read at global positions, a broadcast operand, `slice(x)`), and
    every dropout is drawn at the global positions of the chunk's elements; the plans are
    kept across iterations. Values not sliced flat are joined from their chunks at the
    end; flat slices exist only as chunk pieces (the transformation forbids their use
    outside the group).
    """

    def __init__(self, w: Worker, g: Group) -> None:
        super().__init__(w, g)
        self.G = w.T

    # --- positions and plans ----------------------------------------------------------
    def positions(self, ty: TensorType, k: int) -> npt.NDArray[np.int64]:
        """The positions of chunk k of a value of type `ty` on this rank."""
        return chunk_positions(ty, self.G, self.w.tp, self.K, k)

    def plan(self, k: int, s: Stage, make: Any) -> Any:
        key = (s.name, k)
        plans = self.w.chunk_plans
        if key not in plans:
            plans[key] = make()
        return plans[key]

    def read_plan(
        self,
        k: int,
        name: str,
        ty: TensorType,
        wanted: npt.NDArray[np.int64],
        shape: tuple[int, ...],
    ) -> _Read:
        """How chunk k reads the elements of `name` at positions `wanted`."""
        member = name in self.names
        held = self.positions(ty, k) if member else rank_positions(ty, self.G, self.w.tp)
        try:
            index = locate(held, wanted)
        except LookupError as err:
            raise RuntimeError(
                f"chunk {k} reads elements of '{name}' ({ty}) that rank {self.w.tp} does not "
                f"hold: {err}"
            ) from None
        return _Read(name, member, index, shape)

    def operand_plan(self, k: int, s: Stage, x: Expr) -> _Read:
        """Chunk k of the named operand of a matmul, a collective or a send."""
        if x.op is not Op.REF or x.name is None:
            raise RuntimeError(f"'{s.name}' in an overlapped group must read a named value")
        pos = self.positions(x.type, k)
        return self.read_plan(k, x.name, x.type, pos, (pos.size,))

    def read(self, k: int, r: _Read) -> Array:
        src = self.value(k, r.source) if r.member else self.w.values[r.source]
        flat = src.reshape(-1)
        part = flat if r.index is None else flat[r.index]
        return part.reshape(r.shape)

    # --- steps --------------------------------------------------------------------------
    def join(self) -> None:
        """Values not sliced flat, joined from their chunks (flat slices stay pieces)."""
        for s in self.stages:
            if chunked_slices(s.ty) or not all(s.name in p for p in self.pieces):
                continue
            blocks = [p[s.name] for p in self.pieces]
            self.w.values[s.name] = np.concatenate(blocks).reshape(rank_shape(s.ty, self.G))

    def step(self, k: int, s: Stage) -> None:
        w = self.w
        e = s.expr
        if e.op is Op.SEND:
            self.send(k, s)
            return
        if not w.on_my_stage(s.ty):
            return
        if e.op in COLLECTIVES:
            self.collective(k, s)
            return
        if e.op is Op.MATMUL:
            self.matmul(k, s)
            return
        plan: _ChunkExpr = self.plan(k, s, lambda: _ChunkExprBuilder(self, k, s).build())
        # inputs first: waiting for a predecessor's collective is not this stage's time
        extra = {key: self.read(k, r) for key, r in plan.reads}
        start = w.now()
        ctx = _Ctx(w.values, w.tp, self.G, w.seed, w.comm, self.G, extra)
        for d in plan.dropouts:
            x = ops.evaluate(d.arg, ctx)
            keep = nx.dropout_keep_at(d.tag, w.seed, d.p, d.where).reshape(x.shape)
            extra[d.key] = ops.to_compute(nx.dropout_apply(x, keep, d.p, d.dtype), d.dtype)
        v = ops.stage_value(plan.expr, ctx)
        self.pieces[k][s.name] = np.ascontiguousarray(v).reshape(-1)
        w.record(s.name, "compute", "compute", start, chunk=k)

    def matmul(self, k: int, s: Stage) -> None:
        """Chunk k of the left operand's rows (its k-th 1/K) times the whole right operand."""
        w = self.w
        a, b = s.expr.args
        if len(b.type.shape) > 2 or any(n in self.names for n in b.refs()):
            raise RuntimeError(
                f"matmul '{s.name}' cannot run chunk by chunk (a batched matmul, or its right "
                "operand made in the group)"
            )
        plan: _Read = self.plan(k, s, lambda: self.operand_plan(k, s, a))
        a_part = self.read(k, plan)
        start = w.now()
        a_arr = ops.to_compute(a_part, a.type.dtype)
        b_arr = ops.to_compute(w.operand(b), b.type.dtype)
        acc = np.float64 if s.ty.dtype.value == "f64" else np.float32
        rows = a_arr.reshape(-1, b_arr.shape[0]).astype(acc, copy=False)
        out = rows @ b_arr.astype(acc, copy=False)
        self.pieces[k][s.name] = ops.round_to(out, s.ty.dtype).reshape(-1)
        w.record(s.name, "compute", "matmul", start, chunk=k)

    def send(self, k: int, s: Stage) -> None:
        w = self.w
        (x,) = s.expr.args
        src_stage = x.type.pstage if x.type.pstage is not None else 0
        if w.pp == src_stage:
            plan: _Read = self.plan(k, s, lambda: self.operand_plan(k, s, x))
            data = np.ascontiguousarray(self.read(k, plan))
            start = w.now()
            req = w.world.Isend(data, dest=w.wrank + w.T, tag=100 + k)
            self.pending[k][s.name] = (req, lambda d=data: d, start)
        elif w.pp == src_stage + 1:
            n = self.positions(s.ty, k).size
            buf = np.empty(n, dtype=ops.storage_dtype(s.ty.dtype))
            start = w.now()
            req = w.world.Irecv(buf, source=w.wrank - w.T, tag=100 + k)
            self.pending[k][s.name] = (req, lambda b=buf: b, start)

    def collective_plan(self, k: int, s: Stage) -> _CollPlan:
        """The operand of collective `s` in chunk k, and where the elements it receives
        go in the result's piece."""
        e = s.expr
        (src,) = e.args
        G, tp = self.G, self.w.tp
        operand = self.operand_plan(k, s, src)
        sent = self.positions(src.type, k)
        if e.op is Op.ALLGATHER:  # every rank's piece, in rank order
            got = np.concatenate([chunk_positions(src.type, G, q, self.K, k) for q in range(G)])
        elif e.op is Op.REDUCESCATTER:  # the rank's 1/G of the reduced chunk
            c = sent.size // G
            got = sent[tp * c : (tp + 1) * c]
        elif e.op is Op.ALLREDUCE:
            got = sent
        else:
            raise RuntimeError(f"{e.op.value} cannot run inside an overlapped group")
        try:
            order = locate(got, self.positions(s.ty, k))
        except LookupError as err:
            raise RuntimeError(f"'{s.name}': chunk {k} does not receive its piece: {err}") from None
        return _CollPlan(operand, got.size, order)

    def collective(self, k: int, s: Stage) -> None:
        w = self.w
        e = s.expr
        (src,) = e.args
        G = self.G
        plan: _CollPlan = self.plan(k, s, lambda: self.collective_plan(k, s))
        data = self.read(k, plan.operand)
        order = plan.order
        start = w.now()
        if e.op is Op.ALLGATHER:
            send = np.ascontiguousarray(data).reshape(-1)
            recv = np.empty(plan.count, dtype=send.dtype)
            req = w.comm.Iallgather(send, recv)
            self.pending[k][s.name] = (
                req,
                lambda r=recv: r if order is None else r[order],
                start,
            )
            return
        assert e.rop is not None
        dtype = src.type.dtype
        rop = e.rop
        c = w.compute_buffer(data, dtype).reshape(-1)
        acc = np.empty(plan.count, dtype=c.dtype)
        if e.op is Op.REDUCESCATTER:
            req = w.comm.Ireduce_scatter_block(c, acc, op=w.mpi_op(rop))
        else:
            req = w.comm.Iallreduce(c, acc, op=w.mpi_op(rop))

        def finish(a: Array = acc) -> Array:
            out = w.finish(a, rop, dtype, G).reshape(-1)
            return out if order is None else out[order]

        self.pending[k][s.name] = (req, finish, start)


class _ChunkExprBuilder:
    """Builds the `_ChunkExpr` of a stage in chunk k: each node is evaluated at the
    positions of the chunk's elements in its own shape (a broadcast operand at the
    positions each element reads, as `ops.operand_flat_index`; `slice(x)` at its own)."""

    def __init__(self, pipe: ChunkPipeline, k: int, s: Stage) -> None:
        self.pipe = pipe
        self.k = k
        self.s = s
        self.reads: list[tuple[str, _Read]] = []
        self.dropouts: list[_Dropout] = []
        ty = s.ty
        if ty.is_scalar:
            raise RuntimeError(
                f"'{s.name}' is a scalar: a whole-tensor reduction cannot run chunk by chunk"
            )
        self.pos = pipe.positions(ty, k)
        shape = shape_values(ty.shape)
        row = shape[-1] if chunked_slices(ty) else rank_shape(ty, pipe.G)[-1]
        c = self.pos.size
        self.shape = (c // row, row) if row and c % row == 0 else (c,)
        self.sizes = tuple(Size(str(n), n) for n in self.shape)

    def build(self) -> _ChunkExpr:
        expr = self.conv(self.s.expr, self.pos)
        return _ChunkExpr(expr, tuple(self.reads), tuple(self.dropouts))

    def piece(self, ty: TensorType) -> TensorType:
        return TensorType(ty.dtype, self.sizes, REPLICATED, ty.pstage)

    def conv(self, e: Expr, pos: npt.NDArray[np.int64]) -> Expr:
        ty = e.type
        if ty.is_scalar:
            made = [n for n in e.refs() if n in self.pipe.names]
            if made:
                raise RuntimeError(
                    f"'{self.s.name}' reduces '{made[0]}' to a scalar inside an overlapped "
                    "group; a whole-tensor reduction cannot run chunk by chunk"
                )
            return e  # a parameter, a literal or a scalar made outside: read whole
        op = e.op
        if op is Op.REF:
            assert e.name is not None
            key = f"{e.name}#{len(self.reads)}"  # '#' is in no name of a program
            self.reads.append((key, self.pipe.read_plan(self.k, e.name, ty, pos, self.shape)))
            return Expr(Op.REF, name=key, ty=self.piece(ty))
        if op is Op.SLICE:  # the same shape: each element at its own position
            return self.conv(e.args[0], pos)
        if op in (Op.ZEROS, Op.ONES, Op.FULL):  # the same value at every position
            return Expr(Op.CONST, value=fill_value(e), ty=TensorType(ty.dtype, (), REPLICATED, None))
        if op is Op.DROPOUT:
            (x,) = e.args
            assert e.tag is not None and e.value is not None
            where = pos + np.int64(self.pipe.w.tp * ty.numel) if ty.layout.is_local else pos
            key = f"dropout#{len(self.dropouts)}"
            arg = self.conv(x, self.at(e, x, pos))
            self.dropouts.append(_Dropout(key, arg, e.tag, float(e.value), ty.dtype, where))
            return Expr(Op.REF, name=key, ty=self.piece(ty))
        if op in _NOT_IN_CHUNKS:
            raise RuntimeError(f"{op.value} in '{self.s.name}' cannot run chunk by chunk")
        if op is Op.UPDATE:  # the target is not read
            target, body = e.args
            args: tuple[Expr, ...] = (target, self.conv(body, self.at(e, body, pos)))
        else:
            args = tuple(self.conv(a, self.at(e, a, pos)) for a in e.args)
        return dataclasses.replace(e, args=args, ty=self.piece(ty))

    @staticmethod
    def at(e: Expr, a: Expr, pos: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The positions operand `a` of node `e` is read at, for `e`'s elements at `pos`."""
        shape, a_shape = shape_values(e.type.shape), shape_values(a.type.shape)
        if a.type.is_scalar or a_shape == shape:
            return pos
        return ops.operand_flat_index(pos, shape, a_shape)


class LeadingChunkPipeline(_Pipeline):
    """A group that chunks dimension 0 (one with an alltoall; docs/schedules.md,
    overlap): chunk k of every value in it is block k of the rank's array along dimension
    0, each sliced value keeping its layout. Each stage runs on its chunk as the same
    expression with dimension 0 cut to 1/K (`Ialltoall` for an alltoall), in the same
    pipelined order; the chunks are joined at the end, so the values may leave the
    group."""

    def __init__(self, w: Worker, g: Group) -> None:
        super().__init__(w, g)
        first = self.stages[0].ty
        self.lead = first.shape[0].value
        self.rank_of_values = {len(s.ty.shape) for s in self.stages}
        self.params = {q.name for q in w.program.params}

    def join(self) -> None:
        """Every value joined from its chunks along dimension 0."""
        for s in self.stages:
            if all(s.name in p for p in self.pieces):
                blocks = [p[s.name] for p in self.pieces]
                self.w.values[s.name] = np.concatenate(blocks, axis=0)

    def chunked(self, ty: TensorType | None) -> bool:
        """Whether a value of type `ty` is cut along dimension 0 in this group."""
        return (
            ty is not None
            and len(ty.shape) in self.rank_of_values
            and len(ty.shape) >= 2
            and ty.shape[0].value == self.lead
        )

    def chunk_type(self, ty: TensorType) -> TensorType:
        s0 = ty.shape[0]
        first = Size(f"({s0.text})/{self.K}", s0.value // self.K)
        return dataclasses.replace(ty, shape=(first, *ty.shape[1:]))

    def chunk_expr(self, e: Expr) -> Expr:
        args = tuple(self.chunk_expr(a) for a in e.args)
        ty = self.chunk_type(e.ty) if e.ty is not None and self.chunked(e.ty) else e.ty
        return dataclasses.replace(e, args=args, ty=ty)

    def block(self, k: int, name: str) -> Array:
        """Chunk k of a value made outside the group: block k of dimension 0."""
        ty = self.w.type_of(name)
        whole = self.w.values[name].reshape(rank_shape(ty, self.w.T))
        return np.split(whole, self.K, axis=0)[k]

    def input(self, k: int, x: Expr) -> Array:
        if x.op is Op.REF and x.name in self.names:
            return self.value(k, x.name)
        if x.op is Op.REF and x.name is not None:
            return self.block(k, x.name) if self.chunked(x.type) else self.w.values[x.name]
        raise RuntimeError("an overlapped stage must read named values")

    def step(self, k: int, s: Stage) -> None:
        w = self.w
        e = s.expr
        if e.op is Op.ALLTOALL:
            self.collective(k, s)
            return
        extra = {
            r.name: self.input(k, r)
            for r in e.walk()
            if r.op is Op.REF and r.name is not None and r.name not in self.params
        }
        ctx = _Ctx(w.values, w.tp, w.T, w.seed, w.comm, w.T, extra)
        start = w.now()
        self.pieces[k][s.name] = ops.stage_value(self.chunk_expr(e), ctx)
        w.record(s.name, "compute", "matmul" if e.op is Op.MATMUL else "compute", start, chunk=k)

    def collective(self, k: int, s: Stage) -> None:
        w = self.w
        e = s.expr
        (src,) = e.args
        G = w.T
        part = self.input(k, src)
        start = w.now()
        send = alltoall_pack(part, int(e.value or 0), G)
        recv = np.empty_like(send)
        req = w.comm.Ialltoall(send, recv)
        shape = rank_shape(self.chunk_type(s.ty), G)
        frm = int(e.tag or 0)
        self.pending[k][s.name] = (
            req,
            lambda r=recv, b=send: alltoall_unpack(r, shape, frm, G),
            start,
        )


def _status(job: Path, rank: int, text: str) -> None:
    (job / f"status.{rank}").write_text(text)


def is_internal(err: BaseException) -> bool:
    """Whether an exception inside a worker is a failure of the executor itself: anything
    but a user's error (`CocovizError`), the machine running out of memory or failing a
    file operation (`MemoryError`, `OSError`) and the process being stopped."""
    from cocoviz.errors import CocovizError

    stopped = (KeyboardInterrupt, SystemExit)
    return not isinstance(err, (CocovizError, MemoryError, OSError, *stopped))


def describe(err: BaseException) -> str:
    """``Type: message (file:line in function)``, the place where it was raised."""
    msg = f"{type(err).__name__}: {err}"
    tb = traceback.extract_tb(err.__traceback__)
    if tb:
        last = tb[-1]
        msg += f" ({Path(last.filename).name}:{last.lineno} in {last.name})"
    return msg


def main(argv: list[str]) -> int:
    from mpi4py import MPI

    from cocoviz.errors import CocovizError, InternalError
    from cocoviz.exec.mpi_run import INTERNAL_STATUS
    from cocoviz.ir.lower import load_program

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    spec = json.loads(Path(argv[0]).read_text())
    job = Path(spec["dir"])
    _status(job, rank, f"started pid={os.getpid()}")
    try:
        try:
            program = load_program(spec["program"], spec.get("path", "<mpi>"))
        except CocovizError as err:  # the launcher printed it: not the user's to fix
            raise InternalError(f"the scheduled program does not parse back: {err}") from err
        w = Worker(spec, program, world)
        w.load_inputs()
        iters = int(spec.get("iters", 1))
        w.run(iters, warmup=1 if iters > 1 else 0)
        it = w.reported_iteration()
        names = list(spec["collect"])
        values = w.gather_globals(names)
        if rank == 0:
            for name, v in values.items():
                ty = program.type_of(name)
                nx.save_npy(job / "out" / f"{name}.npy", v, ty.dtype.value)
        result = {
            "rank": rank,
            "pp": w.pp,
            "tp": w.tp,
            **iteration_report(w.makespans, w.iteration_events, it),
        }
        (job / f"result.{rank}.json").write_text(json.dumps(result))
        _status(job, rank, "done")
        return 0
    except BaseException as err:  # noqa: BLE001 - report, then end the whole job
        internal = is_internal(err)
        msg = describe(err) if internal else f"{type(err).__name__}: {err}"
        try:
            _status(job, rank, (INTERNAL_STATUS if internal else "error: ") + msg)
            print(f"cocoviz: rank {rank}: {msg}", file=sys.stderr, flush=True)
            if internal:
                traceback.print_exc()
                sys.stderr.flush()
        finally:
            world.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
