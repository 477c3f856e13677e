"""Emitting programs on rank grids with a dp axis (docs/codegen.md, rank grids; issue 29
item 5): a dp communicator beside the tp one, collectives over dp on a rank's tp part,
values local over dp ([D, …] global forms) and sliced over dp (the flat 1/D of the tp
part) in the inputs, --inputs, --dump and --check; what is not supported yet is refused
naming the construct."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from emit_support import (
    build_emulated,
    check_tree_report,
    compare_dumps,
    diagnostics,
    make,
    need_mpicxx,
    scheduled,
    text_programs,
    write,
)

from cocoviz.emit.emitter import emit
from cocoviz.emit.plan import EmitError
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Program

PROGRAMS = Path(__file__).resolve().parent / "programs"

TEXT_CASES = [
    ("grid_dp_tp", None),  # reducescatter/allreduce over dp of a tp-sliced value, ZeRO update
    ("grid_dp_tp", "split_dp"),
    ("grid_dp_zero", None),  # a data-parallel allreduce and SGD step
    ("grid_dp_zero", "zero"),  # split + reorder: sliced(over=dp) shards and allgather
    ("grid_dp_pp", "split_dp"),  # dp=2, tp=2, pp=2: send to the same dp and tp index
]
SAMPLE_SCHEDULES = ["as_written", "fused_adam", "fused_w1"]
TARGETS = [("cpu", "nccl"), ("cuda", "nccl"), ("cuda", "nccl-device")]


def _build_and_check(
    program: Program,
    ref: Program,
    schedule: str | None,
    target: str,
    collectives: str,
    tmp_path: Path,
    cache: Path,
) -> None:
    """Emit, build (CUDA: in the emulation), run --check and --dump, compare the dumps
    with the numpy reference, then `cocoviz check-tree` (its --check and --inputs run)."""
    need_mpicxx()
    files = emit(
        program,
        ref,
        target=target,  # type: ignore[arg-type]
        collectives=collectives,  # type: ignore[arg-type]
        schedule_name=schedule,
    ).files
    if target == "cuda":
        tree = build_emulated(files, cache)
        cmd = [str(tree / "run.sh"), "--emulate"]
    else:
        tree = tmp_path / "cpu"
        write(tree, files)
        res = make(tree)
        assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stdout + res.stderr
        assert not diagnostics(res), "\n".join(diagnostics(res))
        cmd = [str(tree / "run.sh")]
    dump = tmp_path / "dump"
    cmd += ["--check", "--iters", "1", "--warmup", "0", "--dump", str(dump)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass", run.stderr
    assert result["world"] == program.grid.world and result["dp"] == program.grid.dp
    assert "cocoviz emulation" not in run.stderr, run.stderr
    compare_dumps(program, dump)
    check_tree_report(tree)


@pytest.mark.build
@pytest.mark.parametrize(("target", "collectives"), TARGETS)
@pytest.mark.parametrize(("name", "schedule"), TEXT_CASES)
def test_grid_programs_emit_check_and_dump_the_reference(
    name: str, schedule: str | None, target: str, collectives: str, tmp_path: Path, emu_cache: Path
) -> None:
    program, ref = text_programs((PROGRAMS / f"{name}.coco").read_text(), schedule)
    assert program.grid.has_dp
    _build_and_check(program, ref, schedule, target, collectives, tmp_path, emu_cache)


@pytest.mark.build
@pytest.mark.parametrize(("target", "collectives"), TARGETS)
@pytest.mark.parametrize("schedule", SAMPLE_SCHEDULES)
def test_zero1_tp_mlp_emits_on_dp2_tp2(
    schedule: str, target: str, collectives: str, tmp_path: Path, emu_cache: Path
) -> None:
    program, ref = scheduled("zero1_tp_mlp", schedule, ranks="dp=2,tp=2")
    _build_and_check(program, ref, schedule, target, collectives, tmp_path, emu_cache)


def test_the_cpu_tree_splits_a_dp_communicator() -> None:
    program, ref = text_programs((PROGRAMS / "grid_dp_tp.coco").read_text(), None)
    files = emit(program, ref, target="cpu").files
    main = files["main.cpp"]
    assert "MPI_Comm_split(MPI_COMM_WORLD, ctx.pp * ctx.T + ctx.tp, ctx.dp, &ctx.dp_group)" in main
    assert "MPI_Comm_split(MPI_COMM_WORLD, ctx.pp * ctx.D + ctx.dp, ctx.tp, &ctx.group)" in main
    prog = files["grid_dp_tp.cpp"]
    # gs = reducescatter(+, gw, over=dp) on the dp group, gsum and wf likewise
    assert prog.count("dp_ctx(ctx)") == 3
    # m (sliced over dp): the flat 1/D of its tp part of 256 elements
    assert "part.data() + dp * 128" in prog


GRID_HEAD = "program t\nranks dp=2, tp=2\ndim N = 16\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "input m : f32[N, N] replicated sliced(1, over=dp)\ny = m * 2.0\noutput y\n",
            "a value laid out sliced(1, over=dp) is not supported yet (code generation",
        ),
    ],
)
def test_what_is_not_supported_yet_is_refused_naming_it(body: str, message: str) -> None:
    program = load_program(GRID_HEAD + body, "<test>")
    with pytest.raises(EmitError) as err:
        emit(program, None, target="cpu")
    assert message in str(err.value)


def test_a_collective_over_dp_in_an_overlapped_group_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "ov.coco"
    src.write_text(
        "program ov\nranks dp=2, tp=2\ndim B = 8, H = 16\n"
        "input x : f32[B, H] replicated local(over=dp)\ninput w : f32[H, H] replicated\n"
        "y  = matmul(x, w)\nya = allreduce(avg, y, over=dp)\noutput ya\n"
        "schedule ov { overlap(y, ya, chunks=2) }\n"
    )
    for target in ("cpu", "cuda"):
        rc, out, err = _cli(
            "emit", str(src), "-s", "ov", "--target", target, "-o", str(tmp_path / target)
        )
        assert (rc, out) == (1, ""), err
        assert "allreduce over dp 'ya' inside an overlapped group is not supported yet" in err
        assert "ov.coco:7:" in err and "hint:" in err
        assert not (tmp_path / target).exists() or not any((tmp_path / target).iterdir())


def _cli(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from cocoviz.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_the_cuda_tree_splits_an_nccl_dp_communicator() -> None:
    program, ref = text_programs((PROGRAMS / "grid_dp_tp.coco").read_text(), None)
    files = emit(program, ref, target="cuda").files
    main = files["main.cu"]
    assert "ncclCommSplit(ctx.nccl_world, ctx.pp * ctx.D + ctx.dp, ctx.tp, &ctx.nccl_group" in main
    assert "ncclCommSplit(ctx.nccl_world, ctx.pp * ctx.T + ctx.tp, ctx.dp, &ctx.nccl_dp" in main
    assert "ncclCommDestroy(ctx.nccl_dp)" in main
    assert json.loads(files["manifest.json"])["ranks"] == {"dp": 2, "tp": 2, "pp": 1, "world": 4}
    prog = files["grid_dp_tp.cu"]
    assert prog.count("ctx.nccl_dp,") == 3  # gs, wf (in place at dp * count) and gsum


def test_nccl_device_runs_a_fused_group_over_dp_on_the_host_api() -> None:
    program, ref = scheduled("zero1_tp_mlp", "fused_adam", ranks="dp=2,tp=2")
    emitted = emit(program, ref, target="cuda", collectives="nccl-device")
    manifest = json.loads(emitted.files["manifest.json"])
    notes = json.dumps(manifest)
    assert "nccl-device does not apply (a collective over dp" in notes
