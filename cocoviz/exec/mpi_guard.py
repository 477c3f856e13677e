"""A small parent for each MPI rank of `cocoviz run --mpi`.

mpiexec starts this guard once per rank; the guard starts the real worker
(`cocoviz.exec.mpi_worker`) as its child, passing the process manager's environment and
file descriptors on, and waits for it. When the worker dies by a signal — even SIGKILL,
which no handler can catch — the guard knows which rank it was and records it in the
job directory before exiting, so the launcher can name the rank. (mpiexec's own
message names only a process id, often not the one that failed.) The worker is tied to
the guard's life with PR_SET_PDEATHSIG on Linux, so cleanup never leaves it orphaned.

Kept free of heavy imports: it starts once per rank.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")


def _rank() -> int:
    for var in _RANK_VARS:
        if var in os.environ:
            return int(os.environ[var])
    return -1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main(argv: list[str]) -> int:
    spec_path = argv[0]
    job = Path(json.loads(Path(spec_path).read_text())["dir"])
    rank = _rank()
    child = subprocess.Popen(
        [sys.executable, "-m", "cocoviz.exec.mpi_worker", spec_path],
        close_fds=False,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: child.send_signal(s))
    rc = child.wait()
    if rc < 0 and rank >= 0:
        name = signal.Signals(-rc).name
        (job / f"status.{rank}").write_text(f"killed: signal {name}")
        print(f"cocoviz: rank {rank} was killed by {name}", file=sys.stderr, flush=True)
        return 128 - rc
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
