"""`cocoviz run --mpi` on shard-decomposed groups (`decompose`, docs/schedules.md): every
pattern of tests/programs/decompose_cases.coco on 2, 4 and 8 ranks and in f32, f16 and
bf16; the dumps equal the reference of the unscheduled program
(cocoviz/exec/shard_pipeline.py runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mpi_support import mpi, run_and_compare  # noqa: F401 - mpi is a fixture

CASES = Path(__file__).parent / "programs" / "decompose_cases.coco"

RUNS = [
    ("all", 2, "f32"),
    ("all", 4, "f32"),
    ("all", 8, "f32"),
    ("all", 4, "f16"),
    ("all", 4, "bf16"),
    ("fused_after", 2, "f16"),
    ("fused_after", 8, "f32"),
]


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize(("schedule", "ranks", "dt"), RUNS)
def test_decomposed_groups_match_the_reference(
    tmp_path: Path, schedule: str, ranks: int, dt: str, capsys
) -> None:
    text = CASES.read_text().replace("f32[", f"{dt}[")
    run_and_compare(tmp_path, text, schedule, ranks, capsys)
