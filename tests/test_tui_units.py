"""The TUI's headless pieces: graph layout, highlighting, autosave, timeline rows."""

from __future__ import annotations

import re

import pytest
from rich.style import Style

from cocoviz import samples
from cocoviz.ir.lower import load_program
from cocoviz.timefmt import format_time
from cocoviz.tui.graph_layout import layout_graph
from cocoviz.tui.highlight import lex_line
from cocoviz.tui.timeline_rows import Bar, Row, nice_step, render_bars
from cocoviz.workbench import state


def _text(drawing, y):  # type: ignore[no-untyped-def]
    return "".join(s.text for s in drawing.render_row(y, None, Style()))


@pytest.mark.parametrize("name", samples.names())
def test_every_sample_lays_out_without_overlapping_boxes(name: str) -> None:
    program = load_program(samples.text(name), name)
    d = layout_graph(program)
    assert set(d.nodes) == {s.name for s in program.stages}
    boxes = list(d.nodes.values())
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            apart = a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + 5 <= b.y or b.y + 5 <= a.y
            assert apart, (a.name, b.name)
    for n in boxes:
        assert n.name in _text(d, n.y)


def test_megatron_graph_draws_edges_into_boxes() -> None:
    d = layout_graph(load_program(samples.text("megatron_mlp"), "m"))
    layer, total = d.nodes["layer"], d.nodes["sum"]
    assert total.y > layer.y
    # The arrow into `sum` sits right above its box.
    assert _text(d, total.y - 1)[total.cx] == "▼"
    assert "local" in _text(d, layer.y + 3)  # layout on the node


def test_graph_neighbours_follow_layers() -> None:
    d = layout_graph(load_program(samples.text("megatron_mlp"), "m"))
    assert d.neighbour("layer", "down") == "sum"
    assert d.neighbour("sum", "up") == "layer"
    assert d.neighbour("layer", "up") is None


def test_large_stack_renders_any_row_quickly() -> None:
    from cocoviz.samples.gpt import gpt_stack

    d = layout_graph(load_program(gpt_stack(4), "gpt4"))
    assert len(d.nodes) == 4 * 21
    assert all(len(_text(d, y)) == d.width for y in range(0, d.height, 7))


def test_highlighter_names_the_language_parts() -> None:
    names = {n for _, _, n in lex_line("sum   = allreduce(+, layer)   # replicated")}
    assert {"collective", "comment", "operator"} <= names
    assert "keyword" in {n for *_, n in lex_line("input w : f16[H] sliced(0)")}
    # Byte offsets, not characters, after a non-ASCII comment character.
    line = "x = y  # é then sum(x)"
    hl = list(lex_line(line))
    assert hl[-1] == (len(line[: line.index("#")].encode()), len(line.encode()), "comment")


def test_autosave_round_trip_and_corrupt_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    save = state.Autosave("sample:megatron_mlp", "program p\n", ("split(sum)",), 1.0)
    path = state.write(save, tmp_path)
    assert path.parent.parent == tmp_path
    assert state.read("sample:megatron_mlp", tmp_path) == save
    path.write_text("{not json")
    assert state.read("sample:megatron_mlp", tmp_path) is None
    state.clear("sample:megatron_mlp", tmp_path)
    assert state.read("sample:megatron_mlp", tmp_path) is None


