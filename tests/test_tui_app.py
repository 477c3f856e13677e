"""The TUI driven with Pilot: samples, steps, undo/redo, errors, teach mode, emit,
autosave and robustness."""

from __future__ import annotations

import importlib.util
import random
import shutil
import subprocess

import pytest
from textual.widgets import TextArea
from tui_support import make_app, run_async, settle

from cocoviz import samples
from cocoviz.tui import state
from cocoviz.tui.app import CocovizApp, ErrorPanel, TeachPanel
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.palette import StepPalette
from cocoviz.tui.widgets.source import CocoTextArea, SourceEditor
from cocoviz.tui.widgets.timeline import TimelineView

HAVE_SESSION = importlib.util.find_spec("cocoviz.session") is not None
HAVE_SIM = importlib.util.find_spec("cocoviz.sim.timeline") is not None
needs_session = pytest.mark.skipif(not HAVE_SESSION, reason="cocoviz.session has not landed")
needs_sim = pytest.mark.skipif(not HAVE_SIM, reason="cocoviz.sim.timeline has not landed")


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def _makespan(app: CocovizApp) -> float:
    view = app.query_one(TimelineView)
    assert view.data is not None, view.message_text
    return view.data.makespan


@pytest.mark.parametrize("name", samples.names())
@run_async
async def test_every_sample_opens(tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, name)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.base is not None and app.base.name == name
        assert app.query_one(SourceEditor).diagnostics == ()
        graph = app.query_one(GraphView)
        assert graph.drawing is not None
        assert set(graph.drawing.nodes) == {s.name for s in app.base.stages}
        assert not app.query_one(ErrorPanel).has_class("-shown")
        if HAVE_SIM:
            assert _makespan(app) > 0


async def _apply_from_palette(pilot, app: CocovizApp, stage: str, step: str) -> None:  # type: ignore[no-untyped-def]
    app.selected = stage
    await settle(pilot)
    palette = app.query_one(StepPalette)
    assert step in palette.keyed, (step, palette.entries)
    await pilot.press(str(palette.keyed.index(step) + 1))
    await settle(pilot)
    assert app.history is not None
    # Applied as resolved: `overlap(a, b)` records its chunk count.
    assert app.history.steps[app.history.index - 1].startswith(step.rstrip(")"))


