"""The TUI driven with Pilot: samples, steps, undo/redo, errors, teach mode, emit,
autosave and robustness."""

from __future__ import annotations

import gc
import io
import random

import pytest
from emit_support import need_mpicxx
from textual.widgets import TextArea
from tui_support import coconet_app, make_app, run_async, settle

from cocoviz import samples
from cocoviz.emit.emitter import build
from cocoviz.emit.lower import EmitError
from cocoviz.schedule.tune import tune
from cocoviz.tui.app import CocovizApp, ErrorPanel, TeachPanel
from cocoviz.tui.widgets.code import CodeView
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.history import HistoryList
from cocoviz.tui.widgets.palette import StepPalette
from cocoviz.tui.widgets.source import CocoTextArea, SourceEditor
from cocoviz.tui.widgets.timeline import TimelineView
from cocoviz.workbench import state
from cocoviz.workbench import workbench as workbench_module


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
        assert app.wb.base is not None and app.wb.base.name == name
        assert app.query_one(SourceEditor).diagnostics == ()
        graph = app.query_one(GraphView)
        assert graph.drawing is not None
        assert set(graph.drawing.nodes) == {s.name for s in app.wb.base.stages}
        assert not app.query_one(ErrorPanel).has_class("-shown")
        assert _makespan(app) > 0


async def _apply_from_palette(pilot, app: CocovizApp, stage: str, step: str) -> None:  # type: ignore[no-untyped-def]
    app.selected = stage
    await settle(pilot)
    palette = app.query_one(StepPalette)
    assert step in palette.keyed, (step, palette.entries)
    await pilot.press(str(palette.keyed.index(step) + 1))
    await settle(pilot)
    assert app.wb.session is not None
    # Applied as resolved: `overlap(a, b)` records its chunk count.
    assert app.wb.recorded_steps[app.wb.position - 1].startswith(step.rstrip(")"))


