"""The syntax objects a parse of `.coco` or `.sched` text builds (`Name`, `Call`,
`InputStmt`, …, `Module`), the token classes and the limits on a source that both parsers
enforce, and the nesting check of an expression.

Both parsers build these: the hand-written one (cocoviz/ir/fastparse.py) and lark with its
lexer (cocoviz/ir/larklexer.py), which cocoviz/ir/syntax.py runs. They live below all three,
so the parsers import this module and nothing of syntax.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cocoviz.errors import InputError, Source, Span
from cocoviz.ir.nodes import MAX_EXPR_DEPTH, Expr, Op, StepCall


# --- syntax objects ---------------------------------------------------------------------
@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class Name:
    """A name as written: a stage, input, dimension, dtype, layout or function name."""

    text: str
    span: Span

    # The syntax objects the parser makes most (one per name, number, size, call,
    # assignment and input) store their fields straight into __dict__, as Span's: the
    # generated frozen __init__ makes an object.__setattr__ call per field and costs
    # about twice as much. Fields, equality and hashing are the dataclass's.
    def __init__(self, text: str, span: Span) -> None:
        d = self.__dict__
        d["text"] = text
        d["span"] = span


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class Num:
    """A number literal as written (`value` converts it)."""

    text: str
    span: Span

    def __init__(self, text: str, span: Span) -> None:
        # as Name's
        d = self.__dict__
        d["text"] = text
        d["span"] = span

    @property
    def is_int(self) -> bool:
        return self.text.isdigit()

    @property
    def value(self) -> float | int:
        return int(self.text) if self.is_int else float(self.text)


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class Call:
    """`name(args)` before it is resolved to an operator."""

    name: Name
    args: tuple[Any, ...]
    span: Span

    def __init__(self, name: Name, args: tuple[Any, ...], span: Span) -> None:
        # as Name's
        d = self.__dict__
        d["name"] = name
        d["args"] = args
        d["span"] = span


@dataclass(frozen=True)
class Cmp:
    """`lhs OP rhs`: a comparison, the first argument of `where(…)`."""

    op: Op
    lhs: Any
    rhs: Any
    span: Span


@dataclass(frozen=True)
class Kw:
    """`name=value`: a keyword argument of a call."""

    name: Name
    value: Any
    span: Span


@dataclass(frozen=True)
class TypeArg:
    """`DTYPE[SIZE, …]` as a call argument: the type of a constant (`zeros(f32[B, H])`)."""

    dtype: Name
    sizes: tuple[SizeExpr, ...]
    span: Span


@dataclass(frozen=True)
class RedTok:
    """`+` or `*` as the operator argument of a collective."""

    text: str
    span: Span


@dataclass(frozen=True)
class ProgramStmt:
    """`program NAME`."""

    name: Name
    span: Span


@dataclass(frozen=True)
class RanksStmt:
    """`ranks N` (`n`) or `ranks dp=D, tp=T, pp=P` (`grid`: the named axes as written)."""

    span: Span
    n: Num | None = None
    grid: tuple[tuple[Name, Num], ...] | None = None


@dataclass(frozen=True)
class DimStmt:
    """`dim NAME = SIZE, …`."""

    items: tuple[tuple[Name, Num], ...]
    span: Span


@dataclass(frozen=True)
class ParamStmt:
    """`param NAME : DTYPE = DEFAULT, …`."""

    items: tuple[tuple[Name, Name, Num, bool], ...]  # name, dtype, default, negative
    span: Span


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class SizeExpr:
    """One size of an input's shape: dimension names and integers multiplied (`4*H`)."""

    factors: tuple[Name | Num, ...]
    span: Span

    def __init__(self, factors: tuple[Name | Num, ...], span: Span) -> None:
        # as Name's
        d = self.__dict__
        d["factors"] = factors
        d["span"] = span


