"""`show --json` and `show --graph` scale linearly with the program (issue 31, item 7).

    python bench/bench_show.py [--layers 300,600,1200,1700] [--modes json,graph] [--max-ratio 1.5]

For each GPT stack (`cocoviz samples --gpt N`) and each mode, a fresh process runs
`cocoviz show FILE --json` (or `--graph`) in-process and reports the CPU time of the
command itself (`time.process_time` around `main`, after the same command on a small
sample, so the interpreter's start-up and the modules' imports are not counted), its
output going to /dev/null. It prints the CPU time and the time per layer,
and the ratio of the largest to the smallest time per layer of each mode: linear scaling
keeps it near 1 (it was 2.6x for --json from 300 to 1,200 layers while `Program.stage`
was a linear scan called per stage). Exit 1 when a ratio exceeds --max-ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import os, sys, time
from cocoviz.cli import main
sys.stdout = open(os.devnull, "w")
main(["show", "sgd", "--" + sys.argv[2]])  # the modules the command imports, loaded once
t = time.process_time()
rc = main(["show", sys.argv[1], "--" + sys.argv[2]])
sys.stdout.flush()
print(time.process_time() - t, rc, file=sys.stderr)
"""


def cpu_seconds(path: Path, mode: str) -> float:
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    fields = res.stderr.strip().splitlines()[-1].split() if res.stderr.strip() else []
    if len(fields) != 2 or fields[1] != "0":
        raise SystemExit(f"show --{mode} {path} failed:\n{res.stderr}")
    return float(fields[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="300,600,1200,1700")
    ap.add_argument("--modes", default="json,graph")
    ap.add_argument("--max-ratio", type=float, default=1.5)
    args = ap.parse_args()
    from cocoviz.samples.gpt import gpt_stack

    sizes = [int(n) for n in args.layers.split(",")]
    modes = args.modes.split(",")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for n in sizes:
            paths[n] = Path(tmp, f"gpt{n}.coco")
            paths[n].write_text(gpt_stack(n), encoding="utf-8")
        print(f"{'mode':<6} {'layers':>6} {'CPU s':>8} {'ms/layer':>9}")
        for mode in modes:
            per_layer = []
            for n in sizes:
                t = cpu_seconds(paths[n], mode)
                per_layer.append(t / n)
                print(f"{mode:<6} {n:>6} {t:>8.2f} {1000 * t / n:>9.2f}", flush=True)
            ratio = max(per_layer) / min(per_layer)
            verdict = "ok" if ratio <= args.max_ratio else "NOT LINEAR"
            print(f"{mode:<6} time per layer, largest / smallest: {ratio:.2f}x ({verdict})")
            ok &= ratio <= args.max_ratio
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
