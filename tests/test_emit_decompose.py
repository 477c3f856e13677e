"""A decomposed group (`decompose`, `overlapped shards=G`) in every emitted target
(docs/codegen.md, decomposed groups): tests/programs/decompose_gather.coco holds every shape
of allgather → matmul (left operand flat/sliced(0) rows, a 3-D sliced(1) — strided row
blocks, one strided-batched GEMM per shard —, the contraction with an f32 accumulator, a
column-sliced result; right operand sliced(0) — the contraction — and sliced(1) — column
blocks); tests/programs/decompose_scatter.coco matmul → reducescatter, plain (sum, max) and
starting a fused group (a small megatron-mlp: split, reorder, fuse, decompose).

- the CPU target (MPI_Isend/MPI_Irecv around each shard's GEMM) builds warning-free, passes
  `--check` and its dumps equal the numpy reference: both programs in f32 on 4 ranks, the
  gather in f16 on 2, the scatter in bf16 on 8;
- the CUDA tree (grouped ncclSend/ncclRecv on the communication stream, cuBLAS on the
  compute stream, events between them) passes `--emulate --check` in both collectives
  modes (both programs in f32 on 4 ranks, f16 on 2, bf16 on 8), and under 10 adversarial
  orders; without one of its events the emulation reports the hazard;
- it compiles with nvcc;
- the emitted loop, the manifest and the nccl-device note say what happens.

The dtype of the programs (f32 as written) is substituted here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from emit_support import (
    build_emulated,
    compare_dumps,
    diagnostics,
    emit_text,
    make,
    need_nvcc,
    text_programs,
    write,
)
from test_emit_emulate import check_and_compare, run_emulated

from cocoviz.ir.nodes import Program

PROGRAMS = Path(__file__).parent / "programs"
CASES = [
    ("decompose_gather", "f32", 4),
    ("decompose_scatter", "f32", 4),
    ("decompose_gather", "f16", 2),
    ("decompose_scatter", "f16", 2),
    ("decompose_gather", "bf16", 8),
    ("decompose_scatter", "bf16", 8),
]
"""Every shape at G = 4 in f32; both programs again at G = 2 in f16 and G = 8 in bf16
(the emulation runs all of them; the CPU target, whose builds take longer, `CPU_CASES`)."""
CPU_CASES = [CASES[0], CASES[1], CASES[2], CASES[5]]
SEEDS = 10


def source(name: str, dtype: str) -> str:
    return (PROGRAMS / f"{name}.coco").read_text().replace(": f32[", f": {dtype}[")


def programs(name: str, dtype: str, ranks: int) -> tuple[Program, Program]:
    return text_programs(source(name, dtype), "decomposed", str(ranks))


def files(name: str, dtype: str, ranks: int, target: str, mode: str = "nccl") -> dict[str, str]:
    return emit_text(source(name, dtype), "decomposed", target, mode, str(ranks))


def _run_loop(src: str) -> str:
    """The scheduled program's first decomposed loop (run()), up to its closing brace."""
    sched = src[src.index("namespace sch {") :]
    run = sched[sched.index("void run(") :]
    start = run.index("for (int64_t step = 0;")
    return run[start : run.index("\n  }\n", start)]


def _in_order(text: str, patterns: list[str]) -> None:
    pos = 0
    for pattern in patterns:
        m = re.compile(pattern).search(text, pos)
        assert m is not None, f"{pattern} not found after offset {pos} in:\n{text}"
        pos = m.end()


# ---------------------------------------------------------------- what is emitted