def test_state_dir_follows_xdg(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert state.state_dir() == tmp_path / "cocoviz"


def test_timeline_rows_render_bars_and_times() -> None:
    row = Row(
        0, "comm", (Bar("sum_rs", "collective", 1e-6, 5e-6), Bar("out", "collective", 5e-6, 6e-6))
    )
    cells = render_bars(row, 0.0, 1e-6 / 2, 14)
    assert "".join(c for c, _, _ in cells[2:8]) == "sum_rs"
    assert cells[0][1] == "" and cells[2][2] == "sum_rs" and cells[10][2] == "out"
    assert format_time(2.5e-6) == "2.50 µs"
    assert format_time(425.8e-6) == "426 µs"
    assert format_time(3.25e-3) == "3.25 ms"
    assert nice_step(425e-6, 5) == pytest.approx(100e-6)


def test_axis_labels_are_whole_and_apart() -> None:
    from cocoviz.tui.timeline_rows import axis_labels

    for n in (10, 26, 40, 59, 75, 180):
        for makespan in (426e-6, 1.234e-3, 9.9e-6, 2.5):
            axis = axis_labels(n, 0.0, makespan / n)
            assert len(axis) == n
            # "0", then whole labels (`┆`, a number and its unit), a space or more apart.
            assert re.fullmatch(r"0( +┆[0-9.]+ (ns|µs|ms|s))* *", axis), axis


@pytest.mark.parametrize(
    ("width", "height", "narrow", "wrap"),
    [(80, 23, True, True), (120, 39, False, True), (200, 49, False, False)],
)
def test_pane_layout_rules(width: int, height: int, narrow: bool, wrap: bool) -> None:
    from cocoviz.tui.pane_layout import SOURCE_MIN, TIMELINE_MIN, Needs, plan, source_need

    need = source_need(samples.text("megatron_mlp").splitlines())
    assert need == 106 + 2 + 2 + 2  # the longest line, the gutter, cursor and scrollbar
    p = plan(width, height, Needs(need, 37, 5))
    assert (p.narrow, p.wrap) == (narrow, wrap)
    assert sum(p.columns) == width and sum(p.rows) == height
    if not narrow:
        assert p.source_width >= SOURCE_MIN and sum(p.columns[1:]) >= TIMELINE_MIN
        assert p.rows[1] >= 9 and p.rows[0] >= height // 2
    else:
        assert p.rows[1] >= 11  # the steps have room in the lower half
    # The code tab takes half the height; a collapsed side column gives its width away.
    assert plan(width, height, Needs(need, 37, 5, code=True)).rows[1] >= height // 2
    folded = plan(width, height, Needs(need, 37, 5), side=False)
    assert not folded.side and len(folded.columns) == 2 and sum(folded.columns) == width


def test_a_short_source_is_never_wrapped_on_a_wide_terminal() -> None:
    from cocoviz.tui.pane_layout import Needs, plan

    p = plan(120, 39, Needs(48, 36, 5))
    assert not p.wrap and p.source_width == 48 and not p.narrow


def test_a_step_lays_out_again_only_the_blocks_it_changed_and_draws_the_same() -> None:
    from cocoviz.samples.gpt import gpt_stack
    from cocoviz.schedule import Session
    from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile
    from cocoviz.tui import graph_layout

    program = load_program(gpt_stack(4), "gpt4")
    session = Session(program, load_profile(DEFAULT_PROFILE))
    programs = [program]
    for step in program.schedules[-1].steps:
        session.apply(str(step))
        programs.append(session.program)
    graph_layout._BLOCKS.clear()
    warm = []
    for p in programs:
        before = len(graph_layout._BLOCKS)
        warm.append(layout_graph(p))
        if p is not program:  # a step touches one layer of the stack: a few of its blocks
            assert 0 < len(graph_layout._BLOCKS) - before <= 3
    for p, d in zip(programs, warm, strict=True):
        graph_layout._BLOCKS.clear()
        cold = layout_graph(p)
        assert (cold.width, cold.height, cold.layers) == (d.width, d.height, d.layers)
        for y in range(d.height):
            assert cold.render_row(y, "l1_y", Style()) == d.render_row(y, "l1_y", Style())


def _programs_and_their_steps(name: str) -> list:  # type: ignore[type-arg]
    """A sample and the program after each step of its last schedule block."""
    from cocoviz.schedule import Session
    from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile

    program = load_program(samples.text(name), name)
    out = [program]
    if program.schedules:
        session = Session(program, load_profile(DEFAULT_PROFILE))
        for step in program.schedules[-1].steps:
            session.apply(str(step))
            out.append(session.program)
    return out


@pytest.mark.parametrize("name", samples.names())
def test_the_ir_caches_give_what_walking_the_expressions_gives(name: str) -> None:
    """The layout reads the graph through the IR's per-expression caches (reads, sliced
    reductions) over every step of a schedule: what a fresh walk of each expression gives."""
    from cocoviz.ir.graph import stage_reads, stage_reductions
    from cocoviz.ir.nodes import REDUCTIONS

    for program in _programs_and_their_steps(name):
        for s in program.stages:
            assert stage_reads(s) == set(s.expr.refs())
            walked = [
                e for e in s.expr.walk() if e.op in REDUCTIONS and e.args[0].type.layout.is_sliced
            ]
            assert list(stage_reductions(s)) == walked
