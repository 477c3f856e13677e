"""The geometry of a shard-decomposed overlap (`decompose`, docs/schedules.md): which
shard each rank works on at each step, who it exchanges with, and the GEMM each step
runs, as offsets into the arrays ranks store. Every backend (the MPI executor, both
emitters, the simulator) reads it, so they agree on one decomposition.

Two patterns, each G steps on G ranks:

- **gather** (`g = allgather(x)` read by `m = matmul(…)`): at step s rank r holds shard
  `(r + s) mod G` of `g` (rank `(r + s) mod G`'s part of `x`), multiplies it, and passes it
  to rank `r − 1` while receiving the next from rank `r + 1` (XLA's collective matmul,
  PyTorch's `fused_all_gather_matmul`).
- **scatter** (`p = matmul(…)` reduced by `s = reducescatter(op, p)`): at step s rank r
  computes block `(r − s − 1) mod G` of its partial `p`, combines it with the accumulator
  received from rank `r − 1` for that block, and passes it to rank `r + 1`; after the last
  step the block it holds is its own, `(r − G) mod G = r` (`fused_matmul_reduce_scatter`).

GEMMs are row-major `C[m, n] (+)= A[m, k] · B[k, n]` on element offsets with leading
dimensions, repeated `batch` times at fixed strides (a strided batched GEMM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cocoviz.ir.nodes import Group, Op, Program, Stage
from cocoviz.ir.types import TensorType, block_dim

Mode = Literal["rows", "cols", "accumulate"]


@dataclass(frozen=True)
class Gemm:
    """`C[m, n] (+)= A[m, k] · B[k, n]`, row-major, `batch` times: matrix b of A starts at
    element `a_off + b·a_stride` with rows `lda` apart (likewise B and C). For the gather
    pattern the gathered operand's offsets are into the shard (the sending rank's part of
    the allgather's operand, as that rank stores it); every other offset is into the array
    a rank stores. `accumulate`: the shards split the contraction, so each step adds its
    product to C — except a rank's first step (s = 0), which writes it."""

    m: int
    n: int
    k: int
    a_off: int
    lda: int
    a_stride: int
    b_off: int
    ldb: int
    b_stride: int
    c_off: int
    ldc: int
    c_stride: int
    batch: int = 1
    accumulate: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True)
class ShardPlan:
    """A decomposed group's geometry (see the module docstring).

    gather: `collective` is the allgather, `operand` the matmul operand it is (0 left,
    1 right), `mode` how a shard maps to the result — `rows` (a block of the result's rows),
    `cols` (a block of its columns) or `accumulate` (the shard splits the contraction: each
    step adds a partial product; half types accumulate in f32 and round once).
    scatter: `collective` is the reducescatter; block c is rows `c·m/G …` of the matmul's
    result, which is the reducescatter's rank-c part; the GEMM of block c writes an array of
    `shard_numel` elements (`c_off` 0)."""

    kind: Literal["gather", "scatter"]
    collective: str
    matmul: str
    group: int
    operand: int
    mode: Mode
    shard_numel: int
    """Elements of one shard (gather: one rank's part of the allgather's operand) or of
    one block (scatter: one rank's part of the reducescatter's result)."""
    gemms: tuple[Gemm, ...]
    """The GEMM of shard (block) c, for c in 0 … G−1."""

    def shard_at(self, rank: int, step: int) -> int:
        """The shard (gather) or block (scatter) rank `rank` multiplies at step `step`."""
        G = self.group
        if self.kind == "gather":
            return (rank + step) % G
        return (rank - step - 1) % G

    def send_to(self, rank: int) -> int:
        G = self.group
        return (rank - 1) % G if self.kind == "gather" else (rank + 1) % G

    def recv_from(self, rank: int) -> int:
        G = self.group
        return (rank + 1) % G if self.kind == "gather" else (rank - 1) % G


def _shape(t: TensorType) -> tuple[int, ...]:
    return tuple(s.value for s in t.shape)


