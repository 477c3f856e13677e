"""Snapshots of the TUI (pytest-textual-snapshot): fixed terminal sizes, no clocks.

Update deliberately with `pytest tests/test_tui_snapshots.py --snapshot-update` and
read the diff of the SVGs."""

from __future__ import annotations

import pytest
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
        await settle(pilot)
        await pilot.press("n")
        await settle(pilot)
        await pilot.press("n")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(140, 42), run_before=before)
