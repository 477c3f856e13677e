"""Parse and lower a 96-layer GPT stack (2,016 stages) and print the time.

A benchmark, not a timed test: run it by hand,

    python bench/bench_parse.py [LAYERS] [--repeat N] [--profile]

It prints the best of N runs (wall clock and CPU time, which is steadier on a busy
machine) for parsing alone and for parsing plus lowering (names, types, layouts).
The goal is under 1 s for 96 layers.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from cocoviz.ir.lower import load_program, lower
from cocoviz.ir.syntax import parse_module
from cocoviz.samples.gpt import gpt_stack


def best(fn, repeat: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Best wall-clock and best CPU seconds over `repeat` calls."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layers", nargs="?", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="print the top cProfile entries")
    args = ap.parse_args()

    text = gpt_stack(args.layers)
    t0 = time.perf_counter()
    program = load_program(text, f"gpt{args.layers}.coco")  # includes building the parser
    first = time.perf_counter() - t0
    module = parse_module(text)
    parse_w, parse_c = best(lambda: parse_module(text), args.repeat)
    lower_w, lower_c = best(lambda: lower(module), args.repeat)
    total_w, total_c = best(lambda: load_program(text), args.repeat)
    print(
        f"gpt_stack({args.layers}): {len(program.stages)} stages, {len(program.inputs)} inputs, "
        f"{len(text.splitlines())} lines"
    )
    print(f"  first call (builds the parser): {first:.3f} s")
    print(f"  parse:         {parse_w:.3f} s wall, {parse_c:.3f} s cpu (best of {args.repeat})")
    print(f"  lower:         {lower_w:.3f} s wall, {lower_c:.3f} s cpu")
    print(f"  parse + lower: {total_w:.3f} s wall, {total_c:.3f} s cpu")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(load_program, text)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
