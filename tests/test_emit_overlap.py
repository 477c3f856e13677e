"""Overlap really happens in the emitted CUDA: per chunk, the GEMM runs on the compute
stream, an event recorded there releases the communication stream, which then runs the
chunk's fused collective; the communication stream has the highest priority. In the
pipeline's overlapped group each operation runs on its communicator's stream (tp
collectives on comm, send/recv on p2p, computation on compute), released by one event
per edge and chunk. Every event the emitted code creates is recorded and waited on. The
manifest says the same."""

from __future__ import annotations

import json
import re

import pytest
from emit_support import cases, emit_files


def _loop(cu: str) -> str:
    sched = cu[cu.index("namespace sch {") :]
    run = sched[sched.index("void run(") :]
    start = run.index("for (int64_t k = 0; k < 4; ++k) {")
    end = run.index("\n  }\n", start)
    return run[start:end]


def _in_order(text: str, patterns: list[str]) -> None:
    """Each pattern matches `text` after the previous one's match."""
    pos = 0
    for pattern in patterns:
        m = re.compile(pattern).search(text, pos)
        assert m is not None, f"{pattern} not found after offset {pos} in:\n{text}"
        pos = m.end()


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
    _in_order(loop, steps)


def test_comm_stream_has_highest_priority_and_joins_main() -> None:
    cu = emit_files("megatron_mlp", "fused", "cuda", small=False)["megatron_mlp.cu"]
    assert "cudaStreamCreateWithPriority(&S->comm, cudaStreamNonBlocking, greatest)" in cu
    done = re.search(r"cudaEventRecord\(S->ev_(\w+)_done\[(\d)\], S->comm\)", cu)
    assert done is not None
    wait = f"cudaStreamWaitEvent(S->main, S->ev_{done[1]}_done[{done[2]}], 0)"
    assert wait in cu[done.end() :]


def test_pipeline_overlap_runs_each_communicator_on_its_stream() -> None:
    files = emit_files("pipeline_stage", "fused", "cuda", small=False)
    loop = _loop(files["pipeline_stage.cu"])
    steps = [
        r"ncclReduceScatter\(.*ctx\.nccl_group, S->comm\)",
        r"if \(ctx\.pp == 0\) CHECK_CUDA\(.*cudaEventRecord\(S->ev_\w+\[0\]\[k\], S->comm\)",
        r"if \(ctx\.pp == 0\) CHECK_CUDA\(.*cudaStreamWaitEvent\(S->p2p, S->ev_\w+\[0\]\[k\], 0\)",
        r"ncclSend\(.*ctx\.nccl_world, S->p2p\)",
        r"ncclRecv\(.*ctx\.nccl_world, S->p2p\)",
        r"if \(ctx\.pp == 1\) CHECK_CUDA\(.*cudaEventRecord\(S->ev_\w+\[1\]\[k\], S->p2p\)",
        r"if \(ctx\.pp == 1\) CHECK_CUDA\(.*cudaStreamWaitEvent\(S->compute, S->ev_\w+\[1\]\[k\], 0\)",
        r"COCOVIZ_LAUNCH\(k_sch_out_s, \d+, kThreads, 0, S->compute\)",
        r"if \(ctx\.pp == 1\) CHECK_CUDA\(.*cudaEventRecord\(S->ev_\w+\[2\]\[k\], S->compute\)",
        r"if \(ctx\.pp == 1\) CHECK_CUDA\(.*cudaStreamWaitEvent\(S->comm, S->ev_\w+\[2\]\[k\], 0\)",
        r"ncclAllGather\(.*ctx\.nccl_group, S->comm\)",
    ]
    _in_order(loop, steps)
    # the p2p stream exists only under NCCL's implicit launch order, which main() sets
    cu = files["pipeline_stage.cu"]
    assert "version >= NCCL_VERSION(2, 26, 0)" in cu and "S->p2p = S->comm;" in cu
    main = files["main.cu"]
    assert main.index('setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0)') < main.index("MPI_Init")
    m = json.loads(files["manifest.json"])
    stages = {s["name"]: s for s in m["scheduled"]["stages"]}
    assert stages["sum_rs"]["streams"] == ["comm"] and stages["out"]["streams"] == ["comm"]
    assert stages["recv"]["streams"] == ["p2p"] and stages["out_s"]["streams"] == ["compute"]


def test_programs_without_a_send_have_no_p2p_stream() -> None:
    for name, schedule in (("megatron_mlp", "fused"), ("pipeline_stage", "rs_p2p_c_ag")):
        files = emit_files(name, schedule, "cuda", small=False)
        assert "S->p2p" not in files[f"{name}.cu"]
        assert "NCCL_LAUNCH_ORDER_IMPLICIT" not in files["main.cu"]


def _events(cu: str) -> list[tuple[str, list[int]]]:
    """Every cudaEvent_t the scheduled program declares, with its array extents."""
    sched = cu[cu.index("namespace sch {") :]
    out = []
    for m in re.finditer(r"cudaEvent_t (ev_\w+)((?:\[\d+\])*) = ", sched):
        out.append((m[1], [int(x) for x in re.findall(r"\[(\d+)\]", m[2])]))
    return out


@pytest.mark.parametrize(("name", "schedule"), cases())
def test_every_created_event_is_recorded_and_waited_on(name: str, schedule: str) -> None:
    files = emit_files(name, schedule, "cuda", small=False)
    cu = next(text for path, text in files.items() if path.endswith(".cu") and path != "main.cu")
    for ev, dims in _events(cu):
        if len(dims) == 2:
            # [edge][chunk]: indexed by the chunk k, or by the ring step of a decomposed
            # group (waited on at the same step or, carried, at the next)
            refs = [(f"S->{ev}[{e}]", r"\[(?:k|step)(?: - 1)?\]") for e in range(dims[0])]
        elif len(dims) == 1:
            refs = [(f"S->{ev}[{i}]", "") for i in range(dims[0])]
        else:
            refs = [(f"S->{ev}", "")]
        for ref, index in refs:
            rec = re.escape(ref) + index
            assert re.search(rf"cudaEventRecord\({rec}, S->\w+\)", cu), f"{ref} is never recorded"
            assert re.search(rf"cudaStreamWaitEvent\(S->\w+, {rec}, 0\)", cu), (
                f"{ref} is never waited on"
            )


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
