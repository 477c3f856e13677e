"""Layouts over the dp axis of a rank grid (docs/language.md, rank grids).

A value on a grid `ranks dp=D, tp=T, pp=P` has its layout over tp (`TensorType.layout`,
the layout every program without dp has) and a layout over dp (`TensorType.dp`), which
describes how each tp rank's part is spread over the D ranks of its dp group: the dp
layout of a tp-sliced value slices the rank's block, not the global tensor. Inference
types a node with the tp rules first (`Inferencer._dispatch`) and then applies the dp
rules here; a collective or a `slice` written with `over=dp` has only dp rules (its tp
layout is its operand's).

The dp rules:

- every operand dp-replicated → dp-replicated;
- a dp-local operand (and no dp-sliced one) → dp-local: each dp replica computes with
  its own contents (replicated operands are the same in every replica);
- a dp-sliced operand: only elementwise operations, whose non-scalar operands are all
  sliced over dp alike on a tp part of the same shape; a dp-replicated operand with the
  result's tp layout and part shape reads its part (`slice(x, over=dp)` is inferred, as
  a replicated operand is sliced over tp); anything else is "not supported yet";
- a collective over tp keeps its operand's dp layout; one that changes the shape of a
  tp rank's part (reducescatter, allgather, alltoall) needs an operand that is not
  sliced over dp;
- `update(t, e)`: the tp rule applied to the dp layouts (replicated ← sliced must be
  followed by an `allgather(…, over=dp)` of the update).
"""

from __future__ import annotations

from typing import Protocol

from cocoviz.errors import InputError, Span
from cocoviz.ir.collectives import collective
from cocoviz.ir.nodes import (
    BINARY_CALLS,
    BINARY_INFIX,
    COLLECTIVES,
    COMPARISONS,
    UNARY_CALLS,
    Expr,
    Grid,
    Op,
    Program,
)
from cocoviz.ir.operands import describe
from cocoviz.ir.types import (
    LOCAL,
    REPLICATED,
    Layout,
    TensorType,
    axis_layout_text,
    dp_view,
    same_slicing,
    shape_values,
    sliced,
)


class Inferencer(Protocol):
    """What the dp rules use of inference (`cocoviz.ir.infer.Inferencer`, which calls
    into this module: named here by its shape, so this module imports nothing of it)."""

    grid: Grid
    G: int

    def infer(self, e: Expr, top: bool = True) -> Expr: ...

    def _dispatch(self, e: Expr) -> Expr: ...

_ELEMENTWISE = (
    BINARY_INFIX
    | BINARY_CALLS
    | UNARY_CALLS
    | COMPARISONS
    | {
        Op.NEG,
        Op.CAST,
        Op.WHERE,
    }
)
_RESHAPING = {Op.REDUCESCATTER, Op.ALLGATHER, Op.ALLTOALL}


def _over(layout: Layout) -> str:
    return axis_layout_text(layout, "dp")


def _with_dp(e: Expr, dp: Layout) -> Expr:
    ty = e.type
    if ty.dp == dp:
        return e
    new = TensorType(ty.dtype, ty.shape, ty.layout, ty.pstage, dp)
    return Expr(e.op, e.args, e.name, e.value, e.rop, e.dtype_arg, e.tag, e.shape_arg, new, e.span)


