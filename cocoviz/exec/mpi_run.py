"""`cocoviz run --mpi`: launch one real process per rank with mpiexec and mpi4py.

The scheduled program travels to the workers as printed `.coco` text (the printer
round-trips, groups included). The launcher validates everything it can before launch
(tools present, inputs' dtypes and shapes), then runs ``mpiexec -n N python -m
cocoviz.exec.mpi_worker`` with a deadline. A rank that raises reports itself and calls
MPI_Abort; a rank that dies is noticed by mpiexec, which ends the others; the launcher
reads the per-rank status files to name the ranks that failed. It never waits past its
deadline: on timeout the whole process group is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cocoviz.errors import BuildError, InputError, did_you_mean
from cocoviz.exec import numerics as nx
from cocoviz.exec.layout import global_shape
from cocoviz.ir.nodes import Program
from cocoviz.ir.printer import format_program
from cocoviz.ir.types import format_shape

KILLED_HINT = "a rank killed by SIGKILL is often the out-of-memory killer: try smaller -D sizes"
INSTALL_HINT = "install the MPI extra: pip install 'cocoviz[mpi]' (mpi4py and the mpich wheel)"


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
    """Inputs from `NAME.npy` files (global shapes), validated against the declarations.

    Inputs without a file come from the generator. Unknown `.npy` names are an error
    (a misspelled file would otherwise be silently ignored)."""
    d = Path(inputs_dir)
    if not d.is_dir():
        raise InputError(f"--inputs {d}: no such directory")
    G = program.grid.group
    known = {i.name: i for i in program.inputs}
    out: dict[str, np.ndarray] = {}
    for f in sorted(d.glob("*.npy")):
        name = f.stem
        if name not in known:
            raise InputError(
                f"{f}: '{program.name}' has no input named '{name}'",
                hint=did_you_mean(name, known) or f"its inputs are {', '.join(known)}",
            )
        ty = known[name].ty
        try:
            a = np.load(f, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise InputError(f"{f}: not a readable .npy file ({err})") from None
        want = nx.storage_dtype(ty.dtype.value)
        decl = f"{ty.dtype.value}{format_shape(ty.shape)} {ty.layout}"
        if a.dtype != want:
            raise InputError(
                f"{f}: input '{name}' is declared {decl} (numpy {want}), but the file holds {a.dtype}",
                hint=f"save it as np.{want}"
                + (" (bf16 is stored as float32)" if ty.dtype.value == "bf16" else ""),
            )
        shape = global_shape(ty, G)
        if tuple(a.shape) != shape:
            what = (
                " ([G, *shape]: one row per rank for a local input)" if ty.layout.is_local else ""
            )
            raise InputError(
                f"{f}: input '{name}' is declared {decl}: expected shape {list(shape)}{what}, "
                f"got {list(a.shape)}"
            )
        out[name] = a
    return out


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
    events: list[RankEvent]
    outputs: dict[str, np.ndarray]

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
        T = program.grid.tp
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
                    if i is not None and out[i].stream != ev.stream and out[i].end <= ev.start + 1e-9:
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
            tp=T,
            pp=program.grid.pp,
            lanes=tuple(lanes),
            cross=tuple(cross),
            summary=summarize(lanes),
        )


def run_mpi(
    program: Program,
    collect: list[str],
    *,
    seed: int = 0,
    inputs_dir: str | Path | None = None,
    timeout_s: float = 600.0,
    iters: int = 1,
    env: Mapping[str, str] | None = None,
) -> MpiRun:
    """Run `program` (already scheduled) on grid.world real processes; return the
    measured events and the global values of `collect` (outputs, updated inputs).

    With `iters` > 1 the program runs once to warm up, then `iters` times from the same
    inputs; the makespan is the median and the events are the last iteration's."""
    require_mpi4py()
    mpiexec = find_mpiexec()
    if inputs_dir is not None:
        load_inputs_dir(program, inputs_dir)  # validate before launch
    world = program.grid.world
    with tempfile.TemporaryDirectory(prefix="cocoviz-mpi-") as tmp:
        job = Path(tmp)
        (job / "out").mkdir()
        spec: dict[str, Any] = {
            "dir": str(job),
            "program": format_program(program, schedules=False),
            "path": f"<{program.name}>",
            "seed": seed,
            "inputs_dir": str(Path(inputs_dir).resolve()) if inputs_dir else None,
            "collect": collect,
            "iters": iters,
        }
        (job / "spec.json").write_text(json.dumps(spec))
        cmd = [
            mpiexec,
            "-n",
            str(world),
            sys.executable,
            "-m",
            "cocoviz.exec.mpi_guard",
            str(job / "spec.json"),
        ]
        full_env = dict(os.environ)
        full_env.setdefault("OMP_NUM_THREADS", "1")
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            start_new_session=True,
        )
        dead = _watch(proc, job, world, t0 + timeout_s)
        if dead is not None or proc.returncode is None:
            _kill_group(proc)
            out, err = proc.communicate()
            if dead is None:
                raise BuildError(
                    f"the MPI run did not finish within {timeout_s:.0f} s and was stopped",
                    hint=_status_summary(job, world)
                    or "a rank may be waiting for a peer that never arrives",
                )
            raise BuildError(
                f"the MPI run failed: {_failed_ranks(job, world, '')}; the other ranks were stopped",
                hint=KILLED_HINT,
            )
        out, err = proc.communicate()
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            why = _failed_ranks(job, world, out + err)
            raise BuildError(
                f"the MPI run failed: {why}",
                hint=KILLED_HINT
                if "killed" in why
                else _tail(err) or f"mpiexec exited with {proc.returncode}",
            )
        events: list[RankEvent] = []
        makespan = 0.0
        for r in range(world):
            path = job / f"result.{r}.json"
            if not path.exists():
                raise BuildError(f"rank {r} ended without writing its result", hint=_tail(err))
            res = json.loads(path.read_text())
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
        outputs = {}
        for name in collect:
            ty = program.type_of(name)
            outputs[name] = nx.load_npy(job / "out" / f"{name}.npy", ty.dtype.value)
        return MpiRun(world, wall, makespan, events, outputs)


