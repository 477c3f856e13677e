"""Parsing `.coco` and `.sched` text into syntax objects.

This module is the one boundary where lark's exceptions are converted into
`InputError`s with a source span; nothing from lark escapes it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import lark
from lark import Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from cocoviz.errors import InputError, Source, Span
from cocoviz.ir.nodes import Expr, Op, StepCall


# --- syntax objects ---------------------------------------------------------------------
@dataclass(frozen=True)
class Name:
    text: str
    span: Span


@dataclass(frozen=True)
class Num:
    text: str
    span: Span

    @property
    def is_int(self) -> bool:
        return self.text.isdigit()

    @property
    def value(self) -> float | int:
        return int(self.text) if self.is_int else float(self.text)


@dataclass(frozen=True)
class Call:
    """`name(args)` before it is resolved to an operator."""

    name: Name
    args: tuple[Any, ...]
    span: Span


@dataclass(frozen=True)
class Cmp:
    op: Op
    lhs: Any
    rhs: Any
    span: Span


@dataclass(frozen=True)
class Kw:
    name: Name
    value: Any
    span: Span


@dataclass(frozen=True)
class RedTok:
    """`+` or `*` as the operator argument of a collective."""

    text: str
    span: Span


@dataclass(frozen=True)
class ProgramStmt:
    name: Name
    span: Span


@dataclass(frozen=True)
class RanksStmt:
    span: Span
    n: Num | None = None
    grid: tuple[tuple[Name, Num], tuple[Name, Num]] | None = None


@dataclass(frozen=True)
class DimStmt:
    items: tuple[tuple[Name, Num], ...]
    span: Span


@dataclass(frozen=True)
class ParamStmt:
    items: tuple[tuple[Name, Name, Num, bool], ...]  # name, dtype, default, negative
    span: Span


@dataclass(frozen=True)
class SizeExpr:
    factors: tuple[Name | Num, ...]
    span: Span


@dataclass(frozen=True)
class InputStmt:
    name: Name
    dtype: Name
    sizes: tuple[SizeExpr, ...]
    layout: Name
    layout_arg: tuple[Num, bool] | None  # value, negative
    stage_kw: Name | None
    stage: Num | None
    span: Span


@dataclass(frozen=True)
class OutputStmt:
    names: tuple[Name, ...]
    span: Span


@dataclass(frozen=True)
class Assign:
    name: Name
    expr: Any
    span: Span


@dataclass(frozen=True)
class ScheduleStmt:
    name: Name
    steps: tuple[StepCall, ...]
    span: Span


@dataclass(frozen=True)
class FusedStmt:
    items: tuple[Assign, ...]
    span: Span


@dataclass(frozen=True)
class OverlappedStmt:
    chunks_kw: Name
    chunks: Num
    items: tuple[Assign | FusedStmt, ...]
    span: Span


@dataclass(frozen=True)
class Module:
    statements: tuple[Any, ...]
    source: Source = field(compare=False)


# --- the parser ------------------------------------------------------------------------
class _ParenNewlines:
    """Post-lexer: newlines inside ( ) and [ ] do not end a statement."""

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0
        for tok in stream:
            if tok.type == "_NL":
                if depth == 0:
                    yield tok
                continue
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RSQB"):
                depth = max(depth - 1, 0)
            elif tok.type in ("LBRACE", "RBRACE"):
                depth = 0
            yield tok


@functools.cache
def _parser(start: str) -> lark.Lark:
    text = resources.files("cocoviz.ir").joinpath("grammar.lark").read_text()
    return lark.Lark(
        text,
        parser="lalr",
        start=start,
        postlex=_ParenNewlines(),
        propagate_positions=True,
        maybe_placeholders=False,
        cache=False,
    )


class _Build(Transformer[Token, Any]):
    def __init__(self, source: Source) -> None:
        super().__init__(visit_tokens=False)
        self.source = source

    def _span(self, meta: Any) -> Span:
        if getattr(meta, "empty", False):
            return Span(self.source, 1, 1, 1, 1)
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tok(self, tok: Token) -> Span:
        return Span(
            self.source,
            tok.line or 1,
            tok.column or 1,
            tok.end_line or tok.line or 1,
            tok.end_column or (tok.column or 1) + len(tok),
        )

    def _name(self, tok: Token) -> Name:
        return Name(str(tok), self._tok(tok))

    def _num(self, tok: Token) -> Num:
        return Num(str(tok), self._tok(tok))

    # statements
    @v_args(meta=True)
    def start(self, meta: Any, children: list[Any]) -> tuple[Any, ...]:
        return tuple(children)

    @v_args(meta=True)
    def sched_file(self, meta: Any, children: list[Any]) -> tuple[Any, ...]:
        return tuple(children)

    @v_args(meta=True)
    def program_stmt(self, meta: Any, c: list[Any]) -> ProgramStmt:
        return ProgramStmt(self._name(c[0]), self._span(meta))

    @v_args(meta=True)
    def ranks_flat(self, meta: Any, c: list[Any]) -> RanksStmt:
        return RanksStmt(self._span(meta), n=self._num(c[0]))

    @v_args(meta=True)
    def ranks_grid(self, meta: Any, c: list[Any]) -> RanksStmt:
        return RanksStmt(
            self._span(meta),
            grid=(
                (self._name(c[0]), self._num(c[1])),
                (self._name(c[2]), self._num(c[3])),
            ),
        )

    @v_args(meta=True)
    def dim_stmt(self, meta: Any, c: list[Any]) -> DimStmt:
        return DimStmt(tuple(c), self._span(meta))

    def dim_item(self, c: list[Any]) -> tuple[Name, Num]:
        return (self._name(c[0]), self._num(c[1]))

    @v_args(meta=True)
    def param_stmt(self, meta: Any, c: list[Any]) -> ParamStmt:
        return ParamStmt(tuple(c), self._span(meta))

    def param_item(self, c: list[Any]) -> tuple[Name, Name, Num, bool]:
        num, neg = c[2]
        return (self._name(c[0]), self._name(c[1]), num, neg)

    def signed(self, c: list[Any]) -> tuple[Num, bool]:
        return (self._num(c[0]), False)

    def neg_number(self, c: list[Any]) -> tuple[Num, bool]:
        return (self._num(c[0]), True)

    @v_args(meta=True)
    def input_stmt(self, meta: Any, c: list[Any]) -> InputStmt:
        name, dtype = self._name(c[0]), self._name(c[1])
        sizes = tuple(x for x in c[2:] if isinstance(x, SizeExpr))
        rest = [x for x in c[2:] if not isinstance(x, SizeExpr)]
        layout_name, layout_arg = rest[0]
        stage_kw, stage = (rest[1] if len(rest) > 1 else (None, None))
        return InputStmt(
            name, dtype, sizes, layout_name, layout_arg, stage_kw, stage, self._span(meta)
        )

    @v_args(meta=True)
    def size(self, meta: Any, c: list[Any]) -> SizeExpr:
        return SizeExpr(tuple(c), self._span(meta))

    def size_atom(self, c: list[Any]) -> Name | Num:
        tok = c[0]
        return self._num(tok) if tok.type == "NUMBER" else self._name(tok)

    def layout(self, c: list[Any]) -> tuple[Name, tuple[Num, bool] | None]:
        return (self._name(c[0]), c[1] if len(c) > 1 else None)

    def stage_ann(self, c: list[Any]) -> tuple[Name, Num]:
        return (self._name(c[0]), self._num(c[1]))

    @v_args(meta=True)
    def output_stmt(self, meta: Any, c: list[Any]) -> OutputStmt:
        return OutputStmt(tuple(self._name(t) for t in c), self._span(meta))

    @v_args(meta=True)
    def assign(self, meta: Any, c: list[Any]) -> Assign:
        return Assign(self._name(c[0]), c[1], self._span(meta))

    @v_args(meta=True)
    def schedule_block(self, meta: Any, c: list[Any]) -> ScheduleStmt:
        return ScheduleStmt(self._name(c[0]), tuple(c[1:]), self._span(meta))

    @v_args(meta=True)
    def step(self, meta: Any, c: list[Any]) -> StepCall:
        name = self._name(c[0])
        args = [a for a in c[1:] if a[0] == "pos"]
        kwargs = [a for a in c[1:] if a[0] == "kw"]
        return StepCall(
            name.text,
            tuple(a[1].text for a in args),
            tuple((k[1].text, int(float(k[2].text))) for k in kwargs),
            span=self._span(meta),
            arg_spans=tuple(a[1].span for a in args),
        )

    def step_pos(self, c: list[Any]) -> tuple[str, Name]:
        return ("pos", self._name(c[0]))

    def step_kw(self, c: list[Any]) -> tuple[str, Name, Num]:
        return ("kw", self._name(c[0]), self._num(c[1]))

    @v_args(meta=True)
    def fused_block(self, meta: Any, c: list[Any]) -> FusedStmt:
        return FusedStmt(tuple(c), self._span(meta))

    @v_args(meta=True)
    def overlapped_block(self, meta: Any, c: list[Any]) -> OverlappedStmt:
        return OverlappedStmt(self._name(c[0]), self._num(c[1]), tuple(c[2:]), self._span(meta))

    # expressions
    def _bin(self, op: Op, meta: Any, c: list[Any]) -> Expr:
        return Expr(op, (c[0], c[1]), span=self._span(meta))

    @v_args(meta=True)
    def add(self, meta: Any, c: list[Any]) -> Expr:
        return self._bin(Op.ADD, meta, c)

    @v_args(meta=True)
    def sub(self, meta: Any, c: list[Any]) -> Expr:
        return self._bin(Op.SUB, meta, c)

    @v_args(meta=True)
    def mul(self, meta: Any, c: list[Any]) -> Expr:
        return self._bin(Op.MUL, meta, c)

    @v_args(meta=True)
    def div(self, meta: Any, c: list[Any]) -> Expr:
        return self._bin(Op.DIV, meta, c)

    @v_args(meta=True)
    def neg(self, meta: Any, c: list[Any]) -> Expr:
        return Expr(Op.NEG, (c[0],), span=self._span(meta))

    def number(self, c: list[Any]) -> Expr:
        n = self._num(c[0])
        return Expr(Op.CONST, value=n.value, span=n.span)

    def var(self, c: list[Any]) -> Expr:
        n = self._name(c[0])
        return Expr(Op.REF, name=n.text, span=n.span)

    @v_args(meta=True)
    def call(self, meta: Any, c: list[Any]) -> Call:
        return Call(self._name(c[0]), tuple(c[1:]), self._span(meta))

    def pos_arg(self, c: list[Any]) -> Any:
        return c[0]

    @v_args(meta=True)
    def cmp_arg(self, meta: Any, c: list[Any]) -> Cmp:
        return Cmp(Op(str(c[1])), c[0], c[2], self._span(meta))

    @v_args(meta=True)
    def kw_arg(self, meta: Any, c: list[Any]) -> Kw:
        return Kw(self._name(c[0]), c[1], self._span(meta))

    @v_args(meta=True)
    def op_plus(self, meta: Any, c: list[Any]) -> RedTok:
        return RedTok("+", self._span(meta))

    @v_args(meta=True)
    def op_star(self, meta: Any, c: list[Any]) -> RedTok:
        return RedTok("*", self._span(meta))


_TOKEN_WORDS = {
    "_NL": "end of line",
    "$END": "end of file",
    "NAME": "a name",
    "NUMBER": "a number",
    "CMP": "a comparison",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "COMMA": "','",
    "COLON": "':'",
    "SEMICOLON": "';'",
    "EQUAL": "'='",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "AT": "'@'",
}


def _describe(tok_type: str) -> str:
    if tok_type in _TOKEN_WORDS:
        return _TOKEN_WORDS[tok_type]
    if tok_type.isupper() and tok_type.isalpha():
        return f"'{tok_type.lower()}'"
    return tok_type


def _expected(names: set[str]) -> str:
    words = sorted({_describe(n) for n in names if not n.startswith("__")})
    if not words:
        return ""
    if len(words) > 6:
        words = words[:6] + ["…"]
    return "expected " + ", ".join(words)


def _syntax_error(err: UnexpectedInput, source: Source) -> InputError:
    line = getattr(err, "line", None) or 1
    col = getattr(err, "column", None) or 1
    if isinstance(err, UnexpectedToken):
        tok = err.token
        if tok.type == "$END":
            lines = source.text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
            what = "end of file"
        elif tok.type == "_NL":
            what = "end of line"
            line, col = tok.line or line, tok.column or col
        else:
            what = f"'{tok}'"
        span = Span(source, line, col, line, col + max(len(str(tok)), 1) if tok.type not in ("$END", "_NL") else col + 1)
        exp = _expected(set(err.expected))
        hint = None
        if tok.type == "_NL" and "RPAR" in err.expected:
            hint = "a ')' is missing"
        return InputError(f"syntax error: unexpected {what}" + (f"; {exp}" if exp else ""), span, hint)
    if isinstance(err, UnexpectedCharacters):
        ch = source.line(line)[col - 1 : col] or "?"
        return InputError(
            f"syntax error: unexpected character {ch!r}", Span(source, line, col, line, col + 1)
        )
    if isinstance(err, UnexpectedEOF):
        lines = source.text.splitlines() or [""]
        return InputError(
            "syntax error: unexpected end of file",
            Span(source, len(lines), len(lines[-1]) + 1, len(lines), len(lines[-1]) + 2),
        )
    return InputError(f"syntax error: {err}", Span(source, line, col, line, col + 1))


def _run(text: str, source: Source, start: str) -> tuple[Any, ...]:
    try:
        tree = _parser(start).parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, source) from None
    except lark.exceptions.LarkError as err:  # pragma: no cover - defensive boundary
        raise InputError(f"syntax error: {err}", Span(source, 1, 1, 1, 2)) from None
    try:
        result: tuple[Any, ...] = _Build(source).transform(tree)
    except lark.exceptions.VisitError as err:
        if isinstance(err.orig_exc, InputError):
            raise err.orig_exc from None
        raise
    return result


def parse_module(text: str, path: str = "<input>") -> Module:
    """Parse a `.coco` text into statements (no name or type checks yet)."""
    source = Source(path, text)
    return Module(_run(text, source, "start"), source)


def parse_steps(text: str, path: str = "<steps>") -> tuple[StepCall, ...]:
    """Parse a `.sched` text (or a command-line step) into step calls."""
    source = Source(path, text)
    return tuple(s for s in _run(text, source, "sched_file") if isinstance(s, StepCall))
