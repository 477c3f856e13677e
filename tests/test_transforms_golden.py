"""The printed program after each step of every canonical schedule of every sample,
against golden files in tests/golden/transforms/.

Regenerate with `COCOVIZ_UPDATE_GOLDEN=1 pytest tests/test_transforms_golden.py`, then
read the diff (`git diff tests/golden`) before committing it.
"""

from __future__ import annotations

import os

import pytest
from transforms_util import ROOT, SAMPLES, assert_index_consistent, reparse, sample

from cocoviz.ir.printer import format_program
from cocoviz.ir.transforms.retype import verify_program
from cocoviz.schedule import apply_step

GOLDEN = ROOT / "tests" / "golden" / "transforms"
UPDATE = os.environ.get("COCOVIZ_UPDATE_GOLDEN") == "1"

CASES = [(s, b.name) for s in SAMPLES for b in sample(s).schedules]


@pytest.mark.parametrize(("name", "block"), CASES)
def test_each_step_matches_golden_and_round_trips(name: str, block: str) -> None:
    program = sample(name)
    steps = next(b for b in program.schedules if b.name == block).steps
    for k, step in enumerate(steps, start=1):
        program, resolved = apply_step(program, step)
        verify_program(program, resolved)
        assert_index_consistent(program)
        assert reparse(program) == program, f"step {k} `{step}` does not round-trip"
        text = f"# {name}, schedule {block}, after step {k}: {resolved}\n" + format_program(
            program, schedules=False, annotate=True
        )
        path = GOLDEN / f"{name}.{block}.{k}.coco"
        if UPDATE:
            path.write_text(text, encoding="utf-8")
        assert path.exists(), f"missing golden {path.name}; run with COCOVIZ_UPDATE_GOLDEN=1"
        assert text == path.read_text(encoding="utf-8"), f"{path.name} differs"


def test_no_stale_golden_files() -> None:
    expected = set()
    for name, block in CASES:
        steps = next(b for b in sample(name).schedules if b.name == block).steps
        expected |= {f"{name}.{block}.{k}.coco" for k in range(1, len(steps) + 1)}
    present = {p.name for p in GOLDEN.glob("*.coco")}
    assert present == expected
