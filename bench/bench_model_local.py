"""The whole cost model against this machine (issue 27, item 4): for every sample and
schedule, `cocoviz simulate --hw <cpu-mpi profile>` next to the measured step time of the
program `cocoviz emit --target cpu` writes for it, at the sizes below, on 2 MPI ranks.

Usage: python bench/bench_model_local.py [--profile CPU.toml] [--ranks 2] [--rounds 20]
           [--budget 0.1] [--stat min|median|mean] [--samples adam,lamb] [--build-dir DIR]
           [--json OUT.json]
       python bench/bench_model_local.py --replay OUT.json [--stat median] [--profile CPU.toml]

Without --profile it calibrates as `cocoviz calibrate --local` does (the micro-runs of the
CPU target: elementwise and GEMM throughput, collectives, a send), but times the
micro-runs in the same rounds as the programs, so that the profile and the measurements it
is compared with see the same machine load; the profile is written next to the builds
(cpu-mpi.toml). Each round times every program once (`run.sh --iters N`, N sized to
--budget seconds a run), interleaved, so that they all see the same machine load; a program's
measured step time is its fastest round (its time when nothing else competes for the
cores, as `calibrate --local` measures its micro-runs; --stat median: the typical time
under the load there was). On a shared VM whose caches are fast only now and then (this
one: a few seconds in every twenty), many short rounds give every program a round in a
fast spell (5 rounds of 0.2 s left some programs without one: their ratios moved by up
to 0.3 from run to run). Printed per program: predicted,
measured, predicted / measured (goal 0.8-1.25); per sample: the pairs of schedules whose
measured times differ by more than 10%, and how many of them the model orders the same
way (goal: all).

--json keeps every round of every program and micro-run; --replay reads such a file and
fits and reports it again under another --stat without running anything (the profile it
fits goes to OUT-STAT/cpu-mpi.toml). The mean of the rounds is the statistic that adds up
(a step's mean is the sum of its stages' means; its fastest round is not the sum of
theirs), the fastest round the one least moved by the machine's load (docs/cost-model.md,
"Proof on this machine").

The programs are the samples at a size a CPU rank runs in milliseconds (SIZES); builds go
to --build-dir (default $XDG_CACHE_HOME/cocoviz/bench-model-local) and are kept, so a
second run only measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from cocoviz import samples
from cocoviz.cli.calibrate import build_cpu_program, default_build_dir
from cocoviz.exec.cpu_timing import run_once
from cocoviz.ir.lower import RanksOverride, load_file
from cocoviz.ir.nodes import Program
from cocoviz.schedule import apply_schedule_arg
from cocoviz.sim.hardware import Hardware, load_profile
from cocoviz.sim.local_profile import (
    MICRO,
    fit_local,
    local_profile_toml,
    micro_program,
    starting_profile,
)
from cocoviz.sim.predict import simulate

SIZES: dict[str, tuple[dict[str, int], str | None]] = {
    "adam": ({"N": 1 << 20}, None),
    "lamb": ({"N": 1 << 20}, None),
    "sgd": ({"N": 1 << 20}, None),
    "megatron_mlp": ({"B": 1, "S": 32, "H": 256}, None),
    "megatron_attention_out": ({"B": 1, "S": 32, "H": 256}, None),
    "transformer_block": ({"B": 1, "S": 32, "H": 128}, None),
    "pipeline_stage": ({"B": 1, "S": 32, "H": 256}, "tp=1,pp=2"),
    "megatron_sp_block": ({"S": 32, "B": 1, "H": 128}, None),
    "zero3_layer": ({"T": 64, "H": 256, "F": 256}, None),
    "moe_layer": ({"P": 4, "R": 2, "T": 16, "E": 2, "C": 8, "H": 128, "F": 256}, None),
    "ulysses_attention": ({"S": 128, "NH": 4, "D": 32}, None),
}
"""Each sample's dimensions here (and its grid where it is not plain tp on --ranks)."""


@dataclass
class Case:
    sample: str
    schedule: str  # "" = as written
    program: Program
    directory: Path
    predicted_s: float
    runs: list[float]

    stat: str = "min"

    @property
    def measured_s(self) -> float:
        return pick(self.stat, self.runs)

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s


