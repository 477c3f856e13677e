"""`cocoviz run --mpi` against hostile or mistaken use: signals to the launcher, rank
counts the machine cannot run, input files that are not arrays, out-of-range seeds.

Every process of a run carries the run's TMPDIR (the test's tmp_path) in its
environment, which is how the tests find them without matching anything else."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import need_tool

from cocoviz.cli import main
from cocoviz.errors import InputError, UsageError
from cocoviz.exec import mpi_run
from cocoviz.exec.mpi_run import MpiJob, check_world, rank_limit, read_input
from cocoviz.ir.lower import RanksOverride, load_file, load_program, parse_defines

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
HAS_MPI = Path(sys.executable).with_name("mpiexec").exists()
# tests/conftest.py: skip without mpiexec, or fail under COCOVIZ_REQUIRE_MPI/NVCC
needs_mpi = pytest.mark.usefixtures("mpi_required")
needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")

LONG_RUN = [
    "run",
    "sgd",
    "--schedule",
    "fused",
    "--mpi",
    "--ranks",
    "4",
    "-D",
    "N=65536",
    "--iters",
    "1000000",
    "--no-check",
]


def _sgd(ranks: str = "4"):  # type: ignore[no-untyped-def]
    return load_file(SAMPLES / "sgd.coco", parse_defines(["N=64"]), RanksOverride.parse(ranks))


def _processes_of(marker: Path) -> list[tuple[int, str]]:
    """Live processes (not zombies) whose environment or command line holds `marker`."""
    key = str(marker).encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            cmd = (d / "cmdline").read_bytes()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if (key in env or key in cmd) and stat[stat.rindex(")") + 2] not in "ZX":
            found.append((int(d.name), cmd.replace(b"\0", b" ").decode(errors="replace")))
    return found


def _kind(cmd: str) -> str:
    args = cmd.split()
    if args[1:3] == ["-m", "cocoviz.exec.mpi_worker"]:
        return "worker"
    if args[1:3] == ["-m", "cocoviz.exec.mpi_guard"]:
        return "supervisor" if args[3] == "--supervise" else "guard"
    return Path(args[0]).name


def _kill_all(marker: Path) -> None:
    for pid, _ in _processes_of(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _start(tmp_path: Path, args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cocoviz", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
        start_new_session=True,
    )


def _wait_ranks_running(tmp_path: Path, ranks: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        status = list(tmp_path.glob("cocoviz-mpi-*/status.*"))
        if len(status) == ranks and all(s.read_text().startswith("started") for s in status):
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended early: {proc.communicate()}")
        time.sleep(0.05)
    pytest.fail("the ranks never started")


def _wait_all_gone(tmp_path: Path, since: float, within: float = 10.0) -> float:
    """Seconds from `since` until no process of the run and no job directory is left."""
    while True:
        left = _processes_of(tmp_path)
        dirs = list(tmp_path.glob("cocoviz-mpi-*"))
        if not left and not dirs:
            return time.monotonic() - since
        if time.monotonic() - since > within:
            _kill_all(tmp_path)
            pytest.fail(f"left after {within} s: processes {left}, directories {dirs}")
        time.sleep(0.01)


# --- item 5: nothing of a run outlives `cocoviz run --mpi` -----------------------------


@needs_mpi
@needs_proc
@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 143, "terminated (SIGTERM)"),
        (signal.SIGHUP, 129, "terminated (SIGHUP)"),
        (signal.SIGKILL, -signal.SIGKILL, ""),
    ],
    ids=["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"],
)
def test_signal_to_the_launcher_ends_every_process_and_removes_the_job(
    tmp_path: Path, sig: int, code: int, said: str
) -> None:
    proc = _start(tmp_path, LONG_RUN)
    try:
        _wait_ranks_running(tmp_path, 4, proc)
        run = _processes_of(tmp_path)
        kinds = [_kind(cmd) for _, cmd in run]
        for kind, n in [("worker", 4), ("guard", 4), ("supervisor", 1), ("mpiexec", 1)]:
            assert kinds.count(kind) == n, run
        time.sleep(0.3)  # mid-run
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        took = _wait_all_gone(tmp_path, sent, within=5.0)
    finally:
        proc.kill()
        _kill_all(tmp_path)
    assert proc.returncode == code, err
    assert said in err
    assert "Traceback" not in err
    print(f"{signal.Signals(sig).name}: every process and the job directory gone in {took:.3f} s")


@needs_mpi
@needs_proc
@pytest.mark.parametrize(
    ("seen", "delay"),
    [("owner.json", 0.0), ("spec.json", 0.0), ("mpiexec.out", 0.0), ("mpiexec.out", 0.1)]
    + [("mpiexec.out", 0.25)],
)
def test_sigkill_while_the_run_starts_leaves_nothing(
    tmp_path: Path, seen: str, delay: float
) -> None:
    """SIGKILL of the launcher as soon as the job directory exists, before mpiexec
    runs, and while mpiexec is still starting the guards."""
    proc = _start(tmp_path, LONG_RUN)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(f"cocoviz-mpi-*/{seen}")):
            assert time.monotonic() < deadline, proc.poll()
            time.sleep(0.001)
        time.sleep(delay)
        sent = time.monotonic()
        proc.kill()
        proc.wait(timeout=10)
        _wait_all_gone(tmp_path, sent, within=5.0)
    finally:
        _kill_all(tmp_path)


@needs_mpi
@needs_proc
def test_timeout_ends_every_process_and_removes_the_job(tmp_path: Path) -> None:
    proc = _start(tmp_path, [*LONG_RUN, "--timeout", "3"])
    try:
        _, err = proc.communicate(timeout=60)
        ended = time.monotonic()
        _wait_all_gone(tmp_path, ended, within=3.0)
    finally:
        proc.kill()
        _kill_all(tmp_path)
    assert proc.returncode == 5
    assert "did not finish within 3 s" in err


def test_stale_job_of_a_dead_owner_is_swept(tmp_path: Path, monkeypatch) -> None:
    """A job directory whose owner died before any process could remove it (SIGKILL
    between creating it and starting the supervisor) goes at the next run."""
    import json
    import socket

    monkeypatch.setattr(mpi_run.tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / "cocoviz-mpi-stale"
    stale.mkdir()
    owner = {"pid": dead.pid, "start": "0", "host": socket.gethostname()}
    (stale / "owner.json").write_text(json.dumps(owner))
    mine = tmp_path / "cocoviz-mpi-live"
    mine.mkdir()
    me = {"pid": os.getpid(), "start": mpi_run.process_start(os.getpid())}
    (mine / "owner.json").write_text(json.dumps({**me, "host": socket.gethostname()}))
    other = tmp_path / "cocoviz-mpi-foreign"  # no owner record: not ours to judge
    other.mkdir()
    with MpiJob() as job:
        assert job.dir.parent == tmp_path
    assert not stale.exists() and mine.exists() and other.exists()
    assert not job.dir.exists()


@needs_mpi
def test_launcher_cleans_up_when_the_caller_raises(tmp_path: Path, monkeypatch) -> None:
    """Results read or not, leaving a run removes its directory (the API path)."""
    monkeypatch.setattr(mpi_run.tempfile, "tempdir", str(tmp_path))
    run = mpi_run.run_mpi(_sgd(ranks="2"), ["w1"])
    assert run.world == 2
    assert list(tmp_path.glob("cocoviz-mpi-*")) == []


@needs_mpi
def test_mpiexec_that_cannot_run_is_named(tmp_path: Path, capsys, monkeypatch) -> None:
    bad = tmp_path / "mpiexec"
    bad.write_text("not a program")
    bad.chmod(0o755)
    monkeypatch.setattr(mpi_run, "find_mpiexec", lambda: str(bad))
    monkeypatch.setattr(mpi_run.tempfile, "tempdir", str(tmp_path))
    assert main(["run", "sgd", "--mpi", "--ranks", "2", "-D", "N=64"]) == 5
    err = capsys.readouterr().err
    assert "no rank started" in err and f"cannot run {bad}" in err
    assert list(tmp_path.glob("cocoviz-mpi-*")) == []


@needs_mpi
def test_job_directory_that_cannot_be_made_is_a_build_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(mpi_run.tempfile, "tempdir", str(tmp_path / "missing"))
    assert main(["run", "sgd", "--mpi", "--ranks", "2", "-D", "N=64"]) == 5
    err = capsys.readouterr().err
    assert "cannot create the MPI job directory" in err and "No such file" in err
    assert "TMPDIR" in err


# --- item 6: rank counts the machine cannot run, and timeouts that hold --------------


def _program_with_ranks(n: int) -> str:
    return f"""program tiny
