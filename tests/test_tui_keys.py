"""The focus and key model (cocoviz/tui/keys.py): Tab and Shift-Tab move between panes
and never type; command keys reach the app wherever the source is not in edit mode;
`i`/`enter` enter edit mode and `escape` leaves it; the footer names the focused pane
and lists its keys first, at every size."""

from __future__ import annotations

import pytest
from tui_support import make_app, run_async, settle

from cocoviz import samples
from cocoviz.tui.keys import APP_BINDINGS
from cocoviz.tui.widgets.footer import KeyFooter
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.source import CocoTextArea

SIZES = [(80, 24), (120, 40), (200, 50)]


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def _pane(app) -> str:  # type: ignore[no-untyped-def]
    return type(app.focused).__name__


@run_async
async def test_tab_and_shift_tab_cycle_the_panes_and_never_type(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    text = samples.text("megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        area = app.query_one(CocoTextArea)
        forward = [_pane(app)]
        for _ in range(6):
            await pilot.press("tab")
            await pilot.pause()
            forward.append(_pane(app))
            assert area.text == text and not area.editing
        # Every pane is a stop, the tabs' row is not, and the cycle closes.
        assert forward[:6] == [
            "GraphView",
            "StepPalette",
            "HistoryList",
            "TimelineView",
            "CocoTextArea",
            "GraphView",
        ], forward
        backward = [_pane(app)]
        for _ in range(5):
            await pilot.press("shift+tab")
            await pilot.pause()
            backward.append(_pane(app))
            assert area.text == text and not area.editing
        assert backward == list(reversed(forward[1:7])), backward
        # In edit mode Tab still only moves the focus, and leaves edit mode.
        await pilot.press("i")
        assert area.has_focus and area.editing
        await pilot.press("tab")
        await pilot.pause()
        assert not area.has_focus and not area.editing and area.text == text


@run_async
async def test_a_command_key_in_the_source_runs_the_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    text = samples.text("megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.apply_step("split(sum)")
        await settle(pilot)
        await pilot.press("shift+tab")  # graph → source
        await pilot.pause()
        area = app.query_one(CocoTextArea)
        assert area.has_focus and not area.editing and area.read_only
        await pilot.press("u")
        await settle(pilot)
        assert app.wb.position == 0 and area.text == text
        await pilot.press("1")  # the palette's first step, as in every pane
        await settle(pilot)
        assert app.wb.position == 1 and area.text == text
        # enter starts editing; then the same keys type, and escape leaves.
        await pilot.press("enter")
        assert area.editing and not area.read_only
        area.move_cursor((0, 0))
        await pilot.press("u")
        assert area.text == "u" + text and app.wb.position == 1
        await pilot.press("escape")
        await pilot.pause()
        assert not area.editing and isinstance(app.focused, GraphView)


@run_async
async def test_edit_mode_shows_in_the_pane_title_and_the_footer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        left = app.query_one("#left")
        await pilot.press("i")
        await settle(pilot)
        footer = app.query_one(KeyFooter)
        assert "EDIT" in str(left.border_title)
        assert footer.text().startswith("EDIT source  esc Stop editing"), footer.text()
        # Letter keys type now: the footer does not offer them.
        assert "u Undo" not in footer.text()
        await pilot.press("escape")
        await settle(pilot)
        assert "EDIT" not in str(left.border_title)


PANE_KEYS = {
    "graph": ("graph", "↑↓←→  Select stage"),
    "source": ("source", "enter Edit"),
    "palette": ("steps", "⏎ Apply step"),
    "history": ("history", "⏎ Go to step"),
    "timeline": ("timeline", "↑↓←→  Cursor"),
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@run_async
async def test_the_footer_names_the_focused_pane_and_its_keys_first(tmp_path, size) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        footer = app.query_one(KeyFooter)
        for pane, (name, keys) in PANE_KEYS.items():
            widget = app.query_one(f"#{'editor' if pane == 'source' else pane}")
            widget.focus()
            await pilot.pause()  # focus starts no worker: the footer is recomposed after a refresh
            await pilot.pause()
            text = footer.text()
            assert text.startswith(f"{name}  {keys}"), (size, pane, text)
            # The pane's keys come before the app's and are on the screen.
            assert text.index(keys) < text.index("q Quit")
            for label in footer.query("FooterLabel, FooterKey, KeyGroup"):
                if keys.split()[-1] in str(label.render()):
                    assert label.region.right <= size[0], (pane, label.region)
        app.action_view("code")
        await settle(pilot)
        app.query_one("#files").focus()
        await settle(pilot)
        assert footer.text().startswith("code  d Diff vs previous step"), footer.text()


def test_every_app_binding_has_a_description() -> None:
    for b in APP_BINDINGS:
        assert b.description, b
