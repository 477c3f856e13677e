"""Routing by index: `gather`, `scatter_add`, `topk`, `topk_indices` and
`capacity_slots` — their calls (lowering) and their type, shape and layout rules
(inference). docs/language.md, routing, states the semantics every layer implements.

Every routing operation is a stage of its own (the whole right-hand side) and each rank
computes it on its own arrays: the dimension a routing operation indexes, selects or
counts along is whole on every rank, so an index is the same number globally and on the
rank (a sliced one is refused: an index into another rank's block needs communication,
which the language never inserts).
"""

from __future__ import annotations

from typing import Any

from cocoviz.errors import InputError
from cocoviz.ir.nodes import Expr, Op
from cocoviz.ir.operands import describe, source_text
from cocoviz.ir.operands import replace_fields as _replace
from cocoviz.ir.types import (
    REPLICATED,
    DType,
    Layout,
    Size,
    TensorType,
    block_dim,
    format_shape,
    shape_values,
    sliced,
)

INDEX_DTYPE = DType.I32
"""The dtype of the indices topk_indices and capacity_slots give (docs/language.md)."""

SIGNATURES = {
    Op.GATHER: "x, idx, dim=d",
    Op.SCATTER_ADD: "T[DIMS], idx, src, dim=d",
    Op.TOPK: "x, k, dim=-1",
    Op.TOPK_INDICES: "x, k, dim=-1",
    Op.CAPACITY_SLOTS: "expert, E, C",
}


# --- lowering -----------------------------------------------------------------------


def lower_call(lw: Any, a: Any) -> Expr:
    """The node of a routing call; `lw` is the lowerer (for sizes), `a` its `_CallArgs`."""
    op, fname = a.op, a.fname
    sig = SIGNATURES[op]
    if op is Op.CAPACITY_SLOTS:
        a.no_kw()
        a.arity(3, sig)
        sizes = (lw._size_arg(a.pos[1]), lw._size_arg(a.pos[2]))
        return Expr(op, (a.sub(a.pos[0]),), shape_arg=sizes, span=a.call.span)
    a.no_kw(("dim",))
    fixed = {Op.GATHER: 2, Op.SCATTER_ADD: 3, Op.TOPK: 2, Op.TOPK_INDICES: 2}[op]
    if len(a.pos) not in (fixed, fixed + 1) or (len(a.pos) == fixed + 1 and "dim" in a.kws):
        raise InputError(
            f"{fname} takes {fixed} arguments and the dimension ({fname}({sig})), got "
            f"{len(a.pos)} argument{'s' if len(a.pos) != 1 else ''}"
            + (" and dim=" if "dim" in a.kws else ""),
            a.call.span,
            hint=f"for example {fname}({sig})",
        )
    dim_node = (
        a.kws["dim"].value if "dim" in a.kws else (a.pos[fixed] if len(a.pos) > fixed else None)
    )
    if dim_node is None and op in (Op.GATHER, Op.SCATTER_ADD):
        raise InputError(
            f"{fname} needs the dimension it indexes: dim=",
            a.call.span,
            hint=f"for example {fname}({sig})",
        )
    d = -1 if dim_node is None else a.literal(dim_node, "dim")
    if not isinstance(d, int):
        raise InputError(
            f"{fname}: dim must be an integer dimension, got {d!r}",
            getattr(dim_node, "span", a.call.span),
        )
    if op is Op.GATHER:
        return Expr(op, (a.sub(a.pos[0]), a.sub(a.pos[1])), value=d, span=a.call.span)
    if op is Op.SCATTER_ADD:
        dt, shape = lw.type_arg(
            a.pos[0],
            a.call.span,
            "scatter_add: the first argument must be the result's type, such as f32[B, N, H]",
            "scatter_add(f32[B, N, H], idx, src, dim=1)",
        )
        return Expr(
            op,
            (a.sub(a.pos[1]), a.sub(a.pos[2])),
            value=d,
            dtype_arg=dt,
            shape_arg=shape,
            span=a.call.span,
        )
    kn = a.pos[1]
    if (
        isinstance(kn, Expr)
        and kn.op is Op.CONST
        and (not isinstance(kn.value, int) or kn.value < 1)
    ):
        raise InputError(
            f"{fname}: k must be a positive integer, got {kn.value!r}",
            kn.span or a.call.span,
            hint="k is how many of the largest entries to keep, e.g. topk(x, 2)",
        )
    k = lw._size_arg(kn)
    return Expr(op, (a.sub(a.pos[0]),), value=d, shape_arg=(k,), span=a.call.span)


def topk_k(e: Expr) -> int:
    """k of a TOPK or TOPK_INDICES node."""
    assert e.shape_arg is not None
    return e.shape_arg[0].value


def index_dims(e: Expr) -> int:
    """How many dimensions the indices of a typed GATHER or SCATTER_ADD node add in place
    of the indexed dimension (idx's rank minus `dim`)."""
    assert isinstance(e.value, int)
    return len(e.args[0 if e.op is Op.SCATTER_ADD else 1].type.shape) - e.value


# --- inference ----------------------------------------------------------------------


