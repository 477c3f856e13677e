"""Large programs take the incremental path (re-typing what a step touched, verifying
around it); its result must be what re-typing everything from scratch gives."""

from __future__ import annotations

import pytest
from transforms_util import assert_index_consistent, reparse

from cocoviz.ir.lower import load_program
from cocoviz.ir.transforms import as_transformation
from cocoviz.ir.transforms.retype import FULL_VERIFY_LIMIT, verify_program
from cocoviz.samples.gpt import gpt_stack


def test_gpt_stack_fused_schedule_on_the_incremental_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COCOVIZ_VERIFY", "fast")
    program = load_program(gpt_stack(24), "gpt24.coco")
    assert len(program.stages) > FULL_VERIFY_LIMIT
    steps = program.schedules[0].steps
    result = program
    for step in steps:
        result = as_transformation(step).apply(result)
    verify_program(result)
    assert_index_consistent(result)
    assert reparse(result) == result
    assert len(result.groups) == 24
    assert all(g.chunks == 4 for g in result.groups)
