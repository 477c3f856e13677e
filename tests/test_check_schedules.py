"""`cocoviz check` (and `verify`) apply a prefix shared by schedule blocks once
(cocoviz/schedule/steps.py, `apply_blocks`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cocoviz.schedule as schedule
import cocoviz.schedule.steps as steps_module
from cocoviz.cli.inspect import _check_schedules
from cocoviz.errors import CocovizError
from cocoviz.ir.lower import load_program
from cocoviz.schedule.steps import common_prefix
from cocoviz.sim.hardware import default_hardware

SAMPLE = Path(__file__).resolve().parents[1] / "cocoviz" / "samples" / "adam.coco"


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = steps_module.apply_step

    def spy(program: Any, step: Any, hw: Any = None) -> Any:
        calls.append(str(step))
        return real(program, step, hw)

    monkeypatch.setattr(steps_module, "apply_step", spy)
    return calls


def with_blocks(text: str, blocks: str) -> str:
    head = text[: text.index("\nschedule ")]
    return head + "\n" + blocks


def test_shared_prefix_applied_once(monkeypatch: pytest.MonkeyPatch) -> None:
    text = SAMPLE.read_text()
    program = load_program(text, str(SAMPLE))
    assert [b.name for b in program.schedules] == ["ar_c", "rs_c_ag", "fused"]
    calls = counting(monkeypatch)
    assert _check_schedules(program, default_hardware()) == ["ar_c", "rs_c_ag", "fused"]
    # ar_c: 1 step; rs_c_ag: 4; fused shares rs_c_ag's 4 steps and adds 1
    assert calls == [
        "fuse(gf, m1, v1, mh, vh, w1)",
        "split(g1)",
        "reorder(g1)",
        "asslice(m, v)",
        "dce()",
        "fuse(g1_rs, w1)",
    ]


def test_blocks_prefix_of_each_other_and_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = (
        "schedule a {\n  split(g1)\n  reorder(g1)\n}\n"
        "schedule b {\n  split(g1)\n}\n"
        "schedule c {\n  split(g1)\n  reorder(g1)\n  asslice(m, v)\n}\n"
        "schedule d {\n  split(g1)\n  reorder(g1)\n  asslice(m, v)\n  dce()\n}\n"
        "schedule e {\n  split(g1)\n  reorder(g1)\n}\n"
    )
    program = load_program(with_blocks(SAMPLE.read_text(), blocks), "x.coco")
    calls = counting(monkeypatch)
    assert _check_schedules(program, default_hardware()) == list("abcde")
    assert calls == ["split(g1)", "reorder(g1)", "asslice(m, v)", "dce()"]


@pytest.mark.parametrize(
    "blocks",
    [
        "schedule a {\n  split(g1)\n}\nschedule b {\n  split(g1)\n  fuse(nope)\n}\n",
        "schedule a {\n  split(g1)\n  fuse(nope)\n}\nschedule b {\n  split(g1)\n}\n",
        "schedule a {\n  split(g1)\n  reorder(g1)\n}\n"
        "schedule b {\n  split(g1)\n  reorder(g1)\n  reorder(g1)\n}\n",
    ],
)
def test_first_failure_reported_as_before(blocks: str) -> None:
    """The error (message, position, hint) is the one applying each block alone gives."""
    program = load_program(with_blocks(SAMPLE.read_text(), blocks), "x.coco")
    expected = None
    for block in program.schedules:
        try:
            schedule.apply_block(program, block, default_hardware())
        except CocovizError as err:
            expected = err
            break
    assert expected is not None
    with pytest.raises(type(expected)) as got:
        _check_schedules(program, default_hardware())
    assert str(got.value) == str(expected)
    assert getattr(got.value, "span", None) == getattr(expected, "span", None)
    assert getattr(got.value, "hint", None) == getattr(expected, "hint", None)


def testcommon_prefix() -> None:
    p = load_program(SAMPLE.read_text(), str(SAMPLE))
    ar_c, rs, fused = (b.steps for b in p.schedules)
    assert common_prefix(rs, fused) == 4
    assert common_prefix(ar_c, fused) == 0
    assert common_prefix((), fused) == 0
