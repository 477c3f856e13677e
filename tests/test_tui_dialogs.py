"""The dialogs a new user meets first: the autosave prompt says what restoring replaces
and keeps the steps given with `--schedule` unless asked; the save dialog's name field
has the focus."""

from __future__ import annotations

import pytest
from textual.widgets import Input, Label
from tui_support import make_app, run_async, settle

from cocoviz.workbench import state


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


async def _autosave_one_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.apply_step("split(sum)")
        await settle(pilot)
    saved = state.read("sample:megatron_mlp", tmp_path / "state")
    assert saved is not None and saved.steps == ("split(sum)",)


@run_async
async def test_schedule_wins_over_the_autosave_unless_restored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    await _autosave_one_step(tmp_path)
    app = make_app(tmp_path, "megatron_mlp", schedule="ol_mm_ar_c")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        dialog = app.screen
        assert type(dialog).__name__ == "RestoreDialog"
        said = str(dialog.query_one("#replaces", Label).render())
        assert "the 1 step(s) given with --schedule (overlap(layer, sum, chunks=4))" in said
        assert dialog.focused is not None and dialog.focused.id == "discard"
        await pilot.press("enter")  # the focused button keeps --schedule
        await settle(pilot)
        assert app.wb.applied_steps == ["overlap(layer, sum, chunks=4)"]

    await _autosave_one_step(tmp_path)  # keeping --schedule autosaved its steps
    again = make_app(tmp_path, "megatron_mlp", schedule="ol_mm_ar_c")
    async with again.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("r")
        await pilot.pause(0.6)
        await settle(pilot)
        assert again.wb.applied_steps == ["split(sum)"]


@run_async
async def test_the_save_dialog_types_into_its_name_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        field = app.screen.query_one("#path", Input)
        assert field.has_focus
        field.value = ""
        out = tmp_path / "mine.sched"
        await pilot.press(*str(out), "enter")
        await settle(pilot)
        assert out.exists()
