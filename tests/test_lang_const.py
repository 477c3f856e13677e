"""`zeros/ones/full(T[DIMS], …)` and `iota(T[DIMS], dim=d)` in every layer (docs/language.md,
constants): types and the layout a use gives them, diagnostics of misuse, the printer's
round trip, the numpy reference against numpy, `verify` on 2/4/8 ranks, schedules (reorder
across an allgather; overlap with a constant of one value in every chunk, refused for
iota), the cost model (free), the TUI graph, `run --mpi`, and both code targets (CPU, and
CUDA in the emulation in both collectives modes) on tests/programs/constants.coco."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lang_support import (
    PROGRAMS,
    check_text,
    emitted_check,
    mpi_matches_reference,
    reference_dump,
    run_cli,
)
from mpi_support import mpi  # noqa: F401 - the fixture

from cocoviz.errors import ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.printer import format_program
from cocoviz.schedule.steps import apply_steps

CONST = PROGRAMS / "constants.coco"

HEAD = "ranks 4\ndim B = 8, H = 16\n"


def prog(body: str):
    return load_program(HEAD + body, "t.coco")


# --- types and layouts ------------------------------------------------------------------
def test_a_constant_stage_is_replicated_of_its_type() -> None:
    p = prog("z = zeros(bf16[B, H])\ni = iota(i32[H])\nf = full(f64[], 2.5)\n")
    z, i, f = (p.stage(n).ty for n in ("z", "i", "f"))
    assert (z.dtype.value, [s.text for s in z.shape], str(z.layout)) == (
        "bf16",
        ["B", "H"],
        "replicated",
    )
    assert i.dtype.value == "i32" and p.stage("i").expr.value == 0  # dim= defaults for rank 1
    assert f.is_scalar and f.dtype.value == "f64"


def test_inside_an_expression_a_constant_takes_the_layout_of_its_use() -> None:
    p = prog(
        "input x : f32[B, H] sliced(1)\ninput l : f32[B, H] local\n"
        "y = x * iota(f32[B, H], dim=1)\nk = l + ones(f32[B, H])\n"
    )
    c = p.stage("y").expr.args[1]
    assert c.op.value == "iota" and str(c.type.layout) == "sliced(1)"  # no slice(…) around it
    assert str(p.stage("k").ty.layout) == "local"
    assert "y = x * iota(f32[B, H], dim=1)" in format_program(p)


# --- diagnostics ------------------------------------------------------------------------
BAD = [
    (
        "y = zeros(B)\n",
        "prog.coco:3:11: error: zeros: the first argument must be a type such as f32[B, H]",
        "y = zeros(B)",
        "          ^",
        None,
    ),
    (
        "y = ones(float32[B, H])\n",
        "prog.coco:3:10: error: unknown dtype 'float32'",
        "y = ones(float32[B, H])",
        "         ^^^^^^^",
        "hint: did you mean 'f32'?",
    ),
    (
        "y = zeros(f32[B, K])\n",
        "prog.coco:3:18: error: unknown dimension 'K'",
        "y = zeros(f32[B, K])",
        "                 ^",
        None,
    ),
    (
        "y = full(i32[B], 0.5)\n",
        "prog.coco:3:18: error: full: 0.5 is not an integer, and the constant is i32",
        "y = full(i32[B], 0.5)",
        "                 ^^^",
        "hint: use a float dtype, e.g. full(f32[…], 0.5)",
    ),
    (
        "y = iota(f32[B, H])\n",
        "prog.coco:3:5: error: iota needs the dimension it counts along (dim=) for a shape of "
        "rank 2",
        "y = iota(f32[B, H])",
        "    ^^^^^^^^^^^^^^^",
        "hint: for example iota(i32[B, H], dim=1): every row holds 0, 1, …, H-1",
    ),
    (
        "y = iota(f32[B, H], dim=2)\n",
        "prog.coco:3:21: error: iota: dim=2 is out of range for a shape of rank 2",
        "y = iota(f32[B, H], dim=2)",
        "                    ^^^^^",
        "hint: dimensions are 0…1 (or -1…-2)",
    ),
    (
        "input x : f32[B, H] replicated\ny = relu(f32[B, H])\n",
        "prog.coco:4:10: error: a type ('f32[…]') is only an argument of zeros, ones, full and "
        "iota",
        "y = relu(f32[B, H])",
        "         ^^^^^^^^^",
        "hint: for example zeros(f32[B, H])",
    ),
    (
        "y = full(f32[B])\n",
        "prog.coco:3:5: error: full takes 2 arguments (full(T[DIMS], value)), got 1",
        "y = full(f32[B])",
        "    ^^^^^^^^^^^^",
        None,
    ),
    (
        "input x : f16[B, H] replicated\ny = x + ones(f32[B, H])\n",
        "prog.coco:4:9: error: operands have different dtypes: 'x' is f16, 'ones(f32[B, H])' "
        "is f32; mixing dtypes needs an explicit cast",
        "y = x + ones(f32[B, H])",
        "        ^^^^^^^^^^^^^^^",
        None,
    ),
]


@pytest.mark.parametrize(("body", "head", "line", "caret", "hint"), BAD)
def test_misuse_is_one_diagnostic_with_place_caret_and_hint(
    tmp_path: Path, body: str, head: str, line: str, caret: str, hint: str | None
) -> None:
    rc, err = check_text(tmp_path, HEAD + body)
    assert rc == 1
    lines = err.splitlines()
    assert lines[0].endswith(head), err
    assert lines[1].endswith(f"| {line}") and lines[2].endswith(f"| {caret}"), err
    if hint is not None:
        assert hint in lines, err
    assert "Traceback" not in err and err.count("error:") == 1


# --- printer ----------------------------------------------------------------------------
def test_printer_round_trip() -> None:
    p = load_program(CONST.read_text(), str(CONST))
    text = format_program(p)
    assert "full(f16[B, V], -1000.0)" in text and "iota(i32[B, V], dim=1)" in text
    assert load_program(text, "again.coco") == p


# --- numpy reference --------------------------------------------------------------------
def test_reference_equals_numpy_on_the_global_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    B, H, V = 16, 32, 24
    ins = {
        "x": rng.standard_normal((B, H)).astype(np.float32),
        "xk": rng.standard_normal((B, H)).astype(np.float32),
        "lg": rng.standard_normal((B, V)).astype(np.float16),
        "g": rng.standard_normal((4, H)).astype(np.float32),  # local: one row a rank
        "w": rng.standard_normal((H, H)).astype(np.float32),
    }
    src = tmp_path / "c.coco"
    src.write_text(CONST.read_text().replace("z    = zeros(bf16[B, H])", "z    = zeros(f32[B, H])"))
    got = reference_dump(tmp_path, src, ins)
    x, xk, lg, g, w = (ins[k] for k in ("x", "xk", "lg", "g", "w"))
    assert np.array_equal(got["ramp"], x * np.arange(H, dtype=np.float32))
    cols = np.arange(V)[None, :] < 12
    assert np.array_equal(got["mask"], np.where(cols, lg, np.float16(-1000.0)))
    np.testing.assert_allclose(got["acc"], g.sum(axis=0), rtol=1e-6)
    assert np.array_equal(got["y"], x + np.float32(0.5))
    assert np.array_equal(got["z"], np.zeros((B, H), np.float32))
    assert np.array_equal(got["cnt"], np.full(H, B, np.float32))
    assert np.array_equal(got["hp"], x * np.arange(B, dtype=np.float32)[:, None] + 1)
    np.testing.assert_allclose(got["og"], (xk @ w) * 2 - 1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ranks", ["2", "4", "8"])
def test_verify_on_2_4_8_ranks(ranks: str) -> None:
    rc, out, err = run_cli("verify", str(CONST), "--ranks", ranks)
    assert rc == 0, out + err
    assert "8 value(s) agree" in out


# --- schedules --------------------------------------------------------------------------
def test_reorder_reads_the_iota_as_the_ranks_rows() -> None:
    p = load_program(CONST.read_text(), str(CONST))
    q = apply_steps(p, ["reorder(hf, hp)"])
    iota = q.stage("hp_s").expr.args[0].args[1]
    assert iota.op.value == "iota" and str(iota.type.layout) == "sliced"


def test_overlap_takes_a_fill_and_refuses_an_iota() -> None:
    p = load_program(CONST.read_text(), str(CONST))
    assert apply_steps(p, ["overlap(mm, ms, out, og, chunks=2)"]).groups
    q = load_program(CONST.read_text().replace("- ones(f32[B, H])", "- iota(f32[B, H], dim=1)"))
    with pytest.raises(ScheduleError) as info:
        apply_steps(q, ["overlap(mm, ms, out, og, chunks=2)"])
    assert "iota counts along its whole shape" in info.value.message


# --- cost model, TUI --------------------------------------------------------------------
def test_constants_are_free_in_the_cost_model() -> None:
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.workload import lower_stage, make_context

    p = load_program(CONST.read_text(), str(CONST))
    ctx = make_context(p, load_profile("h100-dgx"))
    (op,) = lower_stage(ctx, "y")
    assert op.nbytes == 2 * (16 // 4) * 32 * 4  # reads x, writes y: the full(…) is free
    assert op.flops == (16 // 4) * 32  # the one addition


def test_tui_graph_names_the_op() -> None:
    from cocoviz.tui.graph_layout import _node_lines

    p = load_program(CONST.read_text(), str(CONST))
    lines, _ = _node_lines(p.stage("z"), 4, frozenset())
    assert lines[0] == "zeros" and lines[2] == "replicated"


# --- executors and code targets ---------------------------------------------------------
@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize("schedule", [None, "on_slices", "chunked"])
def test_mpi_run_matches_reference(schedule, tmp_path: Path) -> None:
    mpi_matches_reference(CONST, schedule, 4, tmp_path)


@pytest.mark.build
@pytest.mark.parametrize(
    ("target", "collectives", "schedule"),
    [
        ("cpu", "nccl", "on_slices"),
        ("cpu", "nccl", "chunked"),
        ("cuda", "nccl", "on_slices"),
        ("cuda", "nccl", "chunked"),
        ("cuda", "nccl-device", "chunked"),
    ],
)
def test_emitted_check_and_dumps_equal_reference(
    target: str, collectives: str, schedule: str, tmp_path: Path, emu_cache: Path
) -> None:
    emitted_check(CONST, schedule, target, collectives, tmp_path, emu_cache)
