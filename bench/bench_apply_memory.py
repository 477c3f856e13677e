"""Memory of repeated schedule steps: apply megatron_mlp's `fused` schedule (split,
reorder, fuse, overlap) ROUNDS times and print the resident set size before and after,
and the `Index` objects still alive. Nothing a round makes outlives it, so the RSS
after should stay near the RSS before (it grew from 23 to 228 MiB when every program's
index was cached forever).

    python bench/bench_apply_memory.py [ROUNDS]
"""

from __future__ import annotations

import argparse
import gc
import resource
import time
from pathlib import Path

from cocoviz import samples
from cocoviz.ir.lower import load_file
from cocoviz.ir.transforms import as_transformation
from cocoviz.ir.transforms.base import Index


def rss_mib() -> float:
    """The current resident set size (Linux /proc), else the peak (getrusage)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def live_indexes() -> int:
    gc.collect()
    return sum(isinstance(o, Index) for o in gc.get_objects())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="?", type=int, default=3000)
    args = ap.parse_args()

    program = load_file(samples.path("megatron_mlp"))
    steps = [as_transformation(s) for s in program.schedules[-1].steps]
    p = program
    for t in steps:  # warm up: parser, caches, imports
        p = t.apply(p)
    gc.collect()
    before = rss_mib()
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        p = program
        for t in steps:
            p = t.apply(p)
    dt = time.perf_counter() - t0
    after_rss = rss_mib()
    live = live_indexes()
    collected = rss_mib()
    print(
        f"{args.rounds} rounds of {len(steps)} steps ({', '.join(map(str, steps))}) in {dt:.1f} s"
    )
    print(f"RSS before: {before:.1f} MiB")
    print(f"RSS after:  {after_rss:.1f} MiB ({after_rss - before:+.1f} MiB)")
    print(f"RSS after gc.collect(): {collected:.1f} MiB; live Index objects: {live}")


if __name__ == "__main__":
    main()
