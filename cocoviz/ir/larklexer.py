"""The lark lexer of the `.coco` language: the tokenizer the lark parser in
cocoviz/ir/syntax.py runs with (the fallback that reports syntax errors; valid text is
parsed by cocoviz/ir/fastparse.py). Kept in its own module so that lark is imported
only when a text needs it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import lark.lexer
from lark import Token

from cocoviz.ir import syntax_tree
from cocoviz.ir.syntax_tree import (
    _CLOSERS,
    _OPENERS,
    _SEPARATORS,
    _STMT_START,
    _BadCharacter,
    _LexLimit,
)


class _Lexer(lark.lexer.Lexer):
    """The tokenizer: one regular expression built from the grammar's terminals.

    - Statement keywords (`program`, `input`, `fused`, …) are keywords only where a
      statement starts; elsewhere they are names, like every function, dtype and
      layout word (docs/language.md, types).
    - Newlines inside ( ) and [ ] do not end a statement; a run of newlines (with
      comments and blank lines between) is one `_NL` token, and a run of separators
      (newlines and `;`) one separator.
    - It remembers the brackets still open, so that an unexpected end of file can
      point at the one that was never closed. Each opener records the depth before it,
      so that closing brackets costs amortized constant time at any nesting depth.
    - It stops a source with more than `syntax_tree.MAX_STATEMENTS` statements or a statement of
      more than `syntax_tree.MAX_STATEMENT_TOKENS` tokens.

    It does the work of lark's contextual lexer plus a post-lexer at a fraction of the
    cost (lexing was a third of the parse time of a large program).
    """

    __future_interface__ = 2  # lex(lexer_state, parser_state), used unwrapped

    def __init__(self, conf: Any) -> None:
        terms = {t.name: t for t in conf.terminals}
        self.keywords = {
            t.pattern.value: t.name
            for t in terms.values()
            if t.pattern.type == "str" and t.pattern.value.isalpha()
        }
        self.punct = {
            t.pattern.value: t.name
            for t in terms.values()
            if t.pattern.type == "str" and not t.pattern.value.isalpha()
        }
        groups = [
            f"(?P<{n}>{terms[n].pattern.to_regexp()})"
            for n in ("WS", "COMMENT", "NUMBER", "NAME", "CMP")
        ]
        punct = "".join(re.escape(p) for p in sorted(self.punct))
        self.regex = re.compile(
            "|".join(groups + ["(?P<SEP>[\n;][\n; \t\f\r]*)", f"(?P<PUNCT>[{punct}])"])
        )
        self.open: list[Token] = []

    def lex(self, lexer_state: Any, parser_state: Any) -> Iterator[Token]:
        text: str = lexer_state.text.text
        match = self.regex.match
        keywords, punct = self.keywords, self.punct
        self.open = opened = []
        outer: list[int] = []  # for each open bracket, `depth` before it
        counts = dict.fromkeys(_OPENERS, 0)  # open brackets of each kind
        depth = 0  # open ( and [ since the innermost {
        pos, line, line_start, n = 0, 1, 0, len(text)
        prev = "_NL"
        statements = 0
        tokens = 0  # in the current statement
        while pos < n:
            m = match(text, pos)
            if m is None:
                raise _BadCharacter(pos, line, pos - line_start + 1)
            kind = m.lastgroup
            end = m.end()
            col = pos - line_start + 1
            if kind == "WS" or kind == "COMMENT":
                pos = end
                continue
            if kind == "SEP":  # newlines and `;`, with the blanks between them
                semi = text.find(";", pos, end)
                if depth == 0 and prev not in _SEPARATORS:
                    prev = "_NL" if text[pos] == "\n" else "SEMICOLON"
                    if prev == "_NL":
                        yield Token("_NL", "\n", pos, line, col, line + 1, 1, pos + 1)
                    else:
                        yield Token("SEMICOLON", ";", pos, line, col, line, col + 1, pos + 1)
                elif depth > 0 and semi >= 0:  # `;` inside brackets: the parser reports it
                    nl = text.rfind("\n", pos, semi)
                    at_line = line + text.count("\n", pos, semi)
                    at_col = semi - (nl + 1 if nl >= 0 else line_start) + 1
                    prev = "SEMICOLON"
                    yield Token(
                        "SEMICOLON", ";", semi, at_line, at_col, at_line, at_col + 1, semi + 1
                    )
                nl = text.rfind("\n", pos, end)
                if nl >= 0:
                    line += text.count("\n", pos, end)
                    line_start = nl + 1
                pos = end
                continue
            value = m.group()
            if kind == "PUNCT":
                kind = punct[value]
                if kind in _OPENERS:
                    opened.append(Token(kind, value, pos, line, col, line, col + 1, end))
                    outer.append(depth)
                    counts[kind] += 1
                    depth = 0 if kind == "LBRACE" else depth + 1
                elif kind in _CLOSERS:
                    # drop brackets up to the matching opener (an unmatched closer is left
                    # to the parser to report)
                    want = _CLOSERS[kind]
                    if counts[want]:
                        i = len(opened) - 1
                        while opened[i].type != want:
                            i -= 1
                        for o in opened[i:]:
                            counts[o.type] -= 1
                        depth = outer[i]
                        del opened[i:], outer[i:]
            elif kind == "NAME" and prev in _STMT_START and value in keywords:
                kind = keywords[value]
            elif kind == "NUMBER" and len(value) > syntax_tree.MAX_NUMBER_DIGITS and value.isdigit():
                raise _LexLimit(
                    f"integer too long: {len(value):,} digits",
                    line,
                    col,
                    "integers are 64-bit: at most 19 digits",
                    end - pos,
                )
            assert kind is not None
            if prev in _STMT_START and kind not in _SEPARATORS:
                statements += 1
                tokens = 0
                if statements > syntax_tree.MAX_STATEMENTS:
                    raise _LexLimit(
                        f"too many statements: more than {syntax_tree.MAX_STATEMENTS:,}",
                        line,
                        col,
                        "real programs have a few thousand statements: is it the right file?",
                    )
            tokens += 1
            if tokens > syntax_tree.MAX_STATEMENT_TOKENS:
                raise _LexLimit(
                    f"statement too long: more than {syntax_tree.MAX_STATEMENT_TOKENS:,} tokens",
                    line,
                    col,
                    "split it into several statements",
                )
            prev = kind
            yield Token(kind, value, pos, line, col, line, col + end - pos, end)
            pos = end