ranks {n}
dim N = {n}
input x : f32[N] sliced
s = allgather(x)
output s
"""


def test_a_million_ranks_is_refused_before_launch(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(mpi_run, "find_mpiexec", _must_not_launch)
    src = tmp_path / "big.coco"
    src.write_text(_program_with_ranks(1_000_000))
    started = time.monotonic()
    rc = main(["run", str(src), "--mpi", "--no-check", "--timeout", "20"])
    err = capsys.readouterr().err
    assert time.monotonic() - started < 10
    assert rc == 2
    assert "1000000 ranks" in err and "at most 1024" in err and "--ranks" in err
    assert main(["run", str(src), "--mpi", "--oversubscribe", "--no-check"]) == 2


def _must_not_launch() -> str:
    raise AssertionError("mpiexec must not be looked up for a refused rank count")


def test_ranks_beyond_the_machine_need_oversubscribe(tmp_path: Path, capsys, monkeypatch):
    n = rank_limit() + 1
    if n > mpi_run.HARD_MAX_RANKS:
        pytest.skip("this machine's limit is the hard cap")
    monkeypatch.setattr(mpi_run, "find_mpiexec", _must_not_launch)
    src = tmp_path / "wide.coco"
    src.write_text(_program_with_ranks(n))
    assert main(["run", str(src), "--mpi", "--no-check"]) == 2
    err = capsys.readouterr().err
    assert f"{n} ranks" in err and "CPUs" in err and "--oversubscribe" in err
    assert rank_limit(oversubscribe=True) == mpi_run.HARD_MAX_RANKS
    check_world(load_program(_program_with_ranks(min(n, 64))), oversubscribe=True)
    monkeypatch.setattr(mpi_run, "_available_memory", lambda: 1 << 20)
    with pytest.raises(UsageError, match="MiB are free"):
        check_world(load_program(_program_with_ranks(2)))


def test_oversubscribe_without_mpi_is_a_usage_error(capsys) -> None:
    rc = main(["run", "sgd", "--ranks", "2", "-D", "N=64", "--oversubscribe"])
    assert rc == 2
    assert "add --mpi" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "1e300", "soon"])
def test_timeout_must_be_a_positive_number_of_seconds(value: str, capsys) -> None:
    rc = main(["run", "sgd", "--mpi", "--ranks", "2", "-D", "N=64", "--timeout", value])
    assert rc == 2
    assert "not a number of seconds" in capsys.readouterr().err


def test_run_mpi_refuses_a_deadline_that_never_passes() -> None:
    prog = load_program(_program_with_ranks(2))
    with pytest.raises(UsageError, match="--timeout"):
        mpi_run.run_mpi(prog, ["s"], timeout_s=math.nan)


def test_watching_a_job_costs_one_listing_per_poll_and_honours_the_deadline(tmp_path, monkeypatch):
    """`MpiJob.wait` reads the `killed/` directory once per poll, never one file per
    rank, and returns at its deadline."""
    monkeypatch.setattr(mpi_run.tempfile, "tempdir", str(tmp_path))
    with MpiJob() as job:
        for r in range(1024):
            (job.dir / f"status.{r}").write_text("started")
        job.launch([sys.executable, "-c", "import time; time.sleep(60)"])  # a stand-in mpiexec
        reads: list[str] = []
        real = Path.read_text
        monkeypatch.setattr(Path, "read_text", lambda p, *a, **k: reads.append(p.name) or real(p))
        start = time.monotonic()
        assert job.wait(start + 1.0) is None
        assert 0.95 <= time.monotonic() - start < 1.5
        assert reads == []
        (job.dir / "killed" / "7").write_text("SIGKILL")
        assert job.wait(time.monotonic() + 5) == 7
        monkeypatch.setattr(Path, "read_text", real)
    assert job.proc.poll() is not None
    assert not job.dir.exists()


# --- item 8: --inputs files that are not arrays ----------------------------------------


def _sgd_inputs(tmp_path: Path) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    return d


def _run_with_inputs(d: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess, so that a read that blocks fails the test instead of
    hanging it."""
    return subprocess.run(
        [sys.executable, "-m", "cocoviz", "run", "sgd", "--ranks", "4", "-D", "N=64"]
        + ["--inputs", str(d), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("mpi", [False, True], ids=["reference", "mpi"])
def test_fifo_input_is_refused_without_blocking(tmp_path: Path, mpi: bool) -> None:
    if mpi:
        need_tool(HAS_MPI, "mpiexec", mpi=True)
    d = _sgd_inputs(tmp_path)
    os.mkfifo(d / "w.npy")
    res = _run_with_inputs(d, *(["--mpi"] if mpi else []))
    assert res.returncode == 1, res.stderr
    assert "w.npy: not a regular file" in res.stderr
    assert "Traceback" not in res.stderr


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


GOOD = _npy_bytes(np.zeros(64, np.float32))
HEADER = GOOD[: len(GOOD) - 64 * 4]
BAD_FILES = {
    "empty": (b"", "not a readable .npy file"),
    "magic only": (GOOD[:8], "not a readable .npy file"),
    "not npy": (b"hello, world\n" * 10, "not a readable .npy file"),
    "bad header": (HEADER.replace(b"'descr'", b"'dscr' "), "not a readable .npy file"),
    "header garbage": (GOOD[:10] + b"\xff" * 118, "not a readable .npy file"),
    "version 9": (GOOD[:6] + b"\x09\x00" + GOOD[8:], "not a readable .npy file"),
    "truncated": (GOOD[:-5], "(truncated)"),
    "trailing": (GOOD + b"\0" * 4096, "(extra bytes follow)"),
    "object": (
        HEADER.replace(b"'<f4'", b"'|O' "),
        "Python objects",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES), ids=list(BAD_FILES))
def test_malformed_npy_is_one_clear_input_error(tmp_path: Path, case: str) -> None:
    data, said = BAD_FILES[case]
    d = _sgd_inputs(tmp_path)
    (d / "w.npy").write_bytes(data)
    res = _run_with_inputs(d)
    assert res.returncode == 1, res.stderr
    assert f"{d / 'w.npy'}:" in res.stderr and said in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr


def test_directory_and_device_named_npy_are_refused(tmp_path: Path) -> None:
    d = _sgd_inputs(tmp_path)
    (d / "w.npy").mkdir()
    res = _run_with_inputs(d)
    assert res.returncode == 1 and "is a directory" in res.stderr
    (d / "w.npy").rmdir()
    (d / "w.npy").symlink_to("/dev/zero")
    res = _run_with_inputs(d)
    assert res.returncode == 1 and "not a regular file" in res.stderr
    (d / "w.npy").unlink()
    (d / "w.npy").symlink_to(d / "missing.npy")
    res = _run_with_inputs(d)
    assert res.returncode == 1 and "no such .npy file" in res.stderr


def test_inputs_that_is_a_file_says_so(tmp_path: Path, capsys) -> None:
    f = tmp_path / "in"
    f.write_text("")
    assert main(["run", "sgd", "--ranks", "2", "-D", "N=64", "--inputs", str(f)]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_read_input_checks_the_open_file_and_maps_it(tmp_path: Path) -> None:
    """The worker reads through the same checks (a file swapped for a FIFO after the
    launcher's check must not hang a rank); good files come back memory-mapped."""
    ty = _sgd().type_of("w")
    f = tmp_path / "w.npy"
    os.mkfifo(f)
    with pytest.raises(InputError, match="not a regular file"):
        read_input(f, "w", ty, 4)
    f.unlink()
    n = int(np.prod([s.value for s in ty.shape]))
    want = np.arange(n, dtype=np.float32)
    np.save(f, want)
    got = read_input(f, "w", ty, 4)
    np.testing.assert_array_equal(got, want.reshape(got.shape))
    assert not got.flags.writeable
    np.save(f, np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    with pytest.raises(InputError, match="expected shape"):
        read_input(f, "w", ty, 4)


# --- item 13: seeds and params out of range -------------------------------------------


@pytest.mark.parametrize("seed", ["-1", str(2**64), str(2**70)])
def test_seed_out_of_range_is_a_usage_error(seed: str, capsys) -> None:
    rc = main(["run", "sgd", "--ranks", "2", "-D", "N=64", "--seed", seed])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--seed" in err and "[0, 2^64)" in err and "internal error" not in err


def test_largest_seed_runs(capsys) -> None:
    assert main(["run", "sgd", "--ranks", "2", "-D", "N=64", "--seed", str(2**64 - 1)]) == 0


PARAM_PROGRAM = """program p
ranks 2
dim N = 8
param k: {dtype} = {value}
input x : {dtype}[N] sliced
y = x * k
output y
"""


@pytest.mark.parametrize(
    ("dtype", "value"),
    [("i32", "3000000000"), ("i32", str(2**64)), ("i32", "-2147483649"), ("i64", str(2**64))],
)
def test_param_out_of_range_for_its_dtype_is_an_input_error(
    tmp_path: Path, dtype: str, value: str, capsys
) -> None:
    src = tmp_path / "p.coco"
    src.write_text(PARAM_PROGRAM.format(dtype=dtype, value=value))
    rc = main(["run", str(src)])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "out of range" in err and dtype in err
