"""`cocoviz run --mpi`: launch one real process per rank with mpiexec and mpi4py.

The scheduled program travels to the workers as printed `.coco` text (the printer
round-trips, groups included). The launcher validates everything it can before launch
(tools present, inputs' dtypes and shapes), then runs ``mpiexec -n N python -m
cocoviz.exec.mpi_worker`` with a deadline. A rank that raises reports itself and calls
MPI_Abort; a rank that dies is noticed by mpiexec, which ends the others; the launcher
reads the per-rank status files to name the ranks that failed — and reports a failure
of the executor itself (an exception in a worker that is not the user's) as an internal
error (exit 70), not as a failed build or run (exit 5). It never waits past its
deadline, and nothing of a run outlives it (`MpiJob`, `cocoviz.exec.mpi_guard`): on
timeout, error, Ctrl-C, SIGTERM — or its own SIGKILL — every process of the run ends and
its job directory is removed. Rank counts beyond what the machine runs are refused before
launch (`check_world`).
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cocoviz import numerics as nx
from cocoviz.errors import BuildError, InputError, InternalError, UsageError, did_you_mean
from cocoviz.exec.layout import grid_global_shape
from cocoviz.exec.mpi_guard import (
    ALIVE,
    JOB_PREFIX,
    KILLED,
    OWNER,
    RANKS_GONE_S,
    process_start,
    remove_job,
    wait_unlocked,
)
from cocoviz.ir.nodes import GroupKind, Program
from cocoviz.ir.printer import format_program
from cocoviz.ir.types import TensorType, format_shape

KILLED_HINT = "a rank killed by SIGKILL is often the out-of-memory killer: try smaller -D sizes"
INSTALL_HINT = "install the MPI extra: pip install 'cocoviz[mpi]' (mpi4py and the mpich wheel)"
INTERNAL_STATUS = "internal: "
"""The status of a rank whose executor failed (`mpi_worker.is_internal`: a cocoviz bug,
reported as an internal error); a user's or the machine's error is ``error: …``."""


def find_mpiexec() -> str:
    """mpiexec next to this Python (the mpich wheel), under MPI_HOME, or on PATH."""
    here = Path(sys.executable).with_name("mpiexec")
    if here.exists():
        return str(here)
    home = os.environ.get("MPI_HOME")
    if home and (Path(home) / "bin" / "mpiexec").exists():
        return str(Path(home) / "bin" / "mpiexec")
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise BuildError("mpiexec was not found", hint=INSTALL_HINT)
    return found


def require_mpi4py() -> None:
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        raise BuildError("mpi4py is not installed", hint=INSTALL_HINT)


def load_inputs_dir(program: Program, inputs_dir: str | Path) -> dict[str, np.ndarray]:
    """Inputs from `NAME.npy` files (global shapes), validated against the declarations
    (`read_input`); memory-mapped, read-only.

    Inputs without a file come from the generator. Unknown `.npy` names are an error
    (a misspelled file would otherwise be silently ignored)."""
    d = Path(inputs_dir)
    try:
        is_dir = d.is_dir()
    except OSError:
        is_dir = False
    if not is_dir:
        what = "not a directory" if d.exists() else "no such directory"
        raise InputError(f"--inputs {d}: {what}")
    G = program.grid.group
    known = {i.name: i for i in program.inputs}
    out: dict[str, np.ndarray] = {}
    try:
        files = sorted(d.glob("*.npy"))
    except OSError as err:
        raise InputError(f"--inputs {d}: cannot list the directory ({err.strerror})") from None
    for f in files:
        name = f.stem
        if name not in known:
            raise InputError(
                f"{f}: '{program.name}' has no input named '{name}'",
                hint=did_you_mean(name, known) or f"its inputs are {', '.join(known)}",
            )
        out[name] = read_input(f, name, known[name].ty, G, program.grid.dp)
    return out


NPY_HINT = "write it with numpy.save (allow_pickle=False)"


def check_dp_groups(program: Program) -> None:
    """An overlapped group whose stages are laid out over dp (or run a collective over
    dp) is refused: the MPI executor's chunk pipelines cut a tp rank's value only."""
    for g in program.groups:
        if g.kind is not GroupKind.OVERLAPPED:
            continue
        for name in g.stages():
            s = program.stage(name)
            if s.expr.tag == "dp" or not s.ty.dp.is_replicated:
                raise UsageError(
                    f"run --mpi: the overlapped group with '{name}' ({s.ty}) is not supported "
                    "yet on a grid with dp (MPI executor: a chunk pipeline cuts a tp rank's "
                    "value only)",
                    hint="run the schedule without overlap, or without --mpi (the reference)",
                )


def read_input(f: Path, name: str, ty: TensorType, group: int, dp: int = 1) -> np.ndarray:
    """Input `name` from the `.npy` file `f`, checked against its declaration: a regular
    file (a FIFO or a device would block or never end), a numpy header of the declared
    dtype and global shape, then exactly the bytes that header promises (so a file is
    never larger than its input). Memory-mapped, read-only; every defect is an
    `InputError`. Opened without blocking and checked on the open file, so a file
    swapped for a FIFO after the check cannot hang a rank."""
    from cocoviz import fsio

    fd = fsio.open_regular(f, ".npy file")
    st = os.fstat(fd)
    with open(fd, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported format version {version[0]}.{version[1]}")
        except (ValueError, TypeError, SyntaxError, EOFError, OSError) as err:
            raise InputError(f"{f}: not a readable .npy file ({err})", hint=NPY_HINT) from None
        offset = fh.tell()
        want = nx.storage_dtype(ty.dtype.value)
        decl = f"{ty.dtype.value}{format_shape(ty.shape)} {ty.layout}"
        if dtype.hasobject:
            raise InputError(f"{f}: the file holds Python objects, not numbers", hint=NPY_HINT)
        if dtype != want:
            raise InputError(
                f"{f}: input '{name}' is declared {decl} (numpy {want}), but the file holds {dtype}",
                hint=f"save it as np.{want}"
                + (" (bf16 is stored as float32)" if ty.dtype.value == "bf16" else ""),
            )
        expect = grid_global_shape(ty, group, dp)  # global_shape without a dp layout
        if tuple(shape) != expect:
            what = (
                " ([G, *shape]: one row per rank for a local input)" if ty.layout.is_local else ""
            )
            if ty.dp.is_local:
                what = " ([D, …]: one value per dp replica for an input local over dp)"
            raise InputError(
                f"{f}: input '{name}' is declared {decl}: expected shape {list(expect)}{what}, "
                f"got {list(shape)}"
            )
        numel = int(np.prod(expect, dtype=np.int64))
        nbytes = numel * dtype.itemsize
        if st.st_size - offset != nbytes:
            short = st.st_size - offset < nbytes
            raise InputError(
                f"{f}: its header promises {nbytes} bytes of data, but the file holds "
                f"{st.st_size - offset}" + (" (truncated)" if short else " (extra bytes follow)"),
                hint=NPY_HINT,
            )
        if nbytes == 0:
            return np.empty(expect, dtype=dtype)
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as err:
            raise InputError(f"{f}: cannot map the file ({err})") from None
    data = np.frombuffer(mm, dtype=dtype, count=numel, offset=offset)
    return data.reshape(expect, order="F" if fortran else "C")


@dataclass(frozen=True)
class RankEvent:
    rank: int
    stage: str
    stream: str
    kind: str
    start: float
    end: float
    nbytes: int
    chunk: int | None


@dataclass
class MpiRun:
    """What a run measured, and the global values it produced."""

    world: int
    wall_s: float
    makespan_s: float
    """The reported iteration's makespan (the median one; slowest rank, barrier to
    barrier)."""
    events: list[RankEvent]
    """The reported iteration's events, every rank's."""
    outputs: dict[str, np.ndarray]
    iteration: int = 0
    """Which timed iteration `makespan_s` and `events` are from (0-based, after the
    warm-up)."""

    def timeline(self, program: Program) -> Any:
        """The measured events as a `cocoviz.sim.timeline.Timeline` (one lane per rank),
        so that the summary and the trace are the same code as `simulate`'s.

        Non-blocking collectives of a chunk pipeline are in flight together; on the
        communication stream each is shown from when the previous one completed (or its
        issue, if later) to its completion, so slices on one stream never overlap."""
        from cocoviz.ir.graph import deps
        from cocoviz.sim.timeline import CrossFlow, Event, Lane, Timeline, summarize
        from cocoviz.sim.workload import COMM, COMPUTE, Kind

        def kind(k: str) -> Kind:
            if k == "matmul":
                return Kind.MATMUL
            if k == "compute":
                return Kind.COMPUTE
            return Kind.P2P if k in ("send", "recv") else Kind.COLLECTIVE

        d = deps(program)
        T = program.grid.tp * program.grid.dp  # a pipeline stage's ranks (rank grids)
        chunks = {g.chunks for g in program.groups if g.chunks}
        lanes: list[Lane] = []
        index: dict[tuple[int, str, int | None], int] = {}
        for r in range(self.world):
            evs = sorted((e for e in self.events if e.rank == r), key=lambda e: (e.start, e.end))
            out: list[Event] = []
            busy = {"compute": 0.0, "comm": 0.0}
            for e in evs:
                start = max(e.start, busy[e.stream])
                end = max(e.end, start)
                busy[e.stream] = end
                stream = COMPUTE if e.stream == "compute" else COMM
                index[(r, e.stage, e.chunk)] = len(out)
                out.append(
                    Event(
                        rank=r,
                        stream=stream,
                        stage=e.stage,
                        kind=kind(e.kind),
                        start=start,
                        end=end,
                        bytes=float(e.nbytes),
                        flops=0.0,
                        name=e.stage,
                        chunk=e.chunk,
                        chunks=max(chunks) if e.chunk is not None and chunks else 1,
                        detail=e.kind,
                        peer=(r + T if e.kind == "send" else r - T if e.kind == "recv" else None),
                    )
                )
            flows = []
            for j, ev in enumerate(out):
                for src in d.get(ev.stage, ()):
                    i = index.get((r, src, ev.chunk), index.get((r, src, None)))
                    if (
                        i is not None
                        and out[i].stream != ev.stream
                        and out[i].end <= ev.start + 1e-9
                    ):
                        flows.append((i, j))
            lanes.append(Lane(r, r // T, (r,), tuple(out), tuple(flows)))
        cross = []
        for (r, stage, chunk), i in index.items():
            ev = lanes[r].events[i]
            if ev.detail == "send" and (r + T, stage, chunk) in index:
                cross.append(CrossFlow(r, i, r + T, index[(r + T, stage, chunk)], 0))
        return Timeline(
            program=program.name,
            hardware="measured (MPI processes)",
            collectives="mpi",
            tp=program.grid.tp,
            pp=program.grid.pp,
            lanes=tuple(lanes),
            cross=tuple(cross),
            summary=summarize(lanes),
        )


HARD_MAX_RANKS = 1024  # even with --oversubscribe: two Python processes per rank
RANKS_PER_CPU = 4
MIN_RANK_LIMIT = 16  # the bundled samples run on any machine
RANK_MEMORY = 64 << 20  # a guard and a worker before any data (measured: 72 MB RSS, 34 private)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rank_limit(oversubscribe: bool = False) -> int:
    """The most MPI ranks a run may start on this machine."""
    if oversubscribe:
        return HARD_MAX_RANKS
    return min(HARD_MAX_RANKS, max(MIN_RANK_LIMIT, RANKS_PER_CPU * usable_cpus()))


def check_world(program: Program, oversubscribe: bool = False) -> None:
    """Refuse, before anything starts, a rank count this machine cannot run: more than
    `RANKS_PER_CPU` per CPU (or `MIN_RANK_LIMIT`) without `oversubscribe`, more than
    `HARD_MAX_RANKS` ever, or more than the free memory holds."""
    world = program.grid.world
    fewer = f"run fewer ranks with --ranks N (e.g. --ranks {min(4, world)})"
    if world > HARD_MAX_RANKS:
        raise UsageError(
            f"'{program.name}' has {world} ranks; an MPI run starts at most {HARD_MAX_RANKS} "
            "processes",
            hint=f"{fewer}, or simulate it: cocoviz simulate",
        )
    limit = rank_limit(oversubscribe)
    if world > limit:
        raise UsageError(
            f"'{program.name}' has {world} ranks, more than this machine runs well as "
            f"processes ({usable_cpus()} CPUs: at most {limit} ranks)",
            hint=f"{fewer}, or pass --oversubscribe (up to {HARD_MAX_RANKS} ranks)",
        )
    free = _available_memory()
    if free is not None and world * RANK_MEMORY > free:
        raise UsageError(
            f"{world} MPI ranks need about {world * RANK_MEMORY >> 20} MiB before any data, "
            f"but {free >> 20} MiB are free",
            hint=fewer,
        )


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the launcher during an MPI run, which was cleaned up.
    (SIGINT raises KeyboardInterrupt as always.) A BaseException, like
    KeyboardInterrupt, so that no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Terminated` (where they would kill the process outright)
    so that the run's cleanup runs; handlers are the main thread's to change."""
    old: dict[signal.Signals, Any] = {}
    if _in_main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                old[sig] = signal.signal(sig, _raise_terminated)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold stop signals back while processes and files are made or removed, so that
    none is left half-made; the last one held is delivered afterwards."""
    held: list[int] = []
    old: dict[signal.Signals, Any] = {}
    if _in_main_thread():
        for sig in _STOP_SIGNALS:
            handler = signal.getsignal(sig)
            if handler not in (signal.SIG_IGN, None):
                old[sig] = signal.signal(sig, lambda s, f: held.append(s))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[-1])


class MpiJob:
    """The processes and files of one MPI run, owned by this process, which nothing of
    the run outlives (see `cocoviz.exec.mpi_guard` for the ties that hold even when
    this process is SIGKILLed).

    Entering starts the run's supervisor in a session of its own (so a Ctrl-C reaches
    only us), which creates the job directory: the spec, the per-rank status and
    result files, the outputs, and mpiexec's output (in files: a pipe nobody reads
    while we wait would block chatty ranks). `launch` hands it the mpiexec command.
    Leaving the `with` in any way — results read, error, timeout, Ctrl-C, SIGTERM —
    kills the supervisor's process group (the supervisor and mpiexec, whose proxy then
    kills the ranks), waits (bounded) until every guard and worker has let go of
    JOB/alive, and removes the directory. Every process of the run carries
    ``COCOVIZ_MPI_JOB=<dir>`` in its environment."""

    def __init__(self, env: Mapping[str, str] | None = None, deadline: float = math.inf) -> None:
        self.env = dict(os.environ if env is None else env)
        self.deadline = deadline
        self.dir = Path()
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner: dict[str, Any] = {}
        self._alive_fd: int | None = None

    def __enter__(self) -> MpiJob:
        try:
            with _signals_deferred():  # no supervisor started but not recorded
                _sweep_stale_jobs()
                self._start_supervisor()
            self._read_job_dir()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spec_path(self) -> Path:
        return self.dir / "spec.json"

    def _start_supervisor(self) -> None:
        supervisor = [sys.executable, "-m", "cocoviz.exec.mpi_guard", "--supervise"]
        self.proc = subprocess.Popen(
            [*supervisor, str(os.getpid()), tempfile.gettempdir()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )

    def _read_job_dir(self) -> None:
        """The job directory the supervisor created (it writes its path, or `!why`)."""
        assert self.proc is not None and self.proc.stdout is not None
        where = tempfile.gettempdir()
        line = ""
        left = None if math.isinf(self.deadline) else max(0.0, self.deadline - time.monotonic())
        if select.select([self.proc.stdout], [], [], left)[0]:
            line = self.proc.stdout.readline().decode(errors="replace").strip()
        self.proc.stdout.close()
        job = Path(line)
        if not line or line.startswith("!") or job.parent != Path(where):
            if line.startswith("!"):
                why = line[1:]
            elif self.proc.poll() is None:
                why = "the run's supervisor did not answer before the timeout"
            else:
                why = "the run's supervisor did not start"
            raise BuildError(
                f"cannot create the MPI job directory in {where} ({why})",
                hint="set TMPDIR to a writable directory",
            )
        self.dir = job
        self._alive_fd = os.open(job / ALIVE, os.O_RDONLY)
        self.owner = json.loads((job / OWNER).read_text())

    def launch(self, cmd: list[str]) -> None:
        """Have the supervisor run `cmd` (mpiexec …)."""
        assert self.proc is not None and self.proc.stdin is not None
        with _signals_deferred():
            try:
                self.proc.stdin.write(json.dumps(cmd).encode())
                self.proc.stdin.close()
            except BrokenPipeError:
                pass  # the supervisor is gone; `wait` sees it

    def wait(self, deadline: float) -> int | None:
        """Wait for mpiexec until `deadline` (time.monotonic); return a rank that was
        killed (its guard says so), or None when mpiexec ended or the deadline passed.
        One directory listing per poll, whatever the rank count."""
        assert self.proc is not None
        killed = self.dir / KILLED
        while True:
            try:
                self.proc.wait(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
                return None
            except subprocess.TimeoutExpired:
                pass
            try:
                names = os.listdir(killed)
            except OSError:
                names = []
            ranks = sorted(int(n) for n in names if n.isdigit())
            if ranks:
                return ranks[0]
            if time.monotonic() >= deadline:
                return None

    def kill(self) -> None:
        """Kill the supervisor and mpiexec (its proxy then kills the ranks). Before the
        launch, closing the supervisor's stdin is enough: it removes the directory."""
        if self.proc is None:
            return
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def output(self, stream: str, limit: int = 1 << 16) -> str:
        """The last `limit` bytes mpiexec wrote to `stream` ("out" or "err")."""
        try:
            with open(self.dir / f"mpiexec.{stream}", "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        with _signals_deferred():
            self.kill()
            if self._alive_fd is not None:  # the proxy kills them once mpiexec is gone
                wait_unlocked(self._alive_fd, RANKS_GONE_S / 3)
            if self.dir.name.startswith(JOB_PREFIX):
                remove_job(self.dir)  # guards left notice that the directory is gone
            if self._alive_fd is not None:
                wait_unlocked(self._alive_fd, RANKS_GONE_S)
                os.close(self._alive_fd)
                self._alive_fd = None


def _sweep_stale_jobs() -> None:
    """Remove the job directories of earlier runs whose owner died before any rank
    could clean up (SIGKILL while mpiexec was starting): ours, on this host."""
    tmp = tempfile.gettempdir()
    try:
        entries = [e for e in os.scandir(tmp) if e.name.startswith(JOB_PREFIX)]
    except OSError:
        return
    host = socket.gethostname()
    for e in entries:
        try:
            if not e.is_dir(follow_symlinks=False) or e.stat().st_uid != os.getuid():
                continue
            owner = json.loads((Path(e.path) / OWNER).read_text())
            if owner["host"] != host or process_start(int(owner["pid"])) == owner["start"]:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        shutil.rmtree(e.path, ignore_errors=True)


def launcher_args(hostfile: str | Path | None, mpi_args: Sequence[str]) -> list[str]:
    """What `cocoviz run --mpi --hostfile FILE --mpi-args ARGS` adds to the mpiexec
    command, before `-n`: `-hostfile FILE` (MPICH's and Open MPI's spelling alike) with the
    file checked up front, then ARGS. Raises UsageError when the hostfile cannot be read
    or lists no host."""
    out: list[str] = []
    if hostfile is not None:
        path = Path(hostfile)
        try:
            hosts = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(
                f"--hostfile {hostfile}: expected a readable text file listing hosts, got "
                f"{getattr(err, 'strerror', None) or err}"
            ) from None
        if not any(hosts):
            raise UsageError(
                f"--hostfile {hostfile}: expected a host on a line (`node1:4`), got none"
            )
        out += ["-hostfile", str(path.resolve())]
    return out + list(mpi_args)


def run_mpi(
    program: Program,
    collect: list[str],
    *,
    seed: int = 0,
    inputs_dir: str | Path | None = None,
    timeout_s: float = 600.0,
    iters: int = 1,
    env: Mapping[str, str] | None = None,
    oversubscribe: bool = False,
    hostfile: str | Path | None = None,
    mpi_args: Sequence[str] = (),
) -> MpiRun:
    """Run `program` (already scheduled) on grid.world real processes; return the
    measured events and the global values of `collect` (outputs, updated inputs).

    With `iters` > 1 the program runs once to warm up, then `iters` times from the same
    inputs; the makespan and the events are those of one iteration, the one whose
    makespan is the median (`measured_iteration`). `hostfile` places the ranks on the
    hosts it lists (mpiexec's `-hostfile`; every host must see this job's directory and
    Python); `mpi_args` go to mpiexec as they are, before `-n`. Raises `Terminated` on
    SIGTERM/SIGHUP (KeyboardInterrupt on SIGINT) after cleaning up."""
    check_world(program, oversubscribe)
    check_dp_groups(program)
    launcher = launcher_args(hostfile, mpi_args)
    if not timeout_s > 0:  # NaN too: a deadline that never passes
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout_s}")
    require_mpi4py()
    mpiexec = find_mpiexec()
    files: dict[str, str] = {}
    if inputs_dir is not None:  # validate before launch
        d = Path(inputs_dir).resolve()
        files = {name: str(d / f"{name}.npy") for name in load_inputs_dir(program, d)}
    world = program.grid.world
    deadline = time.monotonic() + timeout_s
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    with _stop_signals_raise(), MpiJob(full_env, deadline) as job:
        spec: dict[str, Any] = {
            "dir": str(job.dir),
            "owner": job.owner,
            "program": format_program(program, schedules=False),
            "path": f"<{program.name}>",
            "seed": seed,
            "input_files": files,
            "collect": collect,
            "iters": iters,
        }
        job.spec_path.write_text(json.dumps(spec))
        cmd = [
            mpiexec,
            *launcher,
            "-n",
            str(world),
            sys.executable,
            "-m",
            "cocoviz.exec.mpi_guard",
            str(job.spec_path),
        ]
        t0 = time.perf_counter()
        job.launch(cmd)
        assert job.proc is not None
        dead = job.wait(deadline)
        if dead is not None or job.proc.returncode is None:
            job.kill()
            _raise_if_internal(job.dir, world)
            if dead is None:
                raise BuildError(
                    f"the MPI run did not finish within {timeout_s:g} s and was stopped",
                    hint=_status_summary(job.dir, world)
                    or "a rank may be waiting for a peer that never arrives",
                )
            raise BuildError(
                f"the MPI run failed: {_failed_ranks(job.dir, world, '')}; the other ranks "
                "were stopped",
                hint=KILLED_HINT,
            )
        wall = time.perf_counter() - t0
        if job.proc.returncode != 0:
            _raise_if_internal(job.dir, world)
            err = job.output("err")
            why = _failed_ranks(job.dir, world, job.output("out") + err)
            raise BuildError(
                f"the MPI run failed: {why}",
                hint=KILLED_HINT
                if "killed" in why
                else _tail(err) or f"mpiexec exited with {job.proc.returncode}",
            )
        return _results(program, collect, job, world, wall)


