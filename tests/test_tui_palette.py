"""The step palette (cocoviz/schedule/palette.py): every legal overlap group through a
stage and the `decompose` pairs, offered in the TUI with Pilot and applied from it; the
K a palette's overlap shows is the K applying it gives; and a decomposed group as the
graph draws it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tui_support import make_app, run_async, settle

from cocoviz import samples
from cocoviz.errors import CocovizError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import COLLECTIVES, GroupKind, Program
from cocoviz.ir.transforms.base import index
from cocoviz.schedule import apply_step, palette
from cocoviz.schedule.palette import MAX_CHAIN_ITEMS, MAX_OFFERED, overlap_chains
from cocoviz.sim.hardware import default_hardware
from cocoviz.tui.app import CocovizApp
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.palette import StepPalette

SP_MLP = Path(__file__).resolve().parent / "programs" / "sp_mlp.coco"
HW = default_hardware()
MOE_BEST = ("y", "h", "a", "o", "back")
"""moe_layer's own best schedule: `overlap(y, h, a, o, back, chunks=4)`."""


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def _moe() -> Program:
    return load_program(samples.text("moe_layer"), "moe_layer.coco")


def _sp_mlp() -> Program:
    return load_program(SP_MLP.read_text(), "sp_mlp.coco")


def _offered(program: Program, stage: str) -> dict[str, bool]:
    return {e.step: e.ok for e in palette(program, stage, HW)}


def _legal_overlaps(program: Program, stage: str) -> set[tuple[str, ...]]:
    return {
        tuple(re.findall(r"\w+", e.step)[1:])
        for e in palette(program, stage, HW)
        if e.ok and e.step.startswith("overlap(")
    }


def _every_chain(program: Program, stage: str) -> list[tuple[str, ...]]:
    """Every chain of consecutive ungrouped stages through `stage`, each reading its
    predecessor, by brute force (the programs here have no groups)."""
    idx = index(program)
    assert not program.groups
    users = {s.name: idx.users(s.name) for s in program.stages}
    chains: list[tuple[str, ...]] = []

    def extend(chain: tuple[str, ...]) -> None:
        if len(chain) >= 2 and stage in chain:
            chains.append(chain)
        if len(chain) < MAX_CHAIN_ITEMS:
            for u in users[chain[-1]]:
                extend((*chain, u))

    for s in program.stages:
        extend((s.name,))
    return chains


def _applies(program: Program, step: str) -> bool:
    try:
        apply_step(program, step, HW)
    except CocovizError:
        return False
    return True


# --- what the palette offers -------------------------------------------------------------


@pytest.mark.parametrize("stage", ["y", "h", "a", "o", "back"])
def test_moe_the_palette_offers_every_legal_overlap_group(stage: str) -> None:
    program = _moe()
    talks = {s.name for s in program.stages if s.expr.op in COLLECTIVES}
    # legal: applying it (with the model's K) works; a group of three or more is offered
    # when it overlaps communication
    want = {
        c
        for c in _every_chain(program, stage)
        if (len(c) == 2 or talks & set(c)) and _applies(program, f"overlap({', '.join(c)})")
    }
    assert len(want) - sum(len(c) == 2 for c in want) <= MAX_OFFERED  # nothing cut here
    assert _legal_overlaps(program, stage) == want
    assert MOE_BEST in want
    # the sample's own best group comes first: it overlaps both all-to-alls
    first = next(e for e in palette(program, stage, HW) if e.step.startswith("overlap("))
    assert first.step == f"overlap({', '.join(MOE_BEST)})" and first.ok


def test_the_offered_overlap_groups_are_ranked_and_bounded() -> None:
    from cocoviz.samples.gpt import gpt_stack

    program = load_program(gpt_stack(2), "gpt2.coco")
    talks = {s.name for s in program.stages if s.expr.op in COLLECTIVES}
    for s in program.stages:
        chains = overlap_chains(program, s.name)
        assert all(2 <= len(c) <= MAX_CHAIN_ITEMS for c in chains)
        assert all(len(c) == 2 or talks & set(c) for c in chains)
        ranks = [(-len(talks & set(c)), len(c)) for c in chains]
        assert ranks == sorted(ranks)
        offered = [e.step for e in palette(program, s.name, HW) if e.ok]
        longer = [o for o in offered if o.startswith("overlap(") and o.count(",") >= 2]
        assert len(longer) <= MAX_OFFERED


@pytest.mark.parametrize("name", ["moe_layer", "megatron_mlp", "transformer_block", "sp_mlp"])
def test_every_legal_step_applies_and_an_overlap_gets_the_k_it_shows(name: str) -> None:
    program = _sp_mlp() if name == "sp_mlp" else load_program(samples.text(name), name)
    for s in program.stages:
        for e in palette(program, s.name, HW):
            if not e.ok:
                continue
            _, resolved = apply_step(program, e.step, HW)
            assert str(resolved) == (e.resolved or e.step), (s.name, e)
            if e.step.startswith("overlap("):
                k = re.search(r"chunks=(\d+)", str(resolved))
                assert k is not None and e.shown.endswith(f"model: K={k.group(1)}"), e


def test_a_fused_group_is_one_item_named_by_its_first_stage() -> None:
    program = load_program(samples.text("megatron_mlp"), "megatron_mlp.coco")
    for step in ("split(sum)", "reorder(sum)", "fuse(sum_rs, out)"):
        program, _ = apply_step(program, step, HW)
    for stage in ("layer", "sum_rs", "out_s", "out"):
        offered = _offered(program, stage)
        assert offered["overlap(layer, sum_rs)"] is True, (stage, offered)
        # two stages of one fused group are no overlap: not offered
        assert not any(re.match(r"overlap\((sum_rs|out_s|out), (out_s|out)\)", s) for s in offered)


