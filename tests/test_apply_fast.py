"""The shortcuts that make applying a long schedule cheap must not change what a step
produces or what it checks: a fuse or overlap whose stages already run together keeps the
stage tuple (and the groups it makes are still verified), split and reorder type the
stages they build (the result is what re-typing from scratch gives, and a failure is the
same internal error), and `cocoviz.schedule` imports sessions only when asked for them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import ClassVar

import pytest
from transforms_util import ROOT, assert_index_consistent, sample

from cocoviz.errors import InputError, InternalError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Group, GroupKind, Program, StepCall
from cocoviz.ir.transforms import as_transformation
from cocoviz.ir.transforms.base import Edit
from cocoviz.ir.transforms.retype import TypeFailure, verify_program
from cocoviz.ir.transforms.step import Transformation
from cocoviz.samples.gpt import gpt_stack


def test_groups_made_in_place_keep_the_stage_tuple(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COCOVIZ_VERIFY", "fast")
    program = load_program(gpt_stack(2), "gpt2.coco")
    result = program
    for step in program.schedules[0].steps:
        t = as_transformation(step)
        after = t.apply(result)
        if t.name in ("fuse", "overlap"):
            assert after.stages is result.stages, str(t)
            assert after.groups != result.groups
        result = after
        assert_index_consistent(result)
    verify_program(result)  # split and reorder typed their stages as re-typing would


def test_a_group_made_in_place_is_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that makes a group without moving a stage still has the group checked on
    the incremental path (here a buggy one: a fused group of one stage)."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Lonely(Transformation):
        name: ClassVar[str] = "lonely"
        signature: ClassVar[str] = "lonely()"
        makes_groups: ClassVar[bool] = True

        def step(self) -> StepCall:
            return StepCall("lonely")

        def rewrite(self, program: Program) -> Edit:
            g = Group(GroupKind.FUSED, (program.stages[0].name,))
            new = dataclasses.replace(program, groups=(*program.groups, g))
            return Edit(new, window=(0, 0, 0))

    monkeypatch.setenv("COCOVIZ_VERIFY", "fast")
    with pytest.raises(InternalError) as info:
        Lonely().apply(sample("megatron_mlp"))
    assert str(info.value) == (
        "IR invariant broken after step `lonely()`: a fused group has fewer than two items"
    )


def test_a_typed_stage_that_fails_is_the_retyping_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from cocoviz.ir.transforms import split

    def refuse(inf: object, stage: object) -> object:
        raise TypeFailure("sum_rs", InputError("no"))

    monkeypatch.setattr(split, "typed_stage", refuse)
    with pytest.raises(InternalError) as info:
        as_transformation("split(sum)").apply(sample("megatron_mlp"))
    assert str(info.value) == "step `split(sum)`: re-typing 'sum_rs' failed after the step: no"


def test_sessions_are_imported_when_asked_for() -> None:
    code = (
        "import sys, cocoviz.schedule as s\n"
        "assert 'cocoviz.schedule.session' not in sys.modules\n"
        "from cocoviz.schedule import Session, StepFailure, HistoryEntry, palette\n"
        "assert Session.__module__ == 'cocoviz.schedule.session' and callable(palette)\n"
        "assert s.StepFailure is StepFailure and s.HistoryEntry is HistoryEntry\n"
        "try:\n"
        "    s.nothing\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