def infer(inf: Inferencer, e: Expr) -> Expr:
    """Type `e` on a grid with a dp axis: the tp rules, then the dp rules."""
    if e.tag == "dp" and (e.op in COLLECTIVES or e.op is Op.SLICE):
        x = inf.infer(e.args[0], False)
        if e.op is Op.SLICE:
            return _slice_over_dp(inf, e, x)
        return _collective_over_dp(inf, e, x)
    typed = inf._dispatch(e)
    args = typed.args
    if typed.op is Op.CONST or not args:
        return typed
    if typed.op in COLLECTIVES:
        (x,) = args
        lay = x.type.dp
        if lay.is_sliced and typed.op in _RESHAPING:
            raise InputError(
                f"{typed.op.value} over tp of {describe(x)}, which is {_over(lay)}, is not "
                "supported yet: it changes the shape of the tp part the dp slicing is of",
                e.span,
                hint="gather it over dp first (allgather(x, over=dp)), or reduce over dp later",
            )
        return _with_dp(typed, lay)
    if typed.op is Op.UPDATE:
        return _update(typed)
    sliced_args = [a for a in args if a.type.dp.is_sliced]
    if not sliced_args:
        local = any(a.type.dp.is_local for a in args)
        return _with_dp(typed, LOCAL if local else REPLICATED)
    first = sliced_args[0]
    if typed.op not in _ELEMENTWISE:
        raise InputError(
            f"{typed.op.value} of {describe(first)}, which is {_over(first.type.dp)}, is not "
            "supported yet (layout inference over dp: only elementwise operations take "
            "values sliced over dp)",
            e.span,
            hint="gather it first: allgather(x, over=dp)",
        )
    want = dp_view(typed.type, inf.G)
    new_args: list[Expr] = []
    for a in args:
        new_args.append(a)
        if a.type.is_scalar:
            continue
        inner = a.args[0] if a.op is Op.SLICE and a.tag != "dp" else a
        view = dp_view(a.type, inf.G)
        if (
            a.type.dp.is_replicated
            and a.type.layout == typed.type.layout
            and shape_values(view.shape) == shape_values(want.shape)
        ):
            # as over tp: a dp-replicated operand of the same part reads its dp part
            ty = a.type
            part = TensorType(ty.dtype, ty.shape, ty.layout, ty.pstage, first.type.dp)
            new_args[-1] = Expr(
                Op.SLICE, (a,), value=first.type.dp.dim, tag="dp", ty=part, span=a.span
            )
            continue
        if a.type.dp.is_replicated:
            raise InputError(
                f"cannot combine {describe(first)}, {_over(first.type.dp)}, with "
                f"{describe(a)}, which is replicated over dp and {a.type.layout} "
                f"{format_view(view)} on a tp rank: broadcasting or another tp layout "
                "against a value sliced over dp is not supported yet",
                a.span or e.span,
                hint="give it the shape and tp layout of the sliced operand, or gather "
                "that one first: allgather(x, over=dp)",
            )
        if a.type.dp.is_local:
            raise InputError(
                f"cannot combine {describe(first)}, {_over(first.type.dp)}, with "
                f"{describe(a)}, which is local over dp",
                a.span or e.span,
                hint="reduce it over dp first: reducescatter(+, x, over=dp)",
            )
        if (
            inner is not a
            or shape_values(view.shape) != shape_values(want.shape)
            or not same_slicing(a.type.dp, view.shape, first.type.dp, want.shape, inf.grid.dp)
        ):
            raise InputError(
                f"{describe(a)} ({a.type}) and {describe(first)} ({first.type}) are not "
                "sliced over dp alike on tp parts of the same shape: not supported yet",
                a.span or e.span,
                hint="give both operands the same layouts over tp and over dp",
            )
    typed = Expr(
        typed.op, tuple(new_args), typed.name, typed.value, typed.rop, typed.dtype_arg,
        typed.tag, typed.shape_arg, typed.ty, typed.span,
    )  # fmt: skip
    return _with_dp(typed, first.type.dp)


def _slice_over_dp(inf: Inferencer, e: Expr, x: Expr) -> Expr:
    ty = x.type
    if not ty.dp.is_replicated:
        raise InputError(
            f"slice(…, over=dp) takes a value replicated over dp; {describe(x)} is {_over(ty.dp)}",
            e.span,
        )
    if ty.is_scalar:
        raise InputError("slice() of a scalar: a scalar cannot be sliced", e.span)
    view = dp_view(ty, inf.G)
    d = e.value
    if d is not None:
        assert isinstance(d, int)
        if not -len(view.shape) <= d < len(view.shape):
            raise InputError(
                f"slice dimension {d} is out of range for a tp rank's part of {describe(x)} "
                f"{format_view(view)}",
                e.span,
            )
    layout = sliced(d if isinstance(d, int) else None, view.shape)
    check_divisible_dp(view, layout, inf.grid.dp, e.span, f"slice({describe(x)}, over=dp)")
    new = TensorType(ty.dtype, ty.shape, ty.layout, ty.pstage, layout)
    return Expr(Op.SLICE, (x,), value=layout.dim, tag="dp", ty=new, span=e.span)


