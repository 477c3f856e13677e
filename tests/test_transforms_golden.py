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


@pytest.mark.parametrize(("name", "block"), CASES)
def test_each_rewrite_says_where_the_stages_changed(name: str, block: str) -> None:
    """A rewrite's `Edit.window` (lo, hi_new, hi_old), when it gives one, bounds where the
    stage tuples differ: outside it they hold the same objects (the index of the new
    program is derived from it without comparing the tuples)."""
    from cocoviz.ir.transforms import as_transformation

    program = sample(name)
    steps = next(b for b in program.schedules if b.name == block).steps
    for step in steps:
        t = as_transformation(step).resolve(program)
        edit = t.rewrite(program)
        if edit.window is not None:
            lo, hi_new, hi_old = edit.window
            new, old = edit.program.stages, program.stages
            assert 0 <= lo <= hi_new <= len(new) and lo <= hi_old <= len(old), step
            assert len(new) - hi_new == len(old) - hi_old, step
            assert all(a is b for a, b in zip(new[:lo], old[:lo], strict=True)), step
            assert all(a is b for a, b in zip(new[hi_new:], old[hi_old:], strict=True)), step
        program, _ = apply_step(program, step)
