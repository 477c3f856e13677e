"""Every file the tool reads goes through one bounded, non-blocking, regular-file-only
reader (`cocoviz.fsio.read_bytes` and friends), and the parser cache trusts only what
this installation wrote (issue 31, items 1, 2 and 6).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cocoviz import fsio
from cocoviz.cli import main
from cocoviz.ir import syntax

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def cli(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cocoviz", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def clean(rc: int, err: str, code: int, *parts: str) -> None:
    assert rc == code, err
    assert "Traceback" not in err and "internal error" not in err, err
    for part in parts:
        assert part in err, err


# --- --hw files ---------------------------------------------------------------------------


def test_hw_nested_twenty_thousand_deep_is_an_input_error(tmp_path: Path) -> None:
    f = tmp_path / "deep.toml"
    f.write_text("x = " + "[" * 20_000 + "]" * 20_000 + "\n")
    rc, _, err = run("simulate", "sgd", "--hw", str(f))
    clean(rc, err, 1, "deep.toml: nested too deeply")


def test_hw_deep_inline_tables_are_an_input_error(tmp_path: Path) -> None:
    f = tmp_path / "deep.toml"
    f.write_text("x = " + "{a = " * 5_000 + "1" + "}" * 5_000 + "\n")
    rc, _, err = run("simulate", "sgd", "--hw", str(f))
    clean(rc, err, 1, "deep.toml")


def test_hw_not_utf8_is_an_input_error(tmp_path: Path) -> None:
    f = tmp_path / "latin1.toml"
    f.write_bytes(b'name = "caf\xe9"\n')
    rc, _, err = run("simulate", "sgd", "--hw", str(f))
    clean(rc, err, 1, "latin1.toml: not UTF-8 text")


def _capped_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_hw_endless_device_is_refused_at_once() -> None:
    """In a process of its own with at most 4 GiB: a reader without a bound (a
    regression) fails this test instead of exhausting the machine's memory."""
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "cocoviz", "simulate", "sgd", "--hw", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        preexec_fn=_capped_memory,
    )
    clean(res.returncode, res.stderr, 1, "/dev/zero: not a regular file (a device)")
    assert time.monotonic() - start < 30


def test_hw_larger_than_a_profile_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "big.toml"
    f.write_text("# padding\n" * 200_000)
    rc, _, err = run("simulate", "sgd", "--hw", str(f))
    clean(rc, err, 1, "big.toml: too large: a hardware profile file may hold at most 1 MiB")


def test_hw_fifo_without_a_writer_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "hw.toml"
    os.mkfifo(fifo)
    res = cli("simulate", "sgd", "--hw", str(fifo), timeout=30)
    clean(res.returncode, res.stderr, 1, "not a regular file (a FIFO")


# --- programs, schedules -----------------------------------------------------------------


def test_program_fifo_without_a_writer_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "p.coco"
    os.mkfifo(fifo)
    res = cli("check", str(fifo), timeout=30)
    clean(res.returncode, res.stderr, 1, "not a regular file (a FIFO")


def test_schedule_file_that_is_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "s.sched"
    link.symlink_to("/dev/zero")
    rc, _, err = run("show", "sgd", "--schedule", str(link))
    clean(rc, err, 1, "not a regular file (a device)")


# --- the reader itself -------------------------------------------------------------------


def test_reader_refuses_each_kind_with_one_diagnostic(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "f")
    (tmp_path / "big").write_bytes(b"x" * 101)
    (tmp_path / "bad").write_bytes(b"\xff\xfe")
    cases = {
        "d": ("directory", "is a directory, expected a log"),
        "f": ("special", "not a regular file (a FIFO (named pipe)), expected a log"),
        "big": ("too-large", "too large: a log may hold at most 100 bytes"),
        "missing": ("missing", "no such log"),
    }
    for name, (reason, said) in cases.items():
        with pytest.raises(fsio.ReadError) as err:
            fsio.read_bytes(tmp_path / name, "log", limit=100)
        assert err.value.reason == reason and said in err.value.message, err.value.message
    with pytest.raises(fsio.ReadError) as err:
        fsio.read_text(tmp_path / "bad", "log")
    assert err.value.reason == "encoding"
    assert fsio.read_text(tmp_path / "big", "log", limit=101) == "x" * 101