def measured_iteration(results: list[dict[str, Any]]) -> tuple[float, list[RankEvent], int]:
    """The makespan, events and index of the one timed iteration the ranks report (each
    rank's ``result.<rank>.json``, in rank order): the iteration whose makespan is the
    median, chosen alike on every rank, so that every figure of the summary (makespan,
    communication, exposed, overlap, the per-stage table) comes from the same iteration.
    Its makespan is the slowest rank's."""
    its = {int(res.get("iteration", 0)) for res in results}
    if len(its) > 1:
        raise BuildError(f"the ranks reported different iterations ({sorted(its)})")
    events: list[RankEvent] = []
    makespan = 0.0
    for r, res in enumerate(results):
        makespan = max(makespan, float(res["makespan"]))
        for ev in res["events"]:
            events.append(
                RankEvent(
                    r,
                    ev["stage"],
                    ev["stream"],
                    ev["kind"],
                    ev["start"],
                    ev["end"],
                    ev["nbytes"],
                    ev["chunk"],
                )
            )
    return makespan, events, its.pop() if its else 0


def _results(program: Program, collect: list[str], job: MpiJob, world: int, wall: float) -> MpiRun:
    results = []
    for r in range(world):
        path = job.dir / f"result.{r}.json"
        if not path.exists():
            raise BuildError(
                f"rank {r} ended without writing its result", hint=_tail(job.output("err"))
            )
        results.append(json.loads(path.read_text()))
    makespan, events, iteration = measured_iteration(results)
    outputs = {}
    for name in collect:
        ty = program.type_of(name)
        outputs[name] = nx.load_npy(job.dir / "out" / f"{name}.npy", ty.dtype.value)
    return MpiRun(world, wall, makespan, events, outputs, iteration)


