"""`cocoviz tune` on the GPT stacks of `cocoviz samples --gpt L` (issue 34): wall time and
candidates evaluated per size, beside the tuner from before the region-by-region search,
run from a `git worktree` of that commit and bounded by a timeout. Goals: 96 layers in
under 5 s beyond start-up on 2 cores, time growing at most linearly in layers.

    python bench/bench_tune.py [--sizes 4,8,24,96,384] [--before REV] [--timeout S]
                               [--hw NAME] [--repeat N] [--check]

Each command runs as a user runs it (`python -m cocoviz ...`, a fresh process), the
fastest of --repeat runs (the earlier tuner once); wall time, and CPU time (user +
system), which other work on a shared machine disturbs less. Start-up is the CPU time of
`cocoviz check` of the same file (interpreter, imports, parsing the stack); "beyond" is
the tune's CPU time less that; "tune() alone" is the CPU time of the call in this
process (each class searched afresh). The earlier tuner's best steps are predicted again
with this tree's model (the two trees' models may differ), so the "loss" column compares
schedules, not models: how much slower the region-by-region best is (negative: faster).
The earlier tuner's ranking of every sample is compared too, on this tree's model.

``--check`` also runs the whole-program checks of the region rule (slow): every region's
candidates judged by simulating the whole stack (2, 4, 8 layers), and every combination
for a one-layer stack.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "503a1a3"
"""The last commit before the region-by-region tuner (the default of --before)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="4,8,24,96,384", help="layers of each stack")
    ap.add_argument("--before", default=BEFORE, help="the commit of the earlier tuner")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds the earlier tuner gets")
    ap.add_argument("--hw", default="h100-dgx")
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs of each command now (the fastest counts)"
    )
    ap.add_argument("--check", action="store_true", help="also the whole-program checks")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        work = Path(tmp)
        before = _worktree(args.before, work / "before")
        try:
            rows = [_size(n, work, before, args) for n in sizes]
            _print_sizes(rows, args)
            if before is not None:
                _samples(before, args.hw)
            if args.check:
                _checks(args.hw)
        finally:
            if before is not None:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
                    capture_output=True,
                )


def _worktree(rev: str, path: Path) -> Path | None:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        print(f"(no worktree of {rev}: {proc.stderr.strip()}; the earlier tuner is left out)")
        return None
    return path


def _run(
    argv: list[str], cwd: Path, timeout: float | None = None
) -> tuple[float, float, str | None]:
    """Wall and CPU time (user + system) of `python -m cocoviz ARGV` run from `cwd`, and
    its stdout (None when it ran past `timeout` or failed)."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "160"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "cocoviz", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, float("nan"), None
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"  {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        return wall, cpu, None
    return wall, cpu, proc.stdout


def _predicted(path: Path, steps: list[str], hw: str) -> float:
    """The time this tree's model predicts for `steps` on the program at `path`."""
    from cocoviz.ir.lower import load_file
    from cocoviz.schedule.steps import apply_steps
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.timeline import makespan

    profile = load_profile(hw)
    return makespan(apply_steps(load_file(path), steps, profile), profile)


def _in_process(path: Path, hw: str, repeat: int) -> float:
    """CPU time of `tune` alone, in this process, each class searched afresh (the least
    of `repeat`), with the collector as `cocoviz tune` runs it: the loaded program frozen
    out of its sight, its thresholds the CLI's."""
    import gc

    from cocoviz.cli import GC_THRESHOLD
    from cocoviz.ir.lower import load_file
    from cocoviz.schedule.structured import clear_cache
    from cocoviz.schedule.tune import tune
    from cocoviz.sim.hardware import load_profile

    program, profile = load_file(path), load_profile(hw)
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLD)
    best = float("inf")
    try:
        for _ in range(repeat):
            clear_cache()
            t0 = time.process_time()
            tune(program, profile)
            best = min(best, time.process_time() - t0)
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
    return best


