"""A hand-written lexer and recursive-descent parser for valid `.coco` and `.sched` text.

It accepts exactly the language of grammar.lark and builds the same syntax objects with
the same spans as the lark parser in cocoviz/ir/syntax.py, at a fraction of the cost
(and without importing lark). It is the fast path only: on anything it does not accept
(a syntax error, a source over a limit, an expression nested deeper than it recurses,
a semantic error raised while building) it raises `Fallback`, and syntax.py re-parses
with lark, which produces the diagnostic. So it has to be right on valid input only,
and must never accept what lark rejects.

The lexer follows larklexer._Lexer token for token (tests/test_fastparse.py compares the
two parsers on the samples and on the fuzzer's corruptions of them):

- statement keywords are keywords only where a statement starts (after a separator,
  `{`, `}` or at the start of the file); elsewhere they are names;
- newlines inside ( ) and [ ] are dropped; a run of separators (newlines and `;`, with
  blanks between) is one separator, which is dropped too right after another one;
- the limits on statements, tokens per statement and integer length are enforced by
  falling back (lark's lexer then reports them).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from cocoviz.errors import Source, Span
from cocoviz.ir import syntax_tree
from cocoviz.ir.nodes import MAX_EXPR_DEPTH, Expr, Op, StepCall
from cocoviz.ir.syntax_tree import (
    Assign,
    AxisLayout,
    Call,
    Cmp,
    DimStmt,
    FusedStmt,
    InputStmt,
    Kw,
    Name,
    Num,
    OutputStmt,
    OverlappedStmt,
    ParamStmt,
    ProgramStmt,
    RanksStmt,
    RedTok,
    ScheduleStmt,
    SizeExpr,
    TypeArg,
    _check_depth,
)


class Fallback(Exception):
    """The fast parser does not accept this text: parse it with lark to report why."""


# token kinds (the names of the grammar's terminals)
_KEYWORDS = {
    "program": "PROGRAM",
    "ranks": "RANKS",
    "dim": "DIM",
    "param": "PARAM",
    "input": "INPUT",
    "output": "OUTPUT",
    "schedule": "SCHEDULE",
    "fused": "FUSED",
    "overlapped": "OVERLAPPED",
}
_PUNCT = {
    "(": "LPAR",
    ")": "RPAR",
    "[": "LSQB",
    "]": "RSQB",
    "{": "LBRACE",
    "}": "RBRACE",
    "-": "MINUS",
    "+": "PLUS",
    "*": "STAR",
    "/": "SLASH",
    "=": "EQUAL",
    ",": "COMMA",
    ":": "COLON",
    "@": "AT",
}
_NUMBER = r"(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?"
# One alternative per group of tokens the loop below treats alike, the most frequent
# first. Alternatives are tried in order: CMP comes before PUNCT so that `==` is not
# read as `=` (the others start with distinct characters). BAD takes any other
# character but a blank, so that every match starts where the previous one ended
# and only blanks at the end of the line match nothing. It is matched against one
# line at a time: a separator is a `;` there (newlines end the lines).
_REGEX = re.compile(
    r"[ \t\f\r]*(?:"
    r"(?P<NAME>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<CMP><=|>=|==|!=|<|>)"
    r"|(?P<PUNCT>[\-+*/=,:@])"
    r"|(?P<OPEN>[(\[{])"
    r"|(?P<CLOSE>[)\]}])"
    r"|(?P<SEP>;[; \t\f\r]*)"
    rf"|(?P<NUMBER>{_NUMBER})"
    r"|(?P<COMMENT>#[^\n]*)"
    r"|(?P<BAD>[^ \t\f\r])"
    r")"
)
_NAME, _CMP, _PUNCT_G, _OPEN, _CLOSE, _SEP, _NUMBER_G, _COMMENT, _BAD = range(1, 10)
_NUMBER_RE = re.compile(_NUMBER)
_STMT_START = frozenset({"_NL", "SEMICOLON", "LBRACE", "RBRACE"})
_CLOSER_OF = {")": "(", "]": "[", "}": "{"}
_BRACKETS = frozenset({"LPAR", "RPAR", "LSQB", "RSQB", "LBRACE", "RBRACE"})
# Characters that `str.split` takes for blanks and the lexer does not (in ASCII text).
_OTHER_SPACES = "\v\x1c\x1d\x1e\x1f"

# How deep the expression parser recurses before it leaves the text to lark (deeper
# nests are rare and lark parses them without recursion).
_MAX_RECURSION = 200

Tok = tuple[str, str, int, int, int]  # kind, text, line, col, end col (one line each)


def _spaced_lines(text: str) -> list[str] | None:
    """The lines of `text` with a blank either side of each punctuation character, so
    that `str.split` cuts them into words at token boundaries (None if `str.split` would
    also cut at a character the lexer refuses)."""
    if any(c in text for c in _OTHER_SPACES):
        return None
    for c in _PUNCT:
        text = text.replace(c, f" {c} ")
    return text.split("\n")


def tokenize(text: str) -> list[Tok]:
    """The tokens of `text` as larklexer._Lexer makes them (separators: kind `_NL` or
    `SEMICOLON`), followed by an `$END` token. Raises `Fallback` on a bad character,
    an over-long integer, or a source over the statement or token limits.

    Most lines are names, numbers and punctuation between blanks: their words (found
    with `str.split` once the punctuation is spaced out) are their tokens, each found in
    the line with `str.find`, several times cheaper than a regular-expression match per
    token. From the first word that is not a name, a number or a punctuation character
    (a comment, a comparison, an exponent with a sign, a character no token starts
    with, …), `_REGEX` lexes the rest of the line; it lexes whole lines that are not
    ASCII (`str.isidentifier` takes other letters) or that hold `==` (spaced out, two
    `=`). tests/test_load_fast.py compares the tokens with lark's lexer's.
    """
    max_digits = syntax_tree.MAX_NUMBER_DIGITS  # read when called (tests lower it)
    toks: list[Tok] = []
    append = toks.append
    keywords, punct, stmt_start, brackets = _KEYWORDS, _PUNCT, _STMT_START, _BRACKETS
    number = _NUMBER_RE.fullmatch
    opened: list[str] = []  # the open brackets: "(", "[" or "{"
    depth = 0  # open ( and [ since the innermost {
    outer: list[int] = []  # for each open bracket, `depth` before it
    prev = "_NL"
    lines = text.split("\n")
    last = len(lines)
    spaced = _spaced_lines(text)
    for line_no, line in enumerate(lines, 1):
        rest: int | None = 0  # where _REGEX takes over (None: nowhere)
        if spaced is not None and line.isascii() and "==" not in line:
            rest = None
            end = 0  # where the last token ended
            for value in spaced[line_no - 1].split():
                start = line.find(value, end)  # only blanks lie between two words
                kind = punct.get(value)
                if kind is None:
                    if value.isidentifier():
                        kind = keywords.get(value, "NAME") if prev in stmt_start else "NAME"
                    elif value.isdigit() or number(value):
                        kind = "NUMBER"
                        if len(value) > max_digits and value.isdigit():
                            raise Fallback
                    else:
                        rest = start
                        break
                elif kind in brackets:
                    if value in _CLOSER_OF:
                        if not opened or opened[-1] != _CLOSER_OF[value]:
                            raise Fallback  # a mismatched or unmatched closer
                        opened.pop()
                        depth = outer.pop()
                    else:
                        opened.append(value)
                        outer.append(depth)
                        depth = 0 if value == "{" else depth + 1
                end = start + len(value)
                prev = kind
                append((kind, value, line_no, start + 1, end + 1))
        if rest is not None:
            for m in _REGEX.finditer(line, rest):
                group: int = m.lastindex  # type: ignore[assignment]  # every alternative is a group
                start, end = m.span(group)
                if group == _NAME:
                    value = line[start:end]
                    kind = keywords.get(value, "NAME") if prev in stmt_start else "NAME"
                elif group == _PUNCT_G:
                    value = line[start]
                    kind = punct[value]
                elif group == _SEP:
                    if depth:
                        raise Fallback  # `;` inside brackets: a syntax error
                    if prev != "_NL" and prev != "SEMICOLON":
                        prev = "SEMICOLON"
                        append(("SEMICOLON", ";", line_no, start + 1, start + 2))
                    continue
                elif group == _OPEN:
                    value = line[start]
                    kind = punct[value]
                    opened.append(value)
                    outer.append(depth)
                    depth = 0 if value == "{" else depth + 1
                elif group == _CLOSE:
                    value = line[start]
                    kind = punct[value]
                    if not opened or opened[-1] != _CLOSER_OF[value]:
                        raise Fallback  # a mismatched or unmatched closer: a syntax error
                    opened.pop()
                    depth = outer.pop()
                elif group == _NUMBER_G:
                    value = line[start:end]
                    kind = "NUMBER"
                    if len(value) > max_digits and value.isdigit():
                        raise Fallback
                elif group == _CMP:
                    value = line[start:end]
                    kind = "CMP"
                elif group == _COMMENT:
                    continue
                else:
                    raise Fallback  # a character no token starts with
                prev = kind
                append((kind, value, line_no, start + 1, end + 1))
        # The newline ends a statement outside ( ) and [ ], once after other tokens.
        if depth == 0 and prev != "_NL" and prev != "SEMICOLON" and line_no < last:
            prev = "_NL"
            append(("_NL", "\n", line_no, len(line) + 1, 1))
    if opened:
        raise Fallback  # an unclosed bracket: a syntax error
    if len(toks) > min(syntax_tree.MAX_STATEMENTS, syntax_tree.MAX_STATEMENT_TOKENS):
        _check_limits(toks)  # only then can a limit be passed (there are fewer tokens)
    append(("$END", "", last, 1, 1))
    return toks


def _check_limits(toks: list[Tok]) -> None:
    """Raise `Fallback` if the tokens hold more statements, or a statement more tokens,
    than syntax_tree's limits allow (counted as larklexer._Lexer counts them)."""
    max_statements, max_tokens = syntax_tree.MAX_STATEMENTS, syntax_tree.MAX_STATEMENT_TOKENS
    prev = "_NL"
    statements = tokens = 0
    for tok in toks:
        kind = tok[0]
        if kind != "_NL" and kind != "SEMICOLON":
            if prev in _STMT_START:
                statements += 1
                tokens = 0
                if statements > max_statements:
                    raise Fallback
            tokens += 1
            if tokens > max_tokens:
                raise Fallback
        prev = kind


