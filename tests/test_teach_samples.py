"""Teach mode on every sample: each step's text agrees with the model's prediction beside
it (falls ↔ faster, rises ↔ slower, stays ↔ same), and a losing step says why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_workbench import _opened, _simulate_shown, open_source

from cocoviz import samples
from cocoviz.workbench import teach
from cocoviz.workbench.workbench import StepFailure

WORDS = {"faster": "falls", "slower": "rises", "same": "stays"}


@pytest.mark.parametrize("name", samples.names())
def test_teach_text_agrees_with_the_prediction(name: str) -> None:
    wb = _opened(open_source(name), teach=True)
    taught = wb.teach_steps
    assert taught, f"{name} has a schedule to teach"
    for i in range(1, len(taught) + 1):
        assert not isinstance(wb.teach_next(), StepFailure)
        _simulate_shown(wb)
        tb, ta = wb.summary(i - 1), wb.summary(i)
        assert tb is not None and ta is not None
        way = teach.direction(tb, ta)
        text = wb.teach_note().text
        verbs = set(re.findall(r"Predicted time (falls|rises|stays)", text))
        assert verbs == {WORDS[way]}, (name, taught[i - 1], way, text)
        if way == "slower":
            assert f"Why it loses on {wb.hw.name}" in text, text
        else:
            assert "Why it loses" not in text
        # The explanation of what a step does makes no claim about its speed.
        for claim in ("costs nothing", "instead of taking turns", "one launch instead of three"):
            assert claim not in text


SP_MLP = Path(__file__).resolve().parent / "programs" / "sp_mlp.coco"


def test_teach_describes_a_decomposed_group_by_shard() -> None:
    """A decomposed group runs one step per shard over the G ranks, not in K row chunks:
    teach mode says so, and why decompose can win or lose."""
    wb = _opened(open_source(SP_MLP), teach=True)
    assert wb.teach_steps == ["decompose(xg, h)", "decompose(y, ys)"]
    for i, (a, b) in enumerate((("xg", "h"), ("y", "ys")), start=1):
        assert not isinstance(wb.teach_next(), StepFailure)
        _simulate_shown(wb)
        text = wb.teach_note().text
        assert f"overlapped group decomposed by shard over 4 ranks: {a}, {b}" in text, text
        assert "chunks" not in text and teach.WHY["decompose"] in text
        tb, ta = wb.summary(i - 1), wb.summary(i)
        assert tb is not None and ta is not None
        if teach.direction(tb, ta) == "slower":
            assert teach.WIN_WHERE["decompose"] in text
