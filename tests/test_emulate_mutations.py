"""Mutation check of the emulation: seeded mistakes of the kinds a code generator makes —
a collective offset off by one slice, a wrong count, a GEMM leading dimension, a chunk
offset, a removed cudaStreamWaitEvent, a removed LSA barrier, the in-place allgather at
the wrong address, a memset on the legacy stream, a collective one rank skips, a send
nobody makes, a multimem kernel on the unicast barrier or with relaxed barriers, two
device-API kernels on unordered streams, two GEMMs sharing a cuBLAS workspace — are
applied to emitted trees, and the
emulated `run.sh --emulate --check` must catch every one: a rule violation or a hazard
(exit 3, "cocoviz emulation: ..."), the watchdog, a failed CUDA/cuBLAS/NCCL call (exit 1) or a check
mismatch (exit 4). A mutant that runs clean is a hole in the emulation."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from emit_support import EMU_TEST_FLAGS, build_emulated, emit_files, emulation_lib, make
from test_emit_emulate import run_emulated


@dataclass(frozen=True)
class Mutant:
    id: str
    sample: str
    schedule: str
    mode: str
    pattern: str  # a regex matched once in the scheduled program's namespace
    replacement: str
    caught_by: str  # what must appear in the output ("a|b": either): a rule, "hazard", ...
    ranks: str = "4"
    nth: int = 1  # which match of the pattern is mutated (1: the first)
    env: tuple[tuple[str, str], ...] = ()  # for the run (e.g. the LSA variant, not multimem)


LSA_ONLY = (("COCOVIZ_EMU_MULTIMEM", "0"),)
"""The emulation without multimem: the nccl-device kernels' LSA variants run."""


MUTANTS = [
    Mutant(
        "allgather-in-place-address",
        "adam",
        "fused",
        "nccl",
        r"ncclAllGather\(B\.v_sch_w1 \+ \(0\) \+ tp \* 256,",
        "ncclAllGather(B.v_sch_w1_s + (0),",
        "in-place rule",
    ),
    Mutant(
        "reducescatter-wrong-count",
        "adam",
        "fused",
        "nccl",
        r"(ncclReduceScatter\(B\.in_sch_g \+ \(0\), B\.v_sch_g1_rs \+ \(0\), )256,",
        r"\g<1>128,",
        "MISMATCH",
    ),
    Mutant(
        "allgather-offset-one-slice",
        "megatron_mlp",
        "mm_rs_c_ag",
        "nccl",
        r"ncclAllGather\(B\.v_sch_out_s \+ \(0\), B\.v_sch_out \+ \(0\),",
        "ncclAllGather(B.v_sch_out_s + (0), B.v_sch_out + (64),",
        "out of bounds",
    ),
    Mutant(
        "reducescatter-send-offset-one-slice",
        "megatron_mlp",
        "mm_rs_c_ag",
        "nccl",
        r"ncclReduceScatter\(B\.v_sch_layer \+ \(0\),",
        "ncclReduceScatter(B.v_sch_layer + (64),",
        "out of bounds",
    ),
    Mutant(
        "gemm-leading-dimension",
        "megatron_mlp",
        "fused",
        "nccl",
        r"&alpha, B\.in_sch_w, CUDA_R_16F, 16,",
        "&alpha, B.in_sch_w, CUDA_R_16F, 17,",
        "out of bounds",
    ),
    Mutant(
        "gemm-leading-dimension-too-small",
        "megatron_mlp",
        "fused",
        "nccl",
        r"(B\.in_sch_x \+ \(16 \* k\), CUDA_R_16F, )4,",
        r"\g<1>3,",
        "cublasGemmEx",
    ),
    Mutant(
        "chunk-offset",
        "megatron_mlp",
        "fused",
        "nccl",
        r"ncclAllGather\(B\.v_sch_out_s \+ \(16 \* k\), B\.v_sch_out \+ \(64 \* k\),",
        "ncclAllGather(B.v_sch_out_s + (16 * k), B.v_sch_out + (64 * ((k + 1) % 4)),",
        "MISMATCH",
    ),
    Mutant(
        "chunk-offset-of-reducescatter-input",
        "transformer_block",
        "fused",
        "nccl",
        r"ncclReduceScatter\(B\.v_sch_y \+ \(64 \* k\),",
        "ncclReduceScatter(B.v_sch_y + (64 * (3 - k)),",
        "hazard",
    ),
    Mutant(
        "removed-chunk-wait-event",
        "megatron_mlp",
        "fused",
        "nccl",
        r'CHECK_CUDA\("fused\(sum_rs, out_s, out\)", cudaStreamWaitEvent\(S->comm, S->ev_ol_sch_overlap_layer\[0\]\[k\], 0\)\);',
        "",
        "hazard",
    ),
    Mutant(
        "removed-final-wait-event",
        "transformer_block",
        "fused",
        "nccl",
        r'CHECK_CUDA\("y, ys_rs, out_s, out", cudaStreamWaitEvent\(S->main, S->ev_ol_sch_overlap_y_done\[1\], 0\)\);',
        "",
        "hazard",
    ),
    Mutant(
        "removed-pipeline-recv-wait-event",
        "pipeline_stage",
        "fused",
        "nccl",
        r'if \(ctx\.pp == 1\) CHECK_CUDA\("fused\(recv, out_s\)", cudaStreamWaitEvent\(S->compute, S->ev_ol_sch_overlap_sum_rs\[1\]\[k\], 0\)\);',
        "",
        "hazard",
        ranks="tp=2,pp=2",
    ),
    Mutant(
        "removed-first-lsa-barrier",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_acq_rel\);  // peers finished",
        "// peers finished",
        "hazard",
        env=LSA_ONLY,
    ),
    Mutant(
        "removed-last-lsa-barrier",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_acq_rel\);  // our writes",
        "// our writes",
        "hazard",
        env=LSA_ONLY,
    ),
    Mutant(
        "removed-first-lsa-barrier-multimem",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_acquire\);  // peers finished",
        "// peers finished",
        "hazard",
    ),
    Mutant(
        "removed-last-lsa-barrier-multimem",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_release\);  // our writes",
        "// our writes",
        "hazard",
    ),
    Mutant(
        "multimem-kernel-on-the-unicast-barrier",
        "adam",
        "fused",
        "nccl-device",
        r"blockIdx\.x, /\*multimem=\*/true\);",
        "blockIdx.x);",
        "multimem barrier",
    ),
    Mutant(
        "multimem-first-barrier-relaxed",
        "sgd",
        "fused",
        "nccl-device",
        r"memory_order_acquire\);  // peers finished",
        "memory_order_relaxed);  // peers finished",
        "hazard",
    ),
    Mutant(
        "multimem-last-barrier-relaxed",
        "adam",
        "fused",
        "nccl-device",
        r"memory_order_release\);  // our writes",
        "memory_order_relaxed);  // our writes",
        "hazard",
    ),
    Mutant(
        "device-kernels-on-two-streams",
        "megatron_mlp",
        "fused",
        "nccl-device",
        r"COCOVIZ_LAUNCH\(d_sch_sum_rs_device_mc, ctas, kThreads, 0, S->comm\)",
        "COCOVIZ_LAUNCH(d_sch_sum_rs_device_mc, ctas, kThreads, 0, k == 1 ? S->compute : S->comm)",
        "two kernels on one device communicator",
    ),
    Mutant(
        "gemms-share-a-workspace",
        "megatron_mlp",
        "fused",
        "nccl",
        r"cublasSetStream\(ctx\.blas, S->compute\)\);",
        "cublasSetStream(ctx.blas, k == 1 ? S->main : S->compute));",
        "cuBLAS workspace",
    ),
    Mutant(
        "lsa-peer-pack-offset",
        "adam",
        "fused",
        "nccl-device",
        r"load_pack<(\d+)>\(src_peer\[s\] \+ \(i0",
        r"load_pack<\1>(src_peer[s] + (i0 + \1",
        "out of bounds|MISMATCH",
        env=LSA_ONLY,
    ),
    Mutant(
        "multimem-misaligned",
        "adam",
        "fused",
        "nccl-device",
        r"multimem_ld_reduce_add<(\d+)>\(src_mc \+ \(",
        r"multimem_ld_reduce_add<\1>(src_mc + 1 + (",
        "multimem",
    ),
    Mutant(
        "multimem-store-dropped",
        "adam",
        "fused",
        "nccl-device",
        r"::cocoviz::multimem_st<\d+>\(out0_mc[^;]*;",
        "",
        "MISMATCH",
    ),
    Mutant(
        "collective-skipped-on-one-rank",
        "adam",
        "fused",
        "nccl",
        r"CHECK_NCCL\(\"w1\", ncclAllGather",
        'if (tp != 1) CHECK_NCCL("w1", ncclAllGather',
        "collective mismatch|watchdog",
    ),
    Mutant(
        "removed-send",
        "pipeline_stage",
        "ar_p2p_c",
        "nccl",
        r'if \(ctx\.pp == 0\) CHECK_NCCL\("recv", ncclSend\(',
        'if (false) CHECK_NCCL("recv", ncclSend(',
        "watchdog",
        ranks="tp=2,pp=2",
    ),
    Mutant(
        "memset-on-legacy-stream",
        "sgd",
        "rs_c_ag",
        "nccl",
        r"cudaMemsetAsync\(mem, 0, sizeof\(float\) \* 1024, S->main\)",
        "cudaMemset(mem, 0, sizeof(float) * 1024)",
        "hazard",
    ),
]


