"""`sum/mean/amax/amin(x, dim=d, keepdim=…)` in every layer (docs/language.md, reductions
along a dimension): layout rules (along a sliced dimension `sum`/`mean` give local partial
sums the program combines itself, `amax`/`amin` are refused), diagnostics of misuse, the
printer's round trip, the numpy reference against numpy on the global values, `verify` on
2/4/8 ranks, schedules (reorder across an allgather, overlap refused), the cost model, the
TUI graph's label, `run --mpi`, and both code targets (CPU, and CUDA in the emulation in
both collectives modes) on tests/programs/reduce_dims.coco."""

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

RED = PROGRAMS / "reduce_dims.coco"

HEAD = "ranks 4\ndim B = 8, H = 16, F = 12\n"


def prog(body: str):
    return load_program(HEAD + body, "t.coco")


# --- types and layouts ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layout", "call", "dtype", "shape", "want"),
    [
        ("replicated", "sum(x, dim=1)", "f16", "[B]", "replicated"),
        ("local", "amax(x, dim=0)", "f16", "[H]", "local"),
        ("sliced", "sum(x, dim=1)", "f16", "[B]", "sliced"),
        ("sliced", "mean(x, dim=-1, keepdim=true)", "f16", "[B, 1]", "sliced"),
        ("sliced(1)", "amin(x, dim=0)", "f16", "[H]", "sliced"),
        ("sliced(1)", "amax(x, dim=0, keepdim=true)", "f16", "[1, H]", "sliced"),
        ("sliced", "sum(x, dim=0)", "f16", "[H]", "local"),
        ("sliced(1)", "mean(x, dim=1, keepdim=true)", "f16", "[B, 1]", "local"),
    ],
)
def test_layout_rules(layout, call, dtype, shape, want) -> None:
    p = prog(f"input x : f16[B, H] {layout}\ny = {call}\noutput y\n")
    ty = p.stage("y").ty
    assert (ty.dtype.value, shape_text(ty), str(ty.layout)) == (dtype, shape, want)


def test_a_sliced_rank_3_value_keeps_its_slicing_dimension() -> None:
    p = prog(
        "input z : f32[B, H, F] sliced(2)\ny = sum(z, dim=0)\nk = sum(z, dim=1, keepdim=true)\n"
    )
    assert str(p.stage("y").ty.layout) == "sliced(1)"  # F moves down one
    assert str(p.stage("k").ty.layout) == "sliced(2)"


def test_whole_tensor_reductions_keep_their_meaning() -> None:
    p = prog("input x : f16[B, H] sliced\ns = sum(x)\nm = amax(x)\n")
    assert p.stage("s").expr.op.value == "sum" and str(p.stage("s").ty.layout) == "replicated"
    assert p.stage("m").ty.dtype.value == "f32" and not p.stage("m").ty.shape


