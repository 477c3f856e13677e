"""Time the command-line path a user runs on a 96-layer GPT stack (2,016 stages).

A benchmark, not a timed test: run it by hand,

    python bench/bench_cli.py [LAYERS] [--repeat N] [--no-warm] [--compare DIR]

It writes the stack (`cocoviz samples --gpt LAYERS`) to a temporary file and runs, each
in a fresh subprocess,

    start-up   python -c pass
    version    python -m cocoviz --version        (interpreter + cocoviz's CLI imports)
    check      cocoviz check FILE
    apply      cocoviz apply FILE '<the fused block's steps, ';'-separated>'
    simulate   cocoviz simulate FILE --schedule fused

The commands are interleaved (one round runs each once) so that a busy machine slows
all of them alike; it prints the median of N rounds per command, and for check, apply
and simulate the median "beyond start-up" (minus `--version`'s median); each also as
CPU time (user + system), which a loaded machine disturbs less than the wall clock.
The goal of the performance issue: each of check, apply and simulate under 0.3 s
beyond start-up.

Each subprocess gets a private `XDG_CACHE_HOME` and bytecode cache
(`PYTHONPYCACHEPREFIX`, with `PYTHONDONTWRITEBYTECODE` unset); one warm-up round fills
them (the parser cache, the compiled modules), as on a user's machine after the first run. `--no-warm` skips the
warm-up round, so the first measured round pays for building the cache.

`--compare DIR` also times another copy of cocoviz (e.g. `git archive HEAD | tar -x -C
DIR`, the tree before a change) in the same rounds, each command of both run back to
back, and prints its figures beside this tree's: on a loaded machine only figures
measured side by side compare.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock and CPU (user + system) seconds of one subprocess; fails loudly if the
    command fails."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # cwd: a directory without a cocoviz package (`python -m` puts the working directory
    # first on sys.path, ahead of PYTHONPATH, so a run from the repository root would time
    # this tree under --compare's name too)
    proc = subprocess.run(
        cmd, env=env, cwd=env["COCOVIZ_BENCH_CWD"], stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)[:200]} failed:\n{proc.stderr.decode()[-2000:]}")
    return dt, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime


def fused_steps(text: str, block: str = "fused") -> str:
    """The steps of a schedule block, as one ';'-separated argument."""
    m = re.search(rf"^schedule {block} \{{\n(.*?)^\}}", text, re.M | re.S)
    if m is None:
        raise SystemExit(f"no schedule block {block!r} in the sample")
    return "; ".join(line.strip() for line in m.group(1).splitlines() if line.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layers", nargs="?", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-warm", action="store_true", help="skip the warm-up round")
    ap.add_argument(
        "--compare",
        metavar="DIR",
        type=Path,
        help="also time the cocoviz package under DIR (a copy of another version's tree)",
    )
    args = ap.parse_args()
    if args.compare is not None and not (args.compare / "cocoviz" / "__init__.py").is_file():
        raise SystemExit(f"--compare {args.compare}: no cocoviz package there")

    with tempfile.TemporaryDirectory(prefix="cocoviz-bench-") as tmp:
        env = dict(
            os.environ,
            XDG_CACHE_HOME=str(Path(tmp, "cache")),
            COLUMNS="120",
            PYTHONPYCACHEPREFIX=str(Path(tmp, "pycache")),
        )
        # compiled modules are cached as on a user's machine (an environment that turns
        # bytecode caching off would otherwise time the compilation of every module)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        src = Path(tmp, f"gpt{args.layers}.coco")
        out = subprocess.run(
            [PY, "-m", "cocoviz", "samples", "--gpt", str(args.layers)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        src.write_text(out)
        cocoviz = [PY, "-m", "cocoviz"]
        cmds = {
            "start-up": [PY, "-c", "pass"],
            "version": [*cocoviz, "--version"],
            "check": [*cocoviz, "check", str(src)],
            "apply": [*cocoviz, "apply", str(src), fused_steps(out)],
            "simulate": [*cocoviz, "simulate", str(src), "--schedule", "fused"],
        }
        env["COCOVIZ_BENCH_CWD"] = tmp
        trees = {"": dict(env, PYTHONPATH=str(Path(__file__).resolve().parent.parent))}
        if args.compare is not None:
            other = dict(env, PYTHONPATH=str(args.compare.resolve()))
            trees["before"] = other
        if not args.no_warm:
            for cmd in cmds.values():
                for tenv in trees.values():
                    run(cmd, tenv)
        times: dict[str, dict[str, list[tuple[float, float]]]] = {
            t: {k: [] for k in cmds} for t in trees
        }
        for _ in range(args.repeat):
            for name, cmd in cmds.items():
                for tree, tenv in trees.items():
                    times[tree][name].append(run(cmd, tenv))

    print(
        f"{args.layers}-layer GPT stack, median of {args.repeat} (interleaved), CPUs {os.cpu_count()}"
    )
    for tree, per in times.items():
        if args.compare is not None:
            print(f"{'this tree' if not tree else f'{tree} ({args.compare})'}:")
        report(per)


def report(times: dict[str, list[tuple[float, float]]]) -> None:
    """Medians of wall-clock time and, in parentheses, of CPU time (on a loaded machine
    the wall clock also counts the waits for a core; the CPU time does not)."""
    med = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    for name, m in med.items():
        line = f"  {name:<9} {m:7.3f} s (cpu {cpu[name]:.3f})"
        if name in ("check", "apply", "simulate"):
            line += (
                f"   beyond start-up {m - med['version']:6.3f} s"
                f" (cpu {cpu[name] - cpu['version']:.3f})"
            )
        print(line + "   [" + " ".join(f"{w:.3f}" for w, _ in times[name]) + "]")
    print(
        f"  (start-up = `python -m cocoviz --version` {med['version']:.3f} s; goal < 0.3 s beyond it)"
    )


if __name__ == "__main__":
    main()
