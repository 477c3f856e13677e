"""The semantics of every operation on one rank's storage, in numpy (one definition,
shared by the reference of simulated ranks and the mpi4py executor).

Contract: docs/semantics-notes.md. In short:

- A stage's expression is evaluated in the compute type (f32 for f16/bf16/f32, f64 for
  f64, int64 for integers) and its value rounded once to the stage dtype (`stage_value`).
  `cast` and `dropout` round to their dtype where they occur.
- A weak scalar (shape ``[]``) meeting a tensor is first converted to the node's dtype.
- Values are per-rank arrays shaped by `layout.rank_shape`. A replicated operand combined
  with a sliced result is read at the *global* flat index of each result element
  (`broadcast_operand`), never at the local one.
- Whole-tensor reductions of a sliced value are per-rank partials (`reduction_partial`),
  combined across the group in rank order (`combine_ranks`), then finished
  (`reduction_finish`); the driver supplies the cross-rank step through
  `RankContext.combine`.
- Collectives are functions over the list of the group's per-rank arrays; every reduction
  across ranks, collective or implicit, goes through `combine_ranks`, so an allreduce and a
  reducescatter followed by an allgather give the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from cocoviz import numerics as nx
from cocoviz.exec import routing as rt
from cocoviz.exec.layout import (
    block_flat_index,
    chunk_range,
    global_flat_index,
    is_contiguous_chunk,
    join_global,
    rank_shape,
    rank_slices,
    split_global,
    take_rank_part,
)
from cocoviz.ir.nodes import (
    AXIS_REDUCTIONS,
    COMPARISONS,
    CONSTANTS,
    PERMUTES,
    REDUCTIONS,
    ROUTING,
    ROWWISE,
    Expr,
    Op,
    ReduceOp,
    fill_value,
    permutation,
)
from cocoviz.ir.types import DType, TensorType, block_dim, dp_view, shape_values

__all__ = [
    "RankContext",
    "accumulation_dtype",
    "partial_rop",
    "reduction_partial_of",
    "storage_dtype",
    "trunc_div",
    "allgather",
    "allreduce",
    "batched_matmul",
    "alltoall",
    "broadcast",
    "broadcast_operand",
    "combine_ranks",
    "evaluate",
    "implicit_reductions",
    "matmul",
    "reduce",
    "reduce_values",
    "reducescatter",
    "reduction_finish",
    "reduction_partial",
    "round_to",
    "stage_value",
    "to_compute",
]

Array = npt.NDArray[Any]


# ------------------------------------------------------------------------- dtypes


def storage_dtype(dtype: DType) -> np.dtype[Any]:
    return nx.dtype_info(dtype).storage


def round_to(x: npt.ArrayLike, dtype: DType) -> Array:
    """Round computed values to `dtype`'s storage (f16/bf16 nearest even, ints wrap)."""
    a = np.asarray(x)
    if a.dtype == np.bool_:
        a = a.astype(np.int64)
    return nx.to_dtype(a, dtype)


def to_compute(x: npt.ArrayLike, dtype: DType) -> Array:
    """Widen stored values of `dtype` to its compute type (exact)."""
    a = np.asarray(x)
    ct = nx.dtype_info(dtype).compute
    return a if a.dtype == ct else a.astype(ct)


def _as(x: Array, dtype: DType) -> Array:
    """Values of any computed type as `dtype`'s compute type, rounded to `dtype` first
    when that is narrower (weak scalars, cast)."""
    return to_compute(round_to(x, dtype), dtype)


# ----------------------------------------------------------------- rank context


class RankContext(Protocol):
    """What an expression on one rank can see."""

    @property
    def rank(self) -> int:
        """Index of this rank within its group (the tp index)."""
        ...

    @property
    def group(self) -> int:
        """Group size G."""
        ...

    @property
    def seed(self) -> int: ...

    def lookup(self, name: str) -> Array:
        """This rank's stored array of an input, param or earlier stage."""
        ...

    def combine(self, e: Expr, partial: Array) -> Array:
        """The cross-rank step of an implicit reduction: this rank's partial in, the
        group's combined partial (`combine_ranks` over ranks in order) out."""
        ...


# ------------------------------------------------------------ global indexing


def _strides(shape: tuple[int, ...]) -> list[int]:
    st = [1] * len(shape)
    for j in range(len(shape) - 2, -1, -1):
        st[j] = st[j + 1] * shape[j + 1]
    return st