# --- diagnostics ------------------------------------------------------------------------
BAD = [
    (
        "input x : f32[B, H] sliced(1)\ny = amax(x, dim=1)\n",
        "prog.coco:4:5: error: amax along dimension 1 (H = 16), which 'x' is sliced along: each "
        "rank holds 4 of its 16 entries, and the language does not insert the allreduce(max) "
        "that would finish it",
        "y = amax(x, dim=1)",
        "    ^^^^^^^^^^^^^^",
        "hint: re-slice it first, `t = alltoall(x, from=1, to=0)`, then amax(t, dim=1); or "
        "gather it (allgather)",
    ),
    (
        "input x : f32[B, H] sliced\ny = amin(x, dim=0)\n",
        "prog.coco:4:5: error: amin along dimension 0 (B = 8), which 'x' is sliced along: each "
        "rank holds 2 of its 8 entries, and the language does not insert the allreduce(min) "
        "that would finish it",
        "y = amin(x, dim=0)",
        "    ^^^^^^^^^^^^^^",
        None,
    ),
    (
        "input x : f32[B, H] replicated\ny = mean(x)\n",
        "prog.coco:4:5: error: mean needs the dimension to reduce: dim=",
        "y = mean(x)",
        "    ^^^^^^^",
        "hint: for example mean(x, dim=-1); sum(x) and amax(x) without dim= reduce the whole "
        "tensor to a scalar",
    ),
    (
        "input x : f32[B, H] replicated\ny = sum(x, dim=2)\n",
        "prog.coco:4:5: error: sum: dim=2 is out of range for 'x' of rank 2",
        "y = sum(x, dim=2)",
        "    ^^^^^^^^^^^^^",
        "hint: dimensions are 0…1 (or -1…-2)",
    ),
    (
        "input x : i32[B, H] replicated\ny = mean(x, dim=1)\n",
        "prog.coco:4:5: error: mean needs a floating-point operand, got i32",
        "y = mean(x, dim=1)",
        "    ^^^^^^^^^^^^^^",
        "hint: cast it first, e.g. mean(cast(f32, x), dim=1)",
    ),
    (
        "input x : f32[B, H] replicated\ny = sum(x, dim=1, keepdim=yes)\n",
        "prog.coco:4:19: error: sum: keepdim must be true or false",
        "y = sum(x, dim=1, keepdim=yes)",
        "                  ^^^^^^^^^^^",
        None,
    ),
    (
        "input x : f32[B, H] replicated\ny = norm(x, dim=1)\n",
        "prog.coco:4:13: error: norm has no keyword argument 'dim'",
        "y = norm(x, dim=1)",
        "            ^^^",
        None,
    ),
    (
        "input x : f32[3, 8] sliced\ny = sum(x, dim=1)\n",
        "prog.coco:4:5: error: sum: 'x' is flat-sliced and its chunks are not blocks of one "
        "dimension of [3, 8], so no rank holds whole lines along dimension 1",
        "y = sum(x, dim=1)",
        "    ^^^^^^^^^^^^^",
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
    p = load_program(RED.read_text(), str(RED))
    text = format_program(p)
    assert "amax(lg, dim=1, keepdim=true)" in text and "mean(h, dim=0)" in text
    assert load_program(text, "again.coco") == p


# --- numpy reference --------------------------------------------------------------------
def test_reference_equals_numpy_on_the_global_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    ins = {
        "lg": rng.standard_normal((16, 24)).astype(np.float16),
        "h": rng.standard_normal((16, 32)).astype(np.float32),
        "g": rng.standard_normal((16, 32)).astype(np.float32),
    }
    src = tmp_path / "r.coco"
    # reduce_dims without its bf16 input (np.save has no bf16)
    src.write_text(
        RED.read_text()
        .replace("input w  : bf16[V, H] replicated\n", "")
        .replace("wmn = amin(w, dim=0)", "wmn = amin(h, dim=1)")
    )
    got = reference_dump(tmp_path, src, ins)
    lg, h, g = ins["lg"].astype(np.float32), ins["h"], ins["g"]
    mx = lg.max(axis=1, keepdims=True)
    lse = np.log(np.exp(lg - mx).sum(axis=1, keepdims=True)) + mx
    np.testing.assert_allclose(got["lse"], lse, rtol=1e-6)
    np.testing.assert_allclose(got["pr"], g.sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["cm"], h.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert np.array_equal(got["wmn"], h.min(axis=1))
    np.testing.assert_allclose(got["rm"], h.mean(axis=1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["dev"], h - h.mean(axis=1, keepdims=True), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ranks", ["2", "4", "8"])
def test_verify_on_2_4_8_ranks(ranks: str) -> None:
    rc, out, err = run_cli("verify", str(RED), "--ranks", ranks)
    assert rc == 0, out + err
    assert "value(s) agree" in out


# --- schedules --------------------------------------------------------------------------
def test_reorder_reduces_the_slices_before_the_allgather() -> None:
    p = load_program(RED.read_text(), str(RED))
    q = apply_steps(p, ["reorder(hf, rm, dev)"])
    assert str(q.stage("rm_s").ty.layout) == "sliced"
    assert q.stage("rm").expr.op.value == "allgather"


def test_overlap_refuses_a_reduction_along_a_dimension() -> None:
    p = prog(
        "input x : f32[B, H] replicated\ninput w : f32[H, H] sliced(0)\n"
        "y = matmul(slice(x, 1), w)\ns = reducescatter(+, y)\n"
        "t = s - mean(s, dim=1, keepdim=true)\noutput t\n"
    )
    with pytest.raises(ScheduleError) as info:
        apply_steps(p, ["overlap(y, s, t, chunks=2)"])
    assert "reduces along a dimension" in info.value.message


# --- cost model, TUI --------------------------------------------------------------------
def test_cost_model_counts_the_operand_it_reads() -> None:
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.workload import lower_stage, make_context

    p = load_program(RED.read_text(), str(RED))
    ctx = make_context(p, load_profile("h100-dgx"))
    (op,) = lower_stage(ctx, "rm")
    # reads the rank's replicated [B, H] f32 operand, writes [B] f32; a FLOP per element read
    assert op.nbytes == 16 * 32 * 4 + 16 * 4
    assert op.flops == 16 * 32


def test_tui_graph_names_the_op() -> None:
    from cocoviz.tui.graph_layout import _node_lines

    p = load_program(RED.read_text(), str(RED))
    lines, _ = _node_lines(p.stage("col"), 4, frozenset())
    assert lines[0] == "mean" and lines[2].startswith("local")


# --- executors and code targets ---------------------------------------------------------
@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize("schedule", [None, "reduce_slices"])
def test_mpi_run_matches_reference(schedule, tmp_path: Path) -> None:
    mpi_matches_reference(RED, schedule, 4, tmp_path)


@pytest.mark.build
@pytest.mark.parametrize(
    ("target", "collectives"), [("cpu", "nccl"), ("cuda", "nccl"), ("cuda", "nccl-device")]
)
def test_emitted_check_and_dumps_equal_reference(
    target: str, collectives: str, tmp_path: Path, emu_cache: Path
) -> None:
    emitted_check(RED, "reduce_slices", target, collectives, tmp_path, emu_cache)


# --- fused groups: both collectives modes emit different code ---------------------------
FUSED = PROGRAMS / "lang_fused.coco"


def test_fused_groups_verify() -> None:
    rc, out, err = run_cli("verify", str(FUSED))
    assert rc == 0, out + err


def test_a_device_kernel_falls_back_for_a_member_reading_other_elements() -> None:
    from emit_support import text_programs

    from cocoviz.emit.emitter import emit

    def device_kernel(schedule: str) -> bool:
        p, ref = text_programs(FUSED.read_text(), schedule)
        files = emit(p, ref, target="cuda", collectives="nccl-device", schedule_name=schedule)
        return "d_sch_out_rs_device" in files.files["lang_fused.cu"]

    assert device_kernel("fused_const")  # the control: a constant is a literal in it
    assert not device_kernel("fused_mean")
    assert not device_kernel("fused_transpose")


@pytest.mark.build
@pytest.mark.parametrize(
    ("target", "collectives", "schedule"),
    [
        ("cpu", "nccl", "fused_transpose"),
        ("cuda", "nccl", "fused_members"),
        ("cuda", "nccl-device", "fused_members"),
        ("cuda", "nccl-device", "fused_mean"),
        ("cuda", "nccl-device", "fused_transpose"),
        ("cuda", "nccl-device", "fused_const"),
    ],
)
def test_fused_emitted_check_and_dumps_equal_reference(
    target: str, collectives: str, schedule: str, tmp_path: Path, emu_cache: Path
) -> None:
    emitted_check(FUSED, schedule, target, collectives, tmp_path, emu_cache)