@needs_session
@needs_sim
@run_async
async def test_megatron_schedule_from_the_palette_makes_it_faster(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        start = _makespan(app)
        await pilot.click(GraphView)  # the graph has the focus, so digits reach the palette
        await _apply_from_palette(pilot, app, "sum", "split(sum)")
        await _apply_from_palette(pilot, app, "sum", "reorder(sum)")
        # The palette offers fusing with a neighbour; two fusions make RS → compute → AG.
        await _apply_from_palette(pilot, app, "sum_rs", "fuse(sum_rs, out_s)")
        await _apply_from_palette(pilot, app, "out", "fuse(out_s, out)")
        fused = _makespan(app)
        assert {"sum_rs", "out_s", "out"} <= set(app.history.current.groups[0].stages())  # type: ignore[union-attr]
        assert fused < start
        app.selected = "layer"
        await settle(pilot)
        overlap = next(
            e.step
            for e in app.query_one(StepPalette).entries
            if e.ok and e.step.startswith("overlap(layer, sum_rs")
        )
        await _apply_from_palette(pilot, app, "layer", overlap)
        end = _makespan(app)
        assert end != fused  # the timeline changed: chunks of the matmul feed the collective
        view = app.query_one(TimelineView)
        assert any("[1/" in b.label for r in view.data.rows for b in r.bars)  # type: ignore[union-attr]
        assert app.history is not None and app.history.index == 5
        assert "overlapped" in {g.kind.value for g in app.history.current.groups}
        assert app.command_line().startswith(
            "cocoviz apply megatron_mlp 'split(sum)' 'reorder(sum)'"
        )

        # Undo to the start, redo to the end.
        for _ in range(5):
            await pilot.press("u")
        await settle(pilot)
        assert app.history.index == 0
        assert _makespan(app) == pytest.approx(start)
        for _ in range(3):
            await pilot.press("U")
        await pilot.press("ctrl+r", "ctrl+r")
        await settle(pilot)
        assert app.history.index == 5
        assert _makespan(app) == pytest.approx(end)


@needs_session
@run_async
async def test_a_failed_step_is_shown_not_raised(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert not app.apply_step("fuse(layer, out)")
        await settle(pilot)
        assert app.failed is not None and app.failed[0] == "fuse(layer, out)"
        assert app.history is not None and app.history.index == 0


@run_async
async def test_an_error_is_marked_at_its_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        area.focus()
        line = next(i for i, t in enumerate(area.text.splitlines()) if t.startswith("out "))
        area.move_cursor((line, len(area.document.lines[line])))
        await pilot.press(*" + nope")
        await pilot.pause(0.6)
        await settle(pilot)
        diags = app.query_one(SourceEditor).diagnostics
        assert diags, "no diagnostic"
        assert diags[0].span is not None and diags[0].span.line == line + 1
        assert "nope" in diags[0].message
        assert area.error_spans and area.error_spans[0][0] == line + 1
        assert any(name == "error" for *_, name in area._highlights[line])
        # The graph keeps the last program that parsed.
        assert app.query_one(GraphView).drawing is not None
        # Fixing the text clears the diagnostic.
        for _ in range(len(" + nope")):
            await pilot.press("backspace")
        await pilot.pause(0.6)
        await settle(pilot)
        assert app.query_one(SourceEditor).diagnostics == ()


@needs_session
@needs_sim
@run_async
async def test_teach_mode_walks_every_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp", teach_mode=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        panel = app.query_one(TeachPanel)
        assert panel.has_class("-shown")
        steps = app.teach_steps
        assert steps == [str(s) for s in app.base.schedules[-1].steps]  # type: ignore[union-attr]
        times = [_makespan(app)]
        for i, step in enumerate(steps, start=1):
            await pilot.press("n")
            await settle(pilot)
            assert app.history is not None and app.history.index == i
            text = str(panel.render())
            assert step in text and f"step {i} of {len(steps)}" in text
            times.append(_makespan(app))
        assert "last step" in str(panel.render())
        fuse_at = next(i for i, st in enumerate(steps, start=1) if st.startswith("fuse"))
        assert times[fuse_at] < times[0]  # RS → compute on the slice → AG beats AR → compute
        await pilot.press("p")
        await settle(pilot)
        assert app.history.index == len(steps) - 1


@needs_session
@run_async
async def test_emit_writes_a_cpu_tree_that_builds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("cocoviz.emit.templates" if False else "cocoviz.emit")
    from cocoviz.tui import backend
    from cocoviz.tui.backend import Missing

    app = make_app(tmp_path, "megatron_mlp", schedule="fused")
    out = tmp_path / "emitted"
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        try:
            backend._emit_fn()
        except Missing as m:
            pytest.skip(str(m))
        await pilot.press("e")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#dir").value = str(out)  # type: ignore[attr-defined]
        await pilot.click("#cpu")
        await pilot.click("#ok")
        await settle(pilot)
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files, "nothing emitted"
    if shutil.which("mpicxx") is None or not (out / "Makefile").exists():
        pytest.skip("no mpicxx to build the CPU target")
    build = subprocess.run(["make", "-C", str(out)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr


@run_async
async def test_autosave_is_offered_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "sgd")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        area.focus()
        area.move_cursor((0, 0))
        await pilot.press(*"# edited", "enter")
        await pilot.pause(0.6)
        await settle(pilot)
    saved = state.read("sample:sgd", tmp_path / "state")
    assert saved is not None and saved.source.startswith("# edited\n")

    again = make_app(tmp_path, "sgd")
    async with again.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert type(again.screen).__name__ == "RestoreDialog"
        await pilot.press("r")
        await pilot.pause(0.6)
        await settle(pilot)
        assert again.query_one(CocoTextArea).text.startswith("# edited\n")
        assert again.text.startswith("# edited\n")


@run_async
async def test_a_worker_exception_shows_a_panel_and_the_app_keeps_running(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from cocoviz.tui import backend

    def broken(program, hw):  # type: ignore[no-untyped-def]
        raise RuntimeError("simulator exploded")

    monkeypatch.setattr(backend, "simulate", broken)
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        panel = app.query_one(ErrorPanel)
        assert panel.has_class("-shown")
        assert "simulator exploded" in str(panel.render())
        await pilot.press("x")
        assert not panel.has_class("-shown")
        await pilot.press("down", "question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        assert app.is_running


@run_async
async def test_random_typing_anywhere_does_not_crash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(6)
    keys = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789(){}[]=+-*/#,.:;@ ")
    keys += [
        "enter",
        "tab",
        "shift+tab",
        "escape",
        "up",
        "down",
        "left",
        "right",
        "backspace",
        "delete",
        "home",
        "end",
        "pageup",
        "pagedown",
        "u",
        "U",
        "b",
        "d",
        "z",
        "n",
        "p",
        "t",
        "c",
    ]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for _ in range(300):
            await pilot.press(rng.choice(keys))
        await pilot.pause(0.6)
        await settle(pilot)
        assert app.is_running
        assert not app.query_one(ErrorPanel).has_class("-shown"), str(
            app.query_one(ErrorPanel).render()
        )


@run_async
async def test_help_lists_every_binding_and_the_command_palette_has_the_actions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        for b in app.BINDINGS:
            assert b.description, b  # type: ignore[union-attr]
        titles = {c.title for c in app.get_system_commands(app.screen)}
        for b in app.BINDINGS:
            if not b.action.startswith("palette_key"):  # type: ignore[union-attr]
                assert b.description in titles  # type: ignore[union-attr]
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.pause()
        assert type(app.screen).__name__ != "HelpScreen"


@run_async
async def test_selection_is_shared_by_graph_source_and_timeline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        graph = app.query_one(GraphView)
        graph.focus()
        app.selected = "layer"
        await pilot.press("down")
        await settle(pilot)
        assert app.selected == "sum"
        assert graph.selected == "sum"
        assert app.query_one(TimelineView).selected == "sum"
        line = app.base.stage("sum").span.line  # type: ignore[union-attr]
        assert app.query_one(CocoTextArea).selected_line == line
        # Moving the editor's cursor to a stage's line selects it.
        area = app.query_one(TextArea)
        area.focus()
        await pilot.pause()
        out_line = app.base.stage("out").span.line  # type: ignore[union-attr]
        area.move_cursor((out_line - 1, 0))
        await settle(pilot)
        assert app.selected == "out"