def operand_flat_index(
    gidx: npt.NDArray[np.int64], result_shape: tuple[int, ...], op_shape: tuple[int, ...]
) -> npt.NDArray[np.int64]:
    """Flat index into an operand of `op_shape` (right-aligned, numpy broadcasting) of the
    result elements with global flat indices `gidx` in a result of `result_shape`."""
    pad = (1,) * (len(result_shape) - len(op_shape)) + op_shape
    rs, ps = _strides(result_shape), _strides(pad)
    out = np.zeros(gidx.shape, dtype=np.int64)
    for j, (n, m) in enumerate(zip(result_shape, pad, strict=True)):
        if m == 1 or n == 1:
            continue
        coord = (gidx // np.int64(rs[j])) % np.int64(n)
        out += coord * np.int64(ps[j])
    return out


def broadcast_operand(value: Array, result_ty: TensorType, group: int, rank: int) -> Array:
    """A whole (replicated) operand as read by `rank`'s elements of a sliced result.

    Each result element reads the operand at its *global* position, reduced to the
    operand's shape by broadcasting. For a block partition that is a view of the
    operand's block; for a flat chunk that is not a block, a gather by global index.
    """
    if value.ndim == 0 or not result_ty.layout.is_sliced:
        return value
    shape = shape_values(result_ty.shape)
    pad = (1,) * (len(shape) - value.ndim) + value.shape
    v = value.reshape(pad)
    sl = rank_slices(result_ty, group, rank)
    if sl is not None:
        d = len(sl) - 1
        if pad[d] == 1:
            return v
        return v[sl]
    lo, hi = chunk_range(result_ty, group, rank)
    gidx = np.arange(lo, hi, dtype=np.int64)
    return value.reshape(-1)[operand_flat_index(gidx, shape, value.shape)]


def rank_flat_index(
    ty: TensorType, group: int, rank: int
) -> npt.NDArray[np.int64] | tuple[int, int]:
    """Global flat indices of rank's elements: a (start, stop) range when contiguous."""
    lay = ty.layout
    n = ty.numel
    if lay.is_replicated:
        return 0, n
    if lay.is_local:
        return rank * n, (rank + 1) * n
    if is_contiguous_chunk(ty, group):
        return chunk_range(ty, group, rank)
    sl = rank_slices(ty, group, rank)
    assert sl is not None
    return block_flat_index(shape_values(ty.shape), sl)


# ---------------------------------------------------------------- elementwise


def trunc_div(a: Array, b: Array) -> Array:
    """Integer division truncating toward zero (C); division by zero gives 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.floor_divide(a, b)
        r = np.remainder(a, b)
    fix = (r != 0) & ((a < 0) != (b < 0))
    return np.where(fix, q + 1, q)


def _int_pow(a: Array, b: Array) -> Array:
    neg = b < 0
    with np.errstate(over="ignore"):
        p = np.power(a, np.where(neg, 0, b))
    # C-like integer semantics for negative exponents: 1 and -1 stay, others give 0.
    small = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
    return np.where(neg, small, p)


def _binary(op: Op, a: Array, b: Array, is_float: bool) -> Array:
    if op is Op.ADD:
        return a + b
    if op is Op.SUB:
        return a - b
    if op is Op.MUL:
        return a * b
    if op is Op.DIV:
        return a / b if is_float else trunc_div(a, b)
    if op is Op.MAX:
        return np.maximum(a, b)
    if op is Op.MIN:
        return np.minimum(a, b)
    if op is Op.POW:
        return np.power(a, b) if is_float else _int_pow(a, b)
    raise AssertionError(f"not a binary op: {op}")


def _gelu(x: Array) -> Array:
    t = x.dtype.type
    c = t(math.sqrt(2.0 / math.pi))
    return t(0.5) * x * (t(1.0) + np.tanh(c * (x + t(0.044715) * x * x * x)))


_UNARY: dict[Op, Callable[[Array], Array]] = {
    Op.NEG: np.negative,
    Op.SQRT: np.sqrt,
    Op.RSQRT: lambda x: x.dtype.type(1.0) / np.sqrt(x),
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.TANH: np.tanh,
    Op.SIGMOID: lambda x: x.dtype.type(1.0) / (x.dtype.type(1.0) + np.exp(-x)),
    Op.RELU: lambda x: np.maximum(x, x.dtype.type(0)),
    Op.GELU: _gelu,
    Op.ABS: np.abs,
}

_COMPARE: dict[Op, Callable[[Array, Array], Array]] = {
    Op.LT: np.less,
    Op.LE: np.less_equal,
    Op.GT: np.greater,
    Op.GE: np.greater_equal,
    Op.EQ: np.equal,
    Op.NE: np.not_equal,
}


# ------------------------------------------------------------------- row-wise


def _rows(x: Array, n: int) -> Array:
    return x.reshape(-1, n)


def layernorm(x: Array, g: Array, b: Array, eps: float) -> Array:
    """``(x − mean)/sqrt(var + eps)·g + b`` over the last dimension (biased variance)."""
    n = g.shape[-1]
    r = _rows(x, n)
    t = r.dtype.type
    mean = np.mean(r, axis=-1, keepdims=True)
    d = r - mean
    var = np.mean(d * d, axis=-1, keepdims=True)
    out = d / np.sqrt(var + t(eps)) * g + b
    return out.reshape(x.shape)


def rmsnorm(x: Array, g: Array, eps: float) -> Array:
    """``x/sqrt(mean(x²) + eps)·g`` over the last dimension."""
    n = g.shape[-1]
    r = _rows(x, n)
    t = r.dtype.type
    ms = np.mean(r * r, axis=-1, keepdims=True)
    return (r / np.sqrt(ms + t(eps)) * g).reshape(x.shape)


def softmax(x: Array, n: int) -> Array:
    """``exp(x − max)/Σ`` over the last dimension (of length n)."""
    r = _rows(x, n)
    e = np.exp(r - np.max(r, axis=-1, keepdims=True))
    return (e / np.sum(e, axis=-1, keepdims=True)).reshape(x.shape)


# ----------------------------------------------------------------- reductions


def accumulation_dtype(dtype: DType) -> np.dtype[Any]:
    """Reductions accumulate in f32 (f16/bf16/f32), f64 or int64."""
    return nx.dtype_info(dtype).compute


def reduction_partial(op: Op, x: Array, dtype: DType) -> Array:
    """One rank's partial of `sum`/`norm`/`amax` over its values `x` (of `dtype`):
    Σx, Σx² or max|x|, as a 0-d array of the accumulation type."""
    acc = accumulation_dtype(dtype)
    xa = x.astype(acc, copy=False)
    if op is Op.SUM:
        return np.asarray(np.sum(xa, dtype=acc))
    if op is Op.NORM:
        return np.asarray(np.sum(xa * xa, dtype=acc))
    if op is Op.AMAX:
        return np.asarray(np.max(np.abs(xa)) if xa.size else acc.type(0))
    raise AssertionError(f"not a reduction: {op}")


def partial_rop(op: Op) -> ReduceOp:
    """How partials of a reduction combine across ranks."""
    return ReduceOp.MAX if op is Op.AMAX else ReduceOp.SUM


def reduction_finish(op: Op, combined: Array, dtype: DType) -> Array:
    """The reduction's value (in the compute type of its result dtype) from the combined
    partial: sqrt once for `norm`."""
    out = dtype.reduction_dtype
    if op is Op.NORM:
        if out.is_float:
            return to_compute(np.sqrt(combined), out)
        return to_compute(round_to(np.sqrt(combined.astype(np.float64)), out), out)
    return to_compute(combined, out)


# ------------------------------------------------------- combining across ranks


def combine_ranks(arrays: Sequence[npt.ArrayLike], rop: ReduceOp, compute: np.dtype[Any]) -> Array:
    """THE cross-rank reduction: ``((x0 ⊕ x1) ⊕ x2) …`` in rank order, in the compute type
    `compute`, unrounded; `avg` divides the sum by the number of ranks (truncating for
    integers). Elementwise, so combining chunks gives the chunks of the combination."""
    if not arrays:
        raise ValueError("nothing to combine")
    acc = np.array(arrays[0], dtype=compute, copy=True)
    is_float = compute.kind == "f"
    with np.errstate(over="ignore", invalid="ignore"):
        for a in arrays[1:]:
            # Mixed-type ufuncs widen `a` to `compute` in buffered blocks (exact: the
            # compute type holds every stored value), without a full-size temporary.
            x = np.asarray(a)
            if rop in (ReduceOp.SUM, ReduceOp.AVG):
                np.add(acc, x, out=acc)
            elif rop is ReduceOp.PROD:
                np.multiply(acc, x, out=acc)
            elif rop is ReduceOp.MAX:
                np.maximum(acc, x, out=acc)
            else:
                np.minimum(acc, x, out=acc)
    if rop is ReduceOp.AVG:
        n = compute.type(len(arrays))
        acc = acc / n if is_float else trunc_div(acc, np.asarray(n))
    return acc


def reduce_values(arrays: Sequence[Array], rop: ReduceOp, dtype: DType) -> Array:
    """`combine_ranks` of stored values of `dtype`, rounded once to `dtype`."""
    return round_to(combine_ranks(arrays, rop, nx.dtype_info(dtype).compute), dtype)


# ---------------------------------------------------------------- collectives


def _readonly(a: Array) -> Array:
    a.flags.writeable = False
    return a


def allreduce(arrays: Sequence[Array], rop: ReduceOp, dtype: DType) -> list[Array]:
    """Every rank gets the combination of all ranks' arrays (one shared array)."""
    out = _readonly(reduce_values(arrays, rop, dtype))
    return [out] * len(arrays)


def reducescatter(
    arrays: Sequence[Array], rop: ReduceOp, dtype: DType, out_ty: TensorType
) -> list[Array]:
    """Rank r gets the combination of every rank's r-th flat chunk (NCCL's layout)."""
    g = len(arrays)
    shape = rank_shape(out_ty, g)
    flat = [np.asarray(a).reshape(-1) for a in arrays]
    out = []
    for r in range(g):
        lo, hi = chunk_range(out_ty, g, r)
        out.append(reduce_values([f[lo:hi] for f in flat], rop, dtype).reshape(shape))
    return out


def allgather(arrays: Sequence[Array], in_ty: TensorType) -> list[Array]:
    """Every rank gets the global value of a sliced operand (one shared array)."""
    out = join_global(arrays, in_ty, len(arrays))
    out = _readonly(np.ascontiguousarray(out).reshape(shape_values(in_ty.shape)))
    return [out] * len(arrays)


def broadcast(arrays: Sequence[Array], root: int) -> list[Array]:
    """Every rank gets the root's array."""
    out = _readonly(np.array(arrays[root]))
    return [out] * len(arrays)


def reduce(arrays: Sequence[Array], rop: ReduceOp, dtype: DType, root: int) -> list[Array]:
    """The root gets the combination; every other rank holds zeros (a local value)."""
    combined = reduce_values(arrays, rop, dtype)
    zeros = np.zeros_like(combined)
    return [combined if r == root else zeros.copy() for r in range(len(arrays))]


def send(arrays: Sequence[Array], in_ty: TensorType) -> list[Array]:
    """Rank (p, tp) sends its storage to rank (p+1, tp): the receiver holds a copy."""
    if in_ty.layout.is_replicated:
        v = _readonly(np.array(arrays[0]))
        return [v] * len(arrays)
    return [np.array(a) for a in arrays]


def alltoall(arrays: Sequence[Array], in_ty: TensorType, out_ty: TensorType) -> list[Array]:
    """Rank r gets the r-th block of the result's slicing dimension from every rank's
    part: the same global value, re-sliced (what ``MPI_Alltoall`` does once each rank's
    part is packed in destination order)."""
    g = len(arrays)
    whole = join_global(arrays, in_ty, g)
    return [np.ascontiguousarray(p) for p in split_global(whole, out_ty, g)]


def _rop(e: Expr) -> ReduceOp:
    assert e.rop is not None
    return e.rop


COLLECTIVE_SEMANTICS: dict[Op, Callable[[Sequence[Array], Expr], list[Array]]] = {
    Op.ALLREDUCE: lambda a, e: allreduce(a, _rop(e), e.args[0].type.dtype),
    Op.REDUCESCATTER: lambda a, e: reducescatter(a, _rop(e), e.args[0].type.dtype, e.type),
    Op.ALLGATHER: lambda a, e: allgather(a, e.args[0].type),
    Op.BROADCAST: lambda a, e: broadcast(a, int(e.value or 0)),
    Op.REDUCE: lambda a, e: reduce(a, _rop(e), e.args[0].type.dtype, int(e.value or 0)),
    Op.SEND: lambda a, e: send(a, e.args[0].type),
    Op.ALLTOALL: lambda a, e: alltoall(a, e.args[0].type, e.type),
}
"""The reference semantics of each collective (docs/language.md, operations and layout inference): every
rank's operand array → every rank's result array. A new collective's row of
`cocoviz.ir.collectives` needs its entry here."""


def matmul(a: Array, b: Array, out_ty: TensorType, group: int) -> Array:
    """One rank's ``a[..., K] × b[K, N]`` on its stored blocks, accumulated in f32 (f64 for
    f64) and rounded once to the result dtype, shaped as the result's rank array.

    `a` and `b` are the rank's operand arrays in their compute type; a flat-sliced `a`
    whose chunk is whole rows is viewed as rows of length K.
    """
    dtype = out_ty.dtype
    acc = np.float64 if dtype is DType.F64 else np.float32
    b2 = b.astype(acc, copy=False)
    a2 = a.astype(acc, copy=False).reshape(-1, b2.shape[0])
    out = np.matmul(a2, b2)
    return round_to(out, dtype).reshape(rank_shape(out_ty, group))


def batched_matmul(
    a: Array,
    b: Array,
    a_ty: TensorType,
    b_ty: TensorType,
    out_ty: TensorType,
    group: int,
    rank: int,
) -> Array:
    """One rank's ``a[..., M, K] × b[..., K, N]`` (b of rank ≥ 3, numpy's batch
    broadcasting) on its stored blocks, accumulated like `matmul`.

    A replicated operand whose extent along the result's sliced batch dimension is not 1
    is read at the rank's block of that dimension (as a broadcast operand of an
    elementwise op is read at the global index of each element).
    """
    dtype = out_ty.dtype
    acc = np.float64 if dtype is DType.F64 else np.float32
    d = block_dim(out_ty.layout, out_ty.shape, group)
    r = len(out_ty.shape)
    if d is not None and d < r - 2:
        a = _rank_block(a, a_ty, d - r, group, rank)
        b = _rank_block(b, b_ty, d - r, group, rank)
    out = np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))
    return round_to(out, dtype).reshape(rank_shape(out_ty, group))