STATS = ("min", "median", "mean")
"""What a program's rounds reduce to (--stat)."""


def pick(stat: str, runs: list[float]) -> float:
    """The fastest round, the middle one, or their mean."""
    if stat == "min":
        return min(runs)
    return statistics.median(runs) if stat == "median" else statistics.fmean(runs)


def cases(hw: Hardware, ranks: int, names: list[str], root: Path) -> list[Case]:
    out: list[Case] = []
    for name in names:
        defines, grid = SIZES[name]
        base = load_file(samples.path(name), defines, RanksOverride.parse(grid or str(ranks)))
        blocks = [b.name for b in base.schedules]
        # the program as written, unless a block of no steps already is it
        plain = [] if any(not b.steps for b in base.schedules) else [""]
        for schedule in plain + blocks:
            program = apply_schedule_arg(base, schedule, hw) if schedule else base
            predicted = simulate(program, hw, warnings=False).makespan
            directory = root / f"{name}-{schedule or 'as-written'}-{ranks}"
            out.append(Case(name, schedule, program, directory, predicted, []))
    return out


def pairs(group: list[Case]) -> tuple[int, int, list[str]]:
    """(agreeing, compared, disagreements) over the schedule pairs whose measured times
    differ by more than 10%."""
    agree, total, wrong = 0, 0, []
    for i, a in enumerate(group):
        for b in group[i + 1 :]:
            fast, slow = (a, b) if a.measured_s < b.measured_s else (b, a)
            if slow.measured_s <= fast.measured_s * 1.10:
                continue
            total += 1
            if fast.predicted_s < slow.predicted_s:
                agree += 1
            else:
                wrong.append(f"{fast.schedule or 'as written'} < {slow.schedule or 'as written'}")
    return agree, total, wrong


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--profile", help="a cpu-mpi profile (default: run calibrate --local)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--stat", choices=STATS, default="min")
    ap.add_argument("--budget", type=float, default=0.1, help="seconds a run takes (default 0.1)")
    ap.add_argument("--samples", default=",".join(SIZES))
    ap.add_argument("--build-dir", default=None)
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument(
        "--replay",
        default=None,
        help="a --json file of an earlier run: fit and report its rounds again (--stat)",
    )
    args = ap.parse_args()
    if args.replay:
        replay(args)
        return
    root = (
        Path(args.build_dir)
        if args.build_dir
        else default_build_dir().with_name("bench-model-local")
    )
    names = [n for n in args.samples.split(",") if n]
    root.mkdir(parents=True, exist_ok=True)
    micro: dict[str, Path] = {}
    if args.profile is None:
        for m in MICRO:
            directory = root / f"micro-{m.name}-{args.ranks}"
            print(f"building {directory.name}", file=sys.stderr)
            build_cpu_program(micro_program(m.name, args.ranks), directory)
            micro[m.name] = directory
        hw = starting_profile(args.ranks)  # schedules resolve the same on any cpu profile
    else:
        hw = load_profile(args.profile)
    todo = cases(hw, args.ranks, names, root)
    for c in todo:
        c.stat = args.stat
        print(f"building {c.directory.name}", file=sys.stderr)
        build_cpu_program(c.program, c.directory, hw)
    dirs = [*micro.values(), *(c.directory for c in todo)]
    iters = {d: max(1, min(2000, round(args.budget / max(run_once(d, 1, 1), 1e-7)))) for d in dirs}
    runs: dict[Path, list[float]] = {d: [] for d in dirs}
    for r in range(args.rounds):
        for d in dirs:
            runs[d].append(run_once(d, iters[d], max(1, iters[d] // 10)))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    micro_runs = {name: runs[d] for name, d in micro.items()}
    for c in todo:
        c.runs = runs[c.directory]
    finish(todo, micro_runs, root, args)


def finish(todo: list[Case], micro_runs: dict[str, list[float]], root: Path,
           args: argparse.Namespace) -> None:
    """Fit the profile on the micro-runs' rounds (unless --profile), predict, report."""
    profile = args.profile
    if profile is None:
        measured = [(name, pick(args.stat, r)) for name, r in micro_runs.items()]
        cal = fit_local(dict(measured), args.ranks)
        profile = str(root / "cpu-mpi.toml")
        Path(profile).write_text(local_profile_toml(cal, args.ranks, measured))
        worst = max(abs(r.error) for r in cal.residuals)
        print(f"micro-runs fitted: median {cal.summary()[0]:.1%}, max {worst:.1%}", file=sys.stderr)
    hw = load_profile(profile)
    for c in todo:
        c.stat = args.stat
        c.predicted_s = simulate(c.program, hw, warnings=False).makespan
    report(todo, hw, profile, args, micro_runs)


def replay(args: argparse.Namespace) -> None:
    """--replay: the rounds of an earlier --json run, reduced by --stat and fitted again
    (unless --profile): the profile goes to a folder next to the file, FILE-STAT/."""
    saved = json.loads(Path(args.replay).read_text())
    args.ranks = saved["ranks"]
    micro_runs = saved.get("micro_runs", {})
    if args.profile is None and not micro_runs:
        sys.exit(f"{args.replay}: no micro-runs' rounds in it (a run with --profile): pass --profile")
    hw = starting_profile(args.ranks) if args.profile is None else load_profile(args.profile)
    names = list(dict.fromkeys(p["sample"] for p in saved["programs"]))
    runs = {(p["sample"], p["schedule"]): p["runs_s"] for p in saved["programs"]}
    args.rounds = min(len(r) for r in runs.values())
    todo = []
    for c in cases(hw, args.ranks, names, Path(args.replay).parent):
        c.runs = runs[(c.sample, c.schedule or "as written")]
        todo.append(c)
    root = Path(args.replay).with_suffix("")
    root = root.with_name(f"{root.name}-{args.stat}")  # its profile: DIR/cpu-mpi.toml
    root.mkdir(exist_ok=True)
    finish(todo, micro_runs, root, args)


def report(todo: list[Case], hw: Hardware, profile: str, args: argparse.Namespace,
           micro_runs: dict[str, list[float]]) -> None:
    print(f"# {len(todo)} programs on {args.ranks} ranks, profile {profile} ({hw.name}); "
          f"{args.rounds} rounds, {args.stat}")  # fmt: skip
    print("| sample | schedule | predicted | measured | predicted / measured | within 0.8-1.25 |")
    print("|---|---|---|---|---|---|")
    for c in todo:
        ok = "yes" if 0.8 <= c.ratio <= 1.25 else "no"
        print(f"| {c.sample} | {c.schedule or 'as written'} | {c.predicted_s * 1e3:.3f} ms | "
              f"{c.measured_s * 1e3:.3f} ms | {c.ratio:.2f} | {ok} |")  # fmt: skip
    within = sum(0.8 <= c.ratio <= 1.25 for c in todo)
    print(f"\n{within} of {len(todo)} within 0.8-1.25; ratio median "
          f"{statistics.median(c.ratio for c in todo):.2f}\n")  # fmt: skip
    print("| sample | pairs > 10% apart | ordered as measured | not |")
    print("|---|---|---|---|")
    agree_all = total_all = 0
    by_sample: dict[str, list[Case]] = {}
    for c in todo:
        by_sample.setdefault(c.sample, []).append(c)
    ranking = {}
    for name, group in by_sample.items():
        agree, total, wrong = pairs(group)
        agree_all, total_all = agree_all + agree, total_all + total
        ranking[name] = {"agree": agree, "pairs": total, "not": wrong}
        print(f"| {name} | {total} | {agree} | {'; '.join(wrong)} |")
    print(f"\nranking: {agree_all} of {total_all} pairs ordered as measured")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "profile": profile,
                    "ranks": args.ranks,
                    "programs": [
                        {
                            "sample": c.sample,
                            "schedule": c.schedule or "as written",
                            "predicted_s": c.predicted_s,
                            "measured_s": c.measured_s,
                            "runs_s": c.runs,
                            "ratio": c.ratio,
                        }
                        for c in todo
                    ],
                    "ranking": ranking,
                    "micro_runs": micro_runs,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
