"""User-facing errors, source spans, and exit codes.

Two kinds of failure exist (STYLE.md): a user mistake is a `CocovizError` subclass that
carries a message, a source span and a hint, rendered as ``file:line:col: error: …`` with
the source line and a caret; a broken IR invariant after a step is an `InternalError`.
"""

from __future__ import annotations

import difflib
import enum
import functools
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


class ExitCode(enum.IntEnum):
    """Exit codes of every `cocoviz` command (docs/language.md, diagnostics)."""

    OK = 0
    INPUT = 1
    USAGE = 2
    SCHEDULE = 3
    MISMATCH = 4
    BUILD = 5
    INTERNAL = 70


@dataclass(frozen=True)
class Source:
    """A named source text; spans point into it."""

    path: str
    text: str

    @functools.cached_property
    def lines(self) -> list[str]:
        """The lines as the parser counts them: split at '\\n' only (not at the other
        characters `str.splitlines` breaks on), without a trailing '\\r'."""
        return [line.removesuffix("\r") for line in self.text.split("\n")]

    def line(self, n: int) -> str:
        lines = self.lines
        return lines[n - 1] if 0 < n <= len(lines) else ""


@dataclass(frozen=True, init=False)  # its __init__ is written by hand
class Span:
    """A 1-based (line, col) range in a source; excluded from IR equality."""

    source: Source | None
    line: int
    col: int
    end_line: int
    end_col: int

    def __init__(
        self, source: Source | None, line: int, col: int, end_line: int, end_col: int
    ) -> None:
        # The parser makes a span for every name and number. The generated frozen
        # __init__ sets each field with an object.__setattr__ call; storing them straight
        # into the instance's __dict__ costs half as much (same fields, equality, hash).
        d = self.__dict__
        d["source"] = source
        d["line"] = line
        d["col"] = col
        d["end_line"] = end_line
        d["end_col"] = end_col

    @property
    def path(self) -> str:
        return self.source.path if self.source else "<input>"

    def __repr__(self) -> str:
        return f"Span({self.path}:{self.line}:{self.col})"


@dataclass(frozen=True)
class Diagnostic:
    """One message: severity, text, where, and optional hint and notes."""

    message: str
    span: Span | None = None
    hint: str | None = None
    notes: tuple[tuple[str, Span | None], ...] = ()
    severity: str = "error"

    def render(self, color: bool = False) -> str:
        out: list[str] = []
        where = f"{self.span.path}:{self.span.line}:{self.span.col}: " if self.span else ""
        sev = self.severity
        if color:
            sev = {"error": "\x1b[1;31merror\x1b[0m", "warning": "\x1b[1;33mwarning\x1b[0m"}.get(
                sev, sev
            )
        out.append(f"{where}{sev}: {self.message}")
        if self.span is not None:
            out.extend(_excerpt(self.span))
        for note, nspan in self.notes:
            nwhere = f"{nspan.path}:{nspan.line}:{nspan.col}: " if nspan else ""
            out.append(f"{nwhere}note: {note}")
            if nspan is not None:
                out.extend(_excerpt(nspan))
        if self.hint:
            out.append(f"hint: {self.hint}")
        return "\n".join(out)


_MAX_SHOWN = 160
"""Columns of a source line shown under a diagnostic."""


def _excerpt(span: Span) -> list[str]:
    """The source line of a span and a row of carets under it (to the end of the line
    when the span goes on to later lines)."""
    if span.source is None or not 0 < span.line <= len(span.source.lines):
        return []
    text = span.source.line(span.line)
    gutter = f"{span.line:>4} | "
    start = min(max(span.col, 1), len(text) + 1)
    if span.end_line > span.line:
        end = max(len(text) + 1, start + 1)
    else:
        end = min(max(span.end_col, start + 1), max(len(text) + 1, start + 1))
    if len(text) > _MAX_SHOWN:
        # a very long line: the part around the caret, cut ends marked
        lo = max(0, min(start - 1 - _MAX_SHOWN // 4, len(text) - _MAX_SHOWN))
        hi = lo + _MAX_SHOWN
        head, tail = ("…" if lo > 0 else ""), ("…" if hi < len(text) else "")
        text = head + text[lo:hi] + tail
        start = start - lo + len(head)
        end = min(end - lo + len(head), len(text) + 1)
    shown = "".join(c if c.isprintable() else " " for c in text)  # tabs etc.: one column
    pad = _width(shown[: start - 1])
    marks = max(_width(shown[start - 1 : end - 1]), 1)
    caret = " " * (len(gutter) - 2) + "| " + " " * pad + "^" * marks
    return [gutter + shown, caret]


def _width(text: str) -> int:
    """Terminal columns of a text (wide East Asian characters take two)."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


class CocovizError(Exception):
    """A user mistake. Holds one or more diagnostics; never a traceback for the user."""

    exit_code = ExitCode.INPUT

    def __init__(
        self,
        message: str,
        span: Span | None = None,
        hint: str | None = None,
        notes: Sequence[tuple[str, Span | None]] = (),
        *,
        diagnostics: Sequence[Diagnostic] | None = None,
    ) -> None:
        if diagnostics:
            self.diagnostics = tuple(diagnostics)
        else:
            self.diagnostics = (Diagnostic(message, span, hint, tuple(notes)),)
        super().__init__(self.diagnostics[0].message)

    @property
    def message(self) -> str:
        return self.diagnostics[0].message

    @property
    def span(self) -> Span | None:
        return self.diagnostics[0].span

    @property
    def hint(self) -> str | None:
        return self.diagnostics[0].hint

    def render(self, color: bool = False) -> str:
        return "\n".join(d.render(color) for d in self.diagnostics)


class InputError(CocovizError):
    """Syntax, name, type, shape or layout error in a program (exit 1)."""


class UsageError(CocovizError):
    """Wrong command-line usage (exit 2)."""

    exit_code = ExitCode.USAGE


class ScheduleError(CocovizError):
    """An illegal schedule step (exit 3)."""

    exit_code = ExitCode.SCHEDULE


class MismatchError(CocovizError):
    """Scheduled and unscheduled programs disagree (exit 4)."""

    exit_code = ExitCode.MISMATCH


class BuildError(CocovizError):
    """Emitted code failed to build or run (exit 5)."""

    exit_code = ExitCode.BUILD


class InternalError(Exception):
    """A cocoviz bug: an IR invariant broke. Reported as such (exit 70)."""

    exit_code = ExitCode.INTERNAL


@dataclass
class DiagnosticBag:
    """Collects several errors so that, e.g., all unknown names are reported together."""

    items: list[Diagnostic] = field(default_factory=list)

    def add(self, err: CocovizError) -> None:
        self.items.extend(err.diagnostics)

    def raise_if_any(self, cls: type[CocovizError] = InputError) -> None:
        """Raise one error holding every diagnostic, in source order."""
        if self.items:

            def where(d: Diagnostic) -> tuple[int, int]:
                return (d.span.line, d.span.col) if d.span else (0, 0)

            raise cls("", diagnostics=sorted(self.items, key=where))


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A `did you mean` hint for a misspelled name, or None."""
    names = list(candidates)
    same_letters = [c for c in names if c.lower() == name.lower() and c != name]
    close = same_letters or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


def shown_value(text: str, limit: int = 40) -> str:
    """A command-line value quoted in a message, shortened when long."""
    return text if len(text) <= limit else text[:limit] + "…"