def _rank_block(x: Array, ty: TensorType, from_end: int, group: int, rank: int) -> Array:
    """`x` viewed at `rank`'s block of its dimension `from_end` (counted from the end) when
    it is replicated there with an extent that is not broadcast; else `x` as it is."""
    j = len(ty.shape) + from_end
    if not ty.layout.is_replicated or j < 0 or ty.shape[j].value == 1:
        return x
    n = ty.shape[j].value // group
    return x[(slice(None),) * j + (slice(rank * n, (rank + 1) * n),)]


# ---------------------------------------------------------- expression evaluation


def implicit_reductions(e: Expr) -> Iterator[Expr]:
    """Reduction nodes of sliced values in `e`, innermost first (post-order)."""
    for a in e.args:
        yield from implicit_reductions(a)
    if e.op in REDUCTIONS and e.args[0].type.layout.is_sliced:
        yield e


def evaluate(e: Expr, ctx: RankContext) -> Array:
    """The value of expression `e` on `ctx`'s rank, in the compute type of `e`'s dtype
    (a bool array for comparisons), shaped as the rank's array of `e`'s type."""
    return _Eval(ctx).eval(e)


def stage_value(e: Expr, ctx: RankContext) -> Array:
    """A stage's value on one rank: `evaluate`, rounded once to the stage dtype, in the
    rank's storage shape."""
    v = evaluate(e, ctx)
    ty = e.type
    return np.asarray(round_to(v, ty.dtype)).reshape(stored_shape(ty, ctx))


