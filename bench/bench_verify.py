"""Time reference verification of megatron_mlp at B=8, S=1024, H=3072 on 8 ranks.

A benchmark, not a timed test: run it by hand,

    python bench/bench_verify.py [--ranks 8] [-D B=8 -D S=1024 -D H=3072] [--profile]

It verifies the sample against its `fused` schedule (ol(MM, fuse(RS-C-AG))) when
`cocoviz.schedule` can apply it, otherwise against the same schedule written by hand, and
prints the wall-clock and CPU seconds of the two reference runs and the comparison, the
estimated memory, and the per-output report. The goal is under 30 s.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import time
from pathlib import Path

from cocoviz.exec.reference import estimate_bytes
from cocoviz.exec.verify import verify_programs
from cocoviz.ir.lower import RanksOverride, load_file, load_program, parse_defines
from cocoviz.ir.nodes import Program

SAMPLE = Path(__file__).resolve().parents[1] / "cocoviz" / "samples" / "megatron_mlp.coco"

# The `fused` schedule of the sample, as `cocoviz apply` prints it.
HAND_WRITTEN = """program megatron_mlp
ranks 16
dim B = 8, S = 1024, H = 3072

input w : f16[H, H] sliced
input b : f16[H] replicated
input x : f16[B, S, H] sliced(2)
input r : f16[B, S, H] replicated

overlapped chunks=4 {
  layer = matmul(x, w)
  fused {
    sum_rs = reducescatter(+, layer)
    out_s = dropout(sum_rs + b, 0.1, id=out) + slice(r)
    out = allgather(out_s)
  }
}

output out
"""


def scheduled_form(
    original: Program, defines: dict[str, int], ranks: RanksOverride
) -> tuple[Program, str]:
    try:
        from cocoviz.schedule import apply_block, find_block
    except ImportError:
        return load_program(HAND_WRITTEN, "fused.coco", defines, ranks), "hand-written fused form"
    return apply_block(original, find_block(original, "fused")), "schedule 'fused' applied"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", default="8")
    ap.add_argument("-D", dest="defines", action="append", default=["B=8", "S=1024", "H=3072"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="print the top of a cProfile")
    args = ap.parse_args()
    defines = parse_defines(args.defines)
    ranks = RanksOverride.parse(args.ranks)
    original = load_file(SAMPLE, defines, ranks)
    scheduled, how = scheduled_form(original, defines, ranks)
    est = estimate_bytes(original) + estimate_bytes(scheduled)
    dims = ", ".join(f"{d.name}={d.value}" for d in original.dims)
    print(f"megatron_mlp {dims}, ranks {original.grid}: original vs {how}")
    print(f"estimated reference memory: {est / 2**30:.2f} GiB for both runs")

    prof = cProfile.Profile() if args.profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    # a benchmark of the reference at a size beyond the CLI's default work bound
    report = verify_programs(original, scheduled, seed=args.seed, max_mem=1 << 40, max_work=1 << 60)
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(report.format_report(), end="")
    print(f"verify: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {peak:.2f} GiB (goal: < 30 s)")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(20)


if __name__ == "__main__":
    main()
