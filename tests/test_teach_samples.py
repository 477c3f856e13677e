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
    wb = _opened(open_source(name), teach=True, teach_best=False)  # the last block
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
    wb = _opened(open_source(SP_MLP), teach=True, teach_best=False)
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


# --- the tuner's best, step by step -------------------------------------------------------

HW_NAME = "h100-dgx"
"""The hardware of `_opened` (test_workbench.HW) and of `cocoviz tune NAME` (the default)."""

FIRST_ROW = re.compile(r"│\s+1 │\s+(\S+ \S+) │")


def _walk(wb) -> None:  # type: ignore[no-untyped-def]
    while not wb.teach_finished:
        assert not isinstance(wb.teach_next(), StepFailure), wb.failed
        _simulate_shown(wb)


@pytest.mark.parametrize("name", samples.names())
def test_teach_mode_reaches_the_tuners_best_schedule(name: str, capsys) -> None:  # type: ignore[no-untyped-def]
    from cocoviz.cli import main
    from cocoviz.schedule.tune import tune
    from cocoviz.timefmt import format_time

    wb = _opened(open_source(name), teach=True)  # the tuner's best is the default target
    assert wb.hw.name == HW_NAME and wb.teach_waiting and not wb.teaching
    assert wb.best_job() is wb.base  # the UI tunes in a worker; headless, set_teaching does
    wb.set_teaching(True)
    assert wb.base is not None
    best = tune(wb.base, wb.hw).best
    assert wb.teach_steps == list(best.steps)
    _walk(wb)
    final = wb.summary(wb.position)
    assert final is not None and final.makespan_s == pytest.approx(best.time_s, rel=1e-9)
    note = wb.teach_note()
    assert note.next_step is None and format_time(best.time_s) in note.goal

    capsys.readouterr()
    assert main(["tune", name, "--hw", HW_NAME]) == 0
    row = FIRST_ROW.search(capsys.readouterr().out)
    assert row is not None and row.group(1) == format_time(final.makespan_s), row


def test_the_default_target_is_the_tuners_best_not_the_last_block() -> None:
    """A workbench made without saying what to teach teaches the tuner's best schedule;
    `teach_best=False` the last schedule block (on megatron_mlp the two differ)."""
    from cocoviz.schedule import block_steps

    default = _opened(open_source("megatron_mlp"))
    block = _opened(open_source("megatron_mlp"), teach_best=False)
    assert default.base is not None and block.base is not None
    last = [str(s) for s in block_steps(block.base, None)]
    assert default.best_job() is default.base and block.best_job() is None
    assert block.teach_steps == last
    assert default.teach_steps == []  # until the tuner has run
    default.set_teaching(True)
    assert default.best is not None and default.teach_steps == list(default.best.steps)
    assert default.teach_steps != last


def test_a_stopped_tuner_is_not_taken_for_the_best() -> None:
    """The tuner stopped before its end (cancelled, or out of time) gives no best: the
    fastest schedule it found so far is not `cocoviz tune`'s first row. Nothing is
    stored, the request waiting for it is dropped, and the next request tunes again."""
    from cocoviz.workbench import NoBest

    wb = _opened(open_source("megatron_mlp"), teach=True)
    base = wb.best_job()
    assert base is not None and wb.teach_waiting
    calls = 0

    def stop() -> bool:
        nonlocal calls
        calls += 1
        return calls > 3  # after a few candidates, as Escape in the TUI does

    stopped = wb.run_best(base, stop=stop)
    assert isinstance(stopped, NoBest) and stopped.stopped, stopped
    assert "cancelled" in stopped.message and "before it had tried every" in stopped.message
    wb.store_best(base, stopped)
    assert wb.best is None and wb.teach_steps == [] and not wb.teach_waiting
    assert wb.best_job() is base  # asked again, it is tuned again
    late = wb.run_best(base, budget_s=0.0)
    assert isinstance(late, NoBest) and late.stopped and "time ran out" in late.message
    best = wb.run_best(base)
    assert not isinstance(best, NoBest)
    wb.store_best(base, best)
    assert wb.best == best and wb.teach_steps == list(best.steps) and wb.best_job() is None


