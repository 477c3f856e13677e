"""A shard-decomposed group (`decompose`, docs/schedules.md) on MPI: G steps, each a
non-blocking exchange with the ring neighbours (MPI Isend/Irecv) around one GEMM of 1/G
of the work, in the geometry every backend reads (`cocoviz.ir.shards.shard_plan`).

- gather: the allgather's operand parts travel around the ring into a staging area of G
  slots (rank-major, as an allgather's receive buffer); at step s the GEMM of shard
  `shard_at(r, s)` runs while the next shard arrives. The staging area becomes the
  gathered value, which other stages may read.
- scatter: at step s the GEMM of block `shard_at(r, s)` of the matmul's result is rounded
  to the result's dtype (the value the matmul would store), widened, combined with the
  accumulator received from the previous rank, and sent on; after the last step it is
  this rank's part of the reducescatter. Stages after the reducescatter in the group (a
  fused group's computation and allgathers) then run as usual.

Products accumulate in f32 (f64 for f64) and are rounded once, as `ops.matmul`; the
reduction runs in ring order (an f16/bf16 accumulator rounded at each hop, as the emitted
code sends it), so a scatter agrees with the reference within the dtype's
tolerance rather than bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from cocoviz.exec import ops
from cocoviz.exec.layout import is_contiguous_chunk, join_global, rank_shape
from cocoviz.ir.nodes import Group, Program, ReduceOp
from cocoviz.ir.shards import Gemm, shard_plan
from cocoviz.ir.types import DType, shape_values

Array = npt.NDArray[Any]

_COMBINE = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,  # divided by G when finished, as the MPI reducescatter
    ReduceOp.PROD: np.multiply,
    ReduceOp.MAX: np.maximum,
    ReduceOp.MIN: np.minimum,
}


def _acc_dtype(dtype: DType) -> type[np.floating[Any]]:
    return np.float64 if dtype is DType.F64 else np.float32


def _matrix(flat: Array, off: int, rows: int, cols: int, ld: int) -> Array:
    """Rows × cols of `flat` from element `off`, rows `ld` elements apart (a view)."""
    isz = flat.itemsize
    return as_strided(flat[off:], shape=(rows, cols), strides=(ld * isz, isz), writeable=True)


def run_gemm(g: Gemm, a: Array, b: Array, c: Array, first: bool) -> None:
    """`c (+)= a · b` on the flat arrays `a`, `b`, `c` in the geometry of `g`; a rank's
    `first` step writes even where the GEMM accumulates."""
    for i in range(g.batch):
        av = _matrix(a, g.a_off + i * g.a_stride, g.m, g.k, g.lda)
        bv = _matrix(b, g.b_off + i * g.b_stride, g.k, g.n, g.ldb)
        cv = _matrix(c, g.c_off + i * g.c_stride, g.m, g.n, g.ldc)
        if g.accumulate and not first:
            cv += av @ bv
        else:
            np.matmul(av, bv, out=cv)


class ShardPipeline:
    """One decomposed group on this rank (see the module docstring). `w` is the MPI
    worker (`cocoviz.exec.mpi_worker.Worker`): its values, communicator and buffers."""

    def __init__(self, w: Any, g: Group) -> None:
        self.w = w
        program: Program = w.program
        self.plan = shard_plan(program, g)
        members = set(g.stages())
        self.stages = [s for s in program.stages if s.name in members]
        self.coll = program.stage(self.plan.collective)
        self.mm = program.stage(self.plan.matmul)

    def run(self) -> None:
        if self.plan.kind == "gather":
            self.gather()
        else:
            self.scatter()
        done = {self.plan.collective, self.plan.matmul}
        for s in self.stages:
            if s.name not in done:
                self.w.run_stage(s)

    def _bytes(self, a: Array) -> list[Any]:
        return [a.reshape(-1).view(np.uint8), self.w.MPI.BYTE]

    def gather(self) -> None:
        w, plan, ag, mm = self.w, self.plan, self.coll, self.mm
        G, r, comm = w.T, w.tp, w.comm
        xt = ag.expr.args[0].type
        part = np.ascontiguousarray(w.operand(ag.expr.args[0])).reshape(-1)
        n = part.size
        staging = w.buffer(ag.name, part, n * G)
        staging[r * n : (r + 1) * n] = part
        acc = _acc_dtype(mm.ty.dtype)
        other = mm.expr.args[1 - plan.operand]
        fixed = np.ascontiguousarray(w.operand(other)).astype(acc, copy=False).reshape(-1)
        out = np.zeros(int(np.prod(rank_shape(mm.ty, G))), dtype=acc)
        for s in range(G):
            c = plan.shard_at(r, s)
            reqs = []
            if s < G - 1:
                nxt = plan.shard_at(r, s + 1)
                reqs = [
                    comm.Isend(
                        self._bytes(staging[c * n : (c + 1) * n]), dest=plan.send_to(r), tag=s
                    ),
                    comm.Irecv(
                        self._bytes(staging[nxt * n : (nxt + 1) * n]),
                        source=plan.recv_from(r),
                        tag=s,
                    ),
                ]
            t = w.now()
            shard = staging[c * n : (c + 1) * n].astype(acc)
            if plan.operand == 0:
                run_gemm(plan.gemms[c], shard, fixed, out, s == 0)
            else:
                run_gemm(plan.gemms[c], fixed, shard, out, s == 0)
            w.record(mm.name, "compute", "matmul", t, chunk=s)
            if reqs:
                t = w.now()
                w.MPI.Request.Waitall(reqs)
                w.record(ag.name, "comm", "sendrecv", t, part.nbytes, chunk=s)
        if xt.layout.is_sliced and is_contiguous_chunk(xt, G):
            gathered = staging.reshape(shape_values(xt.shape))
        else:
            shape = rank_shape(xt, G)
            parts = [staging[c * n : (c + 1) * n].reshape(shape) for c in range(G)]
            gathered = np.ascontiguousarray(join_global(parts, xt, G))
        w.values[ag.name] = gathered
        w.values[mm.name] = ops.round_to(out, mm.ty.dtype).reshape(rank_shape(mm.ty, G))

    def scatter(self) -> None:
        w, plan, rs, mm = self.w, self.plan, self.coll, self.mm
        G, r, comm = w.T, w.tp, w.comm
        assert rs.expr.rop is not None
        acc = _acc_dtype(mm.ty.dtype)
        a_e, b_e = mm.expr.args
        a = np.ascontiguousarray(w.operand(a_e)).astype(acc, copy=False).reshape(-1)
        b = np.ascontiguousarray(w.operand(b_e)).astype(acc, copy=False).reshape(-1)
        n = plan.shard_numel
        dtype = rs.expr.args[0].type.dtype
        ct = ops.accumulation_dtype(dtype)
        half = dtype.is_half
        combine = _COMBINE[rs.expr.rop]
        block = np.empty(n, dtype=acc)
        sending = [np.empty(n, dtype=ct), np.empty(n, dtype=ct)]  # double-buffered
        incoming = np.empty(n, dtype=ct)
        send_req = None
        total = None
        for s in range(G):
            c = plan.shard_at(r, s)
            recv_req = None
            if s > 0:
                recv_req = comm.Irecv(self._bytes(incoming), source=plan.recv_from(r), tag=s)
            t = w.now()
            run_gemm(plan.gemms[c], a, b, block, True)
            w.record(mm.name, "compute", "matmul", t, chunk=s)
            # the value the matmul stores, as the reducescatter would read it
            value = ops.to_compute(ops.round_to(block, mm.ty.dtype), mm.ty.dtype)
            buf = sending[s % 2]  # step s − 2's send from it was waited for at step s − 1
            np.copyto(buf, value, casting="unsafe")
            if recv_req is not None:
                t = w.now()
                recv_req.Wait()
                w.record(rs.name, "comm", "sendrecv", t, incoming.nbytes, chunk=s)
                combine(buf, incoming, out=buf)
                if half and s < G - 1:  # the accumulator travels rounded, as emitted code's
                    np.copyto(buf, ops.to_compute(ops.round_to(buf, dtype), dtype))
            if send_req is not None:
                send_req.Wait()
            if s < G - 1:
                send_req = comm.Isend(self._bytes(buf), dest=plan.send_to(r), tag=s + 1)
            else:
                send_req = None
                total = buf
        assert total is not None
        out = w.finish(
            np.array(total, copy=True), rs.expr.rop, rs.expr.args[0].type.dtype, G, rs.name
        )
        w.values[rs.name] = out.reshape(rank_shape(rs.ty, G))
