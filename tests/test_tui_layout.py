"""The layout a new user's laptop gets (120×40): every sample's first statement shows
without scrolling (a long header comment scrolls away), the timeline has at least 6
rows, and an overlapped group's frame is labelled in the graph."""

from __future__ import annotations

import pytest
from rich.style import Style
from tui_support import make_app, run_async, settle

from cocoviz import samples
from cocoviz.ir.lower import load_program
from cocoviz.schedule import apply_steps
from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile
from cocoviz.tui.graph_layout import layout_graph
from cocoviz.tui.widgets.source import CocoTextArea
from cocoviz.tui.widgets.timeline import TimelineView


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


@pytest.mark.parametrize("name", samples.names())
@run_async
async def test_the_first_statement_and_six_timeline_rows_show_at_120x40(tmp_path, name) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, name)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        lines = area.document.lines
        first = next(i for i, t in enumerate(lines) if t.strip() and not t.startswith("#"))
        if area.soft_wrap:
            row = area.wrapped_document.location_to_offset((first, 0)).y
        else:
            row = first
        top, height = area.scroll_offset.y, area.scrollable_content_region.height
        assert top <= row < top + height, (name, row, top, height)
        assert app.query_one(TimelineView).region.height >= 6


def _graph_text(program) -> str:  # type: ignore[no-untyped-def]
    """The graph as the pane draws it: the header on the first row (GraphView), then the
    drawing's rows."""
    drawing = layout_graph(program)
    rows = [drawing.header]
    for y in range(1, drawing.height):
        rows.append("".join(seg.text for seg in drawing.render_row(y, None, Style())))
    return "\n".join(rows)


@pytest.mark.parametrize(
    ("steps", "label"),
    [
        (["overlap(layer, sum, chunks=4)"], "overlapped ×4"),
        (["split(sum)", "reorder(sum)", "fuse(sum_rs, out)"], "fused"),
    ],
)
def test_a_group_frame_is_labelled_in_the_graph(steps: list[str], label: str) -> None:
    hw = load_profile(DEFAULT_PROFILE)
    program = apply_steps(load_program(samples.text("megatron_mlp")), steps, hw)
    text = _graph_text(program)
    header = text.splitlines()[0]
    assert header.startswith("megatron_mlp:"), header
    assert f" {label} " in text, text