@run_async
async def test_megatron_schedule_from_the_palette_makes_it_faster(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # CoCoNet's configuration on its V100s, where RS → compute → AG pays (1.17×); at the
    # sample's own size on one H100 node the NVLS allreduce wins (tune, teach mode say so)
    app = coconet_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        assert app.wb.hw.name == "v100-dgx2" and app.wb.base.grid.world == 16  # type: ignore[union-attr]
        start = _makespan(app)
        await pilot.click(GraphView)  # the graph has the focus, so digits reach the palette
        await _apply_from_palette(pilot, app, "sum", "split(sum)")
        await _apply_from_palette(pilot, app, "sum", "reorder(sum)")
        # The palette offers fusing with a neighbour; two fusions make RS → compute → AG.
        await _apply_from_palette(pilot, app, "sum_rs", "fuse(sum_rs, out_s)")
        await _apply_from_palette(pilot, app, "out", "fuse(out_s, out)")
        fused = _makespan(app)
        assert {"sum_rs", "out_s", "out"} <= set(app.wb.program.groups[0].stages())  # type: ignore[union-attr]
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
        assert app.wb.program is not None and app.wb.position == 5
        assert "overlapped" in {g.kind.value for g in app.wb.program.groups}
        assert app.wb.command_line().startswith(
            "cocoviz apply megatron_mlp 'split(sum)' 'reorder(sum)'"
        )

        # Undo to the start, redo to the end.
        for _ in range(5):
            await pilot.press("u")
        await settle(pilot)
        assert app.wb.position == 0
        assert _makespan(app) == pytest.approx(start)
        for _ in range(3):
            await pilot.press("U")
        await pilot.press("ctrl+r", "ctrl+r")
        await settle(pilot)
        assert app.wb.position == 5
        assert _makespan(app) == pytest.approx(end)


@run_async
async def test_a_failed_step_is_shown_not_raised(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert not app.apply_step("fuse(layer, out)")
        await settle(pilot)
        assert app.wb.failed is not None and app.wb.failed.step == "fuse(layer, out)"
        assert app.wb.session is not None and app.wb.position == 0


@run_async
async def test_a_step_redraws_first_and_pauses_the_collector_until_its_timeline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert gc.isenabled()
        drawn = app.timeline_drawn_at
        assert app.apply_step("split(sum)")
        # The simulation starts once the screen is drawn; the collector waits for it.
        assert not [w for w in app.workers if w.group == "sim"]
        assert not gc.isenabled()
        await settle(pilot)
        assert app.timeline_drawn_at > drawn
        assert gc.isenabled()
        await pilot.press("u")  # the unscheduled timeline is kept: nothing to simulate
        await settle(pilot)
        assert app.wb.position == 0 and gc.isenabled()


def _history_lines(history: HistoryList) -> list[tuple[str | None, str, bool]]:
    return [(o.id, str(o.prompt), o.disabled) for o in history.options]


@run_async
async def test_the_history_updated_line_by_line_is_the_history_drawn_afresh(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        history = app.query_one(HistoryList)
        fresh = HistoryList()

        async def check() -> None:
            await settle(pilot)
            failed = app.wb.failed
            shown = (failed.step, history._rows[-1][1][1]) if failed is not None else None
            fresh.set_options([])
            fresh._rows = []
            fresh.show(app.wb.recorded_steps, app.wb.position, shown)
            assert _history_lines(history) == _history_lines(fresh)
            assert history.highlighted == app.wb.position
            # The lines drawn (from the options' drawings that the update kept) are those
            # the options draw afresh.
            drawn = [list(history.render_line(y)) for y in range(history.size.height)]
            history._clear_caches()
            assert [list(history.render_line(y)) for y in range(history.size.height)] == drawn

        for step in ("split(sum)", "reorder(sum)", "fuse(sum_rs, out)"):
            assert app.apply_step(step)
            await check()
        await pilot.press("u", "u")
        await check()
        assert not app.apply_step("fuse(layer, out)")  # refused: a failed line at the end
        await check()
        assert app.apply_step("reorder(sum)")  # a new branch drops the undone steps
        await check()
        await pilot.press("u", "u", "u")
        await check()
        assert [o.id for o in history.options] == ["h:0", "h:1", "h:2"]


@run_async
async def test_an_error_is_marked_at_its_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        await pilot.press("i")  # edit mode: keys type into the text
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


@run_async
async def test_teach_mode_walks_every_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = coconet_app(tmp_path, "megatron_mlp", teach_mode=True)  # where RS-C-AG pays
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        panel = app.query_one(TeachPanel)
        assert panel.has_class("-shown")
        # No schedule named: teach mode walks to the tuner's best, found in a worker.
        best = app.wb.best
        assert best is not None and app.wb.base is not None
        assert best == tune(app.wb.base, app.wb.hw).best
        steps = app.wb.teach_steps
        assert steps == list(best.steps)
        times = [_makespan(app)]
        for i, step in enumerate(steps, start=1):
            await pilot.press("n")
            await settle(pilot)
            assert app.wb.session is not None and app.wb.position == i
            text = str(panel.render())
            assert step in text and f"step {i} of {len(steps)}" in text
            times.append(_makespan(app))
        assert "last step" in str(panel.render()) and "tuner's best" in str(panel.render())
        assert times[-1] == pytest.approx(best.time_s) and times[-1] < times[0]
        await pilot.press("p")
        await settle(pilot)
        assert app.wb.position == len(steps) - 1


@run_async
async def test_teach_mode_keeps_the_users_steps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.apply_step("split(sum)")
        await settle(pilot)
        await pilot.press("t")
        await settle(pilot)
        assert app.wb.teaching and app.wb.position == 0
        assert "your own steps come back" in str(app.query_one(TeachPanel).render())
        await pilot.press("n")
        await settle(pilot)
        assert app.wb.applied_steps == app.wb.teach_steps[:1]
        await pilot.press("t")
        await settle(pilot)
        assert not app.wb.teaching and app.wb.applied_steps == ["split(sum)"]
        assert app.query_one(HistoryList).count >= 2


async def _emit_from_dialog(pilot, app: CocovizApp, directory, target: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.press("e")
    await pilot.pause()
    screen = app.screen
    assert type(screen).__name__ == "EmitDialog"
    screen.query_one("#dir").value = str(directory)  # type: ignore[attr-defined]
    await pilot.click(f"#{target}")
    await pilot.click("#ok")
    await settle(pilot)


@run_async
async def test_emit_writes_a_cpu_tree_that_builds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    need_mpicxx()  # fails instead of skipping under COCOVIZ_REQUIRE_MPI/NVCC=1
    app = make_app(tmp_path, "megatron_mlp", schedule="fused")
    out = tmp_path / "emitted"
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await _emit_from_dialog(pilot, app, out, "cpu")
        assert app.last_emit is not None
        emitted, written = app.last_emit
    files = {p.name for p in out.iterdir() if p.is_file()}
    assert {"megatron_mlp.cpp", "main.cpp", "Makefile", "manifest.json"} <= files
    assert set(written.written) == set(emitted.files)
    assert '"group": "overlapped"' in (out / "manifest.json").read_text()
    build(out)  # raises BuildError with the compiler's messages
    assert (out / emitted.binary).is_file()


@run_async
async def test_emit_into_a_foreign_directory_is_refused_in_the_ui(tmp_path) -> None:  # type: ignore[no-untyped-def]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not cocoviz's")
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await _emit_from_dialog(pilot, app, foreign, "cpu")
        assert app.is_running and app.last_emit is None
        assert not app.query_one(ErrorPanel).has_class("-shown")
        shown = [n.message for n in app._notifications]
        assert any("cocoviz did not write it" in m for m in shown), shown
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


@run_async
async def test_emit_error_is_shown_as_not_supported(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise EmitError("update of 'w' (sliced) by a replicated value is not supported")

    monkeypatch.setattr(workbench_module, "emitted_files", refuse)
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+o")
        await settle(pilot)
        view = app.query_one(CodeView)
        assert view.files == {}
        assert view.message_text.startswith("not supported by the cuda emitter: update of 'w'")
        await _emit_from_dialog(pilot, app, tmp_path / "out", "cpu")
        titles = [n.title for n in app._notifications]
        assert "not supported by the cpu emitter" in titles, titles
        assert not app.query_one(ErrorPanel).has_class("-shown")
        assert not (tmp_path / "out").exists()


@run_async
async def test_code_pane_shows_both_targets_and_the_diff(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+o")
        await settle(pilot)
        view = app.query_one(CodeView)
        assert {"megatron_mlp.cu", "main.cu", "Makefile", "manifest.json"} <= set(view.files)
        assert view.current == "megatron_mlp.cu"  # the program file first
        assert view.previous is None
        # A step: the previous step's files are kept for the diff.
        app.apply_step("split(sum)")
        await settle(pilot)
        assert view.previous is not None and view.previous != view.files
        assert view.previous["megatron_mlp.cu"] != view.files["megatron_mlp.cu"]
        assert "split(sum)" in view.files["manifest.json"]
        app.query_one("#files").focus()
        await pilot.press("d")
        await settle(pilot)
        assert view.show_diff
        assert "+++ current/megatron_mlp.cu" in view.shown_text
        # The CPU target: C++ + MPI.
        await pilot.press("T")
        await settle(pilot)
        assert app.target == "cpu" and view.target == "cpu"
        assert {"megatron_mlp.cpp", "main.cpp", "Makefile", "manifest.json"} <= set(view.files)
        assert view.previous is not None and "megatron_mlp.cpp" in view.previous
        await pilot.press("T")
        await settle(pilot)
        assert "megatron_mlp.cu" in view.files


@run_async
async def test_autosave_is_offered_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "sgd")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        await pilot.press("i")  # edit mode
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
        assert again.wb.text.startswith("# edited\n")


@run_async
async def test_a_worker_exception_shows_a_panel_and_the_app_keeps_running(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    def broken(program, hw):  # type: ignore[no-untyped-def]
        raise RuntimeError("simulator exploded")

    monkeypatch.setattr(workbench_module, "simulate_timeline", broken)
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
async def test_random_typing_anywhere_does_not_crash(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # random keys reach the emit dialog (`e`, a typed name, `enter`): whatever it writes
    # goes under tmp_path, never into the directory the tests run from
    monkeypatch.chdir(tmp_path)
    rng = random.Random(6)
    # every key but q, which quits wherever the source is not being edited
    keys = list("abcdefghijklmnoprstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789(){}[]=+-*/#,.:;@ ")
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
        line = app.wb.base.stage("sum").span.line  # type: ignore[union-attr]
        assert app.query_one(CocoTextArea).selected_line == line
        # Moving the editor's cursor to a stage's line selects it.
        area = app.query_one(TextArea)
        area.focus()
        await pilot.pause()
        out_line = app.wb.base.stage("out").span.line  # type: ignore[union-attr]
        area.move_cursor((out_line - 1, 0))
        await settle(pilot)
        assert app.selected == "out"


@pytest.mark.parametrize("wrap", [False, True])
@run_async
async def test_the_shaded_source_line_follows_the_selection(tmp_path, wrap: bool) -> None:  # type: ignore[no-untyped-def]
    """Only the rows of the lines selected before and after are drawn again (the others
    come from the editor's cache); wrapped or not, the shade moves with the selection."""
    from cocoviz.tui.widgets.source import COCO_THEME

    shade = COCO_THEME.syntax_styles["selected"].bgcolor
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        area.soft_wrap = wrap
        await settle(pilot)

        def shaded_rows() -> set[int]:
            out = set()
            for y in range(area.scrollable_content_region.height):
                segments = list(area.render_line(y))
                if any(s.style is not None and s.style.bgcolor == shade for s in segments):
                    out.add(y + area.scroll_offset.y)
            return out

        assert app.wb.base is not None
        for name in ("layer", "sum", "layer"):
            app.selected = name
            await settle(pilot)
            line = app.wb.base.stage(name).span.line  # type: ignore[union-attr]
            assert shaded_rows() == set(area._rows_of(line - 1)), name


@run_async
async def test_edit_then_ctrl_end_moves_to_the_end_and_leaves_the_layout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        # Keys pressed before the first parse finishes are commands, not text.
        assert isinstance(app.focused, GraphView)
        await pilot.press("i")
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        assert area.has_focus and area.text == samples.text("megatron_mlp")
        await pilot.press("ctrl+end")
        await pilot.pause()
        assert area.cursor_location == area.document.end
        assert app.screen.maximized is None
        assert area.styles.border_left[0] in ("", "none")
        await pilot.press("ctrl+home")
        await pilot.pause()
        assert area.cursor_location == (0, 0)
        await pilot.press("escape")
        await pilot.pause()
        assert not area.has_focus and app.screen.maximized is None


# --- the first hour of a new user: quit, help, layout, status, hover, code options ---------


@run_async
async def test_q_quits_and_autosaves_but_types_a_q_in_the_editor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.apply_step("split(sum)")
        await settle(pilot)
        await pilot.press("i")
        area = app.query_one(CocoTextArea)
        area.move_cursor((0, 0))
        await pilot.press("q")
        await pilot.pause()
        assert app.is_running and area.text.startswith("q# Megatron")
        # Leave the editor before the edit is parsed: q quits, and the edit is saved.
        await pilot.press("escape", "q")
        await pilot.pause()
        assert not app.is_running
    saved = state.read("sample:megatron_mlp", tmp_path / "state")
    assert saved is not None and saved.source.startswith("q# Megatron")
    assert saved.steps == ("split(sum)",)


def _help_body(app: CocovizApp):  # type: ignore[no-untyped-def]
    from textual.containers import VerticalScroll

    return app.screen.query_one("#help-body", VerticalScroll)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@run_async
async def test_help_opens_at_the_top_scrolls_and_closes(tmp_path, size) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        for close in ("escape", "q", "question_mark"):
            await pilot.press("question_mark")
            await pilot.pause()
            assert type(app.screen).__name__ == "HelpScreen"
            body = _help_body(app)
            assert body.has_focus and body.scroll_y == 0
            await pilot.press("pagedown")
            await pilot.pause()
            paged = body.scroll_y
            assert paged > 0
            await pilot.press("down")
            await pilot.pause()
            assert body.scroll_y == paged + 1
            await pilot.press("end")
            await pilot.pause()
            assert body.scroll_y == body.max_scroll_y
            await pilot.press(close)
            await pilot.pause()
            assert type(app.screen).__name__ != "HelpScreen", close


@run_async
async def test_help_lists_quit_first_every_pane_key_and_searches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cocoviz.tui.widgets.help import HelpScreen

    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        rows = app.key_descriptions()
        assert rows[0][1] == "q / ctrl+q"
        described = {what for _, _, what in rows}
        for cls in (CocovizApp, GraphView, TimelineView, CodeView, CocoTextArea):
            for b in cls.BINDINGS:
                if not b.action.startswith("palette_key"):  # type: ignore[union-attr]
                    assert any(b.description in w for w in described), b  # type: ignore[union-attr]
        assert any(key == "a" and where == "timeline" for where, key, _ in rows)
        await pilot.press("question_mark")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, HelpScreen)
        await pilot.press("slash", *"rank")
        await pilot.pause()
        assert screen.shown and len(screen.shown) < len(rows)
        assert all("rank" in " ".join(r).lower() for r in screen.shown)
        assert any(key == "a" for _, key, _ in screen.shown)
        # q types in the search; escape leaves it, then q closes.
        await pilot.press("q")
        await pilot.pause()
        assert app.screen is screen and not screen.shown
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen and _help_body(app).has_focus
        await pilot.press("q")
        await pilot.pause()
        assert app.screen is not screen


@run_async
async def test_the_status_line_counts_the_current_steps_stages(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        editor = app.query_one(SourceEditor)
        assert editor.status == "ok: megatron_mlp, 3 stages on 8 ranks"
        assert app.apply_step("split(sum)")
        await settle(pilot)
        assert app.wb.program is not None and len(app.wb.program.stages) == 4
        assert editor.status == "ok: megatron_mlp at step 1, 4 stages on 8 ranks"
        assert app.query_one(GraphView).drawing.header.startswith("megatron_mlp: 4 stages")  # type: ignore[union-attr]
        await pilot.press("u")
        await settle(pilot)
        assert editor.status == "ok: megatron_mlp, 3 stages on 8 ranks"


@run_async
async def test_hovering_an_event_describes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cocoviz.tui.widgets.timeline import GUTTER

    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        view = app.query_one(TimelineView)
        assert view.data is not None
        # The comm row's bar is the allreduce `sum`: hover the middle of it.
        row = next(i for i, r in enumerate(view.data.rows) if r.stream == "comm")
        bar = view.data.rows[row].bars[0]
        col = int((bar.start + bar.end) / 2 / view._per_cell())
        before = view.details()
        await pilot.hover(TimelineView, offset=(GUTTER + col, view._header + row))
        await pilot.pause()
        assert view.hover == (row, col)
        assert f": {bar.label or bar.stage} (" in view.details() and view.details() != before
        assert view.cursor_row == 0  # hovering does not move the cursor
        await pilot.hover(GraphView, offset=(1, 1))
        await pilot.pause()
        assert view.hover is None and view.details() == before


@run_async
async def test_the_code_pane_switches_target_collectives_and_arch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+o")
        await settle(pilot)
        views = app.query_one("#views")
        assert views.border_title.startswith("code · cuda · nccl · sm_90")
        app.query_one("#files").focus()
        await pilot.press("N")
        await settle(pilot)
        view = app.query_one(CodeView)
        assert app.code_options.collectives == "nccl-device"
        assert "nccl-device" in views.border_title
        assert (
            '"nccl-device"' in view.files["manifest.json"]
            or "nccl-device" in view.files["manifest.json"]
        )
        await pilot.press("A")
        await settle(pilot)
        assert app.code_options.arch == "sm_100" and "sm_100" in views.border_title
        assert "sm_100" in view.files["Makefile"] + view.files["manifest.json"]
        await pilot.press("T")
        await settle(pilot)
        assert app.target == "cpu" and views.border_title.startswith("code · cpu")
        assert "megatron_mlp.cpp" in view.files
        await pilot.press("ctrl+l")
        await settle(pilot)
        assert views.border_title.startswith("timeline")


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)])
@pytest.mark.parametrize("program", ["megatron_mlp", "gpt24"])
@run_async
async def test_the_layout_shows_whole_lines_and_a_wide_timeline(tmp_path, size, program) -> None:  # type: ignore[no-untyped-def]
    from cocoviz.samples.gpt import gpt_stack
    from cocoviz.tui.pane_layout import TIMELINE_MIN

    if program == "gpt24":
        app = make_app(tmp_path, "gpt24.coco", text=gpt_stack(24))
    else:
        app = make_app(tmp_path, program)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        longest = max(len(line) for line in area.text.splitlines())
        text_cols = area.scrollable_content_region.width - area.gutter_width
        assert area.soft_wrap or longest < text_cols, (longest, text_cols)
        # Opens at the program's header, scrolled only as far as the first statement
        # needs to show (a long header comment on a small terminal).
        first = next(i for i, t in enumerate(area.document.lines) if t and t[0] != "#")
        row = area.wrapped_document.location_to_offset((first, 0)).y if area.soft_wrap else first
        top = area.scroll_offset.y
        assert top <= row < top + area.scrollable_content_region.height
        assert top == 0 or row >= area.scrollable_content_region.height - 1
        timeline = app.query_one(TimelineView)
        if size[0] >= 120:
            assert not app.layout_plan.narrow  # type: ignore[union-attr]
            assert timeline.size.width >= TIMELINE_MIN
            assert area.size.width >= 40
        palette = app.query_one(StepPalette)
        assert palette.size.height >= 5
        # Collapsing the side column gives its room to the other panes.
        panes = [app.query_one(q) for q in ("#left", "#center", "#views")]
        before = sum(p.region.area for p in panes)
        await pilot.press("s")
        await pilot.pause()
        assert not app.query_one("#side").display
        assert sum(p.region.area for p in panes) > before
        await pilot.press("s")
        await pilot.pause()
        assert app.query_one("#side").display


def _pane_text(widget, width: int = 32) -> str:  # type: ignore[no-untyped-def]
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


@run_async
async def test_w_shows_the_crossover_sweep_in_the_cost_pane(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cocoviz.schedule.tune import SweepResult, block_of
    from cocoviz.tui.widgets.cost import CostSummary

    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(140, 42)) as pilot:
        await settle(pilot)
        cost = app.query_one(CostSummary)
        assert "makespan" in _pane_text(cost) and app.wb.crossover() is None  # only on demand
        await pilot.press("w")
        await settle(pilot)
        result = app.wb.crossover()
        assert isinstance(result, SweepResult) and result.dim == "S"
        text = _pane_text(cost)
        assert cost.border_title == "crossover on h100-dgx"
        assert "▶2^11" in text  # the sample's own size, marked
        # the pane's sentences are the sweep's crossovers, by block name: small S is
        # latency-bound and the program as written wins; the overlap pays further up
        assert result.crossovers and result.points[0].winner == "MM-AR-C [mm_ar_c]"
        words = " ".join(text.split())
        for c in result.crossovers:
            winner, loser = (block_of(t) or "as written" for t in (c.winner, c.loser))
            assert f"{winner} beats {loser} from S = 2^{c.value.bit_length() - 1}" in words
        assert result.points[-1].winner != result.points[0].winner
        # A step does not run it again; `w` goes back to the figures.
        await pilot.press("1")
        await settle(pilot)
        assert app.wb.crossover() is result
        await pilot.press("w")
        await settle(pilot)
        assert "makespan" in _pane_text(cost) and cost.border_title == "cost"
