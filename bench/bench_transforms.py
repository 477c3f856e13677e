"""Benchmark: apply the `fused` schedule of a 96-layer GPT stack (384 steps on 2,016
stages; every MLP becomes ol(MM, fuse(RS-C-AG))) the way the CLI does
(`cocoviz.schedule.apply_steps`). Goal (issue 18): under 0.12 s in total, and a cost
per step that does not grow with the depth (try 400 layers: 1,600 steps).

    python bench/bench_transforms.py [LAYERS] [--repeat N]

Prints the wall and CPU time of the whole schedule (best of N, each on a freshly loaded
program), per step, and the time to load the program, for comparison.
"""

from __future__ import annotations

import argparse
import time

from cocoviz.ir.lower import load_program
from cocoviz.samples.gpt import gpt_stack
from cocoviz.schedule import apply_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layers", nargs="?", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    source = gpt_stack(args.layers)
    t0 = time.perf_counter()
    program = load_program(source, f"gpt{args.layers}.coco")
    load_s = time.perf_counter() - t0
    steps = program.schedules[0].steps

    best_wall = best_cpu = float("inf")
    result = program
    for _ in range(args.repeat):
        # a fresh program each time: the first step pays for what a program caches
        program = load_program(source, f"gpt{args.layers}.coco")
        w, c = time.perf_counter(), time.process_time()
        result = apply_steps(program, steps)
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    print(
        f"gpt{args.layers}: {len(program.stages)} stages, {len(steps)} steps → "
        f"{len(result.stages)} stages, {len(result.groups)} overlapped groups"
    )
    print(
        f"apply fused schedule: {best_wall:.3f} s wall, {best_cpu:.3f} s CPU "
        f"(best of {args.repeat}; {best_wall / len(steps) * 1e3:.2f} ms a step); "
        f"load: {load_s:.3f} s"
    )


if __name__ == "__main__":
    main()
