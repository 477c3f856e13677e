"""The processes between `cocoviz run --mpi` and its ranks, which keep every process of
a run from outliving the `cocoviz` process that owns it.

``python -m cocoviz.exec.mpi_guard --supervise OWNER DIR`` is the run's supervisor: the
owner starts it in a session of its own; it creates the job directory, then starts
mpiexec and waits for it. ``python -m cocoviz.exec.mpi_guard SPEC.json`` is a rank's guard: mpiexec starts
it once per rank, and it starts the real worker (`cocoviz.exec.mpi_worker`), passing the
process manager's environment and file descriptors on. When the worker dies by a signal
— even SIGKILL, which no handler can catch — the guard knows which rank it was and
records it in the job directory, so the launcher can name the rank. (mpiexec's own
message names only a process id, often not the one that failed.)

Nothing of a run survives its owner, however the owner ends (exit, Ctrl-C, SIGTERM,
SIGKILL):

- the owner (`cocoviz.exec.mpi_run.MpiJob`) kills the supervisor's process group and
  removes the job directory on every way out of a run it is alive to see;
- the supervisor creates the job directory, so that it never exists without a process
  that will remove it. It watches the owner (its stdin pipe until launch, then a pidfd
  or the owner's start time in /proc): when the owner is gone it kills mpiexec (whose
  proxy then kills the ranks), waits until every rank is gone and removes the job
  directory. mpiexec gets SIGKILL if the supervisor dies (PR_SET_PDEATHSIG);
- each guard watches the owner and the job directory too: when the owner is gone, or
  has removed the directory, it kills its worker and exits. A guard whose own parent
  dies gets SIGTERM (PR_SET_PDEATHSIG), which it forwards; the worker is tied to the
  guard with PR_SET_PDEATHSIG (SIGKILL);
- guard and worker hold a shared lock on ``JOB/alive``, so that whoever removes the
  directory can first wait until every rank is gone.

Kept free of heavy imports: it starts once per rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
_PR_SET_PDEATHSIG = 1
JOB_PREFIX = "cocoviz-mpi-"
OWNER = "owner.json"  # {"pid", "start", "host"} of the process that owns the run
ALIVE = "alive"  # the file guards and workers hold a shared lock on
KILLED = "killed"  # the directory of `killed/<rank>` markers, one listing per poll
JOB_ENV = "COCOVIZ_MPI_JOB"  # every process of a run has the job directory here
POLL_S = 0.5  # how often the owner's and the job directory's presence is polled
RANKS_GONE_S = 3.0  # how long to wait for killed ranks before removing the directory


def _rank() -> int:
    for var in _RANK_VARS:
        if var in os.environ:
            return int(os.environ[var])
    return -1


def set_parent_death_signal(sig: int) -> bool:
    """Have the kernel send `sig` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _tie_to_parent(sig: int) -> Callable[[], None] | None:
    """A `preexec_fn` tying the child to this process: `sig` when we die, and no start
    at all if we died between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def tie() -> None:
        set_parent_death_signal(sig)
        if os.getppid() != parent:
            os._exit(1)

    return tie


def process_start(pid: int) -> str | None:
    """An identity of a live process that a reused pid does not share (its start time
    in clock ticks on Linux), or None when `pid` has ended (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "alive"
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` ends (Linux 5.3+), if available."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def remove_job(job: Path) -> None:
    """Remove a job directory, retrying while ranks that are being killed still write."""
    if not job.name.startswith(JOB_PREFIX):
        return
    for _ in range(20):
        shutil.rmtree(job, ignore_errors=True)
        if not job.exists():
            return
        time.sleep(0.05)


def wait_unlocked(fd: int, timeout: float) -> bool:
    """Wait up to `timeout` s until nobody else holds a lock on `fd`'s file (every guard
    and worker of the run has ended)."""
    end = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
            continue
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True


class Owner:
    """The process that owns a run, as recorded in JOB/owner.json."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.pid = int(record["pid"])
        self.start = str(record["start"])

    def alive(self) -> bool:
        return process_start(self.pid) == self.start


def wait_child(
    child: subprocess.Popen[bytes], owner: Owner, also: Callable[[], bool] = lambda: False
) -> int | None:
    """`child`'s exit status, or None once `owner` has ended or `also()` is true."""
    fds = [fd for fd in (_pidfd(child.pid), _pidfd(owner.pid)) if fd is not None]
    try:
        while True:
            if len(fds) == 2:
                select.select(fds, [], [], POLL_S)
                rc = child.poll()
            else:
                try:
                    rc = child.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    rc = None
            if rc is not None:
                return rc
            if not owner.alive() or also():
                return None
    finally:
        for fd in fds:
            os.close(fd)


def _make_job(where: str, owner_pid: int, owner_start: str) -> Path:
    import socket
    import tempfile

    job = Path(tempfile.mkdtemp(prefix=JOB_PREFIX, dir=where))
    try:
        for sub in ("out", KILLED):
            (job / sub).mkdir()
        (job / ALIVE).touch()
        record = {"pid": owner_pid, "start": owner_start, "host": socket.gethostname()}
        (job / OWNER).write_text(json.dumps(record))
    except BaseException:
        remove_job(job)
        raise
    return job


def supervise(owner_pid: int, where: str) -> int:
    """`--supervise OWNER DIR`: the run's supervisor, started by OWNER with pipes on
    stdin and stdout. It creates the job directory in DIR and writes its path on stdout (or
    ``!reason``), then reads the command to run (mpiexec …, a JSON list) from stdin until
    OWNER closes it; it runs the command with the job's marker in its environment and
    exits as it does (128+N for signal N). If OWNER ends first — before sending the
    command or while it runs — the supervisor kills the command, waits for the ranks and
    removes the job directory: the directory never exists without a live process
    that will remove it."""
    if os.getppid() != owner_pid:
        return 1
    start = process_start(owner_pid)
    if start is None:
        return 1
    owner = Owner({"pid": owner_pid, "start": start})
    try:
        job = _make_job(where, owner_pid, start)
    except OSError as err:
        print(f"!{err.strerror or err}", flush=True)
        return 1
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stop.append(s))
    try:
        print(job, flush=True)
        cmd = json.loads(sys.stdin.buffer.read())
        if not (isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd)):
            raise ValueError("not a command")
    except (OSError, ValueError):
        cmd = None  # the owner ended, or gave up before the launch
    alive = os.open(job / ALIVE, os.O_RDONLY)
    if cmd is None or stop or not owner.alive():
        remove_job(job)
        return 1
    env = {**os.environ, JOB_ENV: str(job)}
    with open(job / "mpiexec.out", "wb") as out, open(job / "mpiexec.err", "wb") as errors:
        try:
            child = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=errors,
                env=env,
                preexec_fn=_tie_to_parent(signal.SIGKILL),
            )
        except OSError as err:
            errors.write(f"cocoviz: cannot run {cmd[0]}: {err.strerror}\n".encode())
            return 127
    rc = wait_child(child, owner, also=lambda: bool(stop))
    if rc is not None and owner.alive():
        return rc if rc >= 0 else 128 - rc
    # the owner is gone (mpiexec may have ended first, its ranks having seen that too)
    child.kill()
    child.wait()
    wait_unlocked(alive, RANKS_GONE_S)
    if not owner.alive():
        remove_job(job)
    return 1


class Guard:
    """One rank's guard: starts the worker and waits for it, or for its owner's end."""

    def __init__(self, spec_path: Path, spec: dict[str, Any]) -> None:
        self.spec_path = spec_path
        self.job = spec_path.parent
        self.owner = Owner(spec["owner"])
        self.rank = _rank()

    def run(self) -> int:
        parent = os.getppid()
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent or not self.owner.alive():
            return 1
        self._hold_alive_lock()
        child = subprocess.Popen(
            [sys.executable, "-m", "cocoviz.exec.mpi_worker", str(self.spec_path)],
            close_fds=False,
            preexec_fn=_tie_to_parent(signal.SIGKILL),
        )
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, f: child.send_signal(s))
        rc = wait_child(child, self.owner, also=lambda: not self.spec_path.exists())
        if rc is None or not self.owner.alive():
            # the owner is gone, or it ended the run and removed the job directory
            child.kill()
            child.wait()
            if not self.owner.alive():
                remove_job(self.job)  # the supervisor does too, unless it was killed
            return 1
        if rc < 0 and self.rank >= 0:
            name = signal.Signals(-rc).name
            with contextlib.suppress(OSError):
                (self.job / f"status.{self.rank}").write_text(f"killed: signal {name}")
                (self.job / KILLED / str(self.rank)).write_text(name)
            print(f"cocoviz: rank {self.rank} was killed by {name}", file=sys.stderr, flush=True)
            return 128 - rc
        return rc

    def _hold_alive_lock(self) -> None:
        """A shared lock on JOB/alive, on a descriptor the worker inherits (one open file,
        so the lock lasts until both have ended)."""
        try:
            fd = os.open(self.job / ALIVE, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            return
        os.set_inheritable(fd, True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--supervise"]:
        return supervise(int(argv[1]), argv[2])
    spec_path = Path(argv[0]).resolve()
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, ValueError):
        return 1  # the job directory is gone already: the owner ended the run
    return Guard(spec_path, spec).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
