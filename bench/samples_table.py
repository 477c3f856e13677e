"""The table "Predicted times of the samples" of docs/cost-model.md: each sample as
written and each of its schedule blocks, what `cocoviz simulate SAMPLE --schedule B --hw
H [--collectives C]` predicts. The V100 columns use CoCoNet's configuration (the
`-D`/`--ranks` line in the sample's comments), the H100 column the sample's own sizes.
Prints the Markdown rows; run with `python bench/samples_table.py`."""

from __future__ import annotations

from cocoviz import samples
from cocoviz.errors import CocovizError
from cocoviz.ir.lower import RanksOverride, load_program
from cocoviz.ir.nodes import Program
from cocoviz.schedule.steps import apply_blocks
from cocoviz.sim.hardware import load_profile
from cocoviz.sim.predict import simulate
from cocoviz.timefmt import format_time

SAMPLES = (
    "adam",
    "lamb",
    "sgd",
    "megatron_mlp",
    "megatron_attention_out",
    "pipeline_stage",
    "transformer_block",
)


def _cell(program: Program, hw_name: str, collectives: str, only: str | None = None) -> str:
    hw = load_profile(hw_name)
    base = simulate(program, hw, collectives=collectives, warnings=False)
    parts = [] if only else [f"{format_time(base.summary.makespan_s)} →"]
    try:
        blocks = apply_blocks(program, hw)
    except CocovizError as err:
        return f"— ({err.message})"
    for name, p in blocks:
        if only is not None and name != only:
            continue
        try:
            s = simulate(p, hw, collectives=collectives, baseline=base, warnings=False).summary
        except CocovizError as err:
            parts.append(f"{name}: not modelled ({err.message})")
            continue
        extra = f", overlap {s.overlap_fraction:.0%}" if s.overlap_fraction >= 0.005 else ""
        parts.append(f"{name} {format_time(s.makespan_s)} ({s.speedup or 0:.2f}×{extra})")
    return " ".join(parts[:1]) + " " + ", ".join(parts[1:]) if not only else ", ".join(parts)


def _size(value: int) -> str:
    return f"2^{value.bit_length() - 1}" if value >= 1 << 16 and value & (value - 1) == 0 else str(value)


def main() -> None:
    print(
        "| sample: CoCoNet's ranks / the sample's | v100-dgx2, nccl (CoCoNet's configuration) "
        "| v100-dgx2, nccl-device | h100-dgx, nccl (the sample's sizes) |"
    )
    print("|---|---|---|---|")
    for name in SAMPLES:
        text = samples.text(name)
        defines, ranks, _ = samples.coconet_config(name)
        grid = RanksOverride.parse(ranks) if ranks else None
        small = load_program(text, f"{name}.coco", defines, grid)
        real = load_program(text, f"{name}.coco")
        sizes = ", ".join(f"{d.name}={_size(d.value)}" for d in real.dims)
        print(
            f"| {name} ({small.grid} / {real.grid}, {sizes}) "
            f"| {_cell(small, 'v100-dgx2', 'nccl')} "
            f"| {_cell(small, 'v100-dgx2', 'nccl-device', only='fused')} "
            f"| {_cell(real, 'h100-dgx', 'nccl')} |"
        )


if __name__ == "__main__":
    main()