def _statuses(job: Path, world: int) -> dict[int, str]:
    out = {}
    for r in range(world):
        p = job / f"status.{r}"
        out[r] = p.read_text() if p.exists() else "not started"
    return out


def _status_summary(job: Path, world: int) -> str:
    st = _statuses(job, world)
    waiting = [r for r, s in st.items() if s != "done"]
    return f"ranks not finished: {_rank_list(waiting)}" if waiting else ""


def _rank_list(ranks: list[int], shown: int = 8) -> str:
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return ", ".join(map(str, ranks[:shown])) + more


def _first(items: list[str], shown: int = 4) -> str:
    more = f" (and {len(items) - shown} more ranks)" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more


def _raise_if_internal(job: Path, world: int) -> None:
    """Raise `InternalError` when a rank reported a failure of the executor itself: the
    first such rank and its exception (the run's processes end as the error leaves
    `run_mpi`'s job)."""
    failed = [
        (r, s[len(INTERNAL_STATUS) :])
        for r, s in _statuses(job, world).items()
        if s.startswith(INTERNAL_STATUS)
    ]
    if failed:
        r, why = failed[0]
        n = len(failed) - 1
        more = f" (and on {n} more rank{'s' if n > 1 else ''})" if n else ""
        raise InternalError(f"the MPI executor failed on rank {r}: {why}{more}")


def _failed_ranks(job: Path, world: int, stderr: str) -> str:
    st = _statuses(job, world)
    errors = [f"rank {r}: {s[len('error: ') :]}" for r, s in st.items() if s.startswith("error: ")]
    if errors:
        return _first(errors)
    killed = [
        f"rank {r} was killed ({s.removeprefix('killed: ')})"
        for r, s in st.items()
        if s.startswith("killed")
    ]
    if killed:
        return _first(killed)
    if all(s == "not started" for s in st.values()):
        return "no rank started"
    unfinished = [r for r, s in st.items() if s != "done"]
    if unfinished:
        return f"rank{'s' if len(unfinished) > 1 else ''} {_rank_list(unfinished)} did not finish"
    return "see the MPI output below"


def _tail(text: str, lines: int = 8) -> str | None:
    kept = [
        ln for ln in text.strip().splitlines() if ln.strip() and not set(ln.strip()) <= {"=", "-"}
    ]
    return "\n".join(kept[-lines:]) if kept else None
