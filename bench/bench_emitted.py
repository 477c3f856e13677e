"""The emitted CPU program against `cocoviz run --mpi`, a hand-written mpi4py + numpy step
(bench/numpy_steps.py, checked equal to the cocoviz reference first) and the
memory-traffic bound (the plan's bytes over a measured copy bandwidth), for adam, lamb
and sgd (schedules fused and ar_c) at N = 2^24 on 2 ranks.

Usage: python bench/bench_emitted.py [--n 16777216] [--ranks 2] [--iters 20] [--rounds 3]
           [--programs adam,lamb,sgd] [--schedules fused,ar_c] [--baseline DIR]
           [--mpi-baseline SRC] [--no-emitted] [--no-run-mpi]

Each round runs every contender once, interleaved, so they see the same machine load;
each figure is the median over the rounds of one run's per-iteration time (the emitted
program's ``time_ms``, `run --mpi`'s makespan, the numpy script's median). With
``--baseline DIR`` the programs prebuilt in ``DIR/<program>_<schedule>`` (e.g. by an
older cocoviz) are timed in the same rounds; with ``--mpi-baseline SRC`` so is `cocoviz
run --mpi` of the cocoviz package in the source tree SRC (e.g. ``git archive`` of an older
commit), as "run --mpi (SRC)". Ratios are to the emitted program (to the numpy step with
``--no-emitted``); "run --mpi / numpy" is the ratio of issue 18's item 5 (goal ≤ 1.3),
"numpy / emitted" and "bound / emitted" those of item 2 (goals ≥ 1.5 on every case, ≥ 35%
for the fused schedules). The copy bandwidth is measured in every round too, and the
bound uses its median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from numpy_steps import HAS_V, PARAMS, SCRIPT, update  # noqa: E402

from cocoviz import samples  # noqa: E402
from cocoviz.emit import plan as pl  # noqa: E402
from cocoviz.emit.lower import lower_emit  # noqa: E402
from cocoviz.exec.mpi_run import find_mpiexec  # noqa: E402
from cocoviz.exec.reference import run_reference  # noqa: E402
from cocoviz.ir.lower import RanksOverride, load_file  # noqa: E402
from cocoviz.schedule.steps import apply_block, find_block  # noqa: E402

COPY = """
import json, sys, time
import numpy as np
from mpi4py import MPI
n = int(sys.argv[1])
a = np.ones(n, np.float32); b = np.empty_like(a)
best = float("inf")
for _ in range(7):
    MPI.COMM_WORLD.Barrier(); t0 = time.perf_counter(); np.copyto(b, a)
    best = min(best, time.perf_counter() - t0)
if MPI.COMM_WORLD.rank == 0:
    print(json.dumps(2 * a.nbytes / best))
"""


def _program(name: str, schedule: str | None, n: int, ranks: int) -> Any:
    p0 = load_file(samples.path(name), {"N": n}, RanksOverride.parse(str(ranks)))
    return apply_block(p0, find_block(p0, schedule)) if schedule else p0


def check_numpy_step(name: str, ranks: int, n: int = 4096) -> float:
    """Max relative difference of the hand-written step from the cocoviz reference."""
    prog = _program(name, None, n, ranks)
    res = run_reference(prog)
    g = res.initial_value("g").astype(np.float32).sum(axis=0, dtype=np.float32)
    v = res.initial_value("v") if HAS_V[name] else None
    w1, _, _ = update(name, g, res.initial_value("w"), res.initial_value("m"), v, PARAMS[name])
    ref = res.global_value("w1").astype(np.float64)
    err = float(np.max(np.abs(w1 - ref) / np.maximum(np.abs(ref), 1e-30)))
    if err > 1e-5:
        raise SystemExit(f"the numpy step of {name} differs from the reference (rel {err:.2e})")
    return err


def plan_bytes(name: str, schedule: str, n: int, ranks: int) -> int:
    """Bytes one rank moves through memory in one run of the scheduled plan: every
    distinct load and store of every kernel, and each collective's send + receive."""
    prog = _program(name, schedule, n, ranks)
    plan = lower_emit(prog, None).scheduled
    size = {b.cname: b.dtype.itemsize for b in plan.buffers}
    total = 0

    def walk(steps: tuple[pl.Step, ...]) -> None:
        nonlocal total
        for st in steps:
            if isinstance(st, pl.Kernel):
                acc = {(s.kind, s.buffer, s.a) for s in st.body if s.kind in ("load", "store")}
                total += sum(size[b] for _, b, _ in acc) * st.space.launch_count
            elif isinstance(st, pl.Collective):
                per = st.count * st.dtype.itemsize
                g = ranks
                total += {"allreduce": 2 * per, "reducescatter": per * (g + 1)}.get(
                    st.op, per * (g + 1) if st.op == "allgather" else 2 * per
                )
            elif isinstance(st, pl.ChunkLoop):
                for it in st.items:
                    walk(it.steps * st.chunks)

    walk(plan.steps)
    return total