def test_sp_mlp_offers_decompose_and_refuses_it_with_the_reason() -> None:
    program = _sp_mlp()
    assert _offered(program, "xg")["decompose(xg, h)"] is True
    assert _offered(program, "h")["decompose(xg, h)"] is True
    assert _offered(program, "y")["decompose(y, ys)"] is True
    assert _offered(program, "ys")["decompose(y, ys)"] is True
    # overlap refuses these pairs, and its reason points at decompose
    refused = {e.step: e.reason for e in palette(program, "xg", HW) if not e.ok}
    assert "decompose(xg, h) overlaps them shard by shard" in refused["overlap(xg, h)"]
    # once decomposed, a stage of the group is refused with the reason
    after, _ = apply_step(program, "decompose(xg, h)", HW)
    entry = next(e for e in palette(after, "h", HW) if e.step == "decompose(xg, h)")
    assert not entry.ok and "already in an overlapped group" in entry.reason
    # a matmul → allreduce pair is offered, refused: split the allreduce first
    megatron = load_program(samples.text("megatron_mlp"), "megatron_mlp.coco")
    entry = next(e for e in palette(megatron, "layer", HW) if e.step.startswith("decompose("))
    assert entry.step == "decompose(layer, sum)" and not entry.ok
    assert "is not a reducescatter" in entry.reason


# --- the TUI ------------------------------------------------------------------------------


async def _apply_from_palette(pilot, app: CocovizApp, stage: str, step: str) -> None:  # type: ignore[no-untyped-def]
    app.selected = stage
    await settle(pilot)
    palette_view = app.query_one(StepPalette)
    assert step in palette_view.keyed, (step, palette_view.entries)
    before = app.wb.position
    await pilot.press(str(palette_view.keyed.index(step) + 1))
    await settle(pilot)
    assert app.wb.failed is None and app.wb.position == before + 1
    assert app.wb.recorded_steps[-1].startswith(step.rstrip(")"))


def _frames(app: CocovizApp) -> list[str]:
    drawing = app.query_one(GraphView).drawing
    assert drawing is not None
    return [f.label for f in drawing.frames]


@run_async
async def test_moe_best_schedule_from_the_palette(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, "moe_layer")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.click(GraphView)  # the graph has the focus, so digits reach the palette
        app.selected = "h"
        await settle(pilot)
        shown = [e.shown for e in app.query_one(StepPalette).entries if e.ok]
        assert shown[0].startswith("overlap(y, h, a, o, back)  model: K=")
        await _apply_from_palette(pilot, app, "h", "overlap(y, h, a, o, back)")
        program = app.wb.program
        assert program is not None
        (group,) = program.groups
        assert group.kind is GroupKind.OVERLAPPED and not group.by_shard
        assert tuple(group.stages()) == MOE_BEST
        assert _frames(app) == [f"overlapped ×{group.chunks}"]
        assert "overlap(y, h, a, o, back, chunks=" in app.wb.command_line()


@run_async
async def test_sp_mlp_decomposed_from_the_palette(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, str(SP_MLP))
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.click(GraphView)
        await _apply_from_palette(pilot, app, "xg", "decompose(xg, h)")
        await _apply_from_palette(pilot, app, "ys", "decompose(y, ys)")
        program = app.wb.program
        assert program is not None
        assert [tuple(g.stages()) for g in program.groups] == [("xg", "h"), ("y", "ys")]
        assert all(g.by_shard and g.chunks == 4 for g in program.groups)
        # (a frame too narrow for "overlapped by shard ×4" says "by shard ×4")
        assert [f.removeprefix("overlapped ") for f in _frames(app)] == ["by shard ×4"] * 2
        assert app.wb.command_line().endswith("'decompose(xg, h)' 'decompose(y, ys)'")
        # a stage of a decomposed group offers no more overlap
        app.selected = "h"
        await settle(pilot)
        assert not any(
            e.ok and e.step.startswith(("overlap(", "decompose("))
            for e in app.query_one(StepPalette).entries
        )


def test_decomposed_groups(snap_compare, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = make_app(tmp_path, str(SP_MLP), schedule="decomposed")

    async def before(pilot):  # type: ignore[no-untyped-def]
        await settle(pilot)
        pilot.app.selected = "a"
        await pilot.press("g", "z")  # the graph, zoomed: both frames whole
        await settle(pilot)

    assert snap_compare(app, terminal_size=(100, 64), run_before=before)


@run_async
async def test_sequence_parallel_sample_is_decomposed_from_the_palette(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sample's own shard_overlap schedule, built step by step from the palette."""
    app = make_app(tmp_path, "megatron_sp_block")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.click(GraphView)
        for stage, step in [
            ("xg", "decompose(xg, qkv)"),
            ("proj", "decompose(proj, attn)"),
            ("hg", "decompose(hg, f)"),
            ("ys", "decompose(y, ys)"),
        ]:
            await _apply_from_palette(pilot, app, stage, step)
        program = app.wb.program
        assert program is not None
        pairs = [tuple(g.stages()) for g in program.groups]
        assert pairs == [("xg", "qkv"), ("proj", "attn"), ("hg", "f"), ("y", "ys")]
        assert all(g.by_shard and g.chunks == 8 for g in program.groups)