def _size(layers: int, work: Path, before: Path | None, args: Any) -> dict[str, Any]:
    from cocoviz.samples.gpt import gpt_stack

    path = work / f"gpt{layers}.coco"
    path.write_text(gpt_stack(layers))
    hw = ["--hw", args.hw]
    start = min(_run(["check", str(path)], ROOT)[1] for _ in range(args.repeat))
    runs = [
        _run(["tune", str(path), *hw, "--json", "--top", "1"], ROOT) for _ in range(args.repeat)
    ]
    wall = min(r[0] for r in runs)
    cpu, out = min(((r[1], r[2]) for r in runs), key=lambda r: r[0])
    row: dict[str, Any] = {
        "layers": layers,
        "stages": 21 * layers,
        "start": start,
        "wall": wall,
        "cpu": cpu,
    }
    row["inproc"] = _in_process(path, args.hw, args.repeat)
    if out is not None:
        data = json.loads(out)
        row.update(
            evaluated=data["evaluated"],
            regions=data["regions"],
            kinds=data["kinds"],
            best=data["schedules"][0]["time_s"],
            baseline=data["baseline_s"],
        )
    if before is not None:
        old_wall, _, old_out = _run(
            ["tune", str(path), *hw, "--json", "--top", "1"], before, args.timeout
        )
        row["old_wall"] = old_wall
        if old_out is not None:
            data = json.loads(old_out)
            row["old_evaluated"] = data["evaluated"]
            row["old_best"] = _predicted(path, data["schedules"][0]["steps"], args.hw)
    print(f"  {layers} layers done", file=sys.stderr)
    return row


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def _print_sizes(rows: list[dict[str, Any]], args: Any) -> None:
    print(f"cocoviz tune on `cocoviz samples --gpt L`, {args.hw}, {os.cpu_count()} cores")
    print()
    head = (
        "| layers | stages | tune: wall | tune: CPU | start-up CPU | CPU beyond start-up "
        "| tune() alone, CPU | evaluated | regions (kinds) | best | before: wall | before: "
        "evaluated | before: best (this model) | loss |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        beyond = r["cpu"] - r["start"]
        if "old_wall" not in r:
            old_wall = old_eval = old_best = loss = "-"
        elif "old_best" not in r:
            old_wall = f"> {args.timeout:.0f} s (stopped)"
            old_eval = old_best = loss = "-"
        else:
            old_wall = f"{r['old_wall']:.2f} s"
            old_eval = str(r["old_evaluated"])
            old_best = _ms(r["old_best"])
            loss = f"{(r['best'] - r['old_best']) / r['old_best'] * 100:+.2f}%"
        print(
            f"| {r['layers']} | {r['stages']} | {r['wall']:.2f} s | {r['cpu']:.2f} s | "
            f"{r['start']:.2f} s | {beyond:.2f} s | {r['inproc']:.2f} s | "
            f"{r.get('evaluated', '-')} | {r.get('regions', '-')} ({r.get('kinds', '-')}) | "
            f"{_ms(r.get('best'))} | {old_wall} | {old_eval} | {old_best} | {loss} |"
        )
    print()
    for a, b in zip(rows, rows[1:], strict=False):
        print(
            f"{a['layers']} -> {b['layers']} layers ({b['layers'] / a['layers']:.0f}x): "
            f"tune() alone {b['inproc'] / a['inproc']:.1f}x, CPU beyond start-up "
            f"{(b['cpu'] - b['start']) / max(a['cpu'] - a['start'], 1e-9):.1f}x"
        )
    for r in rows:
        if r["layers"] == 96:
            beyond = r["cpu"] - r["start"]
            verdict = "meets" if beyond < 5 else "misses"
            print(
                f"96 layers: {beyond:.2f} s of CPU beyond start-up, {r['wall']:.2f} s wall in all "
                f"({verdict} the 5 s goal)"
            )


def _samples(before: Path, hw: str) -> None:
    """Every sample's ranking by the earlier tuner (its module, on this tree's model) and
    by this one."""
    from cocoviz import samples
    from cocoviz.ir.lower import load_file
    from cocoviz.schedule.tune import tune
    from cocoviz.sim.hardware import load_profile

    spec = importlib.util.spec_from_file_location(
        "tune_before", before / "cocoviz" / "schedule" / "tune.py"
    )
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules["tune_before"] = old  # (its dataclasses look their module up)
    spec.loader.exec_module(old)
    print()
    same = []
    for name in samples.names():
        program = load_file(samples.path(name))
        for profile in (hw, "v100-dgx2"):
            p = load_profile(profile)
            a, b = old.tune(program, p), tune(program, p)
            ka = [(c.name, c.steps, c.block, c.time_s) for c in a.candidates]
            kb = [(c.name, c.steps, c.block, c.time_s) for c in b.candidates]
            same.append((name, profile, ka == kb and a.evaluated == b.evaluated))
    unchanged = [f"{n} ({p})" for n, p, ok in same if ok]
    changed = [f"{n} ({p})" for n, p, ok in same if not ok]
    print(f"samples whose tune ranking is unchanged: {len(unchanged)} of {len(same)}")
    if changed:
        print(f"changed: {', '.join(changed)}")


def _checks(hw_name: str) -> None:
    from cocoviz.ir.lower import load_program
    from cocoviz.samples.gpt import gpt_stack
    from cocoviz.schedule.structured import tune_in_context
    from cocoviz.schedule.tune import tune
    from cocoviz.sim.hardware import load_profile

    hw = load_profile(hw_name)
    print()
    print("| stack | check | structured best | whole-program best | equal | check time |")
    print("|---|---|---|---|---|---|")
    for layers, exhaustive in ((1, True), (2, False), (4, False), (8, False)):
        program = load_program(gpt_stack(layers), f"gpt{layers}.coco")
        best = tune(program, hw).best
        t0 = time.perf_counter()
        checked = tune_in_context(program, hw, exhaustive=exhaustive)
        took = time.perf_counter() - t0
        kind = "every combination" if exhaustive else "each region's candidates in turn"
        equal = abs(best.time_s - checked.best.time_s) <= 1e-9 * best.time_s
        print(
            f"| gpt{layers} | {kind} ({checked.evaluated} whole programs) | "
            f"{_ms(best.time_s)} | {_ms(checked.best.time_s)} | "
            f"{'yes' if equal and checked.applies else 'NO'} | {took:.1f} s |"
        )


if __name__ == "__main__":
    if shutil.which("git") is None:
        print("(git not found: the earlier tuner is left out)")
    main()