def _local_shape(t: TensorType, G: int) -> tuple[int, ...]:
    """The shape of the array one rank stores (`exec.layout.rank_shape`'s rule: the IR
    cannot import the executor)."""
    shape = _shape(t)
    if not t.layout.is_sliced:
        return shape
    d = block_dim(t.layout, t.shape, G)
    if d is None:
        return (math.prod(shape) // G,)
    return shape[:d] + (shape[d] // G,) + shape[d + 1 :]


def gather_split(x: TensorType, operand: int, G: int) -> tuple[Mode, int] | str:
    """How the shards of `allgather(x)` split the matmul that reads it as `operand`:
    (mode, the dimension of x the shards are blocks of), or why they cannot."""
    shape = _shape(x)
    d = block_dim(x.layout, x.shape, G)
    if operand == 1:
        if len(shape) != 2:
            return "the gathered right operand is not a matrix (a batched matmul)"
        if d == 0:
            return "accumulate", 0
        if d == 1:
            return "cols", 1
        return f"its parts ({x.layout}) are not blocks of rows or columns of the {G} ranks"
    if len(shape) < 2:
        return "the gathered left operand is a vector"
    last = len(shape) - 1
    if d is None:
        # flat parts: whole rows of the flattened leading dimensions, or nothing usable
        rows = math.prod(shape[:-1])
        if rows % G == 0:
            return "rows", 0
        return (
            f"each rank's flat part of {x.numel // G} elements is not whole rows of "
            f"{shape[-1]} elements"
        )
    if d == last:
        return "accumulate", last
    return "rows", d


def shard_plan(program: Program, group: Group) -> ShardPlan:
    """The geometry of decomposed group `group` of `program` (which `decompose` checked)."""
    names = list(group.stages())
    stages = {n: program.stage(n) for n in names}
    first = stages[names[0]]
    G = program.grid.group
    if first.expr.op is Op.ALLGATHER:
        mm = next(s for s in stages.values() if s.expr.op is Op.MATMUL)
        return gather_plan(first, mm, G)
    rs = next(s for s in stages.values() if s.expr.op is Op.REDUCESCATTER)
    return scatter_plan(first, rs, G)


def gather_plan(ag: Stage, mm: Stage, G: int) -> ShardPlan:
    x = ag.expr.args[0].type
    a, b = mm.expr.args
    operand = 0 if a.name == ag.name else 1
    split = gather_split(x, operand, G)
    assert not isinstance(split, str), split
    mode, d = split
    part = _local_shape(x, G)
    out = _local_shape(mm.ty, G)
    n_out = out[-1]
    gemms: list[Gemm] = []
    xs = _shape(x)
    if operand == 0:
        nb = _local_shape(b.type, G)[-1]  # the right operand's rows are nb apart
        for c in range(G):
            if mode == "accumulate":  # shard c: columns c·K/G … of the left operand
                kc = part[-1]
                rows = math.prod(part[:-1])
                gemms.append(
                    Gemm(rows, n_out, kc, 0, kc, 0, c * kc * nb, nb, 0, 0, n_out, 0, 1, True)
                )
                continue
            # rows: shard c is block c of dimension d: P batches of rc rows each
            K = xs[-1]
            P = math.prod(xs[:d])
            rc = (math.prod(xs) // G) // (P * K)
            gemms.append(
                Gemm(
                    rc,
                    n_out,
                    K,
                    0,
                    K,
                    rc * K,
                    0,
                    nb,
                    0,
                    c * rc * n_out,
                    n_out,
                    rc * G * n_out,
                    P,
                    False,
                )
            )
    else:
        al = _local_shape(a.type, G)
        K = _shape(a.type)[-1]
        rows = math.prod(al) // K
        kx, nx = part
        for c in range(G):
            if mode == "accumulate":  # shard c: rows c·K/G … of the right operand
                gemms.append(Gemm(rows, nx, kx, c * kx, K, 0, 0, nx, 0, 0, n_out, 0, 1, True))
            else:  # cols: shard c is columns c·N/G … of the right operand and the result
                gemms.append(Gemm(rows, nx, kx, 0, K, 0, 0, nx, 0, c * nx, n_out, 0, 1, False))
    return ShardPlan("gather", ag.name, mm.name, G, operand, mode, math.prod(part), tuple(gemms))


def scatter_plan(mm: Stage, rs: Stage, G: int) -> ShardPlan:
    a = mm.expr.args[0]
    N = _shape(mm.ty)[-1]  # the matmul's result is local: every rank stores all of it
    rows = math.prod(_shape(mm.ty)[:-1])
    K = math.prod(_local_shape(a.type, G)) // rows  # the left operand's rows, as stored
    rc = rows // G
    gemms = tuple(Gemm(rc, N, K, c * rc * K, K, 0, 0, N, 0, 0, N, 0, 1, False) for c in range(G))
    return ShardPlan("scatter", rs.name, mm.name, G, 0, "rows", rc * N, gemms)


__all__ = ["Gemm", "ShardPlan", "gather_plan", "gather_split", "scatter_plan", "shard_plan"]
