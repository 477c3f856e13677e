"""The lark parser's tables cached across processes (cocoviz/ir/syntax.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lark
import pytest

from cocoviz.ir import syntax
from cocoviz.samples.gpt import gpt_stack

SOURCE = gpt_stack(2)


def parse_with(parser: lark.Lark, text: str = SOURCE) -> Any:
    """Parse with a given parser object, the way syntax._run does."""
    with syntax._LOCK:
        syntax._BUILD.source = syntax.Source("<test>", text)
        try:
            return parser.parse(text, start="start")
        finally:
            syntax._BUILD.source = None


def key() -> str:
    grammar = syntax.resources.files("cocoviz.ir").joinpath("grammar.lark").read_text()
    return syntax._cache_key(grammar)


def cache_files(d: Path) -> list[Path]:
    return sorted(d.glob("parser-*.json"))


def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(grammar: str) -> lark.Lark:
        raise AssertionError("the parser was built, not loaded from the cache")

    monkeypatch.setattr(syntax, "_build_parser", fail)


def test_fresh_cache_dir_is_created_then_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "a" / "cocoviz"
    syntax._parser()  # the process's parser, made before building is forbidden below
    built = syntax._make_parser(d)
    (path,) = cache_files(d)
    if hasattr(os, "getuid"):
        assert d.stat().st_mode & 0o777 == 0o700
    assert path.read_bytes().startswith(b"cocoviz-parser ")
    assert not list(d.glob(".parser-*"))  # no temporary file left
    no_build(monkeypatch)
    loaded = syntax._make_parser(d)
    assert isinstance(loaded.parser.lexer, syntax._Lexer)
    assert parse_with(loaded) == parse_with(built) == parse_with(syntax._parser())
    # error positions and expectations come from the same tables
    bad = "program p\nranks 2\ninput x: f32[4] replicated\ny = (x +\n"
    with pytest.raises(lark.exceptions.UnexpectedInput) as e1:
        parse_with(loaded, bad)
    with pytest.raises(lark.exceptions.UnexpectedInput) as e2:
        parse_with(built, bad)
    assert (e1.value.line, e1.value.column, getattr(e1.value, "expected", None)) == (
        e2.value.line,
        e2.value.column,
        getattr(e2.value, "expected", None),
    )


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: b"",
        lambda raw: raw[: len(raw) // 2],  # truncated: the checksum fails
        lambda raw: b"\x80\x04\x95garbage, a pickle perhaps\n\x00\xff",
        lambda raw: raw.replace(b'"t":', b'"x":', 1),  # checksum mismatch
        lambda raw: raw.split(b"\n", 1)[0].replace(b"cocoviz-parser", b"other") + b"\n{}",
    ],
    ids=["empty", "truncated", "binary", "edited", "foreign-header"],
)
def test_corrupt_cache_file_falls_back_to_building(tmp_path: Path, damage: Any) -> None:
    syntax._make_parser(tmp_path)
    (path,) = cache_files(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(damage(raw))
    parser = syntax._make_parser(tmp_path)
    assert parse_with(parser) == parse_with(syntax._parser())
    assert path.read_bytes() != damage(raw)  # rebuilt and saved again
    assert syntax._load_cached(path, key()) is not None


def _write_with_valid_header(path: Path, key: str, payload: bytes) -> None:
    import hashlib

    head = f"cocoviz-parser {key} {hashlib.sha256(payload).hexdigest()}\n".encode()
    path.write_bytes(head + payload)


@pytest.mark.parametrize(
    "payload",
    [
        b"{}",
        b"[1, 2]",
        b'{"d": [["data", {"d": []}], ["memo", {"d": []}]]}',
        b'{"lexer": "os.system"}',
        b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the recursion limit
        json.dumps({"d": [["data", {"__type__": "Lark"}], ["memo", {}]]}).encode(),
    ],
    ids=["empty-object", "list", "empty-tables", "foreign-class", "deep", "lark-type"],
)
def test_well_formed_but_wrong_cache_falls_back(tmp_path: Path, payload: bytes) -> None:
    """A file with a valid checksum but bad content (hostile or from a buggy writer)."""
    k = key()
    path = syntax._cache_path(tmp_path, k)
    _write_with_valid_header(path, k, payload)
    assert syntax._load_cached(path, k) is None
    assert parse_with(syntax._make_parser(tmp_path)) == parse_with(syntax._parser())


def test_oversized_cache_file_is_not_read(tmp_path: Path) -> None:
    syntax._make_parser(tmp_path)
    (path,) = cache_files(tmp_path)
    with open(path, "ab") as f:
        f.write(b" " * (syntax._CACHE_MAX_BYTES + 1))
    assert syntax._load_cached(path, key()) is None


def test_unwritable_cache_dir_still_parses(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    parser = syntax._make_parser(blocker / "cocoviz")  # mkdir fails
    assert parse_with(parser) == parse_with(syntax._parser())
    assert blocker.read_text() == "not a directory"


def test_read_only_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory the process cannot write to (simulated by refusing every temporary
    file, since root ignores permission bits): parsing works, nothing is left behind,
    and a valid file already there is still used."""

    def refuse(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    d = tmp_path / "ro"
    d.mkdir()
    with monkeypatch.context() as m:
        m.setattr(syntax.tempfile, "mkstemp", refuse)
        assert parse_with(syntax._make_parser(d)) == parse_with(syntax._parser())
        assert cache_files(d) == []
    syntax._make_parser(d)  # writable again: the file is saved
    assert len(cache_files(d)) == 1
    with monkeypatch.context() as m:
        m.setattr(syntax.tempfile, "mkstemp", refuse)
        no_build(m)
        assert parse_with(syntax._make_parser(d)) == parse_with(syntax._parser())


def test_key_changes_with_grammar_and_lark_version(monkeypatch: pytest.MonkeyPatch) -> None:
    grammar = syntax.resources.files("cocoviz.ir").joinpath("grammar.lark").read_text()
    k = syntax._cache_key(grammar)
    assert syntax._cache_key(grammar + "\n") != k
    monkeypatch.setattr(lark, "__version__", "0.0.0")
    assert syntax._cache_key(grammar) != k


def test_cache_dir_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("COCOVIZ_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert syntax.cache_dir() == tmp_path / "cocoviz"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert syntax.cache_dir() == tmp_path / "home" / ".cache" / "cocoviz"
    monkeypatch.setenv("COCOVIZ_CACHE_DIR", str(tmp_path / "x"))
    assert syntax.cache_dir() == tmp_path / "x"
    monkeypatch.setenv("COCOVIZ_CACHE_DIR", "")
    assert syntax.cache_dir() is None
    pkg = Path(syntax.__file__).resolve().parent
    for env in ({}, {"XDG_CACHE_HOME": str(tmp_path)}):
        monkeypatch.delenv("COCOVIZ_CACHE_DIR")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        d = syntax.cache_dir()
        assert d is not None and pkg not in d.resolve().parents
        monkeypatch.setenv("COCOVIZ_CACHE_DIR", "")


def test_concurrent_processes_share_one_whole_file(tmp_path: Path) -> None:
    """Processes starting together on an empty cache: each makes the lark parser (which
    parses only text the fast parser refuses) and parses; one whole file."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    env.pop("COCOVIZ_CACHE_DIR", None)
    code = (
        "from cocoviz.ir.syntax import _parser, parse_module;"
        "from cocoviz.samples.gpt import gpt_stack;"
        "_parser();"
        "print(len(parse_module(gpt_stack(2)).statements))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1 and outs[0].strip().isdigit()
    d = tmp_path / "cocoviz"
    (path,) = cache_files(d)
    assert not list(d.glob(".parser-*"))
    assert syntax._load_cached(path, key()) is not None
