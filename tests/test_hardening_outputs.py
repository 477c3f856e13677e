"""Every file the tool writes goes through one guarded writer (`fsio.write_file`,
`emit.writer.write_tree`): an input of the command is never overwritten, a file the tool
did not write needs --force, a device, FIFO or link is written through and never
replaced, an emitted tree keeps the user's edits and writes nothing when nothing
changed, and a non-blocking stdout gets every byte (issue 31, items 3 and 4).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.emit.writer import MARKER

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def refused(rc: int, err: str, *parts: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    for part in parts:
        assert part in err, err


# --- an input is never an output -----------------------------------------------------------


def test_trace_over_the_program_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "x.coco"
    src.write_text(samples.text("sgd"))
    rc, _, err = run("simulate", str(src), "--trace", str(src))
    refused(rc, err, "it is an input of this command")
    assert src.read_text() == samples.text("sgd")
    rc, _, err = run("simulate", str(src), "--trace", str(src), "--force")
    refused(rc, err, "it is an input of this command")  # --force does not make it an output
    assert src.read_text() == samples.text("sgd")


def test_trace_over_the_schedule_file_through_a_link_is_refused(tmp_path: Path) -> None:
    sched = tmp_path / "s.sched"
    assert run("apply", "sgd", "split(g1)", "-o", str(sched))[0] == 0
    before = sched.read_bytes()
    link = tmp_path / "t.json"
    link.symlink_to(sched)
    rc, _, err = run("simulate", "sgd", "--schedule", str(sched), "--trace", str(link), "--force")
    refused(rc, err, "it is an input of this command")
    assert sched.read_bytes() == before


def test_trace_over_a_file_cocoviz_did_not_write_needs_force(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}')
    rc, _, err = run("simulate", "sgd", "--trace", str(notes))
    refused(rc, err, "not written by cocoviz", "--force")
    assert notes.read_text() == '{"mine": true}'
    assert run("simulate", "sgd", "--trace", str(notes), "--force")[0] == 0
    assert json.loads(notes.read_text())["otherData"]["generator"] == "cocoviz simulate"
    assert run("simulate", "sgd", "--trace", str(notes))[0] == 0  # cocoviz's now


# --- devices, FIFOs and links are written through ----------------------------------------------


# The system's /dev/null is never a destination here: a regression (or this file run
# against an older cocoviz, as root) would replace it with a regular file and break every
# program on the machine that writes to it. A device node made in the test's directory
# is the same device.
def _mknod_null(path: Path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs privileges")


def test_trace_to_a_device_node_keeps_the_device(tmp_path: Path) -> None:
    null = tmp_path / "null"
    _mknod_null(null)
    rc, _, err = run("simulate", "sgd", "--trace", str(null))
    assert rc == 0, err
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_tune_output_on_a_device_node_keeps_the_device(tmp_path: Path) -> None:
    null = tmp_path / "null.sched"
    _mknod_null(null)
    rc, _, err = run("tune", "sgd", "--top", "1", "-o", str(null), "--force")
    assert rc == 0, err
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_trace_through_a_link_to_stdout_reaches_the_pipe(tmp_path: Path) -> None:
    link = tmp_path / "out.json"
    link.symlink_to("/dev/stdout")
    res = subprocess.run(
        [sys.executable, "-m", "cocoviz", "simulate", "sgd", "--json", "--trace", str(link)],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert b'"generator":"cocoviz simulate"' in res.stdout
    assert link.is_symlink()


def test_trace_into_a_fifo_with_a_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    time.sleep(0.2)
    rc, _, err = run("simulate", "sgd", "--trace", str(fifo))
    reader.join(30)
    assert rc == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert b"traceEvents" in got[0]


def test_trace_into_a_fifo_without_a_reader_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    rc, _, err = run("simulate", "sgd", "--trace", str(fifo))
    refused(rc, err, "a FIFO that no process reads")
    assert time.monotonic() - start < 30 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --- emitted trees -------------------------------------------------------------------------

EMIT = ("emit", "sgd", "--target", "cpu", "-o")


def _state(root: Path) -> dict[str, tuple[int, int, bytes]]:
    out = {".": (os.stat(root).st_ino, os.stat(root).st_mtime_ns, b"")}
    for p in sorted(root.iterdir()):
        st = os.lstat(p)
        out[p.name] = (st.st_ino, st.st_mtime_ns, p.read_bytes())
    return out


def test_user_edits_are_kept_and_reported_then_forced(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(*EMIT, str(out))[0] == 0
    make = (out / "Makefile").read_text()
    (out / "Makefile").write_text(make + "# my flags\n")
    rc, _, err = run(*EMIT, str(out))
    assert rc == 0, err
    assert "Makefile: changed since cocoviz wrote it: kept" in err and "1 kept" in err
    assert (out / "Makefile").read_text().endswith("# my flags\n")
    assert "Makefile" not in json.loads((out / MARKER).read_text())["files"]
    rc, _, err = run(*EMIT, str(out))  # still kept on the next emit
    assert rc == 0 and (out / "Makefile").read_text().endswith("# my flags\n")
    rc, _, err = run(*EMIT, str(out), "--force")
    assert rc == 0, err
    assert (out / "Makefile").read_text() == make
    assert "Makefile" in json.loads((out / MARKER).read_text())["files"]


def test_marker_records_each_file_s_hash(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(*EMIT, str(out))[0] == 0
    marker = json.loads((out / MARKER).read_text())
    assert set(marker["sha256"]) == set(marker["files"]) and marker["files"]
    for name, digest in marker["sha256"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest


def test_a_crafted_marker_cannot_make_emit_delete_a_user_file(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(*EMIT, str(out))[0] == 0
    (out / "notes.txt").write_text("my notes")
    (out / "plan.md").write_text("my plan")
    data = json.loads((out / MARKER).read_text())
    data["files"] += ["notes.txt", "plan.md"]
    data["sha256"]["plan.md"] = hashlib.sha256(b"something else").hexdigest()
    (out / MARKER).write_text(json.dumps(data))
    rc, _, err = run(*EMIT, str(out))
    assert rc == 0, err
    assert (out / "notes.txt").read_text() == "my notes"
    assert (out / "plan.md").read_text() == "my plan"
    assert "removed" not in err


def test_an_unchanged_re_emit_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(*EMIT, str(out))[0] == 0
    before = _state(out)
    time.sleep(0.01)
    rc, _, err = run(*EMIT, str(out))
    assert rc == 0, err
    assert "0 file(s) written" in err
    assert _state(out) == before


def test_an_unchanged_re_emit_into_a_read_only_tree_succeeds(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run(*EMIT, str(out))[0] == 0
    real = os.replace

    def no_renames(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Read-only file system")

    os.chmod(out, 0o555)
    try:
        os.replace = no_renames  # type: ignore[assignment]  # as root, chmod alone does not bite
        rc, _, err = run(*EMIT, str(out))
    finally:
        os.replace = real
        os.chmod(out, 0o755)
    assert rc == 0, err


# --- a non-blocking stdout -----------------------------------------------------------------


def test_non_blocking_stdout_gets_every_byte() -> None:
    """A pipe left non-blocking by a parent (node, an editor) and read slowly: the whole
    output arrives (it stopped at 64 KiB, exit 0, no message)."""
    expected = subprocess.run(
        [sys.executable, "-m", "cocoviz", "samples", "--gpt", "200"],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    ).stdout
    assert len(expected) > 200_000
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cocoviz", "samples", "--gpt", "200"],
        stdout=w,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    os.close(w)
    time.sleep(1.0)  # let the pipe fill
    chunks = []
    with os.fdopen(r, "rb") as f:
        while chunk := f.read(4096):
            chunks.append(chunk)
            time.sleep(0.001)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert b"".join(chunks) == expected
