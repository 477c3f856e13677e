"""Every command that writes goes through one safe writer (`cocoviz.fsio`): paths stay
inside the directory the user named, files are replaced atomically beside their
destination (no cross-device rename, no truncated file on a full disk), a symbolic link
the user names is written through (its target, atomically) and one inside an emitted
tree is the user's, writers of one directory take turns, and every
file-system error is one clear diagnostic with exit 2, never an internal error (70).
`.sched` files carry a version and a step count, so a truncated one is refused."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cocoviz import fsio, samples
from cocoviz.cli import main
from cocoviz.emit.writer import MARKER
from cocoviz.errors import InputError
from cocoviz.schedule import SCHED_HEADER, load_sched

SGD = samples.text("sgd")
LONG = "n" * 300  # longer than any file system's NAME_MAX


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def assert_clean_error(rc: int, err: str, code: int = 2) -> None:
    assert rc == code, err
    assert "internal error" not in err and "Traceback" not in err, err
    assert err.startswith("error: "), err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1, err


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (links as their target path)."""
    out: dict[str, bytes] = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = os.readlink(p).encode()
        elif p.is_file():
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(fsio.TMP_PREFIX)]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


# Each command that writes, with OUT where its output path goes (a directory for emit,
# samples --copy and run --dump; a file for the others).
COMMANDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "emit": (("emit", "sgd", "--target", "cpu", "-o", "OUT"), True),
    "apply": (("apply", "sgd", "split(g1)", "-o", "OUT.sched"), False),
    "tune": (("tune", "sgd", "--top", "1", "-o", "OUT.sched"), False),
    "simulate": (("simulate", "sgd", "--json", "--trace", "OUT.json"), False),
    "samples": (("samples", "--copy", "OUT"), True),
    "dump": (("run", "sgd", "-D", "N=1024", "--dump", "OUT"), True),
}


def argv_for(command: str, out: Path) -> list[str]:
    argv, _ = COMMANDS[command]
    return [a.replace("OUT", str(out)) for a in argv]


# --- 1. a crafted .cocoviz-emit marker ---------------------------------------------------------
def test_crafted_marker_cannot_remove_files_outside_the_directory(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    victim, victim_abs = tmp_path / "victim.txt", home / "victim_abs.txt"
    victim.write_text("x")
    victim_abs.write_text("x")
    trap = tmp_path / "trap"
    trap.mkdir()
    marker = {"tool": "cocoviz", "files": ["../victim.txt", str(victim_abs), "a/../../x", 3]}
    (trap / MARKER).write_text(json.dumps(marker))
    env = {**os.environ, "HOME": str(home)}
    res = subprocess.run(
        [sys.executable, "-m", "cocoviz", "emit", "sgd", "-o", "trap", "--target", "cpu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "x" and victim_abs.read_text() == "x"
    assert "removed" not in res.stderr
    assert "lists '../victim.txt', which is not a file name in that directory" in res.stderr
    assert f"lists '{victim_abs}'" in res.stderr
    listed = json.loads((trap / MARKER).read_text())["files"]
    assert sorted(p.name for p in trap.iterdir() if p.name != MARKER) == listed


def test_marker_entries_are_removed_only_as_plain_files_in_the_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    out = tmp_path / "o"
    assert run(*argv_for("emit", out))[0] == 0
    (out / "old.cpp").symlink_to(outside)  # a link is never removed, nor its target
    (out / "olddir").mkdir()  # a directory is never removed
    (out / ".hidden").write_text("h")  # not a name the emitter writes
    (out / "gone.cpp").write_text("cocoviz wrote this")  # listed with its hash: removed
    (out / "nohash.cpp").write_text("listed, no hash")  # cannot be verified: kept
    data = json.loads((out / MARKER).read_text())
    data["files"] += ["old.cpp", "olddir", ".hidden", ".", "..", "gone.cpp", "nohash.cpp"]
    data["sha256"]["gone.cpp"] = hashlib.sha256(b"cocoviz wrote this").hexdigest()
    data["sha256"]["old.cpp"] = hashlib.sha256(b"keep").hexdigest()
    (out / MARKER).write_text(json.dumps(data))
    rc, _, err = run(*argv_for("emit", out))
    assert rc == 0, err
    assert "1 removed" in err and not (out / "gone.cpp").exists()
    assert (out / "old.cpp").is_symlink() and outside.read_text() == "keep"
    assert (out / "olddir").is_dir() and (out / ".hidden").read_text() == "h"
    assert (out / "nohash.cpp").read_text() == "listed, no hash"
    listed = json.loads((out / MARKER).read_text())["files"]
    assert not {"old.cpp", "olddir", "gone.cpp", "nohash.cpp"} & set(listed)


def test_a_marker_that_is_a_symlink_does_not_make_the_directory_cocoviz_s(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"tool": "cocoviz", "files": ["notes.txt"]}))
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / MARKER).symlink_to(elsewhere)
    rc, _, err = run(*argv_for("emit", out))
    assert_clean_error(rc, err)
    assert "cocoviz did not write it" in err
    assert (out / "notes.txt").read_text() == "mine"