def stored_shape(ty: TensorType, ctx: RankContext) -> tuple[int, ...]:
    """The rank's array shape of `ty`: its dp part on a grid with a dp axis, where the
    context says how many dp ranks there are (`dp`; docs/language.md, rank grids)."""
    if ty.dp.is_sliced:
        return rank_shape(dp_view(ty, ctx.group), getattr(ctx, "dp", 1))
    return rank_shape(ty, ctx.group)


def reduction_partial_of(e: Expr, ctx: RankContext) -> Array:
    """This rank's partial of the reduction node `e` (for the driver's combine step)."""
    ev = _Eval(ctx)
    x = e.args[0]
    return reduction_partial(e.op, ev.eval(x), x.type.dtype)


class _Eval:
    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx

    # Operands of a node with dtype `dtype` and type `ty`: weak scalars converted to the
    # node dtype; replicated operands of a sliced node read at global positions.
    def _operand(self, a: Expr, node_ty: TensorType, dtype: DType | None) -> Array:
        at = a.type
        if a.op is Op.CONST and dtype is not None:
            # A literal converts from its exact source value (0.1 in f64 is not f32(0.1)).
            assert a.value is not None
            return _as(np.asarray(a.value), dtype)
        v = self.eval(a)
        if dtype is not None and at.is_scalar and (not node_ty.is_scalar or at.dtype != dtype):
            v = _as(v, dtype) if v.dtype != np.bool_ else v
        if node_ty.layout.is_sliced and not at.layout.is_sliced and not at.is_scalar:
            v = broadcast_operand(v, node_ty, self.ctx.group, self.ctx.rank)
        return v

    def eval(self, e: Expr) -> Array:
        op = e.op
        ty = e.type
        ctx = self.ctx
        if op is Op.REF:
            assert e.name is not None
            return to_compute(ctx.lookup(e.name), ty.dtype)
        if op is Op.CONST:
            assert e.value is not None
            return _as(np.asarray(e.value), ty.dtype)
        if op is Op.SLICE:
            (x,) = e.args
            full = self.eval(x)
            if e.tag == "dp":  # slice(x, over=dp): the dp part of the rank's tp part
                view = dp_view(ty, ctx.group)
                dp, d = getattr(ctx, "dp", 1), getattr(ctx, "dp_rank", 0)
                return take_rank_part(full, view, dp, d).reshape(rank_shape(view, dp))
            part = take_rank_part(full, ty, ctx.group, ctx.rank)
            return part.reshape(rank_shape(ty, ctx.group))
        if op is Op.CAST:
            (x,) = e.args
            v = self.eval(x)
            return _as(v, ty.dtype)
        if op is Op.DROPOUT:
            return self._dropout(e)
        if op in COMPARISONS:
            a, b = (self._operand(x, ty, ty.dtype) for x in e.args)
            return _COMPARE[op](a, b)
        if op is Op.WHERE:
            c_e, a_e, b_e = e.args
            c = self._operand(c_e, ty, None)
            if c.dtype != np.bool_:
                c = c != 0
            a = self._operand(a_e, ty, ty.dtype)
            b = self._operand(b_e, ty, ty.dtype)
            return np.where(c, a, b)
        if op in _UNARY:
            (x,) = e.args
            v = self._operand(x, ty, ty.dtype)
            with np.errstate(all="ignore"):
                return _UNARY[op](v)
        if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.POW):
            a, b = (self._operand(x, ty, ty.dtype) for x in e.args)
            with np.errstate(all="ignore"):
                return _binary(op, a, b, ty.dtype.is_float)
        if op in ROWWISE:
            return self._rowwise(e)
        if op in REDUCTIONS:
            x = e.args[0]
            part = reduction_partial(op, self.eval(x), x.type.dtype)
            if x.type.layout.is_sliced:
                part = ctx.combine(e, part)
            with np.errstate(invalid="ignore"):
                return reduction_finish(op, part, x.type.dtype)
        if op is Op.UPDATE:
            return self.eval(e.args[1])
        if op is Op.MATMUL:
            a_e, b_e = e.args
            a, b = self.eval(a_e), self.eval(b_e)
            if len(b_e.type.shape) > 2:
                out = batched_matmul(a, b, a_e.type, b_e.type, ty, ctx.group, ctx.rank)
                return to_compute(out, ty.dtype)
            return to_compute(matmul(a, b, ty, ctx.group), ty.dtype)
        if op is Op.RESHAPE:
            # every layout keeps each rank's part as the same row-major array
            return self.eval(e.args[0]).reshape(rank_shape(ty, ctx.group))
        if op in AXIS_REDUCTIONS:
            return self._axis_reduction(e)
        if op in CONSTANTS:
            return self._constant(e)
        if op in ROUTING:
            return self._routing(e)
        if op in PERMUTES:
            # a sliced dimension moves with its data: each rank permutes its own block
            # (docs/language.md, transpose and permute)
            x_e = e.args[0]
            xv = self.eval(x_e).reshape(rank_shape(x_e.type, ctx.group))
            return np.transpose(xv, permutation(e)).reshape(rank_shape(ty, ctx.group))
        raise ValueError(
            f"{op.value} cannot be evaluated inside an expression on one rank: "
            "communication is evaluated by the driver over all ranks"
        )

    def _constant(self, e: Expr) -> Array:
        """`zeros/ones/full/iota(T[DIMS], …)` on the rank: the rank's part of the constant in
        the layout its use gave it; `iota` holds each element's coordinate along its
        dimension (docs/language.md, constants)."""
        ty = e.type
        ctx = self.ctx
        shape = rank_shape(ty, ctx.group)
        if e.op is Op.IOTA:
            dims = shape_values(ty.shape)
            d = int(e.value or 0)
            idx = global_flat_index(ty, ctx.group, ctx.rank) % np.int64(max(ty.numel, 1))
            stride = np.int64(math.prod(dims[d + 1 :]))
            v: Array = (idx // stride) % np.int64(dims[d])
        else:
            v = np.full(shape, fill_value(e))
        return _as(np.asarray(v).reshape(shape), ty.dtype)

    def _routing(self, e: Expr) -> Array:
        """gather, scatter_add, topk, topk_indices, capacity_slots on the rank's own
        arrays (docs/language.md, routing: the indexed dimension is whole on the rank)."""
        g = self.ctx.group
        ty = e.type
        vals = [self.eval(a).reshape(rank_shape(a.type, g)) for a in e.args]
        d = int(e.value or 0)
        if e.op is Op.GATHER:
            out = rt.gather(vals[0], vals[1], d)
        elif e.op is Op.SCATTER_ADD:
            ct = nx.dtype_info(ty.dtype).compute
            out = rt.scatter_add(rank_shape(ty, g), ct, vals[0], vals[1], d)
        elif e.op is Op.CAPACITY_SLOTS:
            assert e.shape_arg is not None
            E, C = (s.value for s in e.shape_arg)
            out = rt.capacity_slots(vals[0], E, C)
        else:
            assert e.shape_arg is not None
            k = e.shape_arg[0].value
            out = rt.topk(vals[0], k, d) if e.op is Op.TOPK else rt.topk_order(vals[0], k, d)
        return to_compute(out, ty.dtype).reshape(rank_shape(ty, g))

    def _axis_reduction(self, e: Expr) -> Array:
        """`sum/mean/amax/amin(x, dim=d)` on the rank's own array, accumulated in x's
        compute type; along the dimension x is sliced on, `mean` divides the rank's sum by
        the whole extent, so that the ranks' partial sums add up to the mean
        (docs/language.md, reductions along a dimension)."""
        x_e = e.args[0]
        xt = x_e.type
        xv = self.eval(x_e).reshape(rank_shape(xt, self.ctx.group))
        d = int(e.value or 0)
        acc = accumulation_dtype(xt.dtype)
        xa = xv.astype(acc, copy=False)
        with np.errstate(all="ignore"):
            if e.op is Op.SUM_DIM or e.op is Op.MEAN:
                out = np.sum(xa, axis=d, dtype=acc)
                if e.op is Op.MEAN:
                    out = out / acc.type(xt.shape[d].value)
            elif e.op is Op.AMAX_DIM:
                out = np.max(xa, axis=d)
            else:
                out = np.min(xa, axis=d)
        return to_compute(np.asarray(out), e.type.dtype).reshape(rank_shape(e.type, self.ctx.group))

    def _dropout(self, e: Expr) -> Array:
        (x_e,) = e.args
        ty = e.type
        ctx = self.ctx
        x = self.eval(x_e)
        assert e.tag is not None and e.value is not None
        p = float(e.value)
        where = rank_flat_index(ty, ctx.group, ctx.rank)
        if isinstance(where, tuple):
            keep = nx.dropout_keep(e.tag, ctx.seed, p, where[0], where[1] - where[0])
        else:
            keep = nx.dropout_keep_at(e.tag, ctx.seed, p, where)
        keep = keep.reshape(x.shape)
        return to_compute(nx.dropout_apply(x, keep, p, ty.dtype), ty.dtype)

    def _rowwise(self, e: Expr) -> Array:
        ty = e.type
        x = self.eval(e.args[0])
        params = [self.eval(a) for a in e.args[1:]]
        n = ty.shape[-1].value
        eps = float(e.value) if e.value is not None else 0.0
        with np.errstate(all="ignore"):
            if e.op is Op.LAYERNORM:
                return layernorm(x, params[0], params[1], eps)
            if e.op is Op.RMSNORM:
                return rmsnorm(x, params[0], eps)
            return softmax(x, n)


# ------------------------------------------------------- reusing buffers (mpi4py)


class BufferPool:
    """Arrays recycled by (shape, dtype), so that a process evaluating the same program
    over and over reuses its temporaries instead of paying fresh memory (page faults and
    zeroing) on every iteration. Holds only arrays that own their memory."""

    def __init__(self) -> None:
        self.free: dict[tuple[tuple[int, ...], np.dtype[Any]], list[Array]] = {}

    def take(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array:
        got = self.free.get((shape, dtype))
        if got:
            return got.pop()
        return np.empty(shape, dtype=dtype)

    def give(self, a: Array) -> None:
        if a.base is None and a.flags.c_contiguous and a.flags.writeable:
            self.free.setdefault((a.shape, a.dtype), []).append(a)


_BINARY_UFUNC: dict[Op, Any] = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
    Op.MAX: np.maximum,
    Op.MIN: np.minimum,
    Op.POW: np.power,
}

_UNARY_UFUNC: dict[Op, Any] = {
    Op.NEG: np.negative,
    Op.SQRT: np.sqrt,
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.TANH: np.tanh,
    Op.ABS: np.abs,
}


class _PooledEval(_Eval):
    """`_Eval` with the same values, bit for bit: float elementwise tensor operations
    write into recycled buffers (`out=`, in place on a temporary operand) instead of
    allocating a new array per operation. Only temporaries this evaluation made are ever
    written to or recycled (`owned`); values read from the context are never touched."""

    def __init__(self, ctx: RankContext, pool: BufferPool) -> None:
        super().__init__(ctx)
        self.pool = pool
        self.owned: dict[int, Array] = {}

    def _new(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array:
        a = self.pool.take(shape, dtype)
        self.owned[id(a)] = a
        return a

    def _is_owned(self, a: Array) -> bool:
        return self.owned.get(id(a)) is a

    def _release(self, a: Array) -> None:
        if self._is_owned(a):
            del self.owned[id(a)]
            self.pool.give(a)

    def _out(self, shape: tuple[int, ...], dtype: np.dtype[Any], *args: Array) -> Array:
        """A temporary operand of the result's shape and type, else a recycled buffer."""
        for a in args:
            if a.shape == shape and a.dtype == dtype and self._is_owned(a):
                return a
        return self._new(shape, dtype)

    def eval(self, e: Expr) -> Array:
        op = e.op
        ty = e.type
        if op is Op.REF:
            assert e.name is not None
            v = self.ctx.lookup(e.name)
            ct = nx.dtype_info(ty.dtype).compute
            if v.dtype == ct or v.ndim == 0 or v.dtype.kind != "f" or ct.kind != "f":
                return to_compute(v, ty.dtype)
            out = self._new(v.shape, ct)
            np.copyto(out, v, casting="unsafe")  # as `astype`: widening, exact
            return out
        if op in _BINARY_UFUNC and ty.dtype.is_float:
            a, b = (self._operand(x, ty, ty.dtype) for x in e.args)
            if (a.ndim == 0 and b.ndim == 0) or a.dtype.kind != "f" or b.dtype.kind != "f":
                with np.errstate(all="ignore"):
                    return _binary(op, a, b, True)
            dt = np.result_type(a, b)
            out = self._out(np.broadcast_shapes(a.shape, b.shape), dt, a, b)
            with np.errstate(all="ignore"):
                _BINARY_UFUNC[op](a, b, out=out)
            for arr in (a, b):
                if arr is not out:
                    self._release(arr)
            return out
        if op in _UNARY_UFUNC or op in (Op.RSQRT, Op.SIGMOID, Op.RELU):
            (x,) = e.args
            v = self._operand(x, ty, ty.dtype)
            if v.ndim == 0 or v.dtype.kind != "f":
                with np.errstate(all="ignore"):
                    return _UNARY[op](v)
            out = self._out(v.shape, v.dtype, v)
            one = v.dtype.type(1.0)
            with np.errstate(all="ignore"):
                if op is Op.RSQRT:  # 1/sqrt(x)
                    np.sqrt(v, out=out)
                    np.divide(one, out, out=out)
                elif op is Op.SIGMOID:  # 1/(1 + exp(-x))
                    np.negative(v, out=out)
                    np.exp(out, out=out)
                    np.add(one, out, out=out)
                    np.divide(one, out, out=out)
                elif op is Op.RELU:
                    np.maximum(v, v.dtype.type(0), out=out)
                else:
                    _UNARY_UFUNC[op](v, out=out)
            if v is not out:
                self._release(v)
            return out
        if op is Op.NORM:
            # `reduction_partial`'s Σx² with x² in a recycled buffer: the same array
            # summed the same way (np.sum of a contiguous array), so the same bits
            x = e.args[0]
            xv = self.eval(x)
            acc = accumulation_dtype(x.type.dtype)
            if xv.dtype != acc or xv.ndim == 0:
                part = reduction_partial(op, xv, x.type.dtype)
            else:
                sq = self._out(xv.shape, acc, xv)
                np.multiply(xv, xv, out=sq)
                part = np.asarray(np.sum(sq, dtype=acc))
                self._release(sq)
                self._release(xv)
            if x.type.layout.is_sliced:
                part = self.ctx.combine(e, part)
            with np.errstate(invalid="ignore"):
                return reduction_finish(op, part, x.type.dtype)
        return super().eval(e)


def stage_value_pooled(e: Expr, ctx: RankContext, pool: BufferPool) -> tuple[Array, Array | None]:
    """`stage_value`, bit for bit, with temporaries from `pool`: the value, and the pooled
    buffer holding it (None when the value is not one: an operand itself, a view), which
    the caller gives back to the pool once the value is dead."""
    ev = _PooledEval(ctx, pool)
    v = ev.eval(e)
    ty = e.type
    store = storage_dtype(ty.dtype)
    if (
        v.dtype != store
        and v.ndim > 0
        and v.dtype.kind == "f"
        and store.kind == "f"
        and ty.dtype is not DType.BF16
    ):
        out = ev._new(v.shape, store)
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(out, v, casting="unsafe")  # as `round_to`: one rounding cast
        ev._release(v)
        v = out
    else:
        v = np.asarray(round_to(v, ty.dtype))
    base = v if ev._is_owned(v) else None
    return v.reshape(stored_shape(ty, ctx)), base
