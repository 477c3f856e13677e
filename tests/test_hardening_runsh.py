"""`run.sh --emulate` is supervised like `cocoviz run --mpi`: the whole job dies with
run.sh, SIGKILL included, SIGINT and SIGTERM act at once, and the job's temporary
directory is removed however the run ends (issue 31, item 5).

The launcher and the ranks are stand-ins (a launcher that starts four "ranks" and
never cleans up after itself, ranks that sleep), so the tests need neither MPI nor a
build, and show what run.sh itself guarantees.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cocoviz.cli import main
from cocoviz.emit.stamp import write_stamp

FAKE_MPIEXEC = """#!/bin/sh
# a launcher that starts its ranks and leaves them behind when it is killed
shift 2
for i in 1 2 3 4; do "$@" & done
wait
"""

FAKE_RANK = """#!/bin/sh
echo "$$ $COCOVIZ_EMU_DIR" >> "$RANKS_FILE"
exec sleep 300
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    out = tmp_path / "o"
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["emit", "sgd", "--target", "cuda", "-o", str(out)]) == 0
    built_from = re.search(r"^BUILT_FROM := (.*)$", (out / "Makefile").read_text(), re.M)
    assert built_from is not None
    rank = out / "sgd-emu"
    rank.write_text(FAKE_RANK)
    rank.chmod(0o755)
    write_stamp(out, "sgd-emu", built_from.group(1).split())  # as `make emulate` would
    launcher = tmp_path / "mpiexec"
    launcher.write_text(FAKE_MPIEXEC)
    launcher.chmod(0o755)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def _start(tree: Path) -> tuple[subprocess.Popen[bytes], list[int], Path]:
    ranks_file = tree.parent / "ranks"
    env = {
        **os.environ,
        "MPIEXEC": str(tree.parent / "mpiexec"),
        "RANKS_FILE": str(ranks_file),
    }
    proc = subprocess.Popen(
        ["./run.sh", "--emulate"],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = ranks_file.read_text().split("\n")[:-1] if ranks_file.exists() else []
        if len(lines) == 4:
            break
        time.sleep(0.05)
    assert len(lines) == 4, lines
    pids = [int(line.split()[0]) for line in lines]
    emu_dir = Path(lines[0].split(maxsplit=1)[1])
    assert emu_dir.is_dir()
    return proc, pids, emu_dir


def _all_gone(pids: list[int], emu_dir: Path, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids) and not emu_dir.exists():
            return True
        time.sleep(0.1)
    for p in pids:  # leave nothing behind for the next test
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return False


pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


def test_sigkill_of_run_sh_ends_the_whole_job(tree: Path) -> None:
    proc, pids, emu_dir = _start(tree)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert _all_gone(pids, emu_dir, within=10), "ranks or the directory outlived run.sh"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_act_at_once(tree: Path, sig: signal.Signals) -> None:
    proc, pids, emu_dir = _start(tree)
    start = time.monotonic()
    proc.send_signal(sig)
    if sig == signal.SIGINT:  # an interactive ^C reaches the launcher's process group
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGINT)
    proc.wait(10)
    assert time.monotonic() - start < 5, "run.sh held the signal until the run finished"
    assert _all_gone(pids, emu_dir, within=10)


def test_a_finished_run_leaves_no_directory(tree: Path) -> None:
    (tree / "sgd-emu").write_text('#!/bin/sh\necho "$$ $COCOVIZ_EMU_DIR" >> "$RANKS_FILE"\n')
    ranks_file = tree.parent / "ranks"
    env = {**os.environ, "MPIEXEC": str(tree.parent / "mpiexec"), "RANKS_FILE": str(ranks_file)}
    res = subprocess.run(["./run.sh", "--emulate"], cwd=tree, env=env, timeout=60, check=False)
    assert res.returncode == 0
    emu_dir = Path(ranks_file.read_text().split("\n")[0].split(maxsplit=1)[1])
    assert _all_gone([], emu_dir, within=10)
