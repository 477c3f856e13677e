"""Batched matmul (numpy's broadcasting of batch dimensions) and `reshape`, everywhere
the language goes: inference and its diagnostics, the printer and JSON, the numpy
reference against numpy on the global values, `verify`, the cost model's GEMM shapes,
`overlap`'s refusal, `run --mpi`, the CPU target and the CUDA emulation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import emulation_cache
from emit_support import (
    build_emulated,
    compare_dumps,
    diagnostics,
    make,
    need_mpicxx,
    need_nvcc,
    write,
)

from cocoviz.cli import main
from cocoviz.emit.emitter import emit
from cocoviz.errors import InputError, ScheduleError
from cocoviz.exec.reference import run_reference
from cocoviz.ir.describe import to_json
from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.ir.nodes import Program, unscheduled
from cocoviz.ir.printer import format_program
from cocoviz.schedule import apply_steps

PROGRAM = Path(__file__).parent / "programs" / "batched_matmul.coco"
HEAD = (
    "ranks 4\ndim R = 4, E = 8, EC = 32, T = 16, C = 4, H = 32, F = 64, NH = 8, S = 16, "
    "D = 8, B = 4, M = 8, K = 16, N = 8\n"
)


def prog(body: str) -> Program:
    return load_program(HEAD + body, "t.coco")


def ty(p: Program, name: str) -> str:
    t = p.type_of(name)
    return f"{t.dtype.value}{[s.text for s in t.shape]} {t.layout}".replace("'", "")


def error(body: str) -> InputError:
    with pytest.raises(InputError) as info:
        prog(body)
    return info.value


# --- inference --------------------------------------------------------------------------
def test_the_issue_examples_infer() -> None:
    p = prog(
        "input dmask : f16[R, EC, T] sliced(0)\ninput x : f16[R, T, H] sliced(0)\n"
        "input y : f16[R, E, C, H] sliced(1)\ninput w1 : f16[E, H, F] sliced(0)\n"
        "input q : f16[NH, S, D] sliced(0)\ninput kt : f16[NH, D, S] sliced(0)\n"
        "disp = matmul(dmask, x)\nh = matmul(y, w1)\nscores = matmul(q, kt)\n"
    )
    assert ty(p, "disp") == "f16[R, EC, H] sliced"  # sliced(0) in normal form
    assert ty(p, "h") == "f16[R, E, C, F] sliced(1)"
    assert ty(p, "scores") == "f16[NH, S, S] sliced"


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("f32[B, M, K] replicated", "f32[B, K, N] replicated", "f32[B, M, N] replicated"),
        ("f32[B, M, K] local", "f32[B, K, N] replicated", "f32[B, M, N] local"),
        ("f32[B, M, K] local", "f32[K, N] local", "f32[B, M, N] local"),
        ("f32[B, M, K] local", "f32[1, K, N] local", "f32[B, M, N] local"),
        ("f32[B, M, K] sliced(0)", "f32[1, K, N] replicated", "f32[B, M, N] sliced"),
        ("f32[B, M, K] sliced(0)", "f32[B, K, N] replicated", "f32[B, M, N] sliced"),
        ("f32[M, K] replicated", "f32[E, K, N] sliced(0)", "f32[E, M, N] sliced"),
        ("f32[E, M, K] replicated", "f32[E, K, N] sliced(0)", "f32[E, M, N] sliced"),
        ("f32[R, E, M, K] sliced(1)", "f32[E, K, N] sliced(0)", "f32[R, E, M, N] sliced(1)"),
        ("f32[B, M, K] sliced(1)", "f32[B, K, N] replicated", "f32[B, M, N] sliced(1)"),
        ("f32[M, K] sliced(0)", "f32[B, K, N] replicated", "f32[B, M, N] sliced(1)"),
        ("f32[B, M, K] replicated", "f32[B, K, N] sliced(2)", "f32[B, M, N] sliced(2)"),
        ("f32[B, M, K] sliced(2)", "f32[B, K, N] sliced(1)", "f32[B, M, N] local"),
        ("f32[1, M, K] replicated", "f32[B, K, N] replicated", "f32[B, M, N] replicated"),
    ],
)
def test_batched_layout_rules(a: str, b: str, want: str) -> None:
    p = prog(f"input a : {a}\ninput b : {b}\nc = matmul(a, b)\n")
    assert ty(p, "c") == want


@pytest.mark.parametrize(
    ("a", "b", "message", "hint"),
    [
        (
            "f32[B, M, K] sliced(0)",
            "f32[B, K, N] sliced(2)",
            "matmul: 'a' is sliced and 'b' is sliced(2), but a left operand sliced on batch "
            "dimension B (dimension 0 of the result) needs a right operand sliced on the same "
            "batch dimension, or replicated",
            "slice 'b' along its dimension 0 (sliced(0)), or make it replicated",
        ),
        (
            "f32[B, M, K] sliced(0)",
            "f32[1, K, N] local",
            "matmul: 'a' is sliced and 'b' is local, but a left operand sliced on batch "
            "dimension B (dimension 0 of the result) needs a right operand sliced on the same "
            "batch dimension, or replicated",
            "make 'b' replicated: it is broadcast along that dimension",
        ),
        (
            "f32[B, M, K] sliced(1)",
            "f32[B, K, N] sliced(0)",
            "matmul: 'a' is sliced(1) and 'b' is sliced, but a right operand sliced on batch "
            "dimension B (dimension 0 of the result) needs a left operand sliced on the same "
            "batch dimension, or replicated",
            "slice 'a' along its dimension 0 (sliced(0)), or make it replicated",
        ),
        (
            "f32[B, M, K] sliced(2)",
            "f32[B, K, N] replicated",
            "matmul: 'a' is sliced(2) and 'b' is replicated, but a left operand sliced on the "
            "contraction dimension K needs a right operand sliced on K (its dimension 1) too",
            "declare 'b' sliced(1) to get local partial sums (then allreduce them), or make "
            "'a' replicated",
        ),
        (
            "f32[B, M, K] sliced(1)",
            "f32[B, K, N] sliced(2)",
            "matmul: 'a' is sliced(1) and 'b' is sliced(2), but a left operand sliced on its "
            "rows M needs a replicated right operand",
            "make 'b' replicated (allgather it), or slice both on a batch dimension",
        ),
        (
            "f32[B, M, K] replicated",
            "f32[B, K, N] sliced(1)",
            "matmul: 'a' is replicated and 'b' is sliced(1), but 'b' is sliced on the "
            "contraction dimension K, so 'a' must be sliced on K too",
            "slice 'a' on its last dimension (sliced(2)) to get local partial sums, or slice "
            "'b' on its columns (sliced(2))",
        ),
        (
            "f32[B, M, K] replicated",
            "f32[B, K, N] local",
            "matmul: 'a' is replicated and 'b' is local, but a local right operand needs a "
            "local left operand",
            "reduce 'b' first (allreduce), or make 'a' local",
        ),
    ],
)
def test_batched_layout_errors_say_which_operand_to_change(
    a: str, b: str, message: str, hint: str
) -> None:
    err = error(f"input a : {a}\ninput b : {b}\nc = matmul(a, b)\n")
    assert err.message == message
    assert err.hint == hint


def test_batch_dimensions_that_do_not_broadcast() -> None:
    err = error("input a : f32[B, M, K] replicated\ninput b : f32[E, K, N] replicated\n"
                "c = matmul(a, b)\n")  # fmt: skip
    assert err.message == (
        "matmul: batch dimensions do not broadcast: 'a'[B, M, K] has batch [B], 'b'[E, K, N] "
        "has batch [E] (batch dimension -1: B = 4 vs E = 8)"
    )
    assert err.hint == "batch dimensions are right-aligned and must be equal or 1"


def test_batched_contraction_mismatch_comes_before_layout() -> None:
    # sliced on K × replicated would be a layout error; the wrong K wins
    err = error("input a : f32[B, M, K] sliced(2)\ninput b : f32[B, N, N] replicated\n"
                "c = matmul(a, b)\n")  # fmt: skip
    assert err.message == (
        "matmul: contraction sizes differ: 'a'[B, M, K] has K = K = 16, 'b'[B, N, N] has K = N = 8"
    )
    assert err.hint == (
        "matmul(a, b) contracts the last dimension of a with the second-to-last of b"
    )


def test_a_flat_slicing_that_is_not_a_block_is_refused() -> None:
    head = "ranks 3\ndim B = 4, M = 3, K = 4, N = 2\n"
    with pytest.raises(InputError) as info:
        load_program(
            head + "input a : f32[B, M, K] sliced\ninput b : f32[B, K, N] replicated\n"
            "c = matmul(a, b)\n",
            "t.coco",
        )
    assert info.value.message == (
        "matmul: 'a' is flat-sliced, but its chunks are not blocks of one dimension of [B, M, K]"
    )


# --- reshape ----------------------------------------------------------------------------
def test_reshape_layouts() -> None:
    p = prog(
        "input y : f16[R, E, C, H] sliced(1)\ninput z : f16[R, E, C, H] sliced\n"
        "input r : f16[E, C] replicated\ninput l : f16[E, C] local\n"
        "a = reshape(y, R, E*C, H)\nb = reshape(z, R*E, C, H)\nc = reshape(r, 2, 16)\n"
        "d = reshape(l, E*C)\n"
    )
    assert ty(p, "a") == "f16[R, E*C, H] sliced(1)"
    assert ty(p, "b") == "f16[R*E, C, H] sliced"
    assert ty(p, "c") == "f16[2, 16] replicated"
    assert ty(p, "d") == "f16[E*C] local"


def test_reshape_numel_mismatch_lists_both_shapes() -> None:
    err = error("input y : f16[E, C] replicated\nt = reshape(y, E, H)\n")
    assert err.message == "reshape: 'y'[E, C] has 32 elements, the new shape [E, H] has 256"
    assert err.hint == "the sizes must multiply to the same number of elements"


def test_reshape_that_would_split_the_ranks_parts_is_refused() -> None:
    err = error("input y : f16[B, M, N] sliced(1)\nt = reshape(y, B*M, N)\n")
    assert err.message == (
        "reshape: 'y' is sliced(1) along M = 8, but no dimension of [B*M, N] starts after "
        "the same 4 leading rows and divides by 4, so the ranks' parts would not stay whole"
    )
    assert err.hint is not None and err.hint.startswith("keep the dimensions before M")


def test_reshape_sizes_and_placement_errors() -> None:
    assert error("input y : f16[E, C] replicated\nt = reshape(y, E, Q)\n").message == (
        "unknown dimension 'Q'"
    )
    err = error("input y : f16[E, C] replicated\nt = reshape(y, E + C)\n")
    assert err.message == (
        "reshape: a size must be a dimension name, an integer literal or a product of them"
    )
    err = error("input y : f16[E, C] replicated\nt = reshape(y)\n")
    assert err.message.startswith("reshape takes the value and its new sizes")
    err = error("input y : f16[E, C] replicated\nt = 2 * reshape(y, E*C)\n")
    assert err.message == "reshape(...) must be the whole right-hand side of a named stage"


def test_check_reports_a_reshape_error_with_a_caret(tmp_path: Path, capsys) -> None:
    f = tmp_path / "bad.coco"
    f.write_text(HEAD + "input y : f16[E, C] replicated\nt = reshape(y, E, H)\n")
    assert main(["check", str(f)]) == 1
    err = capsys.readouterr().err
    assert "bad.coco:4:5: error: reshape: 'y'[E, C] has 32 elements" in err
    assert "^^^^^^^^^^^^^^^^" in err


# --- printer, JSON ----------------------------------------------------------------------
def test_printed_program_reparses_equal_and_keeps_size_texts() -> None:
    p = load_file(PROGRAM)
    text = format_program(p)
    assert "flat = reshape(rows, B, M*N)" in text
    assert "back = reshape(psum, B*M, N)" in text
    assert load_program(text, "again.coco") == p
    stages = {s["name"]: s for s in to_json(p)["stages"]}
    assert stages["back"]["op"] == "reshape"
    assert stages["back"]["shape"] == ["B*M", "N"]
    assert stages["h"]["shape"] == ["B", "E", "M", "N"]


# --- the numpy reference ----------------------------------------------------------------
@pytest.mark.parametrize("ranks", ["1", "2", "4"])
def test_reference_matches_numpy_on_global_values(ranks: str) -> None:
    p = load_file(PROGRAM, ranks=RanksOverride.parse(ranks))
    r = run_reference(p, seed=7)

    def g(n: str) -> np.ndarray:
        return r.global_value(n).astype(np.float64)

    mm = np.matmul
    want = {
        "rb": mm(g("ar"), g("bs")),
        "r2": mm(g("a2"), g("bs")),
        "rows": mm(g("am"), g("br")),
        "cols": mm(g("a3"), g("bn")),
        "loc": mm(g("al"), g("b1")),
        "h": mm(g("y"), g("w1")),
        "psum": mm(g("ak"), g("bk")),
    }
    want["flat"] = want["rows"].reshape(4, 64)
    want["t"] = want["rb"].reshape(8, 64)
    want["back"] = want["psum"].reshape(32, 8)
    for name, w in want.items():
        np.testing.assert_allclose(g(name), w, rtol=1e-5, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("ranks", ["2", "4"])
def test_verify(ranks: str, capsys) -> None:
    assert main(["verify", str(PROGRAM), "--ranks", ranks]) == 0
    assert "ok: " in capsys.readouterr().out


# --- cost model -------------------------------------------------------------------------
def test_simulate_counts_one_gemm_per_batch_index(capsys) -> None:
    assert main(["simulate", str(PROGRAM), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    detail = {s["name"]: s.get("detail") for s in out["stages"]}
    assert detail["h"] == "8 x [8, 16] x [16, 8] f32"  # B · E/4 GEMMs per rank
    assert detail["psum"] != detail["part"]
    assert detail["part"] == "4 x [8, 4] x [4, 8] f32"  # K split: partial sums


# --- schedules --------------------------------------------------------------------------
def test_overlap_refuses_a_batched_matmul() -> None:
    p = prog(
        "input a : f32[B, M, K] sliced(2)\ninput b : f32[B, K, N] sliced(1)\n"
        "c = matmul(a, b)\ns = allreduce(+, c)\noutput s\n"
    )
    with pytest.raises(ScheduleError) as info:
        apply_steps(p, ["split(s)", "overlap(c, s_rs, chunks=2)"])
    assert "it is a batched matmul" in info.value.message


# --- executors and targets --------------------------------------------------------------
def test_mpi_run_matches_reference(capsys) -> None:
    from test_mpi_run import _require_mpi

    _require_mpi()
    rc = main(["run", str(PROGRAM), "--mpi", "--ranks", "4", "--schedule", "rs_ag", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    assert report["ok"] and report["check"]


def _emitted(target: str, schedule: str | None = "rs_ag") -> tuple[Program, dict[str, str]]:
    p0 = load_file(PROGRAM)
    p = apply_steps(p0, ["split(psum)"]) if schedule else p0
    return p, emit(p, unscheduled(p0), target=target, schedule_name=schedule).files  # type: ignore[arg-type]


def test_emitted_gemms_use_strided_batches() -> None:
    _, files = _emitted("cuda")
    cu = next(v for k, v in files.items() if k.endswith(".cu") and k != "main.cu")
    assert "cublasGemmStridedBatchedEx" in cu
    # h's batch (B, E/G) does not merge into one stride: a host loop over B
    assert "one strided batch per index" in cu
    manifest = json.loads(files["manifest.json"])
    apis = {s.get("api") for s in manifest.get("steps", []) if isinstance(s, dict)}
    assert "cublasGemmStridedBatchedEx" in apis or "cublasGemmStridedBatchedEx" in json.dumps(
        manifest
    )


def test_cpu_target_builds_runs_check_and_matches_reference(tmp_path: Path) -> None:
    need_mpicxx()
    program, files = _emitted("cpu")
    write(tmp_path, files)
    res = make(tmp_path)
    assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stderr
    assert not diagnostics(res), "\n".join(diagnostics(res))
    dump = tmp_path / "dump"
    run = subprocess.run(
        [str(tmp_path / "run.sh"), "--check", "--iters", "1", "--warmup", "0", "--dump", str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["check"] == "pass"
    compare_dumps(program, dump)


def test_cuda_builds_without_diagnostics(tmp_path: Path) -> None:
    need_nvcc()
    _, files = _emitted("cuda")
    write(tmp_path, files)
    res = make(tmp_path)
    assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stderr
    assert not diagnostics(res), "\n".join(diagnostics(res))


def test_cuda_emulation_runs_check_and_matches_reference(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from test_emit_emulate import check_and_compare

    program, files = _emitted("cuda")
    tree = build_emulated(files, emulation_cache(tmp_path_factory))
    check_and_compare(tree, program, tree / "dump")
