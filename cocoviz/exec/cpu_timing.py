"""Timing a built CPU-target program (``emit --target cpu --build``) on this machine.

``time_step(directory, budget_s=0.3, repeat=3) -> StepTimes`` runs the program's
``run.sh`` (MPI ranks of one core each) and reads the step time it prints
(``"time_ms"``: the slowest rank's mean over ``--iters`` iterations after ``--warmup``).
A first short run sizes ``--iters`` so that one run takes about ``budget_s``; the
measurement is then repeated ``repeat`` times. ``best_s``, the fastest run, is the step
time of the program on the machine as it is when nothing else competes for its cores (on
a machine shared with other work, the other runs are that work's share); ``median_s`` is
the typical time under the load there was.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import BuildError

__all__ = ["StepTimes", "run_once", "time_step"]


@dataclass(frozen=True)
class StepTimes:
    """The step times of repeated runs, seconds."""

    runs: tuple[float, ...]
    iters: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs)

    @property
    def best_s(self) -> float:
        return min(self.runs)


def run_once(directory: Path, iters: int, warmup: int, timeout_s: float = 600.0) -> float:
    """One run of ``run.sh``: the step time in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(directory / "run.sh"), "--iters", str(iters), "--warmup", str(warmup)]
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise BuildError(f"{directory}: the program ran longer than {timeout_s:g} s") from None
    except OSError as err:
        raise BuildError(f"{directory}: cannot run run.sh: {err.strerror}") from None
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        raise BuildError(
            f"{directory}: run.sh exited with {res.returncode}",
            hint="\n".join(tail) or None,
        )
    for line in reversed(res.stdout.strip().splitlines()):
        if line.startswith("{") and "time_ms" in line:
            return float(json.loads(line)["time_ms"]) * 1e-3
    raise BuildError(f"{directory}: run.sh printed no step time")


def time_step(directory: Path, *, budget_s: float = 0.3, repeat: int = 5) -> StepTimes:
    """The step time of a built program, repeated (module docstring)."""
    first = run_once(directory, iters=1, warmup=1)
    iters = max(1, min(2000, round(budget_s / max(first, 1e-7))))
    warmup = max(1, iters // 10)
    runs = tuple(run_once(directory, iters, warmup) for _ in range(max(1, repeat)))
    return StepTimes(runs, iters)
