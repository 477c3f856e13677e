"""The TUI on large programs (issue 31, item 7): what costs time in proportion to the
program is done off the event loop (the graph's layout, the palette of the selected
stage: `cocoviz.tui.offload`) or only for what the screen shows (the timeline's bars, the
editor's rows). Timings are in `bench/bench_tui_huge.py`; these tests check the
behaviour, with `INLINE_STAGES` lowered so that a sample counts as large."""

from __future__ import annotations

import random

import pytest
from tui_support import make_app, run_async, settle

from cocoviz.schedule import palette
from cocoviz.tui import offload
from cocoviz.tui.graph_layout import layout_graph
from cocoviz.tui.timeline_rows import Bar, Row, render_bars
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.palette import StepPalette
from cocoviz.tui.widgets.source import CocoTextArea, CountedRows


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def _header(graph: GraphView) -> str:
    return graph.render_line(0).text


@run_async
async def test_a_large_program_is_laid_out_and_its_palette_found_in_a_worker(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(offload, "INLINE_STAGES", 2)
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        graph, steps = app.query_one(GraphView), app.query_one(StepPalette)
        program = app.wb.program
        assert program is not None and len(program.stages) > offload.INLINE_STAGES
        assert graph.drawing is not None and not graph.pending
        assert graph.drawing.nodes == layout_graph(program).nodes
        assert app.selected is not None
        legal = [e.step for e in palette(program, app.selected, app.wb.hw) if e.ok]
        assert steps.keyed == legal[:9] and legal

        # A step: the screen is redrawn at once, the graph keeps the previous drawing
        # (its header says a new one is being laid out) and the palette says what it
        # waits for; both come from the workers, which have not run yet.
        old = graph.drawing
        assert app.apply_step("split(sum)")
        assert graph.pending and graph.drawing is old
        assert _header(graph).startswith("laying out this step's graph…")
        assert steps.keyed == [] and "finding the steps" in str(steps.get_option_at_index(0).prompt)
        await settle(pilot)
        after = app.wb.program
        assert after is not None and after is not program
        assert not graph.pending and graph.drawing is not old
        assert graph.drawing is not None and graph.drawing.nodes == layout_graph(after).nodes
        assert "laying out" not in _header(graph)
        assert app.selected is not None
        legal = [e.step for e in palette(after, app.selected, app.wb.hw) if e.ok]
        assert steps.keyed == legal[:9]
        # Undo: the drawing kept for the program before the step is shown at once.
        await pilot.press("u")
        assert graph.drawing is old and not graph.pending


@run_async
async def test_only_the_latest_selection_of_a_large_program_is_searched(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(offload, "INLINE_STAGES", 2)
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        program = app.wb.program
        assert program is not None
        searched: list[str] = []
        find = app.wb.find_palette

        def counted(p, stage):  # type: ignore[no-untyped-def]
            searched.append(stage)
            return find(p, stage)

        monkeypatch.setattr(app.wb, "find_palette", counted)
        names = [s.name for s in program.stages if s.name != app.selected][:5]
        for name in names:  # faster than any search: one key after another
            app.selected = name
        await settle(pilot)
        assert searched == [names[-1]]
        assert app.query_one(StepPalette).entries  # shown for the last one
        app.selected = names[0]  # the palette of a program is kept: no search again
        await settle(pilot)
        assert searched == [names[-1], names[0]]
        app.selected = names[-1]
        await settle(pilot)
        assert searched == [names[-1], names[0]]


def _render_all(row: Row, t0: float, per_cell: float, width: int) -> list[tuple[str, str, str]]:
    """`render_bars` as it was before it skipped bars: every bar tested."""
    cells: list[tuple[str, str, str]] = [(" ", "", "")] * width
    for b in row.bars:
        c0 = int((b.start - t0) / per_cell)
        c1 = max(c0 + 1, int(round((b.end - t0) / per_cell)))
        if c1 <= 0 or c0 >= width:
            continue
        c0, c1 = max(c0, 0), min(c1, width)
        n = c1 - c0
        if n == 1:
            cells[c0] = (" ", b.kind, b.stage)
            continue
        name = b.label or b.stage
        chars = name if n > len(name) + 1 else "▏"
        chars += " " * (n - len(chars))
        cells[c0:c1] = [(ch, b.kind, b.stage) for ch in chars]
    return cells


def test_render_bars_draws_what_testing_every_bar_draws() -> None:
    rng = random.Random(31)
    for _ in range(300):
        bars = []
        t = 0.0
        for i in range(rng.randint(0, 60)):
            t += rng.choice([0.0, rng.random() * 3e-6])  # gaps, and bars that touch
            length = rng.choice([1e-9, rng.random() * 5e-6, rng.random() * 40e-6])
            bars.append(Bar(f"s{i}", rng.choice(["compute", "collective"]), t, t + length))
            if rng.random() < 0.2:  # an overlapping bar, starting later, ending sooner
                bars.append(Bar(f"o{i}", "p2p", t + length / 3, t + length / 2))
        bars.sort(key=lambda b: (b.start, b.end))
        row = Row(0, "compute", tuple(bars))
        span = max((b.end for b in bars), default=1e-6)
        width = rng.randint(1, 120)
        per_cell = span / width / rng.choice([1, 2, 8, 64])
        t0 = rng.random() * span
        t0 = rng.choice([0.0, t0, t0 - t0 % per_cell])  # on a cell's edge, too
        assert render_bars(row, t0, per_cell, width) == _render_all(row, t0, per_cell, width)


@run_async
async def test_the_editors_height_is_its_row_count_after_edits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        doc = area.wrapped_document
        assert isinstance(doc, CountedRows)

        def summed() -> int:
            return sum(len(offsets) + 1 for offsets in area.wrapped_document._wrap_offsets)

        assert doc.height == summed() >= area.document.line_count
        for wrap in (True, False, True):
            area.soft_wrap = wrap
            await pilot.pause()
            assert area.wrapped_document.height == summed()
        await pilot.press("i")
        area.move_cursor((3, 0))
        for key in ("x", "enter", "y", "enter", "backspace", "ctrl+k"):
            await pilot.press(key)
            assert area.wrapped_document.height == summed()
        area.load_text("a\nb\n" + "long line " * 40)
        await pilot.pause()
        assert isinstance(area.wrapped_document, CountedRows)
        assert area.wrapped_document.height == summed() > 3


def test_the_drawings_kept_are_bounded_by_stages(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Undo and redo reuse drawings, within a count and a number of stages in all."""
    from cocoviz.ir.lower import load_program
    from cocoviz.samples.gpt import gpt_stack
    from cocoviz.tui.widgets import graph as graph_module

    view = GraphView()
    big = load_program(gpt_stack(8), "gpt8")
    n = len(big.stages)
    kept_at_most = graph_module.STAGES_KEPT // n
    programs = [load_program(gpt_stack(8), "gpt8") for _ in range(kept_at_most + 3)]
    for p in programs:
        view._keep(p, layout_graph(p))
    assert len(view._drawings) == min(kept_at_most, graph_module.DRAWINGS_KEPT)
    assert sum(len(p.stages) for p, _ in view._drawings.values()) <= graph_module.STAGES_KEPT
    assert view._kept(programs[-1]) is not None and view._kept(programs[0]) is None


@run_async
async def test_a_large_programs_objects_are_left_out_of_collections(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Once a large program's step is drawn its objects are frozen (`gc.freeze`): a full
    collection no longer walks them. A small program's are not. The thread switch
    interval is short while the app runs, and restored after."""
    import gc
    import sys

    switch = sys.getswitchinterval()
    gc.unfreeze()
    try:
        app = make_app(tmp_path, "megatron_mlp")
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            assert gc.get_freeze_count() == 0 and gc.isenabled()
            assert sys.getswitchinterval() == min(switch, offload.SWITCH_INTERVAL_S)
            monkeypatch.setattr(offload, "INLINE_STAGES", 2)
            assert app.apply_step("split(sum)")
            assert not gc.isenabled()  # paused until the step's timeline is drawn
            await settle(pilot)
            assert gc.isenabled() and gc.get_freeze_count() > 0
        assert sys.getswitchinterval() == switch
    finally:
        gc.unfreeze()


@run_async
async def test_the_timeline_lays_out_a_rows_bars_once_per_window(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A cursor move redraws the rows' styles from the bars laid out for the window; a
    zoom lays them out again. The merged rows of a timeline are made once."""
    from cocoviz.tui.widgets import timeline as timeline_module
    from cocoviz.tui.widgets.timeline import TimelineView

    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        view = app.query_one(TimelineView)
        assert view.data is not None and view._given[0] is not None
        assert view._given[0].merged() is view.data  # made once, in the worker
        calls: list[int] = []
        real = timeline_module.render_bars

        def counted(row, t0, per_cell, width):  # type: ignore[no-untyped-def]
            calls.append(width)
            return real(row, t0, per_cell, width)

        monkeypatch.setattr(timeline_module, "render_bars", counted)
        view.focus()
        await pilot.pause()
        before = [view.render_line(y).text for y in range(view.size.height)]
        assert not calls  # drawn before: the bars of this window were laid out already
        await pilot.press("right")
        await pilot.pause()
        after = [view.render_line(y).text for y in range(view.size.height)]
        assert not calls and after != before  # the cursor moved: the details line says so
        await pilot.press("plus")
        await pilot.pause()
        view.render_line(view._header)
        assert calls  # another window


def test_the_layouts_caches_are_bounded_in_stages_not_steps() -> None:
    """The boxes and blocks kept for the next layout hold their stages alive: however
    many programs are laid out, they keep the least recently used out beyond their
    bounds (a long session held every stage it had ever drawn)."""
    from cocoviz.ir.lower import load_program
    from cocoviz.samples.gpt import gpt_stack
    from cocoviz.tui import graph_layout as gl

    text = gpt_stack(2)
    n = len(load_program(text, "g").stages)
    programs = [load_program(text, "g") for _ in range(gl.LINES_KEPT // n + 3)]
    drawn = [layout_graph(p) for p in programs]
    assert len(gl._LINES) <= gl.LINES_KEPT and len(gl._BLOCKS) <= gl.BLOCKS_KEPT
    assert all(s is not None for s, *_ in gl._LINES.values())
    kept = {id(s) for s in programs[-1].stages}
    assert kept <= set(gl._LINES)  # the last program's boxes, the most recent
    assert layout_graph(programs[0]).nodes == drawn[0].nodes  # described again, the same