def test_reader_for_tool_files_ignores_links_and_fifos(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "real").write_bytes(b"ok")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert fsio.read_regular(tmp_path / "fifo") is None
    assert fsio.read_regular(tmp_path / "link") is None
    assert fsio.read_regular(tmp_path / "real") == b"ok"
    assert fsio.read_regular(tmp_path / "real", limit=1) is None


# --- the parser cache --------------------------------------------------------------------

SYNTAX_ERROR = "ranks 4\ndim N = 64\ninput x : f32[N] replicated\ny = x * * 2\noutput y\n"


def _cache_file(directory: Path) -> Path:
    from importlib import resources

    grammar = resources.files("cocoviz.ir").joinpath("grammar.lark").read_text()
    return syntax._cache_path(directory, syntax._cache_key(grammar))


def test_cache_fifo_does_not_hang_a_syntax_error(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(_cache_file(cache))
    prog = tmp_path / "bad.coco"
    prog.write_text(SYNTAX_ERROR)
    res = cli("check", str(prog), env={"COCOVIZ_CACHE_DIR": str(cache)}, timeout=30)
    clean(res.returncode, res.stderr, 1, "bad.coco:4:")


def test_cache_secret_that_is_a_fifo_is_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(cache / "secret")
    prog = tmp_path / "bad.coco"
    prog.write_text(SYNTAX_ERROR)
    res = cli("check", str(prog), env={"COCOVIZ_CACHE_DIR": str(cache)}, timeout=30)
    clean(res.returncode, res.stderr, 1, "bad.coco:4:")


def _make_cache(directory: Path) -> Path:
    from importlib import resources

    grammar = resources.files("cocoviz.ir").joinpath("grammar.lark").read_text()
    syntax._make_parser(directory)
    path = _cache_file(directory)
    assert path.is_file()
    assert syntax._load_cached(path, syntax._cache_key(grammar)) is not None
    return path


def test_self_consistent_crafted_cache_is_not_trusted(tmp_path: Path) -> None:
    """A file whose header is the key and a hash of its own payload (all anyone can
    compute without this installation's secret) is not loaded."""
    path = _make_cache(tmp_path)
    key = _cache_file(tmp_path).name
    head, _, payload = path.read_bytes().partition(b"\n")
    full_key = head.split(b" ")[1].decode()
    assert key.startswith(f"parser-{full_key[:32]}")
    crafted = f"cocoviz-parser {full_key} {hashlib.sha256(payload).hexdigest()}\n".encode()
    path.write_bytes(crafted + payload)
    assert syntax._load_cached(path, full_key) is None


def test_cache_carried_from_another_installation_is_not_trusted(tmp_path: Path) -> None:
    """Tables and secret copied together (a restored CI cache, a copied home) but
    signed for another installation are not loaded."""
    path = _make_cache(tmp_path)
    full_key = path.read_bytes().split(b" ")[1].decode()
    payload = path.read_bytes().partition(b"\n")[2]
    secret = (tmp_path / "secret").read_bytes()
    other = hashlib.sha256(secret + b"\0" + b"another installation").digest()
    head = f"cocoviz-parser {full_key} {syntax._signature(other, full_key, payload)}\n"
    path.write_bytes(head.encode() + payload)
    assert syntax._load_cached(path, full_key) is None


def test_cache_with_changed_tables_is_not_trusted(tmp_path: Path) -> None:
    path = _make_cache(tmp_path)
    data = path.read_bytes()
    full_key = data.split(b" ")[1].decode()
    head, _, payload = data.partition(b"\n")
    swapped = payload.replace(b'"MINUS"', b'"PLUSX"').replace(b'"PLUS"', b'"MINUS"')
    swapped = swapped.replace(b'"PLUSX"', b'"PLUS"')
    assert swapped != payload
    path.write_bytes(head + b"\n" + swapped)
    assert syntax._load_cached(path, full_key) is None
