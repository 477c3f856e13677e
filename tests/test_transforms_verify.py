"""Every canonical schedule of every sample keeps the reference results, at 2, 4 and 8
ranks (a 2×2 and a 4×2 tp×pp grid for the pipeline)."""

from __future__ import annotations

import pytest
from transforms_util import SAMPLES, SMALL, sample

from cocoviz.exec import verify
from cocoviz.schedule import apply_block

RANKS = {name: ["2", "4", "8"] for name in SAMPLES}
RANKS["pipeline_stage"] = ["tp=2,pp=2", "tp=4,pp=2"]
RANKS["zero1_tp_mlp"] = ["dp=2,tp=2", "dp=2,tp=4"]  # a dp grid (docs/language.md)

CASES = [
    (name, ranks, block.name)
    for name in SAMPLES
    for ranks in RANKS[name]
    for block in sample(name, SMALL[name], ranks).schedules
]


@pytest.mark.parametrize(("name", "ranks", "block"), CASES)
def test_schedule_keeps_reference_results(name: str, ranks: str, block: str) -> None:
    original = sample(name, SMALL[name], ranks)
    scheduled = apply_block(original, next(b for b in original.schedules if b.name == block))
    report = verify.verify_programs(original, scheduled)
    assert report.ok, report.format_report()


def test_bias_stays_whole_and_is_indexed_by_global_position() -> None:
    # 1·3·8 = 24 elements over 4 ranks: 6 per rank, not a multiple of H = 8, so reading the
    # bias at the local index (CoCoNet's slice(b)) would be wrong on ranks 1 and 2.
    from cocoviz.ir.printer import format_stage

    original = sample("megatron_mlp", {"B": 1, "S": 3, "H": 8}, "4")
    scheduled = apply_block(original, next(b for b in original.schedules if b.name == "mm_rs_c_ag"))
    out_s = next(s for s in scheduled.stages if s.name == "out_s")
    assert format_stage(out_s) == "out_s = dropout(sum_rs + b, 0.1, id=out) + slice(r)"
    assert original.type_of("b") == scheduled.type_of("b")
    report = verify.verify_programs(original, scheduled)
    assert report.ok, report.format_report()