def test_cuda_gather_step_exchanges_on_comm_while_the_gemm_runs_on_compute() -> None:
    cu = files("decompose_gather", "f32", 4, "cuda")["decompose_gather.cu"]
    loop = _run_loop(cu)
    _in_order(
        loop,
        [
            r"const int64_t k = \(tp \+ step\) % 4;",
            # the exchange of step s: shard k to tp - 1, the next one from tp + 1
            r"if \(step \+ 1 < 4\)",
            r"ncclGroupStart\(\)",
            r"ncclSend\(B\.v_sch_g1 \+ k \* 64, 64, ncclFloat32, \(tp \+ 3\) % 4, ctx\.nccl_group, S->comm\)",
            r"ncclRecv\(B\.v_sch_g1 \+ \(k \+ 1\) % 4 \* 64, 64, ncclFloat32, \(tp \+ 1\) % 4, ctx\.nccl_group, S->comm\)",
            r"ncclGroupEnd\(\)",
            r"cudaEventRecord\(S->ev_(\w+)\[0\]\[step\], S->comm\)",
            # the GEMM of step s waits for the shard the exchange of step s - 1 received
            r"if \(step > 0\) CHECK_CUDA\(\"h1\", cudaStreamWaitEvent\(S->compute, S->ev_\w+\[0\]\[step - 1\], 0\)\)",
            r"cublasSetStream\(ctx\.blas, S->compute\)",
            r"cublasGemmEx\(.*B\.v_sch_g1 \+ \(64 \* k\).*B\.v_sch_h1 \+ \(64 \* k\)",
        ],
    )
    # the exchange never waits for the GEMM: nothing the GEMM writes is sent
    assert "cudaStreamWaitEvent(S->comm" not in loop


def test_cuda_gather_batches_strided_row_blocks_and_accumulates_the_contraction() -> None:
    cu = files("decompose_gather", "f16", 4, "cuda")["decompose_gather.cu"]
    sched = cu[cu.index("namespace sch {") :]
    # 3-D x sliced(1): shard k is B strided blocks of S/G rows, one strided-batched GEMM
    assert re.search(
        r"cublasGemmStridedBatchedEx\(ctx\.blas, CUBLAS_OP_N, CUBLAS_OP_N, 16, 4, 16, &alpha, "
        r"B\.in_sch_w \+ \(0\), CUDA_R_16F, 16, 0, B\.s_sch_g3_slots \+ \(128 \* k\), CUDA_R_16F, "
        r"16, 64, &beta, B\.v_sch_h3 \+ \(64 \* k\), CUDA_R_16F, 16, 256, 2,",
        sched,
    )
    # contraction split of f16: beta = 1 into an f32 accumulator, rounded once afterwards
    acc = re.search(
        r"const float alpha = 1, beta = 1;\n.*\n.*B\.s_sch_hk_acc \+ \(0\), CUDA_R_32F", sched
    )
    assert acc is not None
    assert "k_sch_hk_round" in sched and "k_sch_hk_zero" in sched


def test_cuda_scatter_combines_after_the_exchange_and_sends_what_it_combined() -> None:
    cu = files("decompose_scatter", "f16", 4, "cuda")["decompose_scatter.cu"]
    loop = _run_loop(cu)
    _in_order(
        loop,
        [
            r"const int64_t k = \(tp \+ 7 - step\) % 4;",
            r"cublasGemmEx\(.*B\.in_sch_x \+ \(16 \* k\).*B\.s_sch_layer_block \+ \(0\), CUDA_R_16F",
            r"if \(step > 0\) CHECK_CUDA\(\"layer\", cudaStreamWaitEvent\(S->compute, S->ev_\w+\[1\]\[step - 1\], 0\)\)",
            r"COCOVIZ_LAUNCH\(k_sch_sum_rs_combine, \d+, kThreads, 0, S->compute\)\(B, step\)",
            r"cudaEventRecord\(S->ev_\w+\[0\]\[step\], S->compute\)",
            r"cudaStreamWaitEvent\(S->comm, S->ev_\w+\[0\]\[step\], 0\)",
            r"ncclSend\(B\.s_sch_sum_rs_acc \+ step % 2 \* 64, 64, ncclFloat16, \(tp \+ 1\) % 4,",
            r"ncclRecv\(B\.s_sch_sum_rs_recv, 64, ncclFloat16, \(tp \+ 3\) % 4,",
            r"cudaEventRecord\(S->ev_\w+\[1\]\[step\], S->comm\)",
        ],
    )
    # the fused group after the reducescatter runs on its result, after the loop
    sched = cu[cu.index("namespace sch {") :]
    run = sched[sched.index("void run(") :]
    assert run.index("ev_ol_sch_ring_layer_done") < run.index("COCOVIZ_LAUNCH(k_sch_out_s")
    assert "ncclReduceScatter" not in run


