"""Parsing `.coco` and `.sched` text into syntax objects.

Valid text is parsed by the hand-written parser in cocoviz/ir/fastparse.py; text it
does not accept is parsed again by lark (with the lexer in cocoviz/ir/larklexer.py),
which reports the error. lark is imported only then. This module is the one boundary
where lark's exceptions are converted into `InputError`s with a source span; nothing
from lark escapes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import json
import os
import re
import sys
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocoviz.errors import InputError, Source, Span
from cocoviz.ir.nodes import Expr, Op, StepCall
from cocoviz.ir.syntax_tree import (
    Assign,
    AxisLayout,
    Call,
    Cmp,
    DimStmt,
    FusedStmt,
    InputStmt,
    Kw,
    Module,
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
    _BadCharacter,
    _check_depth,
    _LexLimit,
)

if TYPE_CHECKING:
    import lark
    from lark import Token
    from lark.exceptions import UnexpectedInput, UnexpectedToken

    from cocoviz.ir.larklexer import _Lexer


class _Build:
    """Parser callbacks: children (tokens and built objects) → syntax objects.

    Lark calls these while it parses (no parse tree is built); spans are computed from
    the first and last kept token or object of each rule.
    """

    def __init__(self) -> None:
        self.source: Source | None = None

    # spans
    def _tok(self, tok: Token) -> Span:
        return Span(self.source, tok.line, tok.column, tok.end_line, tok.end_column)  # type: ignore[arg-type]

    def _join(self, first: Any, last: Any) -> Span:
        a = first if isinstance(first, Span) else self._span_of(first)
        b = last if isinstance(last, Span) else self._span_of(last)
        return Span(self.source, a.line, a.col, b.end_line, b.end_col)

    def _span_of(self, x: Any) -> Span:
        if isinstance(x, str):  # a lark Token (no syntax object is a str)
            return self._tok(x)  # type: ignore[arg-type]
        span: Span = x.span
        return span

    def _name(self, tok: Token) -> Name:
        return Name(tok.value, self._tok(tok))

    def _num(self, tok: Token) -> Num:
        return Num(tok.value, self._tok(tok))

    def _signed(self, x: Any) -> tuple[Num, bool]:
        return x if isinstance(x, tuple) else (self._num(x), False)

    # statements
    def start(self, c: list[Any]) -> tuple[Any, ...]:
        return tuple(c)

    def sched_file(self, c: list[Any]) -> tuple[Any, ...]:
        return tuple(c)

    def program_stmt(self, c: list[Any]) -> ProgramStmt:
        return ProgramStmt(self._name(c[1]), self._join(c[0], c[1]))

    def ranks_flat(self, c: list[Any]) -> RanksStmt:
        return RanksStmt(self._join(c[0], c[1]), n=self._num(c[1]))

    def ranks_grid(self, c: list[Any]) -> RanksStmt:
        return RanksStmt(
            self._join(c[0], c[-1]),
            grid=tuple(
                (self._name(c[k]), self._num(c[k + 1])) for k in range(1, len(c) - 1, 2)
            ),
        )

    def dim_stmt(self, c: list[Any]) -> DimStmt:
        return DimStmt(tuple(c[1:]), self._join(c[0], c[-1][1]))

    def dim_item(self, c: list[Any]) -> tuple[Name, Num]:
        return (self._name(c[0]), self._num(c[1]))

    def param_stmt(self, c: list[Any]) -> ParamStmt:
        return ParamStmt(tuple(c[1:]), self._join(c[0], c[-1][2]))

    def param_item(self, c: list[Any]) -> tuple[Name, Name, Num, bool]:
        num, neg = self._signed(c[2])
        return (self._name(c[0]), self._name(c[1]), num, neg)

    def neg_number(self, c: list[Any]) -> tuple[Num, bool]:
        n = self._num(c[1])
        return (Num(n.text, self._join(c[0], n)), True)

    def input_stmt(self, c: list[Any]) -> InputStmt:
        name, dtype = self._name(c[1]), self._name(c[2])
        sizes = tuple(x for x in c[3:] if isinstance(x, SizeExpr))
        rest = [x for x in c[3:] if not isinstance(x, SizeExpr)]
        layout_name, layout_arg, layout_span, layout_over = rest[0]
        more = tuple(x for x in rest[1:] if isinstance(x, AxisLayout))
        stage_kw, stage = rest[-1] if len(rest) > 1 and isinstance(rest[-1], tuple) else (None, None)
        end = stage if stage is not None else (more[-1].span if more else layout_span)
        return InputStmt(
            name,
            dtype,
            sizes,
            layout_name,
            layout_arg,
            stage_kw,
            stage,
            self._join(c[0], end),
            layout_span,
            layout_over,
            more,
        )

    def size(self, c: list[Any]) -> SizeExpr:
        factors = tuple(self._num(t) if t.type == "NUMBER" else self._name(t) for t in c)
        return SizeExpr(factors, self._join(c[0], c[-1]))

    def layout_word(self, c: list[Any]) -> tuple[Name, None, Span, None]:
        name = self._name(c[0])
        return (name, None, name.span, None)

    def layout_arg(self, c: list[Any]) -> tuple[Name, tuple[Num, bool], Span, None]:
        return (self._name(c[0]), self._signed(c[1]), self._join(c[0], c[2]), None)

    def layout_arg_over(self, c: list[Any]) -> tuple[Name, tuple[Num, bool], Span, Name]:
        return (self._name(c[0]), self._signed(c[1]), self._join(c[0], c[-1]), self._over(c))

    def layout_over(self, c: list[Any]) -> tuple[Name, None, Span, Name]:
        return (self._name(c[0]), None, self._join(c[0], c[-1]), self._over(c))

    def _over(self, c: list[Any]) -> Name:
        key = self._name(c[-3])
        if key.text != "over":
            raise InputError(
                f"a layout takes one keyword, over=AXIS; got '{key.text}='",
                key.span,
                hint="for example sliced(0, over=dp) or local(over=dp)",
            )
        return self._name(c[-2])

    def layout_more(self, c: list[Any]) -> AxisLayout:
        word, arg, span, over = c[0]
        return AxisLayout(word, arg, over, span)

    def stage_ann(self, c: list[Any]) -> tuple[Name, Num]:
        return (self._name(c[0]), self._num(c[1]))

    def output_stmt(self, c: list[Any]) -> OutputStmt:
        return OutputStmt(tuple(self._name(t) for t in c[1:]), self._join(c[0], c[-1]))

    def assign(self, c: list[Any]) -> Assign:
        name = self._name(c[0])
        _check_depth(name, c[1])
        return Assign(name, c[1], self._join(c[0], c[1]))

    def schedule_block(self, c: list[Any]) -> ScheduleStmt:
        return ScheduleStmt(self._name(c[1]), tuple(c[2:-1]), self._join(c[0], c[-1]))

    def step(self, c: list[Any]) -> StepCall:
        name = self._name(c[0])
        args = [a for a in c[1:-1] if a[0] == "pos"]
        kwargs: list[tuple[str, int]] = []
        for k in c[1:-1]:
            if k[0] != "kw":
                continue
            num: Num = k[2]
            if not num.is_int:
                raise InputError(
                    f"{name.text}: {k[1].text}= must be an integer, got '{num.text}'", num.span
                )
            kwargs.append((k[1].text, int(num.text)))
        return StepCall(
            name.text,
            tuple(a[1].text for a in args),
            tuple(kwargs),
            span=self._join(c[0], c[-1]),
            arg_spans=tuple(a[1].span for a in args),
        )

    def step_pos(self, c: list[Any]) -> tuple[str, Name]:
        return ("pos", self._name(c[0]))

    def step_kw(self, c: list[Any]) -> tuple[str, Name, Num]:
        return ("kw", self._name(c[0]), self._num(c[1]))

    def fused_block(self, c: list[Any]) -> FusedStmt:
        return FusedStmt(tuple(c[1:-1]), self._join(c[0], c[-1]))

    def overlapped_block(self, c: list[Any]) -> OverlappedStmt:
        return OverlappedStmt(
            self._name(c[1]), self._num(c[2]), tuple(c[3:-1]), self._join(c[0], c[-1])
        )

    # expressions
    def add(self, c: list[Any]) -> Expr:
        return Expr(Op.ADD, (c[0], c[1]), span=self._join(c[0], c[1]))

    def sub(self, c: list[Any]) -> Expr:
        return Expr(Op.SUB, (c[0], c[1]), span=self._join(c[0], c[1]))

    def mul(self, c: list[Any]) -> Expr:
        return Expr(Op.MUL, (c[0], c[1]), span=self._join(c[0], c[1]))

    def div(self, c: list[Any]) -> Expr:
        return Expr(Op.DIV, (c[0], c[1]), span=self._join(c[0], c[1]))

    def neg(self, c: list[Any]) -> Expr:
        return Expr(Op.NEG, (c[1],), span=self._join(c[0], c[1]))

    def number(self, c: list[Any]) -> Expr:
        tok = c[0]
        text = tok.value
        value = int(text) if text.isdigit() else float(text)
        return Expr(Op.CONST, value=value, span=self._tok(tok))

    def var(self, c: list[Any]) -> Expr:
        tok = c[0]
        return Expr(Op.REF, name=tok.value, span=self._tok(tok))

    def call(self, c: list[Any]) -> Call:
        return Call(self._name(c[0]), tuple(c[1:-1]), self._join(c[0], c[-1]))

    def paren(self, c: list[Any]) -> Any:
        inner = c[1]
        if isinstance(inner, (Expr, Call)):
            return dataclasses.replace(inner, span=self._join(c[0], c[2]))
        return inner

    def cmp_arg(self, c: list[Any]) -> Cmp:
        return Cmp(Op(c[1].value), c[0], c[2], self._join(c[0], c[2]))

    def kw_arg(self, c: list[Any]) -> Kw:
        return Kw(self._name(c[0]), c[1], self._join(c[0], c[1]))

    def type_arg(self, c: list[Any]) -> TypeArg:
        sizes = tuple(x for x in c[1:] if isinstance(x, SizeExpr))
        return TypeArg(self._name(c[0]), sizes, self._join(c[0], c[-1]))

    def op_plus(self, c: list[Any]) -> RedTok:
        return RedTok("+", self._tok(c[0]))

    def op_star(self, c: list[Any]) -> RedTok:
        return RedTok("*", self._tok(c[0]))


_BUILD = _Build()
# One parser (and one set of callbacks) is shared; a lock makes the per-parse source
# and the lexer's bracket stack safe when a worker thread parses too.
_LOCK = threading.Lock()


# --- the parser, cached across processes ----------------------------------------------
# Building the LALR tables from grammar.lark takes 50-150 ms, a large part of a small
# command's time; the tables are saved once to a user cache directory and loaded by
# later processes (a few ms).
#
# Design (see also tests/test_parser_cache.py):
# - Location: $COCOVIZ_CACHE_DIR if set (empty: no cache), else $XDG_CACHE_HOME/cocoviz
#   (an absolute XDG_CACHE_HOME only, as the XDG spec says), else ~/.cache/cocoviz; never
#   the package directory. The directory is created with mode 0o700.
# - Key: the file name holds a hash of the grammar text, lark's version, the parser
#   options, this format's version and Python's version, so any change to one of them
#   uses a new file (old files are left, a few tens of kB each).
# - Format: JSON, not lark's own cache (a pickle). A file in the user's own cache dir is
#   trusted about as much as their .pyc files, but JSON costs little more to load and
#   a corrupt or hostile file can at worst fail to load: lark's deserializer only
#   instantiates its own whitelisted classes (Rule, TerminalDef, patterns), and the
#   lexer and transformer classes are ours, never named by the file.
# - Trust: only tables this installation wrote are used. The header carries an
#   HMAC-SHA256 of the key and payload under `_cache_secret`: a random secret kept
#   beside the tables (created 0o600, owned by the user) mixed with the identity of
#   this installation (device, inode and modification time of grammar.lark and of
#   lark's package). A self-consistent file crafted by hand, or carried in from another
#   machine or installation (a restored CI cache, a copied home, a container image),
#   fails the check and the parser is built instead: tables that parse `x - x` as
#   `x + x`, or accept a syntax error, are never loaded.
# - Files: the tables and the secret are opened without following links and without
#   blocking, used only when they are regular files owned by the user (POSIX), and
#   the tables at most _CACHE_MAX_BYTES long; a FIFO, a device or a link at either path
#   is ignored, never waited on.
# - Any failure to read (missing, corrupt, wrong key or signature, unreadable) builds
#   the parser from the grammar; any failure to write (read-only or missing home, full
#   disk) is ignored. Writes go to a temporary file in the same directory, then
#   os.replace, so a concurrent process sees either no file or a whole one.
_CACHE_FORMAT = 2
_SECRET_NAME = "secret"
_SECRET_BYTES = 32
_CACHE_MAX_BYTES = 4 << 20
_LARK_OPTIONS: dict[str, Any] = {
    "parser": "lalr",
    "start": ["start", "sched_file"],
    "maybe_placeholders": False,
}
_LEXER_MARK = "cocoviz.ir.syntax._Lexer"


def cache_dir() -> Path | None:
    """The directory of cocoviz's caches (None: caching is turned off)."""
    env = os.environ.get("COCOVIZ_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg, "cocoviz")
    try:
        return Path.home() / ".cache" / "cocoviz"
    except (RuntimeError, KeyError, OSError):  # no home directory
        return None


def _lexer_class() -> type[_Lexer]:
    from cocoviz.ir.larklexer import _Lexer

    return _Lexer


def __getattr__(name: str) -> Any:
    if name == "_Lexer":  # imported on first use: it imports lark
        return _lexer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cache_key(grammar: str) -> str:
    import hashlib  # the cached parser of error reports is the only user

    import lark

    h = hashlib.sha256()
    for part in (
        grammar,
        lark.__version__,
        repr(sorted(_LARK_OPTIONS.items())),
        str(_CACHE_FORMAT),
        "{}.{}".format(*sys.version_info[:2]),
    ):
        h.update(part.encode("utf-8") + b"\0")
    return h.hexdigest()


def _encode(o: Any) -> Any:
    """Lark's serialized tables as JSON: tuples and dicts tagged (dict keys may be ints)."""
    if isinstance(o, (str, int, float, bool)) or o is None:
        return o
    if o is _lexer_class():
        return {"lexer": _LEXER_MARK}
    if isinstance(o, list):
        return [_encode(v) for v in o]
    if isinstance(o, tuple):
        return {"t": [_encode(v) for v in o]}
    if isinstance(o, dict):
        return {"d": [[_encode(k), _encode(v)] for k, v in o.items()]}
    raise TypeError(f"cannot cache a {type(o).__name__}")


def _decode_object(o: dict[str, Any]) -> Any:
    if len(o) != 1:
        raise ValueError("bad cache object")
    if "t" in o:
        return tuple(o["t"])
    if "d" in o:
        return {k: v for k, v in o["d"]}
    if o.get("lexer") == _LEXER_MARK:
        return _lexer_class()
    raise ValueError("bad cache object")


def _installation() -> bytes:
    """What identifies this installation: where and when grammar.lark and lark's
    package were written (a copy elsewhere, even byte for byte, differs)."""
    import lark

    parts = []
    for f in (Path(__file__).with_name("grammar.lark"), Path(lark.__file__)):
        try:
            st = os.stat(f)
            parts.append(f"{f}\0{st.st_dev}\0{st.st_ino}\0{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{f}\0?")
    return "\0".join(parts).encode("utf-8", "surrogateescape")


def _cache_secret(directory: Path, create: bool) -> bytes | None:
    """The key that signs this installation's cached tables in `directory`: its
    random secret (created when `create` and missing) mixed with `_installation`."""
    import hashlib

    from cocoviz import fsio

    path = directory / _SECRET_NAME
    raw = fsio.read_regular(path, _SECRET_BYTES, own=True)
    if raw is None and create:
        try:
            fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except OSError:
            fd = -1  # another process made it first (read it below), or no cache
        if fd >= 0:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(_SECRET_BYTES))
        raw = fsio.read_regular(path, _SECRET_BYTES, own=True)
    if raw is None or len(raw) != _SECRET_BYTES:
        return None
    return hashlib.sha256(raw + b"\0" + _installation()).digest()