def test_teach_mode_walks_beside_the_users_steps(tmp_path: Path) -> None:
    from cocoviz.workbench import state

    wb = _opened(open_source("megatron_mlp"), state_root=tmp_path)
    mine = ["split(sum)", "reorder(sum)"]
    for step in mine:
        assert not isinstance(wb.apply(step), StepFailure)
    assert wb.set_teaching(True) and wb.position == 0  # its own session, from the start
    _walk(wb)
    assert wb.applied_steps == wb.teach_steps and wb.user_steps == mine
    wb.autosave()  # what is saved is the user's own work
    saved = state.read(wb.source.key, tmp_path)
    assert saved is not None and list(saved.steps) == mine
    assert wb.set_teaching(False) and wb.applied_steps == mine and wb.position == 2


COLLECTIVE_NAMES = {
    "allreduce": "allreduce",
    "all-reduce": "allreduce",
    "reduce-scatter": "reducescatter",
    "all-gather": "allgather",
    "all-to-all": "alltoall",
    "broadcast": "broadcast",
}
ALGORITHM_NAMES = {
    "nvlink sharp": "nvls",
    "nvls": "nvls",
    "ring": "ring",
    "tree": "tree",
    "collnet": "collnet",
    "symmetric": "symmetric",
    "ll128": "ll128",
}


def _touched(step: str, before, after) -> set[str]:  # type: ignore[no-untyped-def]
    """The ops of the stages a step names, makes or groups, before and after it."""
    args = re.findall(r"[A-Za-z_]\w*", step.partition("(")[2])
    names = {a for a in args if before.has_stage(a) or after.has_stage(a)}
    names |= {s.name for s in after.stages if not before.has_stage(s.name)}
    for g in after.groups:
        if g not in before.groups:
            names |= set(g.stages())
    ops = set()
    for p in (before, after):
        ops |= {p.stage(n).expr.op.value for n in names if p.has_stage(n)}
    return ops


@pytest.mark.parametrize("best", [False, True], ids=["block", "best"])
@pytest.mark.parametrize("name", samples.names())
def test_no_teach_text_contradicts_the_model(name: str, best: bool) -> None:
    """Every collective a step's text names is one the step touches; every algorithm it
    names is one the model ran before or after the step; its direction is the model's."""
    wb = _opened(open_source(name), teach=not best, teach_best=best)
    wb.set_teaching(True)
    for i in range(1, len(wb.teach_steps) + 1):
        assert not isinstance(wb.teach_next(), StepFailure)
        _simulate_shown(wb)
        tb, ta = wb.summary(i - 1), wb.summary(i)
        before, after = wb.program_at(i - 1), wb.program_at(i)
        assert tb is not None and ta is not None and before is not None and after is not None
        text = wb.teach_note().text
        # The model's own words (`allreduce symmetric/Simple`) are quoted, not claimed.
        low = re.sub(r"the model's collectives were [^;]*; now [^\n]*", "", text.lower())
        step = wb.recorded_steps[i - 1]
        touched = _touched(step, before, after)
        for word, op in COLLECTIVE_NAMES.items():
            if re.search(rf"\b{re.escape(word)}\b", low):
                assert op in touched, (name, step, word, touched, text)
        ran = " ".join(r.detail.lower() for s in (tb, ta) for r in s.stages if r.stream == "comm")
        for word, algo in ALGORITHM_NAMES.items():
            if re.search(rf"\b{re.escape(word)}\b", low):
                assert algo in ran, (name, step, word, ran, text)
        way = teach.direction(tb, ta)
        assert set(re.findall(r"Predicted time (falls|rises|stays)", text)) == {WORDS[way]}
        other = {"faster": "slower", "slower": "faster", "same": None}[way]
        assert other is None or f"% {other}" not in text, text