def test_cpu_target_sends_and_receives_around_each_gemm() -> None:
    gather = _run_loop(files("decompose_gather", "f32", 4, "cpu")["decompose_gather.cpp"])
    _in_order(
        gather,
        [
            r"MPI_Waitall\(2, req_x_sch_g1_ring",  # the previous step's shard has arrived
            r"MPI_Irecv\(B\.v_sch_g1 \+ \(k \+ 1\) % 4 \* 64, .*\(tp \+ 1\) % 4, 0, ctx\.group",
            r"MPI_Isend\(B\.v_sch_g1 \+ k \* 64, .*\(tp \+ 3\) % 4, 0, ctx\.group",
            r"mm_sch_h1\(B, tp, k\);",  # runs while the exchange is in flight
        ],
    )
    scatter = _run_loop(files("decompose_scatter", "f32", 4, "cpu")["decompose_scatter.cpp"])
    _in_order(
        scatter,
        [
            r"mm_sch_layer\(B, tp, k\);",  # runs while the previous step's exchange is in flight
            r"MPI_Waitall\(2, req_x_sch_sum_rs_ring",
            r"k_sch_sum_rs_combine\(B, step\);",
            r"MPI_Irecv\(B\.s_sch_sum_rs_recv, ",
            r"MPI_Isend\(B\.s_sch_sum_rs_acc \+ step % 2 \* 64, ",
        ],
    )


def test_every_event_of_a_decomposed_loop_is_recorded_and_waited_on() -> None:
    for name in ("decompose_gather", "decompose_scatter"):
        cu = files(name, "f32", 4, "cuda")[f"{name}.cu"]
        sched = cu[cu.index("namespace sch {") :]
        for m in re.finditer(r"cudaEvent_t (ev_\w+)\[(\d+)\]\[(\d+)\] = ", sched):
            ev, edges, steps = m[1], int(m[2]), int(m[3])
            assert steps == 4
            for e in range(edges):
                ref = re.escape(f"S->{ev}[{e}]")
                assert re.search(rf"cudaEventRecord\({ref}\[step\], S->\w+\)", sched), ev
                assert re.search(rf"cudaStreamWaitEvent\(S->\w+, {ref}\[step( - 1)?\], 0\)", sched)


def test_manifest_states_the_ring() -> None:
    m = json.loads(files("decompose_scatter", "f32", 4, "cuda", "nccl-device")["manifest.json"])
    stages = {s["name"]: s for s in m["scheduled"]["stages"]}
    assert stages["layer"]["shards"] == 4 and stages["layer"]["group"] == "overlapped"
    assert stages["layer"]["stored"] is False  # p is computed block by block, never whole
    assert "chunks" not in stages["layer"]
    assert stages["sum_rs"]["streams"] == ["comm", "compute"]
    assert any("nccl-device does not apply" in c for c in stages["sum_rs"]["collectives"])
    loop = m["scheduled"]["steps"][0]
    assert loop["kind"] == "shards" and loop["shards"] == 4
    assert (loop["pattern"], loop["mode"]) == ("scatter", "rows")
    assert [it["stream"] for it in loop["per_step"]] == ["compute", "comm"]
    kinds = [st["kind"] for it in loop["per_step"] for st in it["steps"]]
    assert kinds == ["matmul", "combine", "exchange"]
    xch = loop["per_step"][1]["steps"][0]
    assert xch["send_to"] == "tp + 1 (mod G)" and xch["dtype"] == "f32"
    assert loop["events"] == [
        {"after": 1, "before": 2, "carried": False},
        {"after": 2, "before": 1, "carried": True},
    ]
    g = json.loads(files("decompose_gather", "f32", 4, "cpu")["manifest.json"])
    modes = [s["mode"] for s in g["scheduled"]["steps"] if s["kind"] == "shards"]
    assert modes == ["rows", "rows", "rows", "accumulate", "rows", "accumulate", "cols"]
    xch = next(s for s in g["scheduled"]["steps"] if s["kind"] == "shards")["per_step"][0]
    assert xch["steps"][0]["api"].startswith("MPI_Isend")


