"""The command palette (ctrl+p) finds steps legal on the current program with their
predicted times, the program's schedule blocks, the samples, and the app's actions."""

from __future__ import annotations

import pytest
from textual.command import CommandList, CommandPalette
from tui_support import make_app, run_async, settle

from cocoviz import samples
from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile
from cocoviz.timefmt import format_time
from cocoviz.workbench import finder


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


async def _search(pilot, query: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Open the palette, type `query`, wait for the results; their prompts as text."""
    await pilot.press("ctrl+p", *query)
    shown: list[str] = []
    for _ in range(30):  # the palette searches in the background
        await pilot.pause(0.1)
        assert isinstance(pilot.app.screen, CommandPalette)
        results = pilot.app.screen.query_one(CommandList)
        now = [str(results.get_option_at_index(i).prompt) for i in range(results.option_count)]
        if now and now == shown:
            break
        shown = now
    return shown


@run_async
async def test_the_palette_finds_a_step_with_its_predicted_time_and_applies_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app.selected = "out"  # the step is found wherever the selection is
        await settle(pilot)
        found = await _search(pilot, "split(sum)")
        assert found and found[0].startswith("step split(sum)"), found
        program = app.wb.program
        assert program is not None
        after = finder.predicted(program, ["split(sum)"], app.wb.hw)
        assert after is not None and f"predicted {format_time(after)}" in found[0], found[0]
        await pilot.press("enter")
        await settle(pilot)
        assert app.wb.applied_steps == ["split(sum)"]


@run_async
async def test_the_palette_opens_a_sample_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        found = await _search(pilot, "moe_layer")
        assert found and found[0].startswith("open sample moe_layer"), found
        await pilot.press("enter")
        await settle(pilot)
        assert app.wb.base is not None and app.wb.base.name == "moe_layer"
        assert app.query_one("#editor").text == samples.text("moe_layer")  # type: ignore[attr-defined]
        assert "moe_layer.coco" in str(app.query_one("#left").border_title)
        # The palette now finds the new program's steps.
        await pilot.press("escape")
        found = await _search(pilot, "step overlap(y")
        assert found and found[0].startswith("step overlap(y, "), found


@run_async
async def test_the_palette_applies_a_schedule_block_and_lists_actions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "megatron_mlp")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        base = app.wb.base
        assert base is not None
        blocks = finder.schedule_choices(base, load_profile(DEFAULT_PROFILE))
        fused = next(b for b in blocks if b.name == "fused")
        found = await _search(pilot, "schedule fused")
        assert found and found[0].startswith("schedule fused"), found
        await pilot.press("enter")
        await settle(pilot)
        assert app.wb.applied_steps[: len(fused.steps)] == list(fused.steps)
        await pilot.press("escape")
        found = await _search(pilot, "undo")
        assert any(f.startswith("Undo") for f in found), found
