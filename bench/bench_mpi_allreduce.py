"""Allreduce of a 64 MiB f32 tensor: `cocoviz run --mpi` against a plain mpi4py script,
same ranks, same machine, side by side in one run (issue 7's figure).

Usage: python bench/bench_mpi_allreduce.py [--ranks 4] [--iters 20]
Prints both medians and the ratio plain / cocoviz (goal: ≥ 0.9).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cocoviz.exec.mpi_run import find_mpiexec, run_mpi
from cocoviz.ir.lower import load_program

PROGRAM = """program allreduce64
ranks {ranks}
dim N = {n}
input g : f32[N] local
s = allreduce(+, g)
output s
"""

PLAIN = """
import json, sys, time
import numpy as np
from mpi4py import MPI
n, iters = int(sys.argv[1]), int(sys.argv[2])
comm = MPI.COMM_WORLD
x = np.full(n, comm.rank + 1.0, dtype=np.float32)
y = np.empty_like(x)
times = []
for it in range(iters + 1):
    comm.Barrier()
    t0 = time.perf_counter()
    comm.Allreduce(x, y, op=MPI.SUM)
    comm.Barrier()
    if it:
        times.append(time.perf_counter() - t0)
if comm.rank == 0:
    print(json.dumps(times))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="alternate the two runs this many times")
    args = ap.parse_args()
    n = 64 * 1024 * 1024 // 4
    prog = load_program(PROGRAM.format(ranks=args.ranks, n=n))
    plains, ours_all = [], []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "plain.py"
        script.write_text(PLAIN)
        for _ in range(args.rounds):  # alternate, so both see the same machine load
            out = subprocess.run(
                [
                    find_mpiexec(),
                    "-n",
                    str(args.ranks),
                    sys.executable,
                    str(script),
                    str(n),
                    str(args.iters),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            plains.append(statistics.median(json.loads(out.stdout.strip().splitlines()[-1])))
            run = run_mpi(prog, ["s"], iters=args.iters)
            ours_all.append(run.makespan_s)
    plain, ours = statistics.median(plains), statistics.median(ours_all)
    print(
        f"allreduce of 64 MiB f32 on {args.ranks} ranks, median of {args.rounds} alternating rounds of {args.iters} iterations"
    )
    print(f"  plain mpi4py Allreduce : {plain * 1e3:8.2f} ms")
    print(f"  cocoviz run --mpi      : {ours * 1e3:8.2f} ms")
    print(f"  ratio plain / cocoviz  : {plain / ours:8.3f}  (goal ≥ 0.9)")


if __name__ == "__main__":
    main()
