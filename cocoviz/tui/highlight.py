"""A small regex highlighter for `.coco` text.

Textual's TextArea highlights through tree-sitter, and no tree-sitter grammar exists
for the language, so `lex_line` yields the same kind of (start byte, end byte, name)
highlights from regular expressions; the names are keys of the editor's theme.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from cocoviz.ir.nodes import CALL_NAMES, COLLECTIVES
from cocoviz.ir.types import DTYPE_NAMES

KEYWORDS = frozenset(
    {"program", "ranks", "dim", "param", "input", "output", "schedule", "fused", "overlapped"}
)
LAYOUTS = frozenset({"replicated", "local", "sliced"})
STEPS = frozenset({"split", "reorder", "asslice", "dce", "fuse", "overlap"})
COLLECTIVE_NAMES = frozenset(op.value for op in COLLECTIVES)
FUNCTIONS = frozenset(CALL_NAMES) - COLLECTIVE_NAMES

_TOKEN = re.compile(
    r"(?P<comment>#.*)"
    r"|(?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<call>\s*\()?"
    r"|(?P<operator>[-+*/=<>!]=?|@)"
)


def lex_line(line: str) -> Iterator[tuple[int, int, str]]:
    """Highlights of one line as (start byte, end byte, highlight name)."""
    ascii_only = line.isascii()

    def b(i: int) -> int:
        return i if ascii_only else len(line[:i].encode("utf-8"))

    first = True
    for m in _TOKEN.finditer(line):
        kind = m.lastgroup
        start, end = m.start(), m.end()
        if m.group("comment") is not None:
            yield b(start), b(end), "comment"
            continue
        if m.group("number") is not None:
            yield b(start), b(end), "number"
        elif m.group("name") is not None:
            word = m.group("name")
            end = m.end("name")
            is_call = m.group("call") is not None
            if first and word in KEYWORDS:
                yield b(start), b(end), "keyword"
            elif word in KEYWORDS - {"input", "output", "program", "param", "dim", "ranks"}:
                yield b(start), b(end), "keyword"
            elif word in DTYPE_NAMES:
                yield b(start), b(end), "type"
            elif word in LAYOUTS:
                yield b(start), b(end), "layout"
            elif is_call and word in COLLECTIVE_NAMES:
                yield b(start), b(end), "collective"
            elif is_call and word in STEPS:
                yield b(start), b(end), "step"
            elif is_call and word in FUNCTIONS:
                yield b(start), b(end), "function"
        elif kind == "operator":
            yield b(start), b(end), "operator"
        first = False