# --- 2. atomic writes, links replaced, never written through --------------------------------------
def test_dump_replaces_a_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    out = tmp_path / "d"
    assert run(*argv_for("dump", out))[0] == 0
    victim = tmp_path / "victim.npy"
    victim.write_bytes(b"precious")
    (out / "w1.npy").unlink()
    (out / "w1.npy").symlink_to(victim)
    rc, _, err = run(*argv_for("dump", out))
    assert rc == 0, err
    assert victim.read_bytes() == b"precious"
    assert not (out / "w1.npy").is_symlink()
    assert np.load(out / "w1.npy").shape == (1024,)
    assert not temporaries(tmp_path)


def test_a_symlink_in_an_emitted_tree_is_kept_as_the_user_s(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("mine")
    out = tmp_path / "out"
    assert run(*argv_for("emit", out))[0] == 0
    (out / "Makefile").unlink()
    (out / "Makefile").symlink_to(victim)
    rc, _, err = run(*argv_for("emit", out))
    assert rc == 0, err
    assert "Makefile: changed since cocoviz wrote it: kept" in err
    assert (out / "Makefile").is_symlink() and victim.read_text() == "mine"
    rc, _, err = run(*argv_for("emit", out), "--force")  # --force replaces the link itself
    assert rc == 0, err
    assert victim.read_text() == "mine"
    assert (out / "Makefile").is_file() and not (out / "Makefile").is_symlink()


@pytest.mark.parametrize("command", ["apply", "tune", "simulate"])
def test_a_symlink_at_the_destination_is_written_through(command: str, tmp_path: Path) -> None:
    """A link the user named is kept; the file it points to is what gets written, and
    only when it is cocoviz's (or with --force)."""
    victim = tmp_path / "victim"
    victim.write_text("not cocoviz's")
    out = tmp_path / "out"
    argv = argv_for(command, out)
    link = Path(argv[-1])
    link.symlink_to(victim)
    rc, _, err = run(*argv)
    assert_clean_error(rc, err)
    assert "not written by cocoviz" in err
    assert victim.read_text() == "not cocoviz's"
    rc, _, err = run(*argv, "--force")
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert victim.read_text() != "not cocoviz's"
    rc, _, err = run(*argv)  # now it is cocoviz's: written again without --force
    assert rc == 0, err
    assert link.is_symlink()
    assert not temporaries(tmp_path)


def _fail_writes(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Writes to files (not stdout/stderr) write a little, then fail with `code`."""
    real = os.write

    def write(fd: int, data: bytes) -> int:
        if fd <= 2:
            return real(fd, data)
        if len(data) > 16:
            return real(fd, bytes(data)[:16])
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_full_disk_leaves_the_old_output_as_it_was(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    assert run(*argv_for(command, out))[0] == 0
    before = snapshot(tmp_path)
    _fail_writes(monkeypatch, errno.ENOSPC)
    again = tmp_path / "out2" if command == "samples" else out  # --copy never overwrites
    if command == "emit":  # other content, so every file is rewritten
        argv = [*argv_for(command, again)[:-4], "-o", str(again)]
    else:
        argv = argv_for(command, again)
    rc, _, err = run(*argv)
    assert_clean_error(rc, err)
    assert "No space left on device" in err and "hint: the file system is full" in err
    after = {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("out2")}
    assert after == before
    assert not temporaries(tmp_path)
    if command == "samples":
        assert not [p for p in again.rglob("*") if p.is_file()]


# --- 3. concurrent writers ------------------------------------------------------------------------
def _emit_process(out: Path, program: str, target: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cocoviz", "emit", program, "--target", target, "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_concurrent_emits_into_one_directory_take_turns(tmp_path: Path) -> None:
    out = tmp_path / "o"
    for _ in range(2):
        procs = [_emit_process(out, "sgd", "cpu"), _emit_process(out, "adam", "cuda")]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        listed = json.loads((out / MARKER).read_text())["files"]
        names = sorted(p.name for p in out.iterdir() if p.name != MARKER)
        assert names == listed  # one program's tree, nothing of the other left over
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["program"] in ("sgd", "adam")
        assert f"{manifest['program']}.h" in names


def _blocked_on_a_lock(pid: int) -> bool:
    """Whether process `pid` waits for a file lock (a ``->`` line of /proc/locks)."""
    lines = Path("/proc/locks").read_text().splitlines()
    return any("->" in ln and ln.split("->", 1)[1].split()[3] == str(pid) for ln in lines)


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux /proc/locks")
def test_an_emit_waits_for_the_directory_lock(tmp_path: Path) -> None:
    out = tmp_path / "o"
    with fsio.locked_directory(out):
        proc = _emit_process(out, "sgd", "cpu")
        deadline = time.monotonic() + 120
        while proc.poll() is None and not _blocked_on_a_lock(proc.pid):
            assert time.monotonic() < deadline, "the emit neither finished nor waited"
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()  # it waits instead of writing
        assert list(out.iterdir()) == []
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (out / "sgd.cpp").is_file()


# --- 4. program names that clash with the emitter's own files -----------------------------------
@pytest.mark.parametrize(
    ("file", "text", "stem"),
    [
        ("main.coco", SGD.replace("program sgd\n", ""), "main_prog"),
        ("p.coco", SGD.replace("program sgd", "program main"), "main_prog"),
        ("p.coco", SGD.replace("program sgd", "program cocoviz_runtime"), "cocoviz_runtime_prog"),
        ("p.coco", SGD.replace("program sgd", "program Makefile"), "Makefile_prog"),
        ("p.coco", SGD.replace("program sgd", "program run"), "run_prog"),
    ],
    ids=["main.coco", "main", "cocoviz_runtime", "Makefile", "run"],
)
def test_a_program_named_like_an_emitted_file_gets_its_own_stem(
    file: str, text: str, stem: str, tmp_path: Path
) -> None:
    """The program's files never overwrite the launcher, the runtime header or the
    Makefile, and its binary is not a make target: the stem gets the suffix `_prog`."""
    src = tmp_path / file
    src.write_text(text)
    out = tmp_path / "o"
    rc, _, err = run("emit", str(src), "--target", "cpu", "-o", str(out))
    assert rc == 0, err
    assert (out / f"{stem}.cpp").is_file() and (out / f"{stem}.h").is_file()
    assert "int main(" in (out / "main.cpp").read_text()
    assert "cocoviz_runtime.h" in (out / "cocoviz_runtime.h").read_text().splitlines()[0]
    assert f"PROGRAM := {stem}" in (out / "Makefile").read_text()


# --- 12. file-system errors are diagnostics, not internal errors ----------------------------------
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_output_under_a_file_is_a_clear_error(command: str, tmp_path: Path) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("x")
    rc, _, err = run(*argv_for(command, blocker / "sub"))
    assert_clean_error(rc, err)
    assert "somefile/sub" in err and "Not a directory" in err
    assert "hint: a part of the path is a file" in err
    assert blocker.read_text() == "x"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_name_too_long_is_a_clear_error(command: str, tmp_path: Path) -> None:
    rc, _, err = run(*argv_for(command, tmp_path / LONG))
    assert_clean_error(rc, err)
    assert "File name too long" in err and "hint: a file name may have at most 255 bytes" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_missing_parent_directory(command: str, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "out"
    rc, _, err = run(*argv_for(command, out))
    if COMMANDS[command][1]:  # an output directory is created with its parents
        assert rc == 0, err
        assert out.is_dir()
    else:
        assert_clean_error(rc, err)
        assert "the directory" in err and "missing' does not exist" in err
        assert not (tmp_path / "missing").exists()


def _refuse_new_files(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Creating a file fails with `code`, as in a read-only directory (tests run as root,
    where chmod does not stop writes)."""
    real = os.open

    def open_(path: str | os.PathLike[str], flags: int, *args: int, **kw: int) -> int:
        if flags & os.O_CREAT:
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", open_)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.EDQUOT])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_directory_that_refuses_new_files(
    command: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    if COMMANDS[command][1]:
        out.mkdir()
    _refuse_new_files(monkeypatch, code)
    rc, _, err = run(*argv_for(command, out))
    assert_clean_error(rc, err)
    assert os.strerror(code) in err and "\nhint: " in err
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def _cross_device_renames(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rename between two directories fails as it does across file systems (EXDEV), as
    for `-o` onto a mount point staged on the parent file system."""
    real = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str], **kw: int) -> None:
        if Path(src).parent.resolve() != Path(dst).parent.resolve():
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_writes_stage_beside_the_destination(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cross_device_renames(monkeypatch)
    out = tmp_path / "out"
    if command == "emit":
        out.mkdir()  # a mount point is an existing directory
    rc, _, err = run(*argv_for(command, out))
    assert rc == 0, err
    rc, _, err = run(*argv_for(command, out if command != "samples" else tmp_path / "o2"))
    assert rc == 0, err
    assert not temporaries(tmp_path)


# --- 14. .sched files: versioned, truncation detected, tune -o guarded --------------------------
def test_saved_schedules_carry_a_version_and_a_step_count(tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    assert (
        run("apply", "sgd", "split(g1)", "reorder(g1); asslice(m)", "dce()", "-o", str(out))[0] == 0
    )
    lines = out.read_text().splitlines()
    assert lines[:2] == [SCHED_HEADER, "# steps: 4"]
    assert [str(s) for s in load_sched(out)] == ["split(g1)", "reorder(g1)", "asslice(m)", "dce()"]


@pytest.mark.parametrize("keep", [1, 2, 3, 5])
def test_a_truncated_schedule_file_is_refused(keep: int, tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    assert run("apply", "sgd", "split(g1)", "reorder(g1)", "asslice(m)", "-o", str(out))[0] == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:keep]))
    rc, _, err = run("simulate", "sgd", "--json", "--schedule", str(out))
    assert rc == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert "truncated" in err
    rc, _, err = run(
        "emit", "sgd", "--target", "cpu", "--schedule", str(out), "-o", str(tmp_path / "o")
    )
    assert rc == 1 and "truncated" in err
    assert not (tmp_path / "o").exists()


def test_a_schedule_file_cut_inside_a_step(tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    assert run("apply", "sgd", "split(g1)", "reorder(g1)", "-o", str(out))[0] == 0
    out.write_text(out.read_text()[:-5])  # "reorder(g1)\n" -> "reord"... cut mid-line
    rc, _, err = run("simulate", "sgd", "--json", "--schedule", str(out))
    assert rc in (1, 3), err
    assert "internal error" not in err and "Traceback" not in err


def test_a_schedule_file_cut_inside_its_header(tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    out.write_text(SCHED_HEADER[:12])
    with pytest.raises(InputError, match="truncated"):
        load_sched(out)


def test_a_newer_schedule_version_is_refused_with_a_hint(tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    out.write_text("# cocoviz schedule v2\n# steps: 1\nsplit(g1)\n")
    rc, _, err = run("simulate", "sgd", "--json", "--schedule", str(out))
    assert rc == 1
    assert "version 2 was written by a newer cocoviz" in err and "hint: upgrade cocoviz" in err


def test_an_edited_step_count_points_at_its_line(tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    out.write_text(f"{SCHED_HEADER}\n# steps: 1\nsplit(g1)\nreorder(g1)\n")
    rc, _, err = run("simulate", "sgd", "--json", "--schedule", str(out))
    assert rc == 1
    assert err.splitlines()[:3] == [
        f"{out}:2:1: error: the schedule file holds 2 steps but its header says 1: "
        "it is truncated or was edited",
        "   2 | # steps: 1",
        "     | ^^^^^^^^^^",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "# cocoviz schedule\nsplit(g1)\nreorder(g1)\n",  # written by an older cocoviz
        "split(g1)\nreorder(g1)",  # hand-written
        "# my schedule\nsplit(g1); reorder(g1)\n",
    ],
)
def test_schedule_files_without_a_version_are_read_as_they_are(text: str, tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    out.write_text(text)
    assert [str(s) for s in load_sched(out)] == ["split(g1)", "reorder(g1)"]


def test_apply_overwrites_a_schedule_an_older_cocoviz_wrote(tmp_path: Path) -> None:
    out = tmp_path / "s.sched"
    out.write_text("# cocoviz schedule\nsplit(g1)\n")
    assert run("apply", "sgd", "dce()", "-o", str(out))[0] == 0
    assert out.read_text().splitlines()[0] == SCHED_HEADER


def test_tune_output_is_guarded_like_apply(tmp_path: Path) -> None:
    mine = tmp_path / "mine.sched"
    mine.write_text("split(g1)\n")
    rc, _, err = run("tune", "sgd", "--top", "1", "-o", str(mine))
    assert_clean_error(rc, err)
    assert "was not written by cocoviz" in err and "--force" in err
    assert mine.read_text() == "split(g1)\n"
    assert run("tune", "sgd", "--top", "1", "-o", str(mine), "--force")[0] == 0
    text = mine.read_text()
    assert text.startswith(f"{SCHED_HEADER}\n# steps: ")
    assert "written by cocoviz tune" in text
    assert run("tune", "sgd", "--top", "1", "-o", str(mine))[0] == 0  # its own file
    rc, _, err = run("tune", "sgd", "-o", str(tmp_path / "best.txt"))
    assert_clean_error(rc, err)
    assert "must end in .sched" in err
    steps = [str(s) for s in load_sched(mine)]
    rc, out, _ = run("simulate", "sgd", "--json", "--schedule", str(mine))
    assert rc == 0 and json.loads(out)["program"] == "sgd" and steps


# --- the writer's own contract ------------------------------------------------------------------
def test_replace_files_refuses_names_that_leave_the_directory(tmp_path: Path) -> None:
    for name in ("../x", "/etc/x", "a/b", "..", ".", ""):
        with pytest.raises(ValueError):
            fsio.replace_files(tmp_path, {name: b"x"})
    assert list(tmp_path.iterdir()) == [tmp_path / "home"]


def test_new_files_get_the_usual_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fsio.write_file(tmp_path / "a.txt", "a")
        fsio.replace_files(tmp_path, {"run.sh": "#!/bin/sh\n"}, frozenset({"run.sh"}))
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o755