class _Parser:
    def __init__(self, text: str, source: Source) -> None:
        self.toks = tokenize(text)
        self.i = 0
        self.source = source

    # --- tokens and spans
    def expect(self, kind: str) -> Tok:
        tok = self.toks[self.i]
        if tok[0] != kind:
            raise Fallback
        self.i += 1
        return tok

    def span(self, first: Tok, last: Tok) -> Span:
        return Span(self.source, first[2], first[3], last[2], last[4])

    def tspan(self, tok: Tok) -> Span:
        return Span(self.source, tok[2], tok[3], tok[2], tok[4])

    def join(self, a: Span, b: Span) -> Span:
        return Span(self.source, a.line, a.col, b.end_line, b.end_col)

    def span_from(self, first: Tok, b: Span) -> Span:
        """From token `first` to the end of `b` (`join` without a span for the token)."""
        return Span(self.source, first[2], first[3], b.end_line, b.end_col)

    # name() and num() are the most frequent calls: expect() and tspan() inlined
    def name(self) -> Any:
        tok = self.toks[self.i]
        if tok[0] != "NAME":
            raise Fallback
        self.i += 1
        line = tok[2]
        return Name(tok[1], Span(self.source, line, tok[3], line, tok[4]))

    def num(self) -> Any:
        tok = self.toks[self.i]
        if tok[0] != "NUMBER":
            raise Fallback
        self.i += 1
        line = tok[2]
        return Num(tok[1], Span(self.source, line, tok[3], line, tok[4]))

    def signed(self) -> tuple[Any, bool]:

        tok = self.toks[self.i]
        if tok[0] == "MINUS":
            self.i += 1
            n = self.expect("NUMBER")
            return (Num(n[1], self.span(tok, n)), True)
        return (self.num(), False)

    def at(self, kind: str) -> bool:
        return self.toks[self.i][0] == kind

    def accept(self, kind: str) -> bool:
        if self.toks[self.i][0] == kind:
            self.i += 1
            return True
        return False

    def skip_seps(self) -> None:
        toks = self.toks
        while toks[self.i][0] in ("_NL", "SEMICOLON"):
            self.i += 1

    def items(self, item: Any, closer: str | None) -> list[Any]:
        """`_sep* (item _sep+)* item?` up to `closer` (None: the end of the text)."""
        end = closer or "$END"
        toks = self.toks
        out: list[Any] = []
        self.skip_seps()
        while toks[self.i][0] != end:
            out.append(item())
            kind = toks[self.i][0]
            if kind == end:
                break
            if kind != "_NL" and kind != "SEMICOLON":
                raise Fallback
            self.i += 1
            self.skip_seps()
        return out

    # --- files
    def module(self) -> tuple[Any, ...]:
        out = tuple(self.items(self.statement, None))
        self.expect("$END")
        return out

    def sched_file(self) -> tuple[Any, ...]:
        out = tuple(self.items(self.step, None))
        self.expect("$END")
        return out

    # --- statements
    def statement(self) -> Any:
        kind = self.toks[self.i][0]
        if kind == "NAME":
            return self.assign()
        method = _STATEMENTS.get(kind)
        if method is None:
            raise Fallback
        return method(self)

    def program_stmt(self) -> Any:

        kw = self.expect("PROGRAM")
        name = self.name()
        return ProgramStmt(name, self.span_from(kw, name.span))

    def ranks_stmt(self) -> Any:

        kw = self.expect("RANKS")
        if self.at("NUMBER"):
            n = self.num()
            return RanksStmt(self.span_from(kw, n.span), n=n)
        axes = []
        while True:
            a = self.name()
            self.expect("EQUAL")
            axes.append((a, self.num()))
            if not self.accept("COMMA"):
                break
        return RanksStmt(self.span_from(kw, axes[-1][1].span), grid=tuple(axes))

    def dim_stmt(self) -> Any:

        kw = self.expect("DIM")
        items = []
        while True:
            name = self.name()
            self.expect("EQUAL")
            items.append((name, self.num()))
            if not self.accept("COMMA"):
                break
        return DimStmt(tuple(items), self.span_from(kw, items[-1][1].span))

    def param_stmt(self) -> Any:

        kw = self.expect("PARAM")
        items = []
        while True:
            name = self.name()
            self.expect("COLON")
            dtype = self.name()
            self.expect("EQUAL")
            num, neg = self.signed()
            items.append((name, dtype, num, neg))
            if not self.accept("COMMA"):
                break
        return ParamStmt(tuple(items), self.span_from(kw, items[-1][2].span))

    def input_stmt(self) -> Any:
        toks, source = self.toks, self.source
        kw = toks[self.i]  # INPUT (the statement dispatch saw it)
        self.i += 1
        name = self.name()
        self.expect("COLON")
        dtype = self.name()
        self.expect("LSQB")
        sizes = []
        if toks[self.i][0] != "RSQB":
            while True:
                factors = [self.size_atom()]
                while toks[self.i][0] == "STAR":
                    self.i += 1
                    factors.append(self.size_atom())
                span = factors[0].span  # spans are values: one factor's is its size's
                if len(factors) > 1:
                    b = factors[-1].span
                    span = Span(source, span.line, span.col, b.end_line, b.end_col)
                sizes.append(SizeExpr(tuple(factors), span))
                if toks[self.i][0] != "COMMA":
                    break
                self.i += 1
        self.expect("RSQB")
        layout, layout_arg, layout_over, layout_span = self.layout_spec()
        more = []
        while toks[self.i][0] == "NAME":  # layouts over further axes: `local(over=dp)`
            more.append(AxisLayout(*self.layout_spec()))
        stage_kw = stage = None
        if toks[self.i][0] == "AT":
            self.i += 1
            stage_kw = self.name()
            stage = self.num()
        end = stage.span if stage is not None else (more[-1].span if more else layout_span)
        return InputStmt(
            name,
            dtype,
            tuple(sizes),
            layout,
            layout_arg,
            stage_kw,
            stage,
            Span(source, kw[2], kw[3], end.end_line, end.end_col),
            layout_span,
            layout_over,
            tuple(more),
        )

    def layout_spec(self) -> Any:
        """`WORD`, `WORD(d)`, `WORD(over=AXIS)` or `WORD(d, over=AXIS)`."""
        toks = self.toks
        word = self.name()
        arg = over = None
        span = word.span
        if toks[self.i][0] == "LPAR":
            self.i += 1
            if toks[self.i][0] != "NAME":
                arg = self.signed()
                if toks[self.i][0] == "COMMA":
                    self.i += 1
                    over = self.over_kw()
            else:
                over = self.over_kw()
            rpar = self.expect("RPAR")
            span = Span(self.source, span.line, span.col, rpar[2], rpar[4])
        return word, arg, over, span

    def over_kw(self) -> Any:
        key = self.name()
        if key.text != "over":
            raise Fallback  # the grammar's message
        self.expect("EQUAL")
        return self.name()

    def type_arg(self) -> TypeArg:
        """`DTYPE[SIZE, …]` as a call argument (the grammar's `type_arg`)."""
        toks, source = self.toks, self.source
        name_tok = toks[self.i]
        name = self.name()
        self.expect("LSQB")
        sizes = []
        if toks[self.i][0] != "RSQB":
            while True:
                factors = [self.size_atom()]
                while toks[self.i][0] == "STAR":
                    self.i += 1
                    factors.append(self.size_atom())
                span = factors[0].span
                if len(factors) > 1:
                    b = factors[-1].span
                    span = Span(source, span.line, span.col, b.end_line, b.end_col)
                sizes.append(SizeExpr(tuple(factors), span))
                if toks[self.i][0] != "COMMA":
                    break
                self.i += 1
        close = self.expect("RSQB")
        return TypeArg(name, tuple(sizes), self.span_from(name_tok, self.tspan(close)))

    def size_atom(self) -> Any:
        tok = self.toks[self.i]
        cls = Num if tok[0] == "NUMBER" else Name
        if cls is Name and tok[0] != "NAME":
            raise Fallback
        self.i += 1
        line = tok[2]
        return cls(tok[1], Span(self.source, line, tok[3], line, tok[4]))

    def output_stmt(self) -> Any:

        kw = self.expect("OUTPUT")
        names = [self.name()]
        while self.accept("COMMA"):
            names.append(self.name())
        return OutputStmt(tuple(names), self.span_from(kw, names[-1].span))

    def assign(self) -> Any:
        name = self.name()
        self.expect("EQUAL")
        first = self.i
        expr = self.expr(0)
        # Each operator or call on a path of the tree has a token of its own, so an
        # expression of at most MAX_EXPR_DEPTH tokens cannot nest deeper: only a longer
        # one needs the walk.
        if self.i - first > MAX_EXPR_DEPTH:
            _check_depth(name, expr)  # an InputError: lark reports it in source order
        a, b = name.span, expr.span
        return Assign(name, expr, Span(self.source, a.line, a.col, b.end_line, b.end_col))

    def schedule_block(self) -> Any:

        kw = self.expect("SCHEDULE")
        name = self.name()
        self.expect("LBRACE")
        steps = self.items(self.step, "RBRACE")
        close = self.expect("RBRACE")
        return ScheduleStmt(name, tuple(steps), self.span(kw, close))

    def step(self) -> StepCall:
        name = self.name()
        self.expect("LPAR")
        pos: list[Any] = []
        kwargs: list[tuple[str, int]] = []
        if not self.at("RPAR"):
            while True:
                arg = self.name()
                if self.accept("EQUAL"):
                    num = self.num()
                    if not num.is_int:
                        raise Fallback  # a diagnostic of the step callback
                    kwargs.append((arg.text, int(num.text)))
                else:
                    pos.append(arg)
                if not self.accept("COMMA"):
                    break
        close = self.expect("RPAR")
        return StepCall(
            name.text,
            tuple(a.text for a in pos),
            tuple(kwargs),
            span=Span(self.source, name.span.line, name.span.col, close[2], close[4]),
            arg_spans=tuple(a.span for a in pos),
        )

    def fused_block(self) -> Any:

        kw = self.expect("FUSED")
        self.expect("LBRACE")
        items = self.items(self.assign, "RBRACE")
        close = self.expect("RBRACE")
        return FusedStmt(tuple(items), self.span(kw, close))

    def overlapped_block(self) -> Any:

        kw = self.expect("OVERLAPPED")
        chunks_kw = self.name()
        self.expect("EQUAL")
        chunks = self.num()
        self.expect("LBRACE")
        items = self.items(self.ol_item, "RBRACE")
        close = self.expect("RBRACE")
        return OverlappedStmt(chunks_kw, chunks, tuple(items), self.span(kw, close))

    def ol_item(self) -> Any:
        if self.at("FUSED"):
            return self.fused_block()
        return self.assign()

    # --- expressions
    def expr(self, depth: int) -> Any:
        if depth > _MAX_RECURSION:
            raise Fallback
        toks = self.toks
        left = self.product(depth)
        while True:
            kind = toks[self.i][0]
            if kind == "PLUS":
                op = Op.ADD
            elif kind == "MINUS":
                op = Op.SUB
            else:
                return left
            self.i += 1
            right = self.product(depth)
            a, b = left.span, right.span
            span = Span(self.source, a.line, a.col, b.end_line, b.end_col)
            left = Expr(op, (left, right), span=span)

    def product(self, depth: int) -> Any:
        toks = self.toks
        left = self.unary(depth)
        while True:
            kind = toks[self.i][0]
            if kind == "STAR":
                op = Op.MUL
            elif kind == "SLASH":
                op = Op.DIV
            else:
                return left
            self.i += 1
            right = self.unary(depth)
            a, b = left.span, right.span
            span = Span(self.source, a.line, a.col, b.end_line, b.end_col)
            left = Expr(op, (left, right), span=span)

    def unary(self, depth: int) -> Any:
        toks = self.toks
        i = self.i
        tok = toks[i]
        kind = tok[0]
        self.i = i + 1
        if kind == "NAME":
            if toks[i + 1][0] == "LPAR":
                return self.call(tok, depth)
            line = tok[2]
            return Expr(Op.REF, name=tok[1], span=Span(self.source, line, tok[3], line, tok[4]))
        if kind == "NUMBER":
            text = tok[1]
            value = int(text) if text.isdigit() else float(text)
            line = tok[2]
            return Expr(Op.CONST, value=value, span=Span(self.source, line, tok[3], line, tok[4]))
        if kind == "MINUS":
            if depth > _MAX_RECURSION:
                raise Fallback
            inner = self.unary(depth + 1)
            return Expr(Op.NEG, (inner,), span=self.span_from(tok, inner.span))
        if kind == "LPAR":
            inner = self.expr(depth + 1)
            close = self.expect("RPAR")
            return dataclasses.replace(inner, span=self.span(tok, close))
        raise Fallback

    def call(self, name_tok: Tok, depth: int) -> Any:
        self.i += 1  # (
        toks = self.toks
        args: list[Any] = []
        if toks[self.i][0] != "RPAR":
            while True:
                tok = toks[self.i]
                kind = tok[0]
                after = toks[self.i + 1][0]
                if (
                    kind == "NAME"
                    and (after == "COMMA" or after == "RPAR")
                    and depth < _MAX_RECURSION
                ):
                    # a name alone, the most frequent argument: what expr() makes of it
                    self.i += 1
                    line = tok[2]
                    span = Span(self.source, line, tok[3], line, tok[4])
                    args.append(Expr(Op.REF, name=tok[1], span=span))
                elif kind == "NAME" and after == "LSQB":
                    args.append(self.type_arg())
                elif kind == "NAME" and after == "EQUAL":
                    self.i += 2
                    value = self.expr(depth + 1)
                    name = Name(tok[1], self.tspan(tok))
                    args.append(Kw(name, value, self.join(name.span, value.span)))
                elif kind == "PLUS" or kind == "STAR":
                    self.i += 1
                    args.append(RedTok(tok[1], self.tspan(tok)))
                else:
                    lhs = self.expr(depth + 1)
                    cmp = toks[self.i]
                    if cmp[0] == "CMP":
                        self.i += 1
                        rhs = self.expr(depth + 1)
                        args.append(Cmp(Op(cmp[1]), lhs, rhs, self.join(lhs.span, rhs.span)))
                    else:
                        args.append(lhs)
                if toks[self.i][0] != "COMMA":
                    break
                self.i += 1
        close = toks[self.i]
        if close[0] != "RPAR":
            raise Fallback
        self.i += 1
        line, col = name_tok[2], name_tok[3]
        return Call(
            Name(name_tok[1], Span(self.source, line, col, line, name_tok[4])),
            tuple(args),
            Span(self.source, line, col, close[2], close[4]),
        )


_STATEMENTS = {
    "PROGRAM": _Parser.program_stmt,
    "RANKS": _Parser.ranks_stmt,
    "DIM": _Parser.dim_stmt,
    "PARAM": _Parser.param_stmt,
    "INPUT": _Parser.input_stmt,
    "OUTPUT": _Parser.output_stmt,
    "SCHEDULE": _Parser.schedule_block,
    "FUSED": _Parser.fused_block,
    "OVERLAPPED": _Parser.overlapped_block,
}


def parse(text: str, source: Source, start: str) -> tuple[Any, ...]:
    """The statements (start "start") or steps (start "sched_file") of `text`; raises
    `Fallback` where lark must parse it (an error, or a nest too deep to recurse)."""
    try:
        p = _Parser(text, source)
        return p.module() if start == "start" else p.sched_file()
    except Fallback:
        raise
    except Exception as err:  # an InputError from a check, an over-deep recursion, …
        raise Fallback from err
