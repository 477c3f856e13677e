"""Type, shape and layout inference (docs/language.md: dtype, shape and layout rules).

`infer_expr` types one stage's expression bottom-up and canonicalizes it (a replicated
operand of the same shape as a sliced value it is combined with becomes `slice(x[, d])`).
`infer_program` re-types a whole program; transformations build untyped or stale
expressions and call it, so every step re-checks layout legality with the same rules
as the source.

Scalars (shape `[]`: literals, params, reductions) are weakly typed: combined with a
non-scalar tensor they take its dtype. Two non-scalar tensors of different dtypes need
an explicit `cast`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cocoviz.errors import InputError, Span
from cocoviz.ir import axes, routing
from cocoviz.ir.collectives import collective
from cocoviz.ir.nodes import (
    AXIS_NAMES,
    AXIS_REDUCTIONS,
    BINARY_CALLS,
    BINARY_INFIX,
    COLLECTIVES,
    COMPARISONS,
    CONSTANTS,
    PERMUTES,
    REDUCTIONS,
    ROUTING,
    ROWWISE,
    UNARY_CALLS,
    Expr,
    Grid,
    Op,
    Program,
    Stage,
    permutation,
)
from cocoviz.ir.operands import describe, source_text
from cocoviz.ir.operands import replace_fields as _replace
from cocoviz.ir.types import (
    FLAT,
    LOCAL,
    REPLICATED,
    DType,
    Layout,
    LayoutKind,
    Shape,
    Size,
    TensorType,
    block_dim,
    format_shape,
    numel,
    same_slicing,
    shape_values,
    sliced,
)

Env = Mapping[str, TensorType]


def _fmt(ty: TensorType) -> str:
    return f"{ty.dtype.value}{format_shape(ty.shape)} {ty.layout}"


def promote_weak(a: DType, b: DType) -> DType:
    """The dtype of a combination of two scalars."""
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.is_float:
        if DType.F64 in (a, b):
            return DType.F64
        return DType.F32
    return DType.I64


def check_divisible(shape: Shape, layout: Layout, group: int, span: Span | None, what: str) -> None:
    """A sliced extent (or numel, for flat) must divide by the group size."""
    if not layout.is_sliced or group == 1:
        return
    if layout.dim is None:
        n = numel(shape)
        if n % group:
            raise InputError(
                f"{what} is sliced over {group} ranks but its {n} elements "
                f"({format_shape(shape)}) do not divide by {group}",
                span,
                hint="change a size with -D, or the rank count with --ranks",
            )
        return
    size = shape[layout.dim]
    if size.value % group:
        raise InputError(
            f"{what} is sliced along dimension {layout.dim} ({size.text} = {size.value}), "
            f"which does not divide by {group} ranks",
            span,
            hint="change a size with -D, or the rank count with --ranks",
        )


def broadcast_shapes(shapes: Sequence[tuple[Shape, Span | None]]) -> Shape:
    """Numpy trailing-dimension broadcasting; sizes compared by value."""
    first = shapes[0][0] if shapes else ()
    if all(shape is first for shape, _ in shapes):
        return first  # one shape object (most operands are typed by the same declaration)
    rank = max((len(s) for s, _ in shapes), default=0)
    out: list[Size] = []
    for i in range(rank):
        chosen: Size | None = None
        for shape, span in shapes:
            j = i - (rank - len(shape))
            if j < 0:
                continue
            s = shape[j]
            if chosen is None or chosen.value == 1:
                if chosen is not None and s.value == 1:
                    continue
                chosen = s
            elif s.value != 1 and s.value != chosen.value:
                others = ", ".join(format_shape(sh) for sh, _ in shapes)
                raise InputError(
                    f"shapes do not broadcast: {others} (dimension {i - rank}: "
                    f"{chosen.text} = {chosen.value} vs {s.text} = {s.value})",
                    span,
                )
        assert chosen is not None
        out.append(chosen)
    return tuple(out)


class Inferencer:
    """Types expressions against an environment of named values."""

    def __init__(
        self,
        grid: Grid,
        env: dict[str, TensorType],
        inputs: set[str],
        memoize: bool = False,
    ) -> None:
        self.grid = grid
        self.env = env
        self.inputs = inputs
        self.G = grid.group
        """Ranks a collective runs over (the grid's group; read at every node)."""
        self.memoize = memoize
        """Whether the memoized rules look their key up (for typing a whole program, as
        lowering does: a large one applies each rule to a handful of distinct operand
        types over and over, every layer of a stack alike; a few stages typed after a
        step would only pay for the keys)."""
        self.known: dict[tuple[Any, ...], tuple[TensorType, ...]] = {}
        """The type each memoized rule gave, by `_type_key`, with the operand types of
        the key (held, so that no other object takes their ids)."""
        self.types: dict[TensorType, TensorType] = {}
        """One object for each value of the types memoized rules gave, so that types
        equal in value are equal in identity too, and so are the keys of the rules
        reading them (the next layer of a stack finds every rule known)."""

    # --- helpers --------------------------------------------------------------------
    def _pstage(self, args: Sequence[Expr], span: Span | None) -> int | None:
        found: tuple[int, Expr] | None = None
        for a in args:
            p = a.type.pstage
            if p is None:
                continue
            if found is None:
                found = (p, a)
            elif found[0] != p:
                early = found[1] if found[0] < p else a
                lo, hi = min(found[0], p), max(found[0], p)
                name = source_text(early)
                steps = "" if hi - lo == 1 else f" ({hi - lo} sends to reach stage {hi})"
                raise InputError(
                    f"operands live on different pipeline stages: {describe(found[1])} is on "
                    f"stage {found[0]}, {describe(a)} on stage {p}",
                    a.span or span,
                    hint=f"send it first: `{_ident(name)}_next = send({name})` moves it from "
                    f"stage {lo} to stage {lo + 1}{steps}",
                )
        return found[0] if found else None

    def _dtype(self, args: Sequence[Expr], span: Span | None) -> DType:
        tensors = [a for a in args if not a.type.is_scalar]
        if tensors:
            first = tensors[0]
            dt = first.type.dtype
            for a in tensors[1:]:
                if a.type.dtype != dt:
                    raise InputError(
                        f"operands have different dtypes: {describe(first)} is "
                        f"{dt.value}, {describe(a)} is {a.type.dtype.value}; mixing dtypes "
                        "needs an explicit cast",
                        a.span or span,
                        hint=f"convert one of them, e.g. cast({dt.value}, {source_text(a)})",
                    )
            if not dt.is_float:
                for a in args:
                    if a.op is Op.CONST and isinstance(a.value, float) and a.value != int(a.value):
                        raise InputError(
                            f"the literal {a.value!r} would be converted to {dt.value} (the "
                            f"dtype of {describe(first)}) and lose its fraction",
                            a.span or span,
                            hint=f"compute in floating point: cast(f32, {source_text(first)})",
                        )
            return dt
        dt = args[0].type.dtype
        for a in args[1:]:
            dt = promote_weak(dt, a.type.dtype)
        return dt

    def _layout(self, args: Sequence[Expr], shape: Shape, span: Span | None) -> Layout:
        """Combine operand layouts for an elementwise op with result shape `shape`."""
        result: tuple[Layout, Expr] | None = None
        lower_sliced: list[Expr] = []
        for a in args:
            lay = a.type.layout
            if lay.is_replicated:
                continue
            if (
                lay.is_sliced
                and a.type.shape is not shape
                and shape_values(a.type.shape) != shape_values(shape)
            ):
                lower_sliced.append(a)
                continue
            if result is None:
                result = (lay, a)
                continue
            prev, pa = result
            if prev.is_local and lay.is_local:
                continue
            if prev.is_sliced and lay.is_sliced:
                if not same_slicing(prev, pa.type.shape, lay, a.type.shape, self.G):
                    raise InputError(
                        f"sliced operands are sliced differently: {describe(pa)} is {prev}, "
                        f"{describe(a)} is {lay}",
                        a.span or span,
                        hint="both operands must hold the same global elements on every rank",
                    )
                continue
            sl, lo = (pa, a) if prev.is_sliced else (a, pa)
            raise InputError(
                f"cannot combine sliced {describe(sl)} with local {describe(lo)}",
                a.span or span,
                hint="a local value holds different full-size contents on each rank: reduce it "
                "first (allreduce or reducescatter)",
            )
        if result is None and lower_sliced:
            # Only broadcast operands are sliced: the result is sliced along the dimension
            # they are sliced on (replicated full-shape operands adopt that layout).
            a = lower_sliced[0]
            ad = block_dim(a.type.layout, a.type.shape, self.G)
            if ad is None:
                raise InputError(
                    f"{describe(a)} is flat-sliced with a broadcast shape "
                    f"{format_shape(a.type.shape)} whose chunks are not blocks of one "
                    "dimension, so it cannot be broadcast",
                    a.span or span,
                    hint="make it replicated, or slice it along a dimension (sliced(d))",
                )
            result = (sliced(len(shape) - len(a.type.shape) + ad, shape), a)
        for a in lower_sliced:
            assert result is not None
            if result[0].is_local:
                raise InputError(
                    f"cannot combine sliced {describe(a)} with local {describe(result[1])}",
                    a.span or span,
                    hint="a local value holds different full-size contents on each rank: "
                    "reduce it first (allreduce or reducescatter)",
                )
            prev, pa = result
            rd = block_dim(prev, shape, self.G)
            ad = block_dim(a.type.layout, a.type.shape, self.G)
            if rd is None or ad is None or len(shape) - rd != len(a.type.shape) - ad:
                raise InputError(
                    f"{describe(a)} is sliced {_along(ad, a.type.shape)}, but {describe(pa)} "
                    f"is sliced {_along(rd, pa.type.shape)}: a sliced broadcast operand must be "
                    "sliced along the result's sliced dimension",
                    a.span or span,
                    hint=f"make {describe(a)} replicated (broadcast operands are read at the "
                    "global index of each element)",
                )
        if result is None:
            return REPLICATED
        lay = result[0]
        if lay.is_sliced:
            return FLAT if lay.dim is None else sliced(lay.dim, shape)
        return lay

    def _slice_replicated(self, e: Expr, layout: Layout, shape: Shape) -> Expr:
        """Canonicalize: a replicated operand of the result's shape becomes `slice(x[, d])`."""
        ty = e.type
        if not ty.layout.is_replicated or (
            ty.shape is not shape and shape_values(ty.shape) != shape_values(shape)
        ):
            return e
        if e.op in CONSTANTS:  # `slice(zeros(…))` would read a slice of nothing stored
            return _replace(e, ty=_replace(ty, layout=layout))
        if e.op in BINARY_INFIX | BINARY_CALLS | UNARY_CALLS | {
            Op.NEG,
            Op.CAST,
            Op.WHERE,
            Op.DROPOUT,
        }:
            args = tuple(self._slice_replicated(a, layout, shape) for a in e.args)
            return _replace(e, args=args, ty=_replace(ty, layout=layout))
        if e.op in COMPARISONS:
            args = tuple(self._slice_replicated(a, layout, shape) for a in e.args)
            return _replace(e, args=args, ty=_replace(ty, layout=layout))
        return Expr(
            Op.SLICE,
            (e,),
            value=layout.dim,
            ty=_replace(ty, layout=layout),
            span=e.span,
        )

    def _memoized(
        self, e: Expr, args: tuple[Expr, ...], rule: Callable[[Expr, tuple[Expr, ...]], Expr]
    ) -> Expr:
        """`rule(e, args)`, for a rule that only types `e` over its typed operands `args`
        (the result holds them as they are): the type it gave before for the same key
        (`_type_key`), else what it gives now."""
        if not self.memoize:
            return rule(e, args)
        key = _type_key(e, args)
        known = None if key is None else self.known.get(key)
        if known is not None:
            return _replace(e, args=args, ty=known[0])
        typed = rule(e, args)
        return typed if key is None else self._remember(key, typed, args)

    def _remember(self, key: tuple[Any, ...], typed: Expr, args: tuple[Expr, ...]) -> Expr:
        """`typed`, what a rule gave for `key` (its type made the one object of its
        value), with its type kept for `key`."""
        ty = self.types.setdefault(typed.type, typed.type)
        self.known[key] = (ty, *[a.type for a in args])
        return typed if ty is typed.ty else _replace(typed, ty=ty)

    # --- the rules ------------------------------------------------------------------
    def infer(self, e: Expr, top: bool = True) -> Expr:
        if e.op is Op.REF:  # the most frequent node: typed here, without a rule call
            ty = self.env.get(e.name)  # type: ignore[arg-type]
            if ty is not None:
                return _replace(e, ty=ty)
            return self._ref(e)  # raises the error
        if self.grid.has_dp:
            return axes.infer(self, e)  # the tp rules, then the dp rules
        return self._dispatch(e)

    def _dispatch(self, e: Expr) -> Expr:
        """The tp rule of `e` (docs/language.md, layout inference)."""
        rule = _RULES.get(e.op)
        if rule is None:
            return self._elementwise(e)
        return rule(self, e)

    def _ref(self, e: Expr) -> Expr:
        assert e.name is not None
        ty = self.env.get(e.name)
        if ty is None:
            raise InputError(f"unknown name '{e.name}'", e.span)
        return _replace(e, ty=ty)

    def _const(self, e: Expr) -> Expr:
        dt = DType.I32 if isinstance(e.value, int) else DType.F32
        return _replace(e, ty=TensorType(dt, (), REPLICATED, None))

    def _elementwise(self, e: Expr) -> Expr:
        args = tuple([self.infer(a, False) for a in e.args])
        key = _type_key(e, args) if self.memoize else None
        known = None if key is None else self.known.get(key)
        if known is None:
            typed = self._elementwise_rule(e, args)
            return typed if key is None else self._remember(key, typed, args)
        ty = known[0]
        if ty.layout.is_sliced:  # canonicalized as the rule does
            args = tuple([self._slice_replicated(a, ty.layout, ty.shape) for a in args])
        return _replace(e, args=args, ty=ty)

    def _elementwise_rule(self, e: Expr, args: tuple[Expr, ...]) -> Expr:
        if e.op is Op.WHERE:
            cond, a, b = args
            operands: tuple[Expr, ...] = (cond, a, b)
            if a.type.is_scalar and b.type.is_scalar and not cond.type.is_scalar:
                # both branches are weak scalars: they take the compared tensor's dtype
                dtype = cond.type.dtype
            else:
                dtype = self._dtype((a, b), e.span)
        elif e.op is Op.CAST:
            operands = args
            assert e.dtype_arg is not None
            dtype = e.dtype_arg
        else:
            operands = args
            dtype = self._dtype(args, e.span)
        if e.op in COMPARISONS:
            dtype = self._dtype(args, e.span)
        if e.op in (Op.SQRT, Op.RSQRT, Op.EXP, Op.LOG, Op.TANH, Op.SIGMOID, Op.GELU) and (
            not dtype.is_float
        ):
            raise InputError(
                f"{e.op.value} needs a floating-point operand, got {dtype.value}",
                e.span,
                hint=f"cast it first, e.g. {e.op.value}(cast(f32, "
                f"{source_text(operands[0]) if operands else '…'}))",
            )
        shape = broadcast_shapes([(a.type.shape, a.span) for a in operands])
        layout = self._layout(operands, shape, e.span)
        if layout.is_sliced:
            check_divisible(shape, layout, self.G, e.span, "the result")
            operands = tuple(self._slice_replicated(a, layout, shape) for a in operands)
        pstage = self._pstage(operands, e.span)
        return _replace(e, args=operands, ty=TensorType(dtype, shape, layout, pstage))

    def _slice(self, e: Expr) -> Expr:
        (x,) = (self.infer(a, False) for a in e.args)
        if not x.type.layout.is_replicated:
            raise InputError(
                f"slice() takes a replicated value; {describe(x)} is {x.type.layout}",
                e.span,
            )
        if x.type.is_scalar:
            raise InputError("slice() of a scalar: a scalar cannot be sliced", e.span)
        d = e.value
        if d is not None:
            assert isinstance(d, int)
            if not -len(x.type.shape) <= d < len(x.type.shape):
                raise InputError(
                    f"slice dimension {d} is out of range for {format_shape(x.type.shape)}",
                    e.span,
                )
        layout = sliced(d if isinstance(d, int) else None, x.type.shape)
        check_divisible(x.type.shape, layout, self.G, e.span, describe(x))
        return _replace(e, args=(x,), value=layout.dim, ty=_replace(x.type, layout=layout))

    def _dropout(self, e: Expr) -> Expr:
        (x,) = (self.infer(a, False) for a in e.args)
        if not x.type.dtype.is_float:
            raise InputError(
                f"dropout needs a floating-point operand, got {x.type.dtype.value}", e.span
            )
        return _replace(e, args=(x,), ty=x.type)

    def _rowwise(self, e: Expr) -> Expr:
        args = tuple(self.infer(a, False) for a in e.args)
        x = args[0]
        ty = x.type
        if len(ty.shape) == 0:
            raise InputError(f"{e.op.value} needs a tensor of rank ≥ 1, got a scalar", e.span)
        if not ty.dtype.is_float:
            raise InputError(
                f"{e.op.value} needs a floating-point operand, got {ty.dtype.value}", e.span
            )
        last = ty.shape[-1]
        for p in args[1:]:
            pt = p.type
            if shape_values(pt.shape) != (last.value,):
                raise InputError(
                    f"{e.op.value}: {describe(p)} must have shape [{last.text}] (the last "
                    f"dimension of {describe(x)}), got {format_shape(pt.shape)}",
                    p.span or e.span,
                )
            if pt.dtype != ty.dtype:
                raise InputError(
                    f"{e.op.value}: {describe(p)} is {pt.dtype.value} but {describe(x)} is "
                    f"{ty.dtype.value}",
                    p.span or e.span,
                    hint=f"cast({ty.dtype.value}, {source_text(p)})",
                )
            if not pt.layout.is_replicated:
                raise InputError(
                    f"{e.op.value}: {describe(p)} must be replicated, got {pt.layout}",
                    p.span or e.span,
                )
        if ty.layout.is_sliced:
            G = self.G
            if ty.layout.dim is None:
                if (ty.numel // G) % last.value:
                    raise InputError(
                        f"{e.op.value} works on whole rows, but each rank's chunk of "
                        f"{describe(x)} ({ty.numel} / {G} = {ty.numel // G} elements) splits "
                        f"rows of length {last.text} = {last.value}",
                        e.span,
                        hint="slice along a dimension other than the last, or change sizes",
                    )
            elif ty.layout.dim == len(ty.shape) - 1:
                raise InputError(
                    f"{e.op.value} works on whole rows of the last dimension, but "
                    f"{describe(x)} is sliced along it ({ty.layout})",
                    e.span,
                    hint="gather it first (allgather), or slice along another dimension",
                )
        pstage = self._pstage(args, e.span)
        # x's own type object when the stage is x's (as a dropout's), so that a memoized
        # rule reading the result knows its type
        return _replace(e, args=args, ty=ty if pstage == ty.pstage else _replace(ty, pstage=pstage))

    def _reduction(self, e: Expr) -> Expr:
        (x,) = (self.infer(a, False) for a in e.args)
        ty = x.type
        layout = LOCAL if ty.layout.is_local else REPLICATED
        return _replace(
            e,
            args=(x,),
            ty=TensorType(ty.dtype.reduction_dtype, (), layout, ty.pstage),
        )

    def _matmul(self, e: Expr) -> Expr:
        a, b = (self.infer(x, False) for x in e.args)
        return self._memoized(e, (a, b), self._matmul_rule)

    def _matmul_rule(self, e: Expr, args: tuple[Expr, ...]) -> Expr:
        a, b = args
        at, bt = a.type, b.type
        if len(at.shape) < 2:
            raise InputError(
                f"matmul: the left operand {describe(a)} must have rank ≥ 2, got "
                f"{format_shape(at.shape)}",
                a.span or e.span,
            )
        if len(bt.shape) < 2:
            raise InputError(
                f"matmul: the right operand {describe(b)} must have rank ≥ 2, got "
                f"{format_shape(bt.shape)}",
                b.span or e.span,
            )
        k1, k2 = at.shape[-1], bt.shape[-2]
        if k1.value != k2.value:
            raise InputError(
                f"matmul: contraction sizes differ: {describe(a)}{format_shape(at.shape)} has "
                f"K = {k1.text} = {k1.value}, {describe(b)}{format_shape(bt.shape)} has "
                f"K = {k2.text} = {k2.value}",
                e.span,
                hint="matmul(a, b) contracts the last dimension of a with the first of b"
                if len(bt.shape) == 2
                else "matmul(a, b) contracts the last dimension of a with the second-to-last of b",
            )
        batch = _matmul_batch(a, b, e.span) if len(bt.shape) > 2 else None
        if at.dtype != bt.dtype:
            raise InputError(
                f"matmul: operands have different dtypes: {describe(a)} is {at.dtype.value}, "
                f"{describe(b)} is {bt.dtype.value}; mixing dtypes needs an explicit cast",
                e.span,
                hint=f"cast one of them in a stage of its own, e.g. "
                f"`{_ident(source_text(b))}_{at.dtype.value} = cast({at.dtype.value}, "
                f"{source_text(b)})`",
            )
        if not at.dtype.is_float:
            raise InputError("matmul needs floating-point operands", e.span)
        if batch is not None:
            return self._batched_matmul(e, a, b, batch)
        shape = at.shape[:-1] + (bt.shape[1],)
        G = self.G
        la, lb = at.layout, bt.layout
        ka = len(at.shape) - 1
        da = block_dim(la, at.shape, G)
        db = block_dim(lb, bt.shape, G)
        layout: Layout
        if la.is_replicated and lb.is_replicated:
            layout = REPLICATED
        elif la.is_sliced and lb.is_sliced and da == ka and db == 0:
            layout = LOCAL
        elif la.is_sliced and lb.is_replicated and da != ka:
            if la.dim is None and (at.numel // G) % k1.value:
                raise InputError(
                    f"matmul: {describe(a)} is flat-sliced but each rank's chunk "
                    f"({at.numel // G} elements) is not whole rows of length K = {k1.value}",
                    a.span or e.span,
                    hint="slice it along a dimension other than the last",
                )
            layout = FLAT if la.dim is None else sliced(la.dim, shape)
        elif la.is_replicated and lb.is_sliced and db == 1:
            layout = sliced(-1, shape)
        elif la.is_local and (lb.is_local or lb.is_replicated):
            layout = LOCAL
        else:
            raise InputError(*_matmul_layout_error(a, b, da, db, e.span))
        if layout.is_sliced:
            check_divisible(shape, layout, G, e.span, "the matmul result")
        pstage = self._pstage((a, b), e.span)
        return _replace(e, args=(a, b), ty=TensorType(at.dtype, shape, layout, pstage))

    def _batched_matmul(self, e: Expr, a: Expr, b: Expr, batch: Shape) -> Expr:
        """`a[..., M, K] × b[..., K, N]` with b of rank ≥ 3 (docs/language.md, matmul)."""
        at, bt = a.type, b.type
        shape = batch + (at.shape[-2], bt.shape[-1])
        G = self.G
        la, lb = at.layout, bt.layout
        ra, rb, r = len(at.shape), len(bt.shape), len(shape)
        da = block_dim(la, at.shape, G)
        db = block_dim(lb, bt.shape, G)
        for x, d in ((a, da), (b, db)):
            if x.type.layout.is_sliced and d is None:
                raise InputError(
                    f"matmul: {describe(x)} is flat-sliced, but its chunks are not blocks of "
                    f"one dimension of {format_shape(x.type.shape)}",
                    x.span or e.span,
                    hint=f"slice {describe(x)} along a dimension (sliced(d))",
                )
        # the result dimension each operand's block dimension is aligned with (batch dims)
        ia = da + r - ra if da is not None and da < ra - 2 else None
        ib = db + r - rb if db is not None and db < rb - 2 else None
        layout: Layout
        if la.is_replicated and lb.is_replicated:
            layout = REPLICATED
        elif la.is_local and (lb.is_local or lb.is_replicated):
            layout = LOCAL
        elif ia is not None and (lb.is_replicated or ib == ia):
            layout = sliced(ia, shape)
        elif ib is not None and la.is_replicated:
            layout = sliced(ib, shape)
        elif la.is_sliced and da == ra - 2 and lb.is_replicated:
            layout = sliced(r - 2, shape)
        elif la.is_replicated and lb.is_sliced and db == rb - 1:
            layout = sliced(r - 1, shape)
        elif la.is_sliced and lb.is_sliced and da == ra - 1 and db == rb - 2:
            layout = LOCAL
        else:
            raise InputError(*_batched_matmul_layout_error(a, b, shape, da, db, e.span))
        if layout.is_sliced:
            check_divisible(shape, layout, G, e.span, "the matmul result")
        pstage = self._pstage((a, b), e.span)
        return _replace(e, args=(a, b), ty=TensorType(at.dtype, shape, layout, pstage))

    def _reshape(self, e: Expr) -> Expr:
        """`reshape(x, S1, …)`: the same elements in row-major order; each rank keeps its
        part as the same row-major array (docs/language.md, reshape)."""
        (x,) = (self.infer(a, False) for a in e.args)
        ty = x.type
        new = e.shape_arg
        assert new is not None
        if numel(new) != ty.numel:
            raise InputError(
                f"reshape: {describe(x)}{format_shape(ty.shape)} has {ty.numel} elements, "
                f"the new shape {format_shape(new)} has {numel(new)}",
                e.span,
                hint="the sizes must multiply to the same number of elements",
            )
        layout = ty.layout
        G = self.G
        if layout.is_sliced and layout.dim is not None:
            d = layout.dim
            prefix = numel(ty.shape[:d])
            found = [
                j
                for j in range(len(new))
                if numel(new[:j]) == prefix and new[j].value % G == 0 and new[j].value > 1
            ]
            if not found:
                size = ty.shape[d]
                raise InputError(
                    f"reshape: {describe(x)} is sliced({d}) along {size.text} = {size.value}, "
                    f"but no dimension of {format_shape(new)} starts after the same "
                    f"{prefix} leading rows and divides by {G}, so the ranks' parts would "
                    "not stay whole",
                    e.span,
                    hint=f"keep the dimensions before {size.text} (their product {prefix}) "
                    f"as leading dimensions and a dimension that divides by {G} after them, "
                    "or gather it first (allgather)",
                )
            layout = sliced(found[0], new)
        pstage = self._pstage((x,), e.span)
        return _replace(e, args=(x,), ty=TensorType(ty.dtype, new, layout, pstage))

    def _permute(self, e: Expr) -> Expr:
        """`transpose(x, d0, d1)` / `permute(x, p…)`: the dimensions reordered; a sliced
        dimension moves with its data, so each rank permutes its own block
        (docs/language.md, transpose and permute)."""
        (x,) = (self.infer(a, False) for a in e.args)
        ty = x.type
        fname = e.op.value
        rank = len(ty.shape)
        assert e.tag is not None
        written = [int(v) for v in e.tag.split(",")]
        if e.op is Op.TRANSPOSE and rank < 2:
            raise InputError(
                f"transpose needs a value of rank ≥ 2; {describe(x)} is "
                f"{format_shape(ty.shape)}",
                e.span,
                hint="a vector or a scalar has nothing to transpose",
            )
        if e.op is Op.PERMUTE and len(written) != rank:
            raise InputError(
                f"permute: {describe(x)}{format_shape(ty.shape)} has {rank} dimensions, the "
                f"permutation lists {len(written)}",
                e.span,
                hint=f"list each of the dimensions 0…{rank - 1} once, e.g. permute("
                f"{source_text(x)}, {', '.join(str(i) for i in reversed(range(rank)))})"
                if rank
                else "a scalar has no dimensions to permute",
            )
        dims: list[int] = []
        for v in written:
            if not -rank <= v < rank:
                raise InputError(
                    f"{fname}: dimension {v} is out of range for {describe(x)} of rank {rank}",
                    e.span,
                    hint=f"dimensions are 0…{rank - 1} (or -1…-{rank})",
                )
            dims.append(v + rank if v < 0 else v)
        if e.op is Op.PERMUTE and sorted(dims) != list(range(rank)):
            twice = sorted({d for d in dims if dims.count(d) > 1})
            raise InputError(
                f"permute: ({', '.join(map(str, written))}) is not a permutation of the "
                f"dimensions 0…{rank - 1}: dimension {twice[0]} appears twice",
                e.span,
                hint="list each dimension exactly once",
            )
        e = _replace(e, args=(x,), tag=",".join(map(str, dims)))
        perm = permutation(e)
        shape = tuple(ty.shape[p] for p in perm)
        layout = ty.layout
        if layout.is_sliced:
            d = block_dim(layout, ty.shape, self.G)
            if d is None:
                raise InputError(
                    f"{fname}: {describe(x)} is flat-sliced and its chunks are not blocks of "
                    f"one dimension of {format_shape(ty.shape)}, so they cannot be permuted "
                    "rank by rank",
                    e.span,
                    hint="slice it along a dimension (sliced(d)), or gather it first "
                    "(allgather)",
                )
            layout = sliced(perm.index(d), shape)
        pstage = self._pstage((x,), e.span)
        return _replace(e, ty=TensorType(ty.dtype, shape, layout, pstage))

    def _constant(self, e: Expr) -> Expr:
        """`zeros/ones/full/iota(T[DIMS], …)`: replicated, on every pipeline stage; combined
        with a sliced value it is read as `slice(…)`, as any replicated operand
        (docs/language.md, constants)."""
        assert e.dtype_arg is not None and e.shape_arg is not None
        return _replace(e, ty=TensorType(e.dtype_arg, e.shape_arg, REPLICATED, None))

    def _routing(self, e: Expr) -> Expr:
        """gather, scatter_add, topk, topk_indices, capacity_slots (docs/language.md,
        routing; the rules are in cocoviz/ir/routing.py)."""
        return routing.infer(self, e)

    def _axis_reduction(self, e: Expr) -> Expr:
        """`sum/mean/amax/amin(x, dim=d, keepdim=…)` (docs/language.md, reductions along
        a dimension): each rank reduces its own array along d. Along a dimension x is
        sliced on, `sum` and `mean` give local partial sums for the program to combine
        (allreduce or reducescatter: communication is written, never inserted);
        `amax` and `amin` there are an error."""
        (x,) = (self.infer(a, False) for a in e.args)
        ty = x.type
        fname = AXIS_NAMES[e.op]
        rank = len(ty.shape)
        if rank == 0:
            raise InputError(
                f"{fname}(…, dim=…) needs a tensor of rank ≥ 1; {describe(x)} is a scalar",
                e.span,
            )
        assert isinstance(e.value, int)
        d = e.value + rank if e.value < 0 else e.value
        if not 0 <= d < rank:
            raise InputError(
                f"{fname}: dim={e.value} is out of range for {describe(x)} of rank {rank}",
                e.span,
                hint=f"dimensions are 0…{rank - 1} (or -1…-{rank})",
            )
        if e.op is Op.MEAN and not ty.dtype.is_float:
            raise InputError(
                f"mean needs a floating-point operand, got {ty.dtype.value}",
                e.span,
                hint=f"cast it first, e.g. mean(cast(f32, {source_text(x)}), dim={e.value})",
            )
        keep = e.tag == "keepdim"
        shape = ty.shape[:d] + ((Size("1", 1),) if keep else ()) + ty.shape[d + 1 :]
        layout = ty.layout
        if layout.is_sliced:
            b = block_dim(layout, ty.shape, self.G)
            if b is None:
                raise InputError(
                    f"{fname}: {describe(x)} is flat-sliced and its chunks are not blocks of "
                    f"one dimension of {format_shape(ty.shape)}, so no rank holds whole lines "
                    f"along dimension {d}",
                    e.span,
                    hint="slice it along a dimension (sliced(d)), or gather it first "
                    "(allgather)",
                )
            if b == d and e.op in (Op.SUM_DIM, Op.MEAN):
                layout = LOCAL
            elif b == d:
                size = ty.shape[d]
                other = next((k for k in range(rank) if k != d), None)
                raise InputError(
                    f"{fname} along dimension {d} ({size.text} = {size.value}), which "
                    f"{describe(x)} is sliced along: each rank holds {size.value // self.G} of "
                    f"its {size.value} entries, and the language does not insert the "
                    f"allreduce({'max' if e.op is Op.AMAX_DIM else 'min'}) that would finish "
                    "it",
                    e.span,
                    hint=(
                        f"re-slice it first, `t = alltoall({source_text(x)}, from={d}, "
                        f"to={other})`, then {fname}(t, dim={d}); or gather it (allgather)"
                    )
                    if other is not None
                    else "gather it first (allgather)",
                )
            else:
                layout = sliced(b if keep or b < d else b - 1, shape)
        pstage = self._pstage((x,), e.span)
        return _replace(
            e, args=(x,), value=d, ty=TensorType(ty.dtype, shape, layout, pstage)
        )

    def _update(self, e: Expr) -> Expr:
        t, v = (self.infer(x, False) for x in e.args)
        if t.op is not Op.REF or t.name not in self.inputs:
            raise InputError(
                f"update: the first operand must be a program input, got {describe(t)}",
                t.span or e.span,
                hint="update(t, e) writes e into input t in place",
            )
        tt, vt = t.type, v.type
        if shape_values(tt.shape) != shape_values(vt.shape) or tt.dtype != vt.dtype:
            raise InputError(
                f"update: the new value of '{t.name}' must be "
                f"{tt.dtype.value}{format_shape(tt.shape)} like '{t.name}' (no broadcasting "
                f"or conversion), got {vt.dtype.value}{format_shape(vt.shape)}",
                v.span or e.span,
                hint=f"cast({tt.dtype.value}, …) converts the dtype"
                if shape_values(tt.shape) == shape_values(vt.shape)
                else None,
            )
        lt, lv = tt.layout, vt.layout
        layout: Layout
        if lt.is_replicated and lv.is_replicated:
            layout = REPLICATED
        elif lt.is_replicated and lv.is_sliced:
            layout = lv
        elif lt.is_sliced and lv.is_sliced and same_slicing(lt, tt.shape, lv, vt.shape, self.G):
            layout = lt
        elif lt.is_local and lv.is_local:
            layout = LOCAL
        else:
            raise InputError(
                f"update: cannot write a {lv} value into {lt} input '{t.name}'",
                e.span,
                hint=_update_hint(t, v),
            )
        pstage = self._pstage((t, v), e.span)
        return _replace(e, args=(t, v), ty=TensorType(tt.dtype, tt.shape, layout, pstage))

    def _collective(self, e: Expr) -> Expr:
        (x,) = (self.infer(a, False) for a in e.args)
        if not self.memoize or collective(e.op).reslices:
            return self._collective_rule(e, (x,))  # (a reslice normalizes `value`, `tag`)
        return self._memoized(e, (x,), self._collective_rule)

    def _collective_rule(self, e: Expr, args: tuple[Expr, ...]) -> Expr:
        """The layout rule of a collective, from its row of the collectives table."""
        (x,) = args
        ty = x.type
        op = e.op
        G = self.G
        row = collective(op)
        if not row.operand.accepts(ty.layout):
            raise InputError(
                f"{op.value} needs {row.operand.value}; {describe(x)} is {ty.layout}",
                e.span,
                hint=row.operand_hint,
            )
        if row.result is None:  # to the next pipeline stage
            if not self.grid.is_grid or self.grid.pp < 2:
                raise InputError(
                    f"{op.value} moves a value to the next pipeline stage, but this program "
                    "has no pipeline stages",
                    e.span,
                    hint="declare a grid: ranks tp=T, pp=P",
                )
            p = ty.pstage if ty.pstage is not None else 0
            if p + 1 >= self.grid.pp:
                raise InputError(
                    f"{op.value} of {describe(x)} on the last pipeline stage ({p}): there is "
                    "no next stage",
                    e.span,
                )
            return _replace(e, args=(x,), ty=_replace(ty, pstage=p + 1))
        if row.reslices:
            return self._reslice(e, x)
        if row.result.is_sliced:
            check_divisible(ty.shape, row.result, G, e.span, f"{op.value} of {describe(x)}")
        if row.rooted:
            root = e.value if isinstance(e.value, int) else 0
            if not 0 <= root < G:
                raise InputError(
                    f"{op.value}: root {root} is not a rank of the group (0…{G - 1})", e.span
                )
        return _replace(e, args=(x,), ty=_replace(ty, layout=row.result))

    def _reslice(self, e: Expr, x: Expr) -> Expr:
        """`alltoall(x, from=d, to=e)`: the same global value, sliced along e instead of d."""
        ty = x.type
        fname = e.op.value
        rank = len(ty.shape)
        d = block_dim(ty.layout, ty.shape, self.G)
        if d is None:
            raise InputError(
                f"{fname} needs an operand sliced along a dimension; {describe(x)} is "
                f"flat-sliced and its first dimension does not split in {self.G} blocks",
                e.span,
                hint="declare or produce it sliced(d) for the dimension it is split along",
            )

        def dim(v: int, key: str) -> int:
            k = v + rank if v < 0 else v
            if not 0 <= k < rank:
                raise InputError(
                    f"{fname}: {key}={v} is out of range for {describe(x)} of rank {rank}",
                    e.span,
                )
            return k

        if e.tag is not None:
            f = dim(int(e.tag), "from")
            if block_dim(sliced(f, ty.shape), ty.shape, self.G) != d:
                raise InputError(
                    f"{fname}: from={e.tag}, but {describe(x)} is {ty.layout} (sliced along "
                    f"dimension {d})",
                    e.span,
                    hint=f"write from={d}, or leave from= out",
                )
        assert isinstance(e.value, int)
        to = dim(e.value, "to")
        if to == d:
            raise InputError(
                f"{fname}: {describe(x)} is already sliced along dimension {to}; an all-to-all "
                "to the same dimension moves nothing",
                e.span,
                hint="to= names the dimension the result is sliced along",
            )
        layout = sliced(to, ty.shape)
        along = Layout(LayoutKind.SLICED, to)
        check_divisible(ty.shape, along, self.G, e.span, f"{fname} of {describe(x)}")
        return _replace(e, args=(x,), value=to, tag=str(d), ty=_replace(ty, layout=layout))


def _type_key(e: Expr, args: tuple[Expr, ...]) -> tuple[Any, ...] | None:
    """All that a memoized rule's outcome depends on: the operator, the attributes it
    reads and the types of the operands, by identity (None for a literal operand, whose
    value the rules read too)."""
    key: list[Any] = [e.op, e.value, e.dtype_arg]
    for a in args:
        if a.op is Op.CONST:
            return None
        key.append(id(a.ty))
    return tuple(key)


def _update_hint(t: Expr, v: Expr) -> str:
    lt, lv = t.type.layout, v.type.layout
    if lv.is_local:
        return (
            "a local value differs from rank to rank: reduce its local operands first "
            "(allreduce, or reducescatter for a sliced input)"
        )
    if lt.is_sliced and lv.is_replicated:
        return f"each rank writes its own part: use slice(…) of the new value, like slice({t.name})"
    if lt.is_sliced:
        return f"the new value must be sliced like '{t.name}' ({lt})"
    return f"a local input is written with a local value; '{t.name}' is local"


def _matmul_layout_error(
    a: Expr, b: Expr, da: int | None, db: int | None, span: Span | None
) -> tuple[str, Span | None, str]:
    """Message, span and hint for an illegal matmul layout pair: which operand to change."""
    la, lb = a.type.layout, b.type.layout
    ka = len(a.type.shape) - 1
    an, bn = describe(a), describe(b)
    head = f"matmul: {an} is {la} and {bn} is {lb}, "
    if la.is_sliced and da == ka:  # a sliced on K
        if lb.is_replicated:
            why = "but a left operand sliced on the contraction dimension K needs a right "
            why += "operand sliced on K too"
        else:
            why = f"but {bn} must be sliced on K, its first dimension, to match"
        return (
            head + why,
            span,
            f"declare {bn} sliced(0) to get local partial sums (then allreduce them), or "
            f"make {an} replicated",
        )
    if la.is_sliced:  # a sliced on rows
        return (
            head + "but a left operand sliced on its rows needs a replicated right operand",
            span,
            f"make {bn} replicated (allgather it), or slice {an} on its last dimension "
            "(sliced(-1)) with " + bn + " sliced(0)",
        )
    if la.is_local:
        return (
            head + "but a local left operand needs a local or replicated right operand",
            span,
            f"make {bn} replicated (allgather it), or reduce {an} first (allreduce)",
        )
    # a replicated
    if lb.is_local:
        return (
            head + "but a local right operand needs a local left operand",
            span,
            f"reduce {bn} first (allreduce), or make {an} local",
        )
    if db == 0:
        return (
            head + f"but {bn} is sliced on the contraction dimension K, so {an} must be "
            "sliced on K too",
            span,
            f"slice {an} on its last dimension (sliced(-1)) to get local partial sums, or "
            f"slice {bn} on its columns (sliced(1))",
        )
    return (
        head + f"but the flat slicing of {bn} splits neither whole rows nor whole columns "
        "across the ranks",
        span,
        f"slice {bn} along a dimension: sliced(1) (columns) or sliced(0) (rows)",
    )


def _matmul_batch(a: Expr, b: Expr, span: Span | None) -> Shape:
    """The broadcast batch dimensions of `a[..., M, K] × b[..., K, N]` (numpy's rule:
    right-aligned, equal or 1)."""
    sa, sb = a.type.shape[:-2], b.type.shape[:-2]
    n = max(len(sa), len(sb))
    out: list[Size] = []
    for i in range(n):
        x = sa[i - n + len(sa)] if i - n + len(sa) >= 0 else None
        y = sb[i - n + len(sb)] if i - n + len(sb) >= 0 else None
        if x is not None and y is not None and 1 not in (x.value, y.value) and x != y:
            if x.value != y.value:
                raise InputError(
                    f"matmul: batch dimensions do not broadcast: {describe(a)}"
                    f"{format_shape(a.type.shape)} has batch {format_shape(sa)}, {describe(b)}"
                    f"{format_shape(b.type.shape)} has batch {format_shape(sb)} (batch "
                    f"dimension {i - n}: {x.text} = {x.value} vs {y.text} = {y.value})",
                    span,
                    hint="batch dimensions are right-aligned and must be equal or 1",
                )
        if x is None or (x.value == 1 and y is not None):
            assert y is not None
            out.append(y)
        else:
            out.append(x)
    return tuple(out)


def _batched_matmul_layout_error(
    a: Expr, b: Expr, shape: Shape, da: int | None, db: int | None, span: Span | None
) -> tuple[str, Span | None, str]:
    """Message, span and hint for an illegal layout pair of a batched matmul."""
    la, lb = a.type.layout, b.type.layout
    ra, rb, r = len(a.type.shape), len(b.type.shape), len(shape)
    an, bn = describe(a), describe(b)
    head = f"matmul: {an} is {la} and {bn} is {lb}, "

    def aligned(x: Expr, i: int) -> str:
        j = i - r + len(x.type.shape)
        if j < 0 or x.type.shape[j].value == 1:
            return f"make {describe(x)} replicated: it is broadcast along that dimension"
        return f"slice {describe(x)} along its dimension {j} (sliced({j})), or make it replicated"

    if la.is_sliced and da is not None and da < ra - 2:
        i = da + r - ra
        return (
            head + f"but a left operand sliced on batch dimension {shape[i].text} (dimension "
            f"{i} of the result) needs a right operand sliced on the same batch dimension, or "
            "replicated",
            span,
            aligned(b, i),
        )
    if lb.is_sliced and db is not None and db < rb - 2:
        i = db + r - rb
        return (
            head + f"but a right operand sliced on batch dimension {shape[i].text} (dimension "
            f"{i} of the result) needs a left operand sliced on the same batch dimension, or "
            "replicated",
            span,
            aligned(a, i),
        )
    if la.is_sliced and da == ra - 1:
        return (
            head + f"but a left operand sliced on the contraction dimension K needs a right "
            f"operand sliced on K (its dimension {rb - 2}) too",
            span,
            f"declare {bn} sliced({rb - 2}) to get local partial sums (then allreduce them), "
            f"or make {an} replicated",
        )
    if la.is_sliced:
        return (
            head + "but a left operand sliced on its rows M needs a replicated right operand",
            span,
            f"make {bn} replicated (allgather it), or slice both on a batch dimension",
        )
    if la.is_local:
        return (
            head + "but a local left operand needs a local or replicated right operand",
            span,
            f"make {bn} replicated (allgather it), or reduce {an} first (allreduce)",
        )
    if lb.is_local:
        return (
            head + "but a local right operand needs a local left operand",
            span,
            f"reduce {bn} first (allreduce), or make {an} local",
        )
    return (
        head + f"but {bn} is sliced on the contraction dimension K, so {an} must be sliced "
        "on K too",
        span,
        f"slice {an} on its last dimension (sliced({ra - 1})) to get local partial sums, or "
        f"slice {bn} on its columns (sliced({rb - 1}))",
    )


_RULES: dict[Op, Callable[[Inferencer, Expr], Expr]] = {
    Op.REF: Inferencer._ref,
    Op.CONST: Inferencer._const,
    Op.SLICE: Inferencer._slice,
    Op.DROPOUT: Inferencer._dropout,
    Op.MATMUL: Inferencer._matmul,
    Op.RESHAPE: Inferencer._reshape,
    **{op: Inferencer._permute for op in PERMUTES},
    **{op: Inferencer._routing for op in ROUTING},
    **{op: Inferencer._axis_reduction for op in AXIS_REDUCTIONS},
    **{op: Inferencer._constant for op in CONSTANTS},
    Op.UPDATE: Inferencer._update,
    **{op: Inferencer._rowwise for op in ROWWISE},
    **{op: Inferencer._reduction for op in REDUCTIONS},
    **{op: Inferencer._collective for op in COLLECTIVES},
}


def _along(d: int | None, shape: Shape) -> str:
    """'along H (dimension 1)' for a block dimension, or 'in flat chunks'."""
    if d is None:
        return "in flat chunks"
    return f"along {shape[d].text} (dimension {d} of {format_shape(shape)})"



def _ident(name: str) -> str:
    return name if name.isidentifier() else "x"


def program_env(program: Program) -> dict[str, TensorType]:
    env: dict[str, TensorType] = {}
    for p in program.params:
        env[p.name] = TensorType(p.dtype, (), REPLICATED, None)
    for i in program.inputs:
        env[i.name] = i.ty
    return env


def infer_program(program: Program) -> Program:
    """Re-type every stage of `program` in order; raises InputError on a violation."""
    env = program_env(program)
    inf = Inferencer(program.grid, env, {i.name for i in program.inputs})
    stages: list[Stage] = []
    for s in program.stages:
        expr = inf.infer(s.expr)
        env[s.name] = expr.type
        stages.append(dataclasses.replace(s, expr=expr))
    out = dataclasses.replace(program, stages=tuple(stages))
    check_updates(out)
    if program.grid.has_dp:
        axes.check_updates(out)
    return out


def check_updates(program: Program) -> None:
    """Program-level rules of `update` (docs/language.md, layout inference)."""
    seen: dict[str, Stage] = {}
    gathered = {
        s.expr.args[0].name
        for s in program.stages
        if s.expr.op is Op.ALLGATHER and s.expr.args[0].op is Op.REF
    }
    for s in program.stages:
        if s.expr.op is not Op.UPDATE:
            continue
        tgt = s.expr.args[0]
        assert tgt.name is not None
        if tgt.name in seen:
            raise InputError(
                f"input '{tgt.name}' is updated twice (also by '{seen[tgt.name].name}')",
                s.span,
                notes=[(f"first update '{seen[tgt.name].name}' is here", seen[tgt.name].span)],
                hint="an input is the target of at most one update",
            )
        seen[tgt.name] = s
        if tgt.type.layout.is_replicated and s.ty.layout.is_sliced and s.name not in gathered:
            raise InputError(
                f"update of replicated '{tgt.name}' with a sliced value must be followed by "
                f"an allgather of '{s.name}'",
                s.span,
                hint=f"add `{s.name}_full = allgather({s.name})`, or declare '{tgt.name}' sliced",
            )