def infer(inf: Any, e: Expr) -> Expr:
    """Type, shape and layout of a routing node (docs/language.md, routing); `inf` is the
    Inferencer."""
    args = tuple(inf.infer(a, False) for a in e.args)
    fname = e.op.value
    G = inf.G
    for a in args:
        if a.type.dp.is_sliced or a.type.dp.is_local:
            raise InputError(
                f"{fname}: {describe(a)} is laid out over dp; routing on a rank grid's dp "
                "axis is not supported yet",
                e.span,
                hint="route before the value is sliced over dp",
            )

    def norm_dim(rank: int, what: str) -> int:
        assert isinstance(e.value, int)
        d = e.value + rank if e.value < 0 else e.value
        if not 0 <= d < rank:
            raise InputError(
                f"{fname}: dim={e.value} is out of range for {what} of rank {rank}",
                e.span,
                hint=f"dimensions are 0…{rank - 1} (or -1…-{rank})"
                if rank
                else "a scalar has no dimension to index",
            )
        return d

    def sdim(x: Expr) -> int | None:
        """The dimension x is sliced along (None: replicated); refuses other layouts."""
        ty = x.type
        if ty.layout.is_replicated:
            return None
        if ty.layout.is_local:
            raise InputError(
                f"{fname}: {describe(x)} is local (each rank holds its own partial value); "
                "routing reads whole or sliced values",
                e.span,
                hint="combine it first (allreduce or reducescatter)",
            )
        b = block_dim(ty.layout, ty.shape, G)
        if b is None:
            raise InputError(
                f"{fname}: {describe(x)} is flat-sliced and its chunks are not blocks of one "
                f"dimension of {format_shape(ty.shape)}",
                e.span,
                hint="slice it along a dimension (sliced(d)), or gather it first (allgather)",
            )
        return b

    def integer(x: Expr, what: str) -> None:
        if x.type.dtype.is_float:
            raise InputError(
                f"{fname}: {what} must be integers (i32 or i64), {describe(x)} is "
                f"{x.type.dtype.value}",
                e.span,
                hint=f"indices come from topk_indices or capacity_slots, or cast(i32, "
                f"{source_text(x)})",
            )

    def whole(x: Expr, b: int | None, d: int, what: str) -> None:
        if b == d:
            size = x.type.shape[d]
            other = next((k for k in range(len(x.type.shape)) if k != d), None)
            raise InputError(
                f"{fname} {what} dimension {d} ({size.text} = {size.value}), which "
                f"{describe(x)} is sliced along: an index may point into another rank's "
                "block, and the language does not insert the communication that would fetch "
                "it",
                e.span,
                hint=(
                    f"re-slice it first, `t = alltoall({source_text(x)}, from={d}, "
                    f"to={other})`, or gather it (allgather)"
                )
                if other is not None
                else "gather it first (allgather)",
            )

    pstage = inf._pstage(args, e.span)
    if e.op in (Op.TOPK, Op.TOPK_INDICES):
        (x,) = args
        ty = x.type
        rank = len(ty.shape)
        if rank == 0:
            raise InputError(
                f"{fname} needs a tensor of rank ≥ 1; {describe(x)} is a scalar", e.span
            )
        d = norm_dim(rank, describe(x))
        k = topk_k(e)
        n = ty.shape[d].value
        if k > n:
            raise InputError(
                f"{fname}: k={k} is more than the {n} entries of {describe(x)} along "
                f"dimension {d} ({ty.shape[d].text})",
                e.span,
                hint=f"k is at most {ty.shape[d].text} = {n}",
            )
        b = sdim(x)
        whole(x, b, d, "along")
        assert e.shape_arg is not None
        shape = ty.shape[:d] + (e.shape_arg[0],) + ty.shape[d + 1 :]
        dt = ty.dtype if e.op is Op.TOPK else INDEX_DTYPE
        lay = REPLICATED if b is None else sliced(b, shape)
        return _replace(e, args=args, value=d, ty=TensorType(dt, shape, lay, pstage))
    if e.op is Op.CAPACITY_SLOTS:
        (x,) = args
        ty = x.type
        integer(x, "the expert indices")
        if len(ty.shape) < 2:
            raise InputError(
                f"capacity_slots needs expert indices of rank ≥ 2 ([…, tokens, k]); "
                f"{describe(x)} is {format_shape(ty.shape)}",
                e.span,
                hint="the last dimension holds each token's k choices, e.g. [T, 1] for top-1",
            )
        b = sdim(x)
        rank = len(ty.shape)
        for d, what in (
            (rank - 2, "counts along the tokens'"),
            (rank - 1, "counts along the choices'"),
        ):
            whole(x, b, d, what)
        lay = REPLICATED if b is None else sliced(b, ty.shape)
        return _replace(e, args=args, ty=TensorType(INDEX_DTYPE, ty.shape, lay, pstage))

    # gather / scatter_add: the indexed dimension d of the data is replaced by idx's
    # dimensions after its first d (which match the data's first d)
    if e.op is Op.GATHER:
        x, idx = args
        data_shape = x.type.shape
        data_what = describe(x)
        d = norm_dim(len(data_shape), data_what)
        data = x
    else:
        idx, src = args
        assert e.shape_arg is not None and e.dtype_arg is not None
        data_shape = e.shape_arg
        d = norm_dim(len(data_shape), f"the result {format_shape(data_shape)}")
        data = src
    integer(idx, "the indices")
    ish = idx.type.shape
    if len(ish) <= d or shape_values(ish[:d]) != shape_values(data_shape[:d]):
        raise InputError(
            f"{fname}: the indices {describe(idx)}{format_shape(ish)} must have the first "
            f"{d} dimension{'s' if d != 1 else ''} of "
            + (
                f"{data_what}{format_shape(data_shape)}"
                if e.op is Op.GATHER
                else f"the result {format_shape(data_shape)}"
            )
            + f" and at least one more (the indices into dimension {d})",
            e.span,
            hint=f"for example idx of shape [{', '.join(s.text for s in data_shape[:d] + (Size('N', 0),))}]",
        )
    m = len(ish) - d
    b_idx = sdim(idx)
    if e.op is Op.GATHER:
        shape = data_shape[:d] + ish[d:] + data_shape[d + 1 :]
        b = sdim(x)
        whole(x, b, d, "indexes")
        dt = x.type.dtype
    else:
        shape = data_shape
        want = data_shape[:d] + ish[d:] + data_shape[d + 1 :]
        got = src.type.shape
        ok = len(got) == len(want) and all(
            g.value == w.value or (d <= j < d + m and g.value == 1)
            for j, (g, w) in enumerate(zip(got, want, strict=True))
        )
        if not ok:
            raise InputError(
                f"scatter_add: {describe(src)}{format_shape(got)} must have the shape "
                f"{format_shape(want)}: the result's dimensions with dimension {d} replaced "
                f"by those of the indices {format_shape(ish[d:])} (each of those may be 1, "
                "the same row for every index)",
                e.span,
            )
        b = sdim(src)
        if b is not None and d <= b < d + m:
            raise InputError(
                f"scatter_add: {describe(src)} is sliced along dimension {b}, one of the "
                "indices' dimensions: each rank would add only its part of the contributions",
                e.span,
                hint="slice it along another dimension, or gather it first (allgather)",
            )
        dt = e.dtype_arg
    layout: Layout = REPLICATED
    # each rank computes with its own arrays, so the slicing of the data and of the
    # indices must describe the same part of the result. A replicated one of the two,
    # where the other is sliced along a leading (batch) dimension, is read as the rank's
    # rows — `slice(…, b)`, as any replicated operand of a sliced computation
    # (docs/language.md, layout inference)
    if b is not None and b < d and b_idx is None:
        idx = inf._slice_replicated(idx, sliced(b, ish), ish)
        b_idx = b
    elif b is None and b_idx is not None and b_idx < d:
        dsh = data.type.shape
        data = inf._slice_replicated(data, sliced(b_idx, dsh), dsh)
        b = b_idx
    args = (data, idx) if e.op is Op.GATHER else (idx, data)
    if b is not None and b < d:
        if b_idx != b:
            raise InputError(
                f"{fname}: {describe(data)} is sliced along dimension {b} and the indices "
                f"{describe(idx)} along dimension {b_idx}; both must be sliced along "
                f"dimension {b} (each rank routes its own rows)",
                e.span,
                hint="slice the indices as the data, or gather them first (allgather)",
            )
        layout = sliced(b, shape)
    elif b is not None:
        # a dimension after the indexed one (or an index dimension of gather's indices)
        if b_idx is not None:
            raise InputError(
                f"{fname}: {describe(data)} is sliced along dimension {b} and the indices "
                f"{describe(idx)} along dimension {b_idx}; with data sliced after dimension "
                f"{d} the indices must be replicated",
                e.span,
                hint="gather the indices first (allgather)",
            )
        layout = sliced(b + m - 1 if e.op is Op.GATHER else b - m + 1, shape)
    elif b_idx is not None:
        if e.op is Op.SCATTER_ADD:
            raise InputError(
                f"scatter_add: the indices {describe(idx)} are sliced along dimension {b_idx}, "
                "one of their index dimensions: each rank would add only its part of the "
                "contributions",
                e.span,
                hint="gather the indices first (allgather)",
            )
        layout = sliced(b_idx, shape)  # each rank gathers its own indices' rows
    assert dt is not None
    return _replace(e, args=args, value=d, ty=TensorType(dt, shape, layout, pstage))


def label(e: Expr) -> str:
    """A routing stage's box in the graph: the operation with its k, E, C and dimension
    (`topk k=2 dim=2`, `capacity_slots E=8 C=128`)."""
    parts = [e.op.value]
    if e.op in (Op.TOPK, Op.TOPK_INDICES) and e.shape_arg:
        parts.append(f"k={e.shape_arg[0].text}")
    if e.op is Op.CAPACITY_SLOTS and e.shape_arg:
        parts += [f"E={e.shape_arg[0].text}", f"C={e.shape_arg[1].text}"]
    else:
        parts.append(f"dim={e.value}")
    return " ".join(parts)
