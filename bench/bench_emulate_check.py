"""Fast feedback of the emulated check (issue 33, item 5): wall times of emitting, building
and checking an emitted CUDA tree under the emulation, with the runtime library built
first and then taken from its cache; the deadlock detector's latency on a seeded send/recv
peer mismatch; and what the emulation's initcheck and racecheck cost a run.

Usage: python bench/bench_emulate_check.py [--sample sgd] [--schedule ar_c] [--ranks 2]
           [-D N=1024] [--runs 5] [--overhead-sample lamb] [--overhead-n 65536]
           [--watchdog] [--json FILE]

1. first: a fresh runtime cache (COCOVIZ_EMU_CACHE in a temporary folder): `cocoviz emit`,
   `make -j2 emulate` (the runtime library and the tree), `./run.sh --emulate --check`.
   cached: the same for a second tree of the same sample in a new folder, the runtime
   copied from the cache; and the check alone again. Each phase is timed on its own.
2. deadlock latency: pipeline_stage (schedule ar_p2p_c, tp=2,pp=2, B=2 S=8 H=16) with each stage-0
   rank's ncclSend sent to the other stage-1 rank (`world_rank + T` -> `(world_rank ^ 1) +
   T`): no receive matches, every rank ends up blocked. The figure is the time from
   starting run.sh to the "deadlock:" line on stderr (COCOVIZ_EMU_TIMEOUT stays 60 s);
   with --watchdog also the same run with the detector off (COCOVIZ_EMU_DEADLOCK_S=0),
   i.e. the watchdog's time.
3. overhead: `run.sh --emulate --check` of a larger tree (lamb, N=65536, 2 ranks: norms
   reduced in shared memory, element-wise kernels) with racecheck and initcheck on (the
   default), racecheck off, and both off; the median of --runs runs each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


CPU = {"s": 0.0}  # CPU seconds (user + system) of every command run so far


def sh(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> float:
    """Runs cmd; returns its wall time (and adds its CPU time to CPU); fails loudly."""
    start, t0 = time.monotonic(), os.times()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took, t1 = time.monotonic() - start, os.times()
    CPU["s"] += (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
    if res.returncode != 0:
        sys.exit(
            f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout[-4000:]}{res.stderr[-4000:]}"
        )
    return took


def emit(
    sample: str, schedule: str, ranks: str, dims: list[str], out: Path, env: dict[str, str]
) -> float:
    cmd = [
        sys.executable,
        "-m",
        "cocoviz",
        "emit",
        sample,
        "--schedule",
        schedule,
        "--ranks",
        ranks,
        "-o",
        str(out),
    ]
    for d in dims:
        cmd += ["-D", d]
    return sh(cmd, env=env)


def check(tree: Path, env: dict[str, str]) -> float:
    return sh(
        ["./run.sh", "--emulate", "--check", "--iters", "1", "--warmup", "0"], cwd=tree, env=env
    )


def tree_round(
    sample: str, schedule: str, ranks: str, dims: list[str], out: Path, env: dict[str, str]
) -> dict[str, float]:
    cpu0 = CPU["s"]
    t_emit = emit(sample, schedule, ranks, dims, out, env)
    t_build = sh(["make", "-j2", "emulate"], cwd=out, env=env)
    t_check = check(out, env)
    return {
        "emit_s": t_emit,
        "build_s": t_build,
        "check_s": t_check,
        "total_s": t_emit + t_build + t_check,
        "cpu_s": CPU["s"] - cpu0,
    }


def deadlock_latency(work: Path, env: dict[str, str], detector: bool) -> dict[str, object]:
    tree = work / ("deadlock" if detector else "deadlock-watchdog")
    emit("pipeline_stage", "ar_p2p_c", "tp=2,pp=2", ["B=2", "S=8", "H=16"], tree, env)
    prog = tree / "pipeline_stage.cu"
    text = prog.read_text()
    pattern = r"(ncclSend\([^;]*?)ctx\.world_rank \+ ctx\.T,"
    mutated, n = re.subn(pattern, r"\1(ctx.world_rank ^ 1) + ctx.T,", text)
    if n == 0:
        sys.exit(
            "the seeded peer mismatch found no ncclSend to world_rank + T in pipeline_stage.cu"
        )
    prog.write_text(mutated)
    sh(["make", "-j2", "emulate"], cwd=tree, env=env)
    e = dict(env, COCOVIZ_EMU_TIMEOUT="60")
    if not detector:
        e["COCOVIZ_EMU_DEADLOCK_S"] = "0"
    start = time.monotonic()
    p = subprocess.Popen(
        ["./run.sh", "--emulate", "--check", "--iters", "1", "--warmup", "0"],
        cwd=tree,
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stderr is not None
    seen_at = None
    report = []
    rule = "deadlock:" if detector else "watchdog:"
    for line in p.stderr:
        report.append(line)
        if seen_at is None and rule in line:
            seen_at = time.monotonic() - start
    p.wait()
    total = time.monotonic() - start
    if seen_at is None:
        sys.exit(f"no {rule} report ({p.returncode}):\n{''.join(report)[-4000:]}")
    text = "".join(report)
    cycle_part = text[text.find("wait-for cycle:") : text.find("every rank:")]
    cycle = [ln.strip() for ln in cycle_part.splitlines()[1:]]
    return {"report_s": seen_at, "exit_s": total, "sends_patched": n, "cycle": cycle[:6]}


def overhead(work: Path, env: dict[str, str], sample: str, n: int, runs: int) -> dict[str, float]:
    tree = work / "overhead"
    emit(sample, "ar_c", "2", [f"N={n}"], tree, env)
    sh(["make", "-j2", "emulate"], cwd=tree, env=env)
    variants = {
        "checks_on_s": {},
        "racecheck_off_s": {"COCOVIZ_EMU_RACECHECK": "0"},
        "both_off_s": {"COCOVIZ_EMU_RACECHECK": "0", "COCOVIZ_EMU_INITCHECK": "0"},
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(runs):  # interleaved, so every variant sees the same load
        for k, extra in variants.items():
            c0 = CPU["s"]
            times[k].append(check(tree, dict(env, **extra)))
            cpu[k].append(CPU["s"] - c0)
    out = {k: statistics.median(v) for k, v in times.items()}
    out.update({k.replace("_s", "_cpu_s"): statistics.median(v) for k, v in cpu.items()})
    out["racecheck_cpu_overhead"] = out["checks_on_cpu_s"] / out["racecheck_off_cpu_s"] - 1
    out["racecheck_overhead"] = out["checks_on_s"] / out["racecheck_off_s"] - 1
    out["both_overhead"] = out["checks_on_s"] / out["both_off_s"] - 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", default="sgd")
    ap.add_argument("--schedule", default="ar_c")
    ap.add_argument("--ranks", default="2")
    ap.add_argument("-D", dest="dims", action="append", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--overhead-sample", default="lamb")
    ap.add_argument("--overhead-n", type=int, default=65536)
    ap.add_argument("--watchdog", action="store_true", help="also time the watchdog (60 s)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    dims = a.dims if a.dims is not None else ["N=1024"]
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="cocoviz-bench-emu-") as t:
        work = Path(t)
        env = dict(os.environ, COCOVIZ_EMU_CACHE=str(work / "cache"))
        env.pop("COCOVIZ_EMU_RACECHECK", None)
        env.pop("COCOVIZ_EMU_INITCHECK", None)
        env.pop("COCOVIZ_EMU_DEADLOCK_S", None)
        first = tree_round(a.sample, a.schedule, a.ranks, dims, work / "first", env)
        cached = tree_round(a.sample, a.schedule, a.ranks, dims, work / "cached", env)
        again = check(work / "cached", env)
        figures["sample"] = f"{a.sample} {a.schedule} ranks={a.ranks} {' '.join(dims)}"
        figures["load_average"] = os.getloadavg()
        figures["first"] = first
        figures["cached"] = cached
        figures["check_again_s"] = again
        print(
            f"emulated check of {figures['sample']} (emit + make -j2 emulate + run.sh --emulate --check):"
        )
        for name, r in (("first (runtime built)", first), ("cached (runtime copied)", cached)):
            print(
                f"  {name:24s} {r['total_s']:6.1f} s  (emit {r['emit_s']:.1f}, build {r['build_s']:.1f}, "
                f"check {r['check_s']:.1f}; {r['cpu_s']:.1f} CPU-s)"
            )
        print(f"  {'the check alone again':24s} {again:6.1f} s")
        print(f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        dl = deadlock_latency(work, env, True)
        figures["deadlock"] = dl
        print(
            f"deadlock detection (pipeline_stage ar_p2p_c tp=2,pp=2, ncclSend to the wrong peer): "
            f"report after {dl['report_s']:.1f} s, exit after {dl['exit_s']:.1f} s (watchdog: 60 s)"
        )
        for c in dl["cycle"]:  # type: ignore[union-attr]
            print(f"    {c[:150]}")
        if a.watchdog:
            wd = deadlock_latency(work, env, False)
            figures["watchdog"] = wd
            print(
                f"  the same with COCOVIZ_EMU_DEADLOCK_S=0: watchdog report after {wd['report_s']:.1f} s"
            )
        ov = overhead(work, env, a.overhead_sample, a.overhead_n, a.runs)
        figures["overhead"] = ov
        print(
            f"check checks' cost ({a.overhead_sample} ar_c N={a.overhead_n}, 2 ranks, median of {a.runs}): "
            f"on {ov['checks_on_s']:.2f} s, racecheck off {ov['racecheck_off_s']:.2f} s, both off "
            f"{ov['both_off_s']:.2f} s: racecheck +{100 * ov['racecheck_overhead']:.0f}%, "
            f"racecheck + initcheck +{100 * ov['both_overhead']:.0f}%; in CPU seconds "
            f"{ov['checks_on_cpu_s']:.2f} / {ov['racecheck_off_cpu_s']:.2f} / {ov['both_off_cpu_s']:.2f}: "
            f"racecheck +{100 * ov['racecheck_cpu_overhead']:.0f}%"
        )
        shutil.rmtree(work / "cache", ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
