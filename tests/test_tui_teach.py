"""Teach mode's search for the tuner's best schedule in the TUI: the panel shows how far
it is while the app answers keys, `escape` stops it (and a stopped search is never taught
as the best), and a program opened later is taught towards its own best."""

from __future__ import annotations

import time

import pytest
from tui_support import make_app, run_async, settle

from cocoviz.schedule.tune import TuneResult, tune
from cocoviz.tui.app import CocovizApp, TeachPanel
from cocoviz.tui.host import ProgramHost
from cocoviz.tui.teaching import progress_line
from cocoviz.tui.widgets.footer import KeyFooter
from cocoviz.workbench import workbench as workbench_module


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


class SlowTuner:
    """`tune` as the workbench calls it, each candidate made to take `delay_s` longer
    (so that a test can act while it runs); every result is kept."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.results: list[TuneResult] = []

    def __call__(self, program, hw, *, stop=None, **kwargs):  # type: ignore[no-untyped-def]
        def slow_stop() -> bool:
            time.sleep(self.delay_s)
            return stop() if stop is not None else False

        result = tune(program, hw, stop=slow_stop, **kwargs)
        self.results.append(result)
        return result


async def _until(pilot, check, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        await pilot.pause(0.05)
    return check()


def _panel(app: CocovizApp) -> str:
    return str(app.query_one(TeachPanel).render())


@run_async
async def test_the_search_shows_progress_answers_keys_and_escape_stops_it(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    slow = SlowTuner(0.05)
    monkeypatch.setattr(workbench_module, "tune", slow)
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        assert app.wb.teach_waiting and not app.wb.teaching
        assert await _until(pilot, lambda: "candidates simulated" in _panel(app)), _panel(app)
        assert "esc" in _panel(app) and "stops the search" in _panel(app)
        await pilot.pause()
        assert "esc Stop the tuner" in app.query_one(KeyFooter).text()
        # The app answers keys while the tuner runs in its thread.
        shown = app.side_shown
        await pilot.press("s")
        assert app.side_shown is not shown and app.wb.teach_waiting
        await pilot.press("escape")
        assert not app.wb.teach_waiting and not app.wb.teaching
        assert not app.query_one(TeachPanel).has_class("-shown")
        await settle(pilot)
        # The search did stop early, and what it had found is not taken for the best.
        assert slow.results and slow.results[-1].stopped == "stopped"
        assert app.wb.best is None and app.wb.teach_steps == []
        assert app.wb.best_job() is app.wb.base  # t searches again
        messages = [n.message for n in app._notifications]
        assert any("stopped before it had tried every schedule" in m for m in messages)
        assert "Stop the tuner" not in app.query_one(KeyFooter).text()

        # Asked again and left to finish, it teaches the tuner's best.
        slow.delay_s = 0.0
        await pilot.press("t")
        await settle(pilot)
        assert app.wb.teaching and slow.results[-1].complete
        assert app.wb.best == slow.results[-1].best
        assert app.wb.teach_steps == list(slow.results[-1].best.steps)


@run_async
async def test_t_while_the_tuner_runs_stops_it_too(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    slow = SlowTuner(0.05)
    monkeypatch.setattr(workbench_module, "tune", slow)
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("t")
        assert await _until(pilot, lambda: "candidates simulated" in _panel(app))
        await pilot.press("t")
        assert not app.wb.teach_waiting and not app.wb.teaching
        await settle(pilot)
        assert slow.results[-1].stopped == "stopped" and app.wb.best is None


@run_async
async def test_a_program_opened_later_is_taught_towards_its_own_best(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert isinstance(app, ProgramHost)  # what the command palette's providers use
        app.open_program("moe_layer")
        await settle(pilot)
        assert app.wb.base is not None and app.wb.base.name == "moe_layer"
        assert app.wb.teach_best  # the workbench's default, not the app's choice
        await pilot.press("t")
        await settle(pilot)
        best = tune(app.wb.base, app.wb.hw).best
        assert app.wb.teaching and app.wb.teach_steps == list(best.steps)
        assert "tuner's best" in _panel(app)


def test_the_progress_line_counts_candidates_regions_and_time() -> None:
    from cocoviz.schedule.tune import TuneProgress

    assert progress_line(None) == "starting"
    half = progress_line(TuneProgress(57, 2, 4, 1.5, 1.5))
    assert half.startswith("[" + "█" * 12 + "░" * 12 + "] 57 candidates simulated")
    assert "region 3 of 4" in half and "about" in half and "left" in half
    whole = progress_line(TuneProgress(9, 0, 1, 0.5, None))
    assert "░" * 24 in whole and "region" not in whole and "left" not in whole
    check = progress_line(TuneProgress(80, 4, 4, 3.0, None, phase="check"))
    assert "█" * 24 in check and "checking the best" in check