def check_divisible_dp(
    view: TensorType, layout: Layout, dp: int, span: Span | None, what: str
) -> None:
    """A layout sliced over dp: the sliced extent of a tp rank's part (its numel, for
    flat) must divide by the dp size D."""
    if not layout.is_sliced or dp == 1:
        return
    if layout.dim is None:
        n, extent = view.numel, f"its {view.numel} elements"
    else:
        size = view.shape[layout.dim]
        n, extent = size.value, f"its dimension {layout.dim} ({size.text} = {size.value})"
    if n % dp:
        raise InputError(
            f"{what} is sliced over the dp axis, but {extent} of a tp rank's part "
            f"{format_view(view)} do not divide by dp={dp}",
            span,
            hint="change a size with -D, or the axis sizes with --ranks dp=D,tp=T",
        )


def format_view(view: TensorType) -> str:
    from cocoviz.ir.types import format_shape

    return format_shape(view.shape)


def _collective_over_dp(inf: Inferencer, e: Expr, x: Expr) -> Expr:
    ty = x.type
    op = e.op
    row = collective(op)
    D = inf.grid.dp
    if not row.operand.accepts(ty.dp):
        raise InputError(
            f"{op.value}(…, over=dp) needs {row.operand.value} over dp; {describe(x)} is "
            f"{_over(ty.dp)}",
            e.span,
            hint=row.operand_hint.replace("allgather", "allgather(…, over=dp)")
            if row.operand_hint
            else None,
        )
    assert row.result is not None  # send and alltoall take no over= (lowering)
    view = dp_view(ty, inf.G)
    result = row.result
    if result.is_sliced:
        check_divisible_dp(view, result, D, e.span, f"{op.value}(…, over=dp) of {describe(x)}")
        result = sliced(None, view.shape)
    if row.rooted:
        root = e.value if isinstance(e.value, int) else 0
        if not 0 <= root < D:
            raise InputError(
                f"{op.value}: root {root} is not a rank of the dp group (0…{D - 1})", e.span
            )
    new = TensorType(ty.dtype, ty.shape, ty.layout, ty.pstage, result)
    return Expr(op, (x,), rop=e.rop, value=e.value, tag="dp", ty=new, span=e.span)


def _update(typed: Expr) -> Expr:
    t, v = typed.args
    lt, lv = t.type.dp, v.type.dp
    if lt.is_replicated and lv.is_replicated:
        return _with_dp(typed, REPLICATED)
    if lt.is_replicated and lv.is_sliced:
        return _with_dp(typed, lv)
    if lt.is_sliced and lv == lt:
        return _with_dp(typed, lt)
    if lt.is_local and lv.is_local:
        return _with_dp(typed, LOCAL)
    raise InputError(
        f"update: cannot write a value {_over(lv)} into input '{t.name}', which is {_over(lt)}",
        typed.span,
        hint="over dp, an update follows the tp rules: replicated ← replicated or sliced, "
        "sliced ← the same slicing, local ← local",
    )


def check_updates(program: Program) -> None:
    """An update of a dp-replicated input with a dp-sliced value is followed by its
    `allgather(…, over=dp)` (as over tp)."""
    gathered = {
        s.expr.args[0].name
        for s in program.stages
        if s.expr.op is Op.ALLGATHER and s.expr.tag == "dp" and s.expr.args[0].op is Op.REF
    }
    for s in program.stages:
        if s.expr.op is not Op.UPDATE:
            continue
        tgt = s.expr.args[0]
        if tgt.type.dp.is_replicated and s.ty.dp.is_sliced and s.name not in gathered:
            raise InputError(
                f"update of '{tgt.name}' (replicated over dp) with a value sliced over dp "
                f"must be followed by an allgather over dp of '{s.name}'",
                s.span,
                hint=f"add `{s.name}_full = allgather({s.name}, over=dp)`",
            )