@dataclass(frozen=True)
class AxisLayout:
    """A further layout of an input, over a named axis: `local(over=dp)`."""

    word: Name
    arg: tuple[Num, bool] | None
    over: Name | None
    span: Span


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class InputStmt:
    """`input NAME : DTYPE[SIZE, …] LAYOUT`, optionally `@stage K`."""

    name: Name
    dtype: Name
    sizes: tuple[SizeExpr, ...]
    layout: Name
    layout_arg: tuple[Num, bool] | None  # value, negative
    stage_kw: Name | None
    stage: Num | None
    span: Span
    layout_span: Span | None = None  # the layout word and its argument
    layout_over: Name | None = None  # `over=AXIS` of the first layout
    more_layouts: tuple[AxisLayout, ...] = ()  # layouts over further axes

    def __init__(
        self,
        name: Name,
        dtype: Name,
        sizes: tuple[SizeExpr, ...],
        layout: Name,
        layout_arg: tuple[Num, bool] | None,
        stage_kw: Name | None,
        stage: Num | None,
        span: Span,
        layout_span: Span | None = None,
        layout_over: Name | None = None,
        more_layouts: tuple[AxisLayout, ...] = (),
    ) -> None:
        # as Name's
        d = self.__dict__
        d["layout_over"] = layout_over
        d["more_layouts"] = more_layouts
        d["name"] = name
        d["dtype"] = dtype
        d["sizes"] = sizes
        d["layout"] = layout
        d["layout_arg"] = layout_arg
        d["stage_kw"] = stage_kw
        d["stage"] = stage
        d["span"] = span
        d["layout_span"] = layout_span


@dataclass(frozen=True)
class OutputStmt:
    """`output NAME, …`."""

    names: tuple[Name, ...]
    span: Span


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class Assign:
    """`NAME = EXPR`: a stage."""

    name: Name
    expr: Any
    span: Span

    def __init__(self, name: Name, expr: Any, span: Span) -> None:
        # as Name's
        d = self.__dict__
        d["name"] = name
        d["expr"] = expr
        d["span"] = span


@dataclass(frozen=True)
class ScheduleStmt:
    """`schedule NAME { STEP … }`."""

    name: Name
    steps: tuple[StepCall, ...]
    span: Span


@dataclass(frozen=True)
class FusedStmt:
    """`fused { STAGE … }`: a printed fused group."""

    items: tuple[Assign, ...]
    span: Span


@dataclass(frozen=True)
class OverlappedStmt:
    """`overlapped chunks=K { … }`: a printed overlapped group of stages and fused blocks."""

    chunks_kw: Name
    chunks: Num
    items: tuple[Assign | FusedStmt, ...]
    span: Span


@dataclass(frozen=True)
class Module:
    """The statements of a `.coco` text, in source order."""

    statements: tuple[Any, ...]
    source: Source = field(compare=False)


# --- tokens and limits -----------------------------------------------------------------
_OPENERS = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}
_CLOSERS = {v: k for k, v in _OPENERS.items()}
# Tokens after which a statement starts (where `input`, `output`, … are keywords).
_STMT_START = {"_NL", "SEMICOLON", "LBRACE", "RBRACE"}
_SEPARATORS = {"_NL", "SEMICOLON"}

# Limits on what one source may hold, so that hostile or runaway input (a generated file
# gone wrong, /dev/zero) ends in a diagnostic instead of exhausting memory or time. The
# largest real programs (a 96-layer GPT stack: 2,016 stages, 120 KB) are far below them.
MAX_SOURCE_BYTES = 16 * 1024 * 1024
MAX_STATEMENTS = 100_000
MAX_STATEMENT_TOKENS = 100_000
MAX_NUMBER_DIGITS = 40
"""Characters of an integer literal: anything longer (leading zeros or not) is far out
of the range of the 64-bit integers a program computes with, and Python refuses to
convert integers of more than 4,300 digits."""


class _BadCharacter(Exception):
    def __init__(self, pos: int, line: int, col: int) -> None:
        self.pos, self.line, self.col = pos, line, col


class _LexLimit(Exception):
    """A source over one of the limits above; reported at (line, col) for `width`
    columns."""

    def __init__(self, message: str, line: int, col: int, hint: str, width: int = 1) -> None:
        super().__init__(message)
        self.message, self.line, self.col, self.hint = message, line, col, hint
        self.width = width


def _check_depth(name: Name, root: Any) -> None:
    """An expression may nest at most `MAX_EXPR_DEPTH` operators and calls (counted on
    its deepest path; names, numbers and parentheses add nothing)."""
    stack = [(root, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, (Expr, Call)):
            kids: tuple[Any, ...] = node.args
        elif isinstance(node, Cmp):
            kids = (node.lhs, node.rhs)
        elif isinstance(node, Kw):
            kids = (node.value,)
        else:
            continue
        if not kids:
            continue
        if d > MAX_EXPR_DEPTH:
            raise InputError(
                f"the expression of '{name.text}' is nested too deeply: more than "
                f"{MAX_EXPR_DEPTH:,} levels of operators and calls",
                name.span,
                hint="compute it in several stages: name a part, e.g. `t = …`, and use t",
            )
        stack.extend((k, d + 1) for k in kids)
