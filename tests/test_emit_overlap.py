"""Overlap really happens in the emitted CUDA: per chunk, the GEMM runs on the compute
stream, an event recorded there releases the communication stream, which then runs the
chunk's fused collective; the communication stream has the highest priority. The
manifest says the same."""

from __future__ import annotations

import json
import re

from emit_support import emit_files


def _loop(cu: str) -> str:
    sched = cu[cu.index("namespace sch {") :]
    run = sched[sched.index("void run(") :]
    start = run.index("for (int64_t k = 0; k < 4; ++k) {")
    end = run.index("\n  }\n", start)
    return run[start:end]


def test_each_chunk_gemm_event_wait_collective_in_order() -> None:
    files = emit_files("megatron_mlp", "fused", "cuda", small=False)
    loop = _loop(files["megatron_mlp.cu"])
    steps = [
        r"cublasSetStream\(ctx\.blas, S->compute\)",
        r"cublasGemmEx\(ctx\.blas, .*B\.in_sch_x \+ \(\d+ \* k\).*B\.v_sch_layer \+ \(\d+ \* k\)",
        r"cudaEventRecord\(S->ev_(\w+)\[0\]\[k\], S->compute\)",
        r"cudaStreamWaitEvent\(S->comm, S->ev_\w+\[0\]\[k\], 0\)",
        r"ncclReduceScatter\(B\.v_sch_layer \+ \(\d+ \* k\), B\.v_sch_sum_rs \+ \(\d+ \* k\), .*S->comm\)",
        r"COCOVIZ_LAUNCH\(k_sch_out_s, \d+, kThreads, 0, S->comm\)\(B, C, P, tp, k\)",
        r"ncclAllGather\(B\.v_sch_out_s \+ \(\d+ \* k\), B\.v_sch_out \+ \(\d+ \* k\), .*S->comm\)",
    ]
    pos = 0
    for pattern in steps:
        m = re.compile(pattern).search(loop, pos)
        assert m is not None, f"{pattern} not found after offset {pos} in:\n{loop}"
        pos = m.end()


def test_comm_stream_has_highest_priority_and_joins_main() -> None:
    cu = emit_files("megatron_mlp", "fused", "cuda", small=False)["megatron_mlp.cu"]
    assert "cudaStreamCreateWithPriority(&S->comm, cudaStreamNonBlocking, greatest)" in cu
    assert re.search(r"cudaStreamWaitEvent\(S->main, S->ev_\w+_comm_done, 0\)", cu)


def test_cpu_target_runs_the_same_chunk_loop() -> None:
    cpp = emit_files("megatron_mlp", "fused", "cpu", small=False)["megatron_mlp.cpp"]
    sched = cpp[cpp.index("namespace sch {") :]
    loop = sched[sched.index("for (int64_t k = 0; k < 4; ++k)") :]
    assert (
        loop.index("mm_sch_layer(B, tp, k)")
        < loop.index("reducescatter<")
        < loop.index("k_sch_out_s(B, C, P, tp, k)")
    )


def test_manifest_states_streams_chunks_and_kernels() -> None:
    m = json.loads(emit_files("megatron_mlp", "fused", "cuda", small=False)["manifest.json"])
    stages = {s["name"]: s for s in m["scheduled"]["stages"]}
    assert stages["layer"]["streams"] == ["compute"] and stages["layer"]["chunks"] == 4
    assert stages["sum_rs"]["streams"] == ["comm"] and stages["sum_rs"]["group"] == "overlapped"
    assert (
        stages["out_s"]["kernels"] == stages["sum_rs"]["kernels"][:0] + stages["out_s"]["kernels"]
    )
    assert any(k.startswith("k_sch_out_s") for k in stages["out_s"]["kernels"])
    loop = next(s for s in m["scheduled"]["steps"] if s["kind"] == "chunks")
    assert loop["chunks"] == 4
    assert [it["stream"] for it in loop["per_chunk"]] == ["compute", "comm"]
    kinds = [st["kind"] for st in loop["per_chunk"][1]["steps"]]
    assert kinds == ["collective", "kernel", "collective"]
    assert m["schedule"]["steps"][-1] == "overlap(layer, sum_rs, chunks=4)"