def _watch(proc: subprocess.Popen[str], job: Path, world: int, deadline: float) -> int | None:
    """Wait for mpiexec; return a rank that was killed (its guard says so), or None when
    the run ended by itself or the deadline passed."""
    while True:
        try:
            proc.wait(timeout=0.1)
            return None
        except subprocess.TimeoutExpired:
            pass
        for r, s in _statuses(job, world).items():
            if s.startswith("killed"):
                return r
        if time.perf_counter() > deadline:
            return None


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _statuses(job: Path, world: int) -> dict[int, str]:
    out = {}
    for r in range(world):
        p = job / f"status.{r}"
        out[r] = p.read_text() if p.exists() else "not started"
    return out


def _status_summary(job: Path, world: int) -> str:
    st = _statuses(job, world)
    waiting = [r for r, s in st.items() if s != "done"]
    return f"ranks not finished: {', '.join(map(str, waiting))}" if waiting else ""


def _failed_ranks(job: Path, world: int, stderr: str) -> str:
    st = _statuses(job, world)
    errors = [f"rank {r}: {s[len('error: ') :]}" for r, s in st.items() if s.startswith("error: ")]
    if errors:
        return "; ".join(errors)
    killed = [
        f"rank {r} was killed ({s.removeprefix('killed: ')})"
        for r, s in st.items()
        if s.startswith("killed")
    ]
    if killed:
        return "; ".join(killed)
    unfinished = [r for r, s in st.items() if s != "done"]
    if unfinished:
        return f"rank{'s' if len(unfinished) > 1 else ''} {', '.join(map(str, unfinished))} did not finish"
    return "see the MPI output below"


def _tail(text: str, lines: int = 8) -> str | None:
    kept = [
        ln for ln in text.strip().splitlines() if ln.strip() and not set(ln.strip()) <= {"=", "-"}
    ]
    return "\n".join(kept[-lines:]) if kept else None