def mutate(cu: str, m: Mutant) -> str:
    start = cu.index("namespace sch {")
    head, sched = cu[:start], cu[start:]
    found = list(re.finditer(m.pattern, sched))
    assert len(found) >= m.nth, f"{m.id}: pattern not found {m.nth} time(s): {m.pattern}"
    at = found[m.nth - 1]
    return head + sched[: at.start()] + at.expand(m.replacement) + sched[at.end() :]


@pytest.fixture(scope="session")
def emu_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp().parent / "emulation"


@pytest.mark.parametrize("m", MUTANTS, ids=[m.id for m in MUTANTS])
def test_emulation_catches_mutant(m: Mutant, emu_cache: Path, tmp_path: Path) -> None:
    files = emit_files(m.sample, m.schedule, "cuda", m.mode, ranks=m.ranks)
    base = build_emulated(files, emu_cache)
    tree = tmp_path / "mutant"
    shutil.copytree(base, tree, ignore=shutil.ignore_patterns("dump", ".built", ".passed"))
    prog = tree / f"{m.sample}.cu"
    prog.write_text(mutate(prog.read_text(), m))
    lib = emulation_lib(emu_cache)
    res = make(tree, "emulate", f"EMU_LIB={lib}", EMU_TEST_FLAGS)
    assert res.returncode == 0, res.stdout + res.stderr
    run = run_emulated(
        tree,
        "--check",
        "--iters",
        "1",
        "--warmup",
        "0",
        env={"COCOVIZ_EMU_TIMEOUT": "10", **dict(m.env)},
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0, f"mutant {m.id} survived:\n{out}"
    assert any(c in out for c in m.caught_by.split("|")), (
        f"mutant {m.id} caught, but not by {m.caught_by!r}:\n{out}"
    )
