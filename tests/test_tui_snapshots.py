"""Snapshots of the TUI (pytest-textual-snapshot): fixed terminal sizes, no clocks.

Update deliberately with `pytest tests/test_tui_snapshots.py --snapshot-update` and
read the diff of the SVGs."""

from __future__ import annotations

import pytest
from textual.widgets import Input
from tui_support import make_app, settle

from cocoviz import samples


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def test_start_screen(snap_compare, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    assert snap_compare(app, terminal_size=(140, 42), run_before=settle)


def test_start_screen_80x24(snap_compare, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


def test_overlapped_schedule(snap_compare, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp", schedule="fused")

    async def before(pilot):  # type: ignore[no-untyped-def]
        await settle(pilot)
        pilot.app.selected = "sum_rs"
        await settle(pilot)

    assert snap_compare(app, terminal_size=(140, 42), run_before=before)


def test_error_state(snap_compare, tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = samples.text("megatron_mlp").replace(
        "out   = dropout(sum + b, 0.1) + r", "out   = dropout(sum + bias, 0.1) + r"
    )
    app = make_app(tmp_path, "megatron_mlp", text=text)
    assert snap_compare(app, terminal_size=(140, 42), run_before=settle)


def test_teach_mode(snap_compare, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp", teach_mode=True)

    async def before(pilot):  # type: ignore[no-untyped-def]
        await settle(pilot)  # the tuner's best is found, teach mode starts
        await pilot.press("n")  # its one step: the last
        await settle(pilot)

    assert snap_compare(app, terminal_size=(140, 42), run_before=before)


SIZES = [(80, 24), (120, 40), (200, 50)]
"""The sizes a new user's terminal has: the smallest usable, a laptop's, a wide one."""


def _keys(*keys: str):  # type: ignore[no-untyped-def]
    """A run_before that settles, presses `keys`, and settles again."""

    async def before(pilot):  # type: ignore[no-untyped-def]
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)
        await pilot.pause(0.1)
        await settle(pilot)

    return before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_first_screen(snap_compare, tmp_path, size) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    assert snap_compare(app, terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_help(snap_compare, tmp_path, size) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    assert snap_compare(app, terminal_size=size, run_before=_keys("question_mark"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_command_palette(snap_compare, tmp_path, size) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")

    async def before(pilot):  # type: ignore[no-untyped-def]
        await settle(pilot)
        # steps and actions both match: the steps with their predicted times
        await pilot.press("ctrl+p", *"step overlap")
        # The palette searches in the background (the steps' times in a thread): wait
        # until its list has the three steps and stops changing.
        from textual.command import CommandList

        seen: list[str] = []
        for _ in range(100):
            await pilot.pause(0.1)
            results = pilot.app.screen.query_one(CommandList)
            now = [str(results.get_option_at_index(i).prompt) for i in range(results.option_count)]
            if len(now) >= 3 and now == seen:
                break
            seen = now
        pilot.app.screen.query_one(Input).cursor_blink = False  # no clock in the picture
        await settle(pilot)

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_code_view(snap_compare, tmp_path, size) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    assert snap_compare(app, terminal_size=size, run_before=_keys("ctrl+o"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_footer_of_the_source_pane(snap_compare, tmp_path, size) -> None:  # type: ignore[no-untyped-def]
    """The source focused in command mode: the footer names it and its key (enter to
    edit) before the app's keys, at every size (the graph's: test_first_screen)."""
    app = make_app(tmp_path, "megatron_mlp")
    assert snap_compare(app, terminal_size=size, run_before=_keys("shift+tab"))