def _mpi(ranks: int, argv: list[str]) -> str:
    out = subprocess.run(
        [find_mpiexec(), "-n", str(ranks), *argv], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def _emitted_ms(d: Path, iters: int) -> float:
    out = subprocess.run(
        [str(d / "run.sh"), "--iters", str(iters)], capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["time_ms"])


def _run_mpi_ms(argv: list[str], src: Path | None = None) -> float:
    """`cocoviz run --mpi`'s makespan in ms; with `src`, of the cocoviz in that tree (run
    from it: ``python -m`` puts the working directory first on the path, and the ranks
    start there too)."""
    env = None
    if src is not None:
        old = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": str(src) + (os.pathsep + old if old else "")}
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env, cwd=src)
    return float(json.loads(out.stdout)["makespan_s"]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--programs", default="adam,lamb,sgd")
    ap.add_argument("--schedules", default="fused,ar_c")
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--no-run-mpi", action="store_true", help="skip `cocoviz run --mpi`")
    ap.add_argument("--no-emitted", action="store_true", help="skip the emitted program")
    ap.add_argument(
        "--mpi-baseline",
        type=Path,
        default=None,
        metavar="SRC",
        help="also time `cocoviz run --mpi` of the cocoviz package in source tree SRC",
    )
    args = ap.parse_args()
    progs = args.programs.split(",")
    scheds = args.schedules.split(",")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "step.py").write_text(SCRIPT.format(bench=str(BENCH)))
        (t / "copy.py").write_text(COPY)
        copy_argv = [sys.executable, str(t / "copy.py"), str(args.n)]
        table: list[tuple[str, float, float]] = []
        for name in progs:
            print(f"{name}: numpy step vs reference, max rel diff {check_numpy_step(name, 2):.1e}")
        for name in progs:
            for sched in scheds:
                d = t / f"{name}_{sched}"
                if not args.no_emitted:
                    subprocess.run(
                        [sys.executable, "-m", "cocoviz", "emit", str(samples.path(name)),
                         "--schedule", sched, "--target", "cpu", "-o", str(d), "-D",
                         f"N={args.n}", "--ranks", str(args.ranks), "--build"],
                        check=True, capture_output=True,
                    )  # fmt: skip
                base = args.baseline / f"{name}_{sched}" if args.baseline else None
                res: dict[str, list[float]] = {}
                bws: list[float] = []
                run_argv = [sys.executable, "-m", "cocoviz", "run", str(samples.path(name)),
                            "--schedule", sched, "-D", f"N={args.n}", "--ranks",
                            str(args.ranks), "--mpi", "--iters", str(args.iters),
                            "--no-check", "--json"]  # fmt: skip
                for _ in range(args.rounds):
                    # the copy bandwidth in the same rounds: the bound sees the same load
                    bws.append(float(_mpi(args.ranks, copy_argv)))
                    if not args.no_emitted:
                        res.setdefault("emitted", []).append(_emitted_ms(d, args.iters))
                    if base is not None:
                        res.setdefault("baseline", []).append(_emitted_ms(base, args.iters))
                    if not args.no_run_mpi:
                        res.setdefault("run --mpi", []).append(_run_mpi_ms(run_argv))
                    if args.mpi_baseline is not None:
                        res.setdefault("run --mpi (SRC)", []).append(
                            _run_mpi_ms(run_argv, args.mpi_baseline)
                        )
                    times = json.loads(
                        _mpi(args.ranks, [sys.executable, str(t / "step.py"), name, sched,
                                          str(args.n), str(args.iters)])
                    )  # fmt: skip
                    res.setdefault("numpy", []).append(statistics.median(times) * 1e3)
                bw = statistics.median(bws)
                bound = plan_bytes(name, sched, args.n, args.ranks) / bw * 1e3
                ref = "numpy" if args.no_emitted else "emitted"
                em = statistics.median(res[ref])
                print(f"{name} {sched} (N={args.n}, {args.ranks} ranks, median of {args.rounds};"
                      f" copy bandwidth per rank, {args.ranks} copying at once:"
                      f" {bw / 1e9:.1f} GB/s):")  # fmt: skip
                for k, v in res.items():
                    m = statistics.median(v)
                    print(f"  {k:15s} {m:9.2f} ms   ratio to {ref} {m / em:6.2f}")
                print(f"  {'bound':15s} {bound:9.2f} ms   {ref} / bound {em / bound:6.2f}"
                      f"  ({bound / em:.0%} of the bound)")  # fmt: skip
                npy = statistics.median(res["numpy"])
                if not args.no_emitted:
                    speedup = npy / em
                    of_bound = bound / em
                    table.append((f"{name} {sched}", speedup, of_bound))
                    goal = "met" if speedup >= 1.5 else "NOT met"
                    print(f"  numpy / emitted {speedup:5.2f}  (goal >= 1.5: {goal})")
                    if sched == "fused":
                        goal = "met" if of_bound >= 0.35 else "NOT met"
                        print(f"  bound / emitted {of_bound:5.0%}  (goal >= 35%: {goal})")
                for k in ("run --mpi", "run --mpi (SRC)"):
                    if k in res:
                        r = statistics.median(res[k]) / npy
                        met = "met" if r <= 1.3 else "NOT met"
                        print(f"  {k} / numpy {r:5.2f}  (goal <= 1.3: {met})")
                sys.stdout.flush()
        if table:
            print("\nemitted program: speed-up over the numpy step, share of the memory bound")
            for case, speedup, of_bound in table:
                print(f"  {case:12s} {speedup:6.2f}x  {of_bound:5.0%}")


if __name__ == "__main__":
    main()
