"""How messages name an operand (`describe`, `source_text`), and the fast copy of the IR's
frozen dataclasses (`_replace`) — shared by inference (`cocoviz.ir.infer`) and the rules it
calls into (`cocoviz.ir.axes` for grids, `cocoviz.ir.routing` for the routing ops), so that
those rules import nothing of inference."""

from __future__ import annotations

from typing import Any, TypeVar

from cocoviz.ir.nodes import Expr, Op

_T = TypeVar("_T")


def replace_fields(obj: _T, **changes: Any) -> _T:
    """`dataclasses.replace` for the frozen, slot-less IR dataclasses (`Expr`,
    `TensorType`) without its per-call field introspection: inference copies every node,
    and this made lowering of large programs markedly faster."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def source_text(e: Expr) -> str:
    """An operand as the user could write it in a hint: its name or source text, or `…`."""
    if e.op is Op.REF and e.name is not None:
        return e.name
    if e.op is Op.CONST and e.value is not None:
        return repr(e.value)
    if e.op is Op.SLICE and e.args and e.args[0].op is Op.REF and e.args[0].name:
        return e.args[0].name
    sp = e.span
    if sp is not None and sp.source is not None and sp.line == sp.end_line:
        text = sp.source.line(sp.line)[sp.col - 1 : sp.end_col - 1]
        if 0 < len(text) <= 40:
            return text
    return "…"


def describe(e: Expr) -> str:
    """A short name for an operand in messages."""
    if e.op is Op.REF:
        return f"'{e.name}'"
    if e.op is Op.CONST:
        return repr(e.value)
    if e.op is Op.SLICE and e.args and e.args[0].op is Op.REF:
        dim = "" if e.value is None else f", {e.value}"
        return f"'slice({e.args[0].name}{dim})'"
    sp = e.span
    if sp is not None and sp.source is not None and sp.line == sp.end_line:
        text = sp.source.line(sp.line)[sp.col - 1 : sp.end_col - 1]
        if 0 < len(text) <= 40:
            return f"'{text}'"
    return f"the {_OP_WORDS.get(e.op, e.op.value + '(…)')} expression"


_OP_WORDS = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/", Op.NEG: "negation"}
