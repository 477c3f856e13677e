"""Large programs take the incremental path (re-typing what a step touched, verifying
around it); its result must be what re-typing everything from scratch gives."""

from __future__ import annotations

import pytest
from transforms_util import assert_index_consistent, reparse

from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program
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


@pytest.mark.parametrize("log", [0, 1, 10**9])
def test_index_derived_at_every_step_agrees(monkeypatch: pytest.MonkeyPatch, log: int) -> None:
    """Each step's index is derived from the one before: the tables behind them are edited
    in place, keeping an undo log of `log` edits. Every program of the schedule, asked
    again afterwards (newest first, then oldest first, then checked against a step), still
    answers as an index built from scratch: it takes the tables back through the log, or
    builds its own when the log does not reach it."""
    from cocoviz.ir.transforms import base, legal_steps

    monkeypatch.setattr(base, "_LOG_LIMIT", log)
    program = load_program(gpt_stack(3), "gpt3.coco")
    history = [program]
    result = program
    for step in program.schedules[0].steps:
        result = as_transformation(step).apply(result)
        assert_index_consistent(result)
        history.append(result)
    for p in reversed(history):
        assert_index_consistent(p)
    for p in history:
        assert_index_consistent(p)
    middle = history[len(history) // 2]
    assert any(o.ok for o in legal_steps(middle, middle.stages[-1].name))
    assert_index_consistent(middle)
    assert_index_consistent(result)
    again = program
    for step in program.schedules[0].steps:
        again = as_transformation(step).apply(again)
    assert again == result
    assert_index_consistent(again)


def test_changed_window_compares_stage_objects() -> None:
    """(lo, hi_new, hi_old) of two stage lists: the same objects before lo and from
    hi_new / hi_old on, whatever the lists' lengths (objects that are equal but not the
    same one differ)."""
    from cocoviz.ir.transforms.base import _changed_window

    class S:
        pass

    a, b, c, d, e, x, y = (S() for _ in range(7))
    old = (a, b, c, d, e)
    cases = {
        (a, b, c, d, e): (5, 5, 5),  # the same
        (a, b, x, d, e): (2, 3, 3),  # one replaced
        (a, b, x, y, c, d, e): (2, 4, 2),  # two inserted
        (a, e): (1, 1, 4),  # three removed
        (a, b, c, d, e, x): (5, 6, 5),  # appended
        (x, a, b, c, d, e): (0, 1, 0),  # prepended
        (a, c, b, d, e): (1, 3, 3),  # two swapped
        (): (0, 0, 5),
    }
    for new, window in cases.items():
        assert _changed_window(old, new) == window, new  # type: ignore[arg-type]


def test_indexes_of_one_schedule_answer_from_two_threads() -> None:
    """The indexes of a schedule's programs share tables: a UI queries older programs in
    worker threads (simulating, emitting) while it applies steps in its own, and each
    index still answers for its program."""
    import threading

    program = load_program(gpt_stack(4), "gpt4.coco")
    history = [program]
    for step in program.schedules[0].steps[:8]:
        history.append(as_transformation(step).apply(history[-1]))
    errors: list[BaseException] = []

    def query(programs: list[Program]) -> None:
        try:
            for _ in range(3):
                for p in programs:
                    assert_index_consistent(p)
        except BaseException as err:  # reported below
            errors.append(err)

    worker = threading.Thread(target=query, args=(history[::2],))
    worker.start()
    result = history[-1]
    for step in program.schedules[0].steps[8:]:
        result = as_transformation(step).apply(result)
    query(history[1::2])
    worker.join()
    assert not errors, errors
    assert_index_consistent(result)