def _signature(secret: bytes, key: str, payload: bytes) -> str:
    import hashlib
    import hmac

    return hmac.new(secret, key.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def _load_cached(path: Path, key: str) -> lark.Lark | None:
    """The parser saved at `path`, or None when there is none that can be used."""
    import hmac

    import lark

    from cocoviz import fsio

    try:
        raw = fsio.read_regular(path, _CACHE_MAX_BYTES, own=True)
        if raw is None:
            return None
        secret = _cache_secret(path.parent, create=False)
        if secret is None:
            return None
        head, _, payload = raw.partition(b"\n")
        want = f"cocoviz-parser {key} {_signature(secret, key, payload)}".encode()
        if not hmac.compare_digest(head, want):
            return None
        saved = json.loads(payload, object_hook=_decode_object)
        data, memo = saved["data"], saved["memo"]
        if not isinstance(data, dict) or not isinstance(memo, dict):
            return None
        data["options"] = {**data["options"], "lexer": _lexer_class()}
        parser = lark.Lark._load_from_dict(data, memo, transformer=_BUILD)
        if not isinstance(parser.parser.lexer, _lexer_class()):
            return None
        return parser
    except Exception:  # a missing, corrupt or foreign file: build the parser instead
        return None


def _save_cached(parser: lark.Lark, directory: Path, path: Path, key: str) -> None:
    """Save the parser's tables at `path`, atomically, signed; failures are ignored."""
    import lark.grammar
    import lark.lexer

    tmp: str | None = None
    try:
        data, memo = parser.memo_serialize([lark.lexer.TerminalDef, lark.grammar.Rule])
        drop = ("lexer", "transformer")
        data["options"] = {k: v for k, v in data["options"].items() if k not in drop}
        payload = json.dumps(_encode({"data": data, "memo": memo}), separators=(",", ":")).encode()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        secret = _cache_secret(directory, create=True)
        if secret is None:
            return
        head = f"cocoviz-parser {key} {_signature(secret, key, payload)}\n".encode()
        fd, tmp = tempfile.mkstemp(prefix=".parser-", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(head + payload)
        os.replace(tmp, path)
        tmp = None
    except Exception:  # a read-only or missing cache directory, a full disk, …
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _build_parser(grammar: str) -> lark.Lark:
    import lark

    return lark.Lark(grammar, lexer=_lexer_class(), transformer=_BUILD, **_LARK_OPTIONS)


def _cache_path(directory: Path, key: str) -> Path:
    return directory / f"parser-{key[:32]}.json"


def _make_parser(directory: Path | None) -> lark.Lark:
    """The parser, loaded from or saved to the cache in `directory` (None: no cache)."""
    grammar = resources.files("cocoviz.ir").joinpath("grammar.lark").read_text()
    if directory is None:
        return _build_parser(grammar)
    key = _cache_key(grammar)
    path = _cache_path(directory, key)
    parser = _load_cached(path, key)
    if parser is None:
        parser = _build_parser(grammar)
        _save_cached(parser, directory, path, key)
    return parser


@functools.cache
def _parser() -> lark.Lark:
    return _make_parser(cache_dir())


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
    # `;` and end of line are interchangeable; name the newline only
    words = sorted({_describe(n) for n in names if not n.startswith("__") and n != "SEMICOLON"})
    if not words:
        return ""
    if len(words) > 6:
        return ""
    if len(words) == 1:
        return "expected " + words[0]
    return "expected " + ", ".join(words[:-1]) + " or " + words[-1]


def _lexer() -> _Lexer:
    lexer = _parser().parser.lexer
    assert isinstance(lexer, _lexer_class())
    return lexer


def _bracket_note(source: Source) -> tuple[str, tuple[tuple[str, Span | None], ...], str | None]:
    """For an unexpected end of file: the innermost bracket never closed, if any."""
    opened = _lexer().open
    if not opened:
        return "", (), None
    tok = opened[-1]
    closer = {"LPAR": ")", "LSQB": "]", "LBRACE": "}"}[tok.type]
    line, col = tok.line or 1, tok.column or 1
    span = Span(source, line, col, line, col + 1)
    return (
        f"; the '{tok.value}' at line {tok.line} is never closed",
        ((f"'{tok.value}' opened here", span),),
        f"add the missing '{closer}'",
    )


def _end_of_input(err: UnexpectedToken, source: Source) -> Span:
    """Where an unexpected end of file is reported: just after the last token."""
    tok = err.token  # $END borrows the position of the last token, if there was one
    text = source.text
    pos = getattr(tok, "start_pos", None)
    if not text.strip() or pos is None or tok.line is None:
        return Span(source, 1, 1, 1, 2)
    if 0 <= pos < len(text) and text[pos] in "\r\n":  # the last token was a newline
        line, col = tok.line, tok.column
    else:
        line, col = tok.end_line, tok.end_column
    return Span(source, line, col, line, col + 1)


KEYWORDS = ("program", "ranks", "dim", "param", "input", "output", "schedule")


def _misspelled_keyword(before: str) -> str | None:
    """A hint when the statement starts with a word that is close to a keyword."""
    m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*", before)
    if m is None or m.group(1) in KEYWORDS:
        return None
    close = difflib.get_close_matches(m.group(1), KEYWORDS, n=1, cutoff=0.6)
    if not close:
        return None
    return f"did you mean '{close[0]}'? a statement starts with a keyword or 'NAME ='"


def _before(source: Source, tok: Token) -> str:
    """The source text before a token, without comments and trailing blanks."""
    pos = tok.start_pos if tok.start_pos is not None else 0
    return re.sub(r"#[^\n]*", "", source.text[:pos]).rstrip()


def _syntax_error(err: UnexpectedInput, source: Source) -> InputError:
    from lark.exceptions import UnexpectedEOF, UnexpectedToken

    line = getattr(err, "line", None) or 1
    col = getattr(err, "column", None) or 1
    if isinstance(err, UnexpectedToken):
        tok = err.token
        exp = _expected(set(err.expected))
        if tok.type == "$END":
            extra, notes, hint = _bracket_note(source)
            return InputError(
                "syntax error: unexpected end of file" + (extra or (f"; {exp}" if exp else "")),
                _end_of_input(err, source),
                hint,
                notes,
            )
        if tok.type == "_NL":
            what = "end of line"
            line, col = tok.line or line, tok.column or col
            span = Span(source, line, col, line, col + 1)
        else:
            what = f"'{tok}'"
            span = Span(source, line, col, tok.end_line or line, tok.end_column or col + 1)
        hint = _misspelled_keyword(source.line(line)[: col - 1])
        if tok.type in ("RPAR", "RSQB") and _before(source, tok).endswith(","):
            hint = f"remove the ',' before '{tok}': a trailing comma is not allowed"
        return InputError(
            f"syntax error: unexpected {what}" + (f"; {exp}" if exp else ""), span, hint
        )
    if isinstance(err, UnexpectedEOF):
        return InputError("syntax error: unexpected end of file", Span(source, 1, 1, 1, 2))
    return InputError(f"syntax error: {err}", Span(source, line, col, line, col + 1))


def _run(text: str, source: Source, start: str) -> tuple[Any, ...]:
    from cocoviz.ir import fastparse

    try:
        return fastparse.parse(text, source, start)
    except fastparse.Fallback:
        pass  # not valid text (or too deeply nested to recurse): lark parses and reports
    return _run_lark(text, source, start)


def _run_lark(text: str, source: Source, start: str) -> tuple[Any, ...]:
    import lark.exceptions
    from lark.exceptions import UnexpectedInput

    parser = _parser()
    with _LOCK:
        _BUILD.source = source
        try:
            result: tuple[Any, ...] = parser.parse(text, start=start)  # type: ignore[assignment]
        except UnexpectedInput as err:
            raise _syntax_error(err, source) from None
        except _LexLimit as lim:
            span = Span(source, lim.line, lim.col, lim.line, lim.col + lim.width)
            raise InputError(lim.message, span, lim.hint) from None
        except _BadCharacter as bad:
            ch = text[bad.pos]
            raise InputError(
                f"syntax error: unexpected character {ch!r}",
                Span(source, bad.line, bad.col, bad.line, bad.col + 1),
            ) from None
        except lark.exceptions.LarkError as err:  # pragma: no cover - defensive boundary
            raise InputError(f"syntax error: {err}", Span(source, 1, 1, 1, 2)) from None
        finally:
            _BUILD.source = None
    return result


def parse_module(text: str, path: str = "<input>") -> Module:
    """Parse a `.coco` text into statements (no name or type checks yet)."""
    source = Source(path, text)
    return Module(_run(text, source, "start"), source)


def parse_steps(text: str, path: str = "<steps>") -> tuple[StepCall, ...]:
    """Parse a `.sched` text (or a command-line step) into step calls."""
    source = Source(path, text)
    return tuple(s for s in _run(text, source, "sched_file") if isinstance(s, StepCall))
