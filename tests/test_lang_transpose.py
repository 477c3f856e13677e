"""`transpose(x, d0, d1)` and `permute(x, p0, …)` in every layer (docs/language.md,
transpose and permute): layout rules (a sliced dimension moves with its data), the
diagnostics of their misuse, the printer's round trip, the numpy reference against numpy's
own transpose of the global value, `verify` on 2/4/8 ranks, schedules (reorder across an
allgather, overlap refused), the cost model, the TUI graph's label, `run --mpi`, and both
code targets (CPU, and CUDA in the emulation in both collectives modes) on
tests/programs/zero_wgrad.coco."""

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
    shape_text,
)
from mpi_support import mpi  # noqa: F401 - the fixture

from cocoviz.errors import ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.printer import format_program
from cocoviz.schedule.steps import apply_steps

ZERO = PROGRAMS / "zero_wgrad.coco"

HEAD = "ranks 4\ndim B = 8, H = 16, F = 12\n"


def prog(body: str):
    return load_program(HEAD + body, "t.coco")


# --- types and layouts ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layout", "call", "shape", "want"),
    [
        ("replicated", "transpose(x, 0, 1)", "[H, B]", "replicated"),
        ("local", "transpose(x, 0, 1)", "[H, B]", "local"),
        ("sliced", "transpose(x, 0, 1)", "[H, B]", "sliced(1)"),
        ("sliced(1)", "transpose(x, 0, 1)", "[H, B]", "sliced"),
        ("sliced(1)", "transpose(x, -1, -2)", "[H, B]", "sliced"),
        ("sliced(-1)", "permute(x, 1, 0)", "[H, B]", "sliced"),
    ],
)
def test_a_sliced_dimension_moves_with_its_data(layout, call, shape, want) -> None:
    p = prog(f"input x : f16[B, H] {layout}\ny = {call}\noutput y\n")
    ty = p.stage("y").ty
    assert f"{ty.dtype.value}{shape_text(ty)}" == f"f16{shape}"
    assert str(ty.layout) == want


def test_permute_of_rank_3_and_the_zero_gradient_matmul() -> None:
    p = load_program(ZERO.read_text(), str(ZERO))
    assert str(p.stage("g").ty.layout) == "local"  # xᵀ sliced on the contraction dim
    assert str(p.stage("ch").ty.layout) == "sliced(1)"
    assert [s.text for s in p.stage("ch").ty.shape] == ["S", "NH", "D"]
    assert str(p.stage("dx").ty.layout) == "sliced"