# ---------------------------------------------------------------- built and run


@pytest.mark.build
@pytest.mark.parametrize(("name", "dtype", "ranks"), CPU_CASES)
def test_cpu_runs_check_and_matches_reference(
    name: str, dtype: str, ranks: int, tmp_path: Path
) -> None:
    from emit_support import need_mpicxx

    need_mpicxx()
    write(tmp_path, files(name, dtype, ranks, "cpu"))
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
    compare_dumps(programs(name, dtype, ranks)[0], dump)


@pytest.mark.build
@pytest.mark.parametrize("mode", ["nccl", "nccl-device"])
@pytest.mark.parametrize(("name", "dtype", "ranks"), CASES)
def test_emulated_cuda_runs_check_and_matches_reference(
    name: str, dtype: str, ranks: int, mode: str, emu_cache: Path
) -> None:
    tree = build_emulated(files(name, dtype, ranks, "cuda", mode), emu_cache)
    check_and_compare(tree, programs(name, dtype, ranks)[0], tree / f"dump-{mode}")


@pytest.mark.build
@pytest.mark.parametrize("name", ["decompose_gather", "decompose_scatter"])
def test_emulated_cuda_passes_adversarial_orders(name: str, emu_cache: Path) -> None:
    tree = build_emulated(files(name, "f32", 4, "cuda"), emu_cache)
    for seed in range(1, SEEDS + 1):
        env = {"COCOVIZ_EMU_ORDER": "adversarial", "COCOVIZ_EMU_SEED": str(seed)}
        res = run_emulated(tree, "--check", "--iters", "1", "--warmup", "0", env=env)
        assert res.returncode == 0, f"COCOVIZ_EMU_SEED={seed}:\n{res.stdout}{res.stderr}"
        assert "cocoviz emulation" not in res.stderr, res.stderr
        assert json.loads(res.stdout.strip().splitlines()[-1])["check"] == "pass"


@pytest.mark.build
@pytest.mark.parametrize(
    ("name", "dropped"),
    [
        # the GEMM no longer waits for the shard the previous step's exchange received
        ("decompose_gather", r"\n.*\[step - 1\], 0\)\);"),
        # the exchange no longer waits for the combine that wrote what it sends
        ("decompose_scatter", r"\n.*cudaStreamWaitEvent\(S->comm, S->ev_\w+\[0\]\[step\], 0\)\);"),
    ],
)
def test_emulation_reports_a_missing_event(name: str, dropped: str, emu_cache: Path) -> None:
    """Every step of the ring is visible to the emulation's hazard checks: drop one of the
    loop's event waits from the emitted code and the run ends with the hazard."""
    tree_files = files(name, "f32", 4, "cuda")
    cu = tree_files[f"{name}.cu"]
    mutated, n = re.subn(dropped, "", cu)
    assert n > 0
    tree = build_emulated({**tree_files, f"{name}.cu": mutated}, emu_cache)
    res = run_emulated(tree, "--check", "--iters", "1", "--warmup", "0")
    assert res.returncode != 0
    assert "hazard" in res.stderr and "between operations the program does not order" in res.stderr


@pytest.mark.build
def test_cuda_compiles_with_nvcc(tmp_path: Path) -> None:
    need_nvcc()
    for name, dtype in (("decompose_gather", "f16"), ("decompose_scatter", "bf16")):
        d = tmp_path / name
        write(d, files(name, dtype, 4, "cuda"))
        res = make(d, "ARCH=sm_90")
        assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stderr[-4000:]
        assert not diagnostics(res), "\n".join(diagnostics(res))
        assert (d / name).exists()
