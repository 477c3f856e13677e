"""Time the command-line path a user runs on a 96-layer GPT stack (2,016 stages).

A benchmark, not a timed test: run it by hand,

    python bench/bench_cli.py [LAYERS] [--repeat N] [--no-warm]

It writes the stack (`cocoviz samples --gpt LAYERS`) to a temporary file and runs, each
in a fresh subprocess,

    start-up   python -c pass
    version    python -m cocoviz --version        (interpreter + cocoviz's CLI imports)
    check      cocoviz check FILE
    apply      cocoviz apply FILE '<the fused block's steps, ';'-separated>'
    simulate   cocoviz simulate FILE --schedule fused

The commands are interleaved (one round runs each once) so that a busy machine slows
all of them alike; it prints the median of N rounds per command, and for check, apply
and simulate the median "beyond start-up" (minus `--version`'s median). The goal of
the performance issue: each of check, apply and simulate under 0.3 s beyond start-up.

Each subprocess gets a private `XDG_CACHE_HOME` and bytecode cache
(`PYTHONPYCACHEPREFIX`, with `PYTHONDONTWRITEBYTECODE` unset); one warm-up round fills
them (the parser cache, the compiled modules), as on a user's machine after the first run. `--no-warm` skips the
warm-up round, so the first measured round pays for building the cache.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable


def run(cmd: list[str], env: dict[str, str]) -> float:
    """Wall-clock seconds of one subprocess; fails loudly if the command fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)[:200]} failed:\n{proc.stderr.decode()[-2000:]}")
    return dt


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
    args = ap.parse_args()

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
        if not args.no_warm:
            for cmd in cmds.values():
                run(cmd, env)
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.repeat):
            for name, cmd in cmds.items():
                times[name].append(run(cmd, env))

    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{args.layers}-layer GPT stack, median of {args.repeat} (interleaved), CPUs {os.cpu_count()}"
    )
    for name, m in med.items():
        line = f"  {name:<9} {m:7.3f} s"
        if name in ("check", "apply", "simulate"):
            line += f"   beyond start-up {m - med['version']:6.3f} s"
        print(line + "   [" + " ".join(f"{t:.3f}" for t in times[name]) + "]")
    print(
        f"  (start-up = `python -m cocoviz --version` {med['version']:.3f} s; goal < 0.3 s beyond it)"
    )


if __name__ == "__main__":
    main()