# --- diagnostics ------------------------------------------------------------------------
BAD = [
    (
        "input x : f16[B, H] replicated\ny = transpose(x, 0, 2)\n",
        "prog.coco:4:5: error: transpose: dimension 2 is out of range for 'x' of rank 2",
        "y = transpose(x, 0, 2)",
        "    ^^^^^^^^^^^^^^^^^^",
        "hint: dimensions are 0…1 (or -1…-2)",
    ),
    (
        "input x : f16[B, H, F] replicated\ny = permute(x, 1, 1, 0)\n",
        "prog.coco:4:5: error: permute: (1, 1, 0) is not a permutation of the dimensions 0…2: "
        "dimension 1 appears twice",
        "y = permute(x, 1, 1, 0)",
        "    ^^^^^^^^^^^^^^^^^^^",
        "hint: list each dimension exactly once",
    ),
    (
        "input x : f16[B, H, F] replicated\ny = permute(x, 1, 0)\n",
        "prog.coco:4:5: error: permute: 'x'[B, H, F] has 3 dimensions, the permutation lists 2",
        "y = permute(x, 1, 0)",
        "    ^^^^^^^^^^^^^^^^",
        "hint: list each of the dimensions 0…2 once, e.g. permute(x, 2, 1, 0)",
    ),
    (
        "input x : f16[H] replicated\ny = transpose(x, 0, 0)\n",
        "prog.coco:4:5: error: transpose needs a value of rank ≥ 2; 'x' is [H]",
        "y = transpose(x, 0, 0)",
        "    ^^^^^^^^^^^^^^^^^^",
        "hint: a vector or a scalar has nothing to transpose",
    ),
    (
        "input x : f16[B, H] replicated\ny = transpose(x, 1)\n",
        "prog.coco:4:5: error: transpose takes 3 arguments (transpose(x, d0, d1)), got 2",
        "y = transpose(x, 1)",
        "    ^^^^^^^^^^^^^^^",
        None,
    ),
    (
        "input x : f16[B, H] replicated\ny = transpose(x, 0, B)\n",
        "prog.coco:4:21: error: transpose: a dimension must be a number literal",
        "y = transpose(x, 0, B)",
        "                    ^",
        None,
    ),
    (
        "input x : f16[B, H] replicated\ny = transpose(x, 0, 1.0)\n",
        "prog.coco:4:21: error: transpose: a dimension must be an integer, got 1.0",
        "y = transpose(x, 0, 1.0)",
        "                    ^^^",
        None,
    ),
    (
        "input x : f16[3, 8] sliced\ny = transpose(x, 0, 1)\n",
        "prog.coco:4:5: error: transpose: 'x' is flat-sliced and its chunks are not blocks of "
        "one dimension of [3, 8], so they cannot be permuted rank by rank",
        "y = transpose(x, 0, 1)",
        "    ^^^^^^^^^^^^^^^^^^",
        "hint: slice it along a dimension (sliced(d)), or gather it first (allgather)",
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
    p = load_program(ZERO.read_text(), str(ZERO))
    text = format_program(p)
    assert "transpose(x, 0, 1)" in text and "permute(ctx, 1, 0, 2)" in text
    assert load_program(text, "again.coco") == p
    q = prog("input x : f16[B, H] sliced\ny = transpose(x, -1, 0) * 2\noutput y\n")
    assert "transpose(x, 1, 0) * 2" in format_program(q)  # normal, non-negative dimensions
    assert load_program(format_program(q), "q.coco") == q


# --- numpy reference --------------------------------------------------------------------
def test_reference_equals_numpy_on_the_global_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    src = tmp_path / "t.coco"
    src.write_text(
        HEAD + "dim E = 4\n"
        "input x : f32[B, H] sliced\ninput dy : f32[B, F] sliced\n"
        "input z : f32[B, H, E] sliced(1)\ninput r : f32[H, B] replicated\n"
        "g = matmul(transpose(x, 0, 1), dy)\ngr = allreduce(+, g)\n"
        "p = permute(z, 2, 0, 1)\nt = transpose(x, 1, 0) * 2 + r\n"
        "u = transpose(relu(r), 0, 1) + x\n"
        "output gr, p, t, u\n"
    )
    ins = {
        "x": rng.standard_normal((8, 16)).astype(np.float32),
        "dy": rng.standard_normal((8, 12)).astype(np.float32),
        "z": rng.standard_normal((8, 16, 4)).astype(np.float32),
        "r": rng.standard_normal((16, 8)).astype(np.float32),
    }
    got = reference_dump(tmp_path, src, ins)
    x, dy, z, r = ins["x"], ins["dy"], ins["z"], ins["r"]
    np.testing.assert_allclose(got["gr"], x.T @ dy, rtol=1e-5, atol=1e-5)
    assert np.array_equal(got["p"], z.transpose(2, 0, 1))
    assert np.array_equal(got["t"], x.T * 2 + r)
    assert np.array_equal(got["u"], np.maximum(r, 0).T + x)


@pytest.mark.parametrize("ranks", ["2", "4", "8"])
def test_verify_on_2_4_8_ranks(ranks: str) -> None:
    rc, out, err = run_cli("verify", str(ZERO), "--ranks", ranks)
    assert rc == 0, out + err
    assert "value(s) agree" in out


# --- schedules --------------------------------------------------------------------------
def test_reorder_moves_a_transpose_before_the_allgather() -> None:
    p = load_program(ZERO.read_text(), str(ZERO))
    q = apply_steps(p, ["reorder(wf, wt)"])
    assert str(q.stage("wt_s").ty.layout) == "sliced(1)"  # the shard, transposed
    assert q.stage("wt").expr.op.value == "allgather"
    assert not q.has_stage("wf")


def test_overlap_refuses_a_transpose() -> None:
    p = prog(
        "input x : f32[B, H] replicated\ninput w : f32[H, H] sliced(0)\n"
        "input c : f32[H, B] sliced(1)\n"
        "y = matmul(slice(x, 1), w)\ns = reducescatter(+, y)\n"
        "t = transpose(s, 0, 1) + c\noutput t\n"
    )
    with pytest.raises(ScheduleError) as info:
        apply_steps(p, ["overlap(y, s, t, chunks=2)"])
    assert "moves elements between rows" in info.value.message


def test_decompose_refuses_a_transposed_matmul_operand_and_takes_a_named_one() -> None:
    text = (
        "input x : f32[B, H] local\ninput dy : f32[B, F] local\n"
        "gw = matmul(transpose(x, 0, 1), dy)\ngs = reducescatter(+, gw)\noutput gs\n"
    )
    with pytest.raises(ScheduleError) as info:
        apply_steps(prog(text), ["decompose(gw, gs)"])
    assert "multiplies a transpose of its operand" in info.value.message
    assert "make the transpose a stage of its own" in (info.value.hint or "")
    named = text.replace(
        "gw = matmul(transpose(x, 0, 1), dy)", "xt = transpose(x, 0, 1)\ngw = matmul(xt, dy)"
    )
    q = apply_steps(prog(named), ["decompose(gw, gs)"])
    assert q.groups


# --- cost model, TUI --------------------------------------------------------------------
def test_cost_model_prices_the_copy_of_a_transposed_matmul_operand() -> None:
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.workload import lower_stage, make_context

    p = load_program(ZERO.read_text(), str(ZERO))
    ctx = make_context(p, load_profile("h100-dgx"))
    ops = lower_stage(ctx, "g")
    assert [o.kind.value for o in ops][-1] == "matmul"
    copy = ops[0]
    assert copy.detail == "transpose of a matmul operand"
    assert copy.nbytes == 2 * (32 // 4) * 16 * 2  # reads and writes the rank's [H, B/G] f16
    assert lower_stage(ctx, "dx")[0].kind.value == "matmul"  # wt is a named value


def test_tui_graph_names_the_op() -> None:
    from cocoviz.tui.graph_layout import _node_lines

    p = load_program(ZERO.read_text(), str(ZERO))
    lines, _ = _node_lines(p.stage("ch"), 4, frozenset())
    assert lines[0] == "permute" and lines[2].startswith("sliced(1)")


# --- executors and code targets ---------------------------------------------------------
@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize("schedule", [None, "gather_late"])
def test_mpi_run_matches_reference(schedule, tmp_path: Path) -> None:
    mpi_matches_reference(ZERO, schedule, 4, tmp_path)


@pytest.mark.build
@pytest.mark.parametrize(
    ("target", "collectives"), [("cpu", "nccl"), ("cuda", "nccl"), ("cuda", "nccl-device")]
)
def test_emitted_check_and_dumps_equal_reference(
    target: str, collectives: str, tmp_path: Path, emu_cache: Path
) -> None:
    emitted_check(ZERO, "gather_late", target, collectives, tmp_path, emu_cache)


# --- a pipeline grid: a transpose, an iota, a send, a mean along a sliced dimension ------
PIPE = """ranks tp=2, pp=2
dim B = 8, H = 16
input x : f32[B, H] sliced(0)
input r : f32[H, B] replicated @stage 1
t  = transpose(x, 0, 1) + iota(f32[H, B], dim=0)
nx = send(t)
m  = mean(nx, dim=0)
y  = nx * r + ones(f32[H, B])
output m, y
"""


def test_on_a_pipeline_grid_the_reference_equals_numpy(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    src = tmp_path / "pipe.coco"
    src.write_text(PIPE)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    r = rng.standard_normal((16, 8)).astype(np.float32)
    got = reference_dump(tmp_path, src, {"x": x, "r": r})
    t = x.T + np.arange(16, dtype=np.float32)[:, None]
    np.testing.assert_allclose(got["m"], t.mean(axis=0), rtol=1e-6)
    assert np.array_equal(got["y"], t * r + 1)
    p = load_program(PIPE, "pipe.coco")
    assert (p.stage("t").ty.pstage, p.stage("m").ty.pstage) == (0, 1)
    assert str(p.stage("m").ty.layout) == "sliced"


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
def test_on_a_pipeline_grid_mpi_matches_reference(tmp_path: Path) -> None:
    src = tmp_path / "pipe.coco"
    src.write_text(PIPE)
    mpi_matches_reference(src, None, 4, tmp_path)
