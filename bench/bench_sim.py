"""Benchmarks of the simulator and the tuner (goals: a 96-layer GPT stack simulated in
under 1 s; megatron_mlp tuned in under 5 s). Prints the figures; run with
`python bench/bench_sim.py [--layers N] [--hw NAME]`."""

from __future__ import annotations

import argparse
import gc
import time

from cocoviz import samples
from cocoviz.ir.lower import load_file, load_program
from cocoviz.ir.nodes import Program
from cocoviz.samples.gpt import gpt_stack
from cocoviz.schedule.tune import tune
from cocoviz.sim.hardware import Hardware, load_profile
from cocoviz.sim.predict import simulate


def _schedule(program: Program, block: str) -> Program:
    from cocoviz.schedule import apply_block, find_block

    return apply_block(program, find_block(program, block))


def _timed(fn, repeat: int = 3):  # type: ignore[no-untyped-def]
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=96)
    ap.add_argument("--hw", default="h100-dgx")
    args = ap.parse_args()
    hw = load_profile(args.hw)
    _gpt_stack(args.layers, hw)
    # The tuner runs as `cocoviz tune` would: without the GPT stack's 10^5 objects alive
    # (gone with `_gpt_stack`'s frame), whose garbage-collector passes would be timed.
    gc.collect()
    _tuner(args.hw)


def _gpt_stack(layers: int, hw: Hardware) -> None:
    t0 = time.perf_counter()
    gpt = load_program(gpt_stack(layers), f"gpt{layers}.coco")
    t_parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    scheduled = _schedule(gpt, "fused")
    t_sched = time.perf_counter() - t0
    t_plain, plain = _timed(lambda: simulate(gpt, hw))
    t_sim, tl = _timed(lambda: simulate(scheduled, hw, baseline=plain))
    t_fast, _ = _timed(lambda: simulate(scheduled, hw, baseline=plain, warnings=False))
    events = sum(len(lane.events) for lane in tl.lanes) * len(tl.lanes[0].ranks)
    print(
        f"GPT stack: {layers} layers, {len(gpt.stages)} stages, {gpt.grid.world} ranks, {hw.name}"
    )
    print(f"  parse + lower                  {t_parse:8.3f} s")
    print(f"  apply the 'fused' schedule     {t_sched:8.3f} s ({4 * layers} steps)")
    print(f"  simulate, unscheduled          {t_plain:8.3f} s")
    print(f"  simulate, scheduled            {t_sim:8.3f} s (with warnings; goal < 1 s)")
    print(f"  simulate, scheduled, no warn   {t_fast:8.3f} s")
    print(
        f"  predicted {plain.makespan * 1e3:.3f} ms -> {tl.makespan * 1e3:.3f} ms "
        f"(speedup {tl.summary.speedup:.2f}x), {events} events, {len(tl.warnings)} warnings"
    )



def _tuner(hw_name_default: str) -> None:
    for name, hw_name, coll in (
        ("megatron_mlp", hw_name_default, "nccl"),
        ("megatron_mlp", "v100-dgx2", "nccl-device"),
        ("adam", "v100-dgx2", "nccl"),
    ):
        program = load_file(samples.path(name))
        hw2 = load_profile(hw_name)
        t_tune, result = _timed(lambda p=program, h=hw2, c=coll: tune(p, h, collectives=c), 1)
        best = result.best
        print(
            f"tune {name} on {hw_name} ({coll}): {t_tune:.3f} s for {result.evaluated} schedules "
            f"(goal < 5 s); best {best.title} {best.time_s * 1e6:.1f} us, "
            f"{result.baseline_s / best.time_s:.2f}x over as written"
        )


if __name__ == "__main__":
    main()
