"""Mutation suite of emitted trees (docs/codegen.md, "Mutation suite: what the emulated
check catches"): seeded mistakes of the kinds a code generator makes — NCCL offsets,
counts, operators and datatypes, removed stream waits and events recorded on the wrong
stream, cuBLAS transpose flags, leading dimensions, strides and scales, chunk bounds,
send/recv peers, pack offsets, LSA and multimem barriers, element-wise tails, a kernel
launched before its producer, a skipped state update or zero fill, a wrong dtype
conversion, an off-by-one loop bound, a missing __syncthreads() in code both programs
share — are applied to emitted trees of eight samples and a test program with sizes that
are not multiples of the pack width, in both --collectives modes. The default emulated
check (`run.sh --emulate --check`) kills a mutant when it ends non-zero with a rule
violation or hazard ("cocoviz emulation: ..."), the watchdog or a deadlock report, a failed
CUDA/cuBLAS/NCCL call, or a check mismatch.

Each (sample, schedule, mode, ranks) tree is built once (tests/emit_support.py,
build_emulated: cached by content across the session and its xdist workers); a mutant
copies the built tree and recompiles its program source only. A mutant listed with
`survives` must survive (the reason is in docs/codegen.md); `test_kill_rate` holds the
rate at 95% or more and the survivors to the docs' list."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from emit_support import (
    EMU_TEST_FLAGS,
    build_emulated,
    emit_files,
    emit_text,
    emulation_lib,
    make,
)
from test_emit_emulate import run_emulated

PROGRAMS = Path(__file__).parent / "programs"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "codegen.md"


@dataclass(frozen=True)
class Mutant:
    id: str
    sample: str  # a sample's name, or a test program under tests/programs ("tail_sizes.coco")
    schedule: str
    mode: str
    pattern: str  # a regex matched in the scheduled program's namespace (scope "sch")
    replacement: str
    caught_by: str  # what the report is expected to hold ("a|b": either); informative
    kind: str = ""  # the class of mistake
    ranks: str = "4"
    nth: int = 1  # which match of the pattern is mutated (1: the first)
    scope: str = "sch"  # a namespace of the program (sch: the scheduled program, nccl_host:
    # the host-API fallback of an nccl-device tree), or "file": the whole program source
    survives: str = ""  # a known survivor: why the default check cannot see it


MUTANTS = [
    Mutant(
        "allgather-in-place-address",
        "adam",
        "fused",
        "nccl",
        r"ncclAllGather\(B\.v_sch_w1 \+ \(0\) \+ tp \* 256,",
        "ncclAllGather(B.v_sch_w1_s + (0),",
        "in-place rule",
        kind="NCCL offsets",
    ),
    Mutant(
        "reducescatter-wrong-count",
        "adam",
        "fused",
        "nccl",
        r"(ncclReduceScatter\(B\.in_sch_g \+ \(0\), B\.v_sch_g1_rs \+ \(0\), )256,",
        r"\g<1>128,",
        "MISMATCH",
        kind="NCCL counts",
    ),
    Mutant(
        "allgather-offset-one-slice",
        "megatron_mlp",
        "mm_rs_c_ag",
        "nccl",
        r"ncclAllGather\(B\.v_sch_out_s \+ \(0\), B\.v_sch_out \+ \(0\),",
        "ncclAllGather(B.v_sch_out_s + (0), B.v_sch_out + (64),",
        "out of bounds",
        kind="NCCL offsets",
    ),
    Mutant(
        "reducescatter-send-offset-one-slice",
        "megatron_mlp",
        "mm_rs_c_ag",
        "nccl",
        r"ncclReduceScatter\(B\.v_sch_layer \+ \(0\),",
        "ncclReduceScatter(B.v_sch_layer + (64),",
        "out of bounds",
        kind="NCCL offsets",
    ),
    Mutant(
        "gemm-leading-dimension",
        "megatron_mlp",
        "fused",
        "nccl",
        r"&alpha, B\.in_sch_w, CUDA_R_16F, 16,",
        "&alpha, B.in_sch_w, CUDA_R_16F, 17,",
        "out of bounds",
        kind="cuBLAS leading dimensions",
    ),
    Mutant(
        "gemm-leading-dimension-too-small",
        "megatron_mlp",
        "fused",
        "nccl",
        r"(B\.in_sch_x \+ \(16 \* k\), CUDA_R_16F, )4,",
        r"\g<1>3,",
        "cublasGemmEx",
        kind="cuBLAS leading dimensions",
    ),
    Mutant(
        "chunk-offset",
        "megatron_mlp",
        "fused",
        "nccl",
        r"ncclAllGather\(B\.v_sch_out_s \+ \(16 \* k\), B\.v_sch_out \+ \(64 \* k\),",
        "ncclAllGather(B.v_sch_out_s + (16 * k), B.v_sch_out + (64 * ((k + 1) % 4)),",
        "MISMATCH",
        kind="chunk bounds",
    ),
    Mutant(
        "chunk-offset-of-reducescatter-input",
        "transformer_block",
        "fused",
        "nccl",
        r"ncclReduceScatter\(B\.v_sch_y \+ \(64 \* k\),",
        "ncclReduceScatter(B.v_sch_y + (64 * (3 - k)),",
        "hazard",
        kind="chunk bounds",
    ),
    Mutant(
        "removed-chunk-wait-event",
        "megatron_mlp",
        "fused",
        "nccl",
        r'CHECK_CUDA\("fused\(sum_rs, out_s, out\)", cudaStreamWaitEvent\(S->comm, S->ev_ol_sch_overlap_layer\[0\]\[k\], 0\)\);',
        "",
        "hazard",
        kind="stream waits",
    ),
    Mutant(
        "removed-final-wait-event",
        "transformer_block",
        "fused",
        "nccl",
        r'CHECK_CUDA\("y, ys_rs, out_s, out", cudaStreamWaitEvent\(S->main, S->ev_ol_sch_overlap_y_done\[1\], 0\)\);',
        "",
        "hazard",
        kind="stream waits",
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
        kind="stream waits",
    ),
    Mutant(
        "removed-first-lsa-barrier",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_acq_rel\);  // peers finished",
        "// peers finished",
        "hazard",
        kind="barriers (LSA)",
    ),
    Mutant(
        "removed-last-lsa-barrier",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_acq_rel\);  // our writes",
        "// our writes",
        "hazard",
        kind="barriers (LSA)",
    ),
    Mutant(
        "removed-first-lsa-barrier-multimem",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_acquire\);  // peers finished",
        "// peers finished",
        "hazard",
        kind="barriers (multimem)",
    ),
    Mutant(
        "removed-last-lsa-barrier-multimem",
        "sgd",
        "fused",
        "nccl-device",
        r"bar\.sync\(ncclCoopCta\(\), cuda::memory_order_release\);  // our writes",
        "// our writes",
        "hazard",
        kind="barriers (multimem)",
    ),
    Mutant(
        "multimem-kernel-on-the-unicast-barrier",
        "adam",
        "fused",
        "nccl-device",
        r"blockIdx\.x, /\*multimem=\*/true\);",
        "blockIdx.x);",
        "multimem barrier",
        kind="barriers (multimem)",
    ),
    Mutant(
        "multimem-first-barrier-relaxed",
        "sgd",
        "fused",
        "nccl-device",
        r"memory_order_acquire\);  // peers finished",
        "memory_order_relaxed);  // peers finished",
        "hazard",
        kind="barriers (multimem)",
    ),
    Mutant(
        "multimem-last-barrier-relaxed",
        "adam",
        "fused",
        "nccl-device",
        r"memory_order_release\);  // our writes",
        "memory_order_relaxed);  // our writes",
        "hazard",
        kind="barriers (multimem)",
    ),
    Mutant(
        "device-kernels-on-two-streams",
        "megatron_mlp",
        "fused",
        "nccl-device",
        r"COCOVIZ_LAUNCH\(d_sch_sum_rs_device_mc, ctas, kThreads, 0, S->comm\)",
        "COCOVIZ_LAUNCH(d_sch_sum_rs_device_mc, ctas, kThreads, 0, k == 1 ? S->compute : S->comm)",
        "two kernels on one device communicator",
        kind="streams",
    ),
    Mutant(
        "gemms-share-a-workspace",
        "megatron_mlp",
        "fused",
        "nccl",
        r"cublasSetStream\(ctx\.blas, S->compute\)\);",
        "cublasSetStream(ctx.blas, k == 1 ? S->main : S->compute));",
        "cuBLAS workspace",
        kind="cuBLAS workspace",
    ),
    Mutant(
        "lsa-peer-pack-offset",
        "adam",
        "fused",
        "nccl-device",
        r"load_pack<(\d+)>\(src_peer\[s\] \+ \(i0",
        r"load_pack<\1>(src_peer[s] + (i0 + \1",
        "out of bounds|MISMATCH",
        kind="pack offsets",
    ),
    Mutant(
        "multimem-misaligned",
        "adam",
        "fused",
        "nccl-device",
        r"multimem_ld_reduce_add<(\d+)>\(src_mc \+ \(",
        r"multimem_ld_reduce_add<\1>(src_mc + 1 + (",
        "multimem",
        kind="pack offsets",
    ),
    Mutant(
        "multimem-store-dropped",
        "adam",
        "fused",
        "nccl-device",
        r"::cocoviz::multimem_st<\d+>\(out0_mc[^;]*;",
        "",
        "MISMATCH",
        kind="skipped store",
    ),
    Mutant(
        "collective-skipped-on-one-rank",
        "adam",
        "fused",
        "nccl",
        r"CHECK_NCCL\(\"w1\", ncclAllGather",
        'if (tp != 1) CHECK_NCCL("w1", ncclAllGather',
        "collective mismatch|deadlock|watchdog",
        kind="NCCL calls",
    ),
    Mutant(
        "removed-send",
        "pipeline_stage",
        "ar_p2p_c",
        "nccl",
        r'if \(ctx\.pp == 0\) CHECK_NCCL\("recv", ncclSend\(',
        'if (false) CHECK_NCCL("recv", ncclSend(',
        "deadlock: every rank is blocked",
        ranks="tp=2,pp=2",
        kind="send/recv peers",
    ),
    Mutant(
        # (the emulation build allocates without the poison memset, so a kernel is moved:
        # the momentum update on the legacy stream, which orders nothing against the
        # program's non-blocking streams, reads the reduce-scatter's output unordered)
        "kernel-on-legacy-stream",
        "sgd",
        "rs_c_ag",
        "nccl",
        r"COCOVIZ_LAUNCH\(k_sch_m1, 1, kThreads, 0, S->main\)",
        "COCOVIZ_LAUNCH(k_sch_m1, 1, kThreads, 0, 0)",
        "hazard",
        kind="streams",
    ),
    # ---- moe_layer, overlapped (alltoall, batched GEMMs, a software pipeline), nccl
    Mutant(
        "alltoall-wrong-count",
        "moe_layer",
        "overlapped",
        "nccl",
        r"(ncclAlltoAll\(B\.s_sch_y_send \+ \(1024 \* k\), B\.v_sch_y \+ \(1024 \* k\), )256,",
        r"\g<1>192,",
        "MISMATCH",
        kind="NCCL counts",
    ),
    Mutant(
        "alltoall-wrong-datatype",
        "moe_layer",
        "overlapped",
        "nccl",
        r"(ncclAlltoAll\(B\.v_sch_o \+ \(1024 \* k\), B\.s_sch_back_recv \+ \(1024 \* k\), 256, )ncclBfloat16",
        r"\g<1>ncclFloat32",
        "out of bounds|MISMATCH",
        kind="NCCL datatypes",
    ),
    Mutant(
        "removed-wait-before-expert-gemm",
        "moe_layer",
        "overlapped",
        "nccl",
        r'CHECK_CUDA\("h", cudaStreamWaitEvent\(S->compute, S->ev_ol_sch_overlap_y\[0\]\[k\], 0\)\);',
        "",
        "hazard",
        kind="stream waits",
    ),
    Mutant(
        "event-recorded-on-the-wrong-stream",
        "moe_layer",
        "overlapped",
        "nccl",
        r"cudaEventRecord\(S->ev_ol_sch_overlap_y\[1\]\[k\], S->compute\)",
        "cudaEventRecord(S->ev_ol_sch_overlap_y[1][k], S->comm)",
        "hazard",
        kind="events",
    ),
    Mutant(
        "gemm-transpose-flag",
        "moe_layer",
        "overlapped",
        "nccl",
        r"cublasGemmStridedBatchedEx\(ctx\.blas, CUBLAS_OP_N, CUBLAS_OP_N, 16, 32, 16,",
        "cublasGemmStridedBatchedEx(ctx.blas, CUBLAS_OP_T, CUBLAS_OP_N, 16, 32, 16,",
        "MISMATCH",
        kind="cuBLAS transpose flags",
    ),
    Mutant(
        "batched-gemm-stride",
        "moe_layer",
        "overlapped",
        "nccl",
        r"(B\.v_sch_y \+ \(1024 \* k\) \+ ao, CUDA_R_16BF, 16, )64,",
        r"\g<1>0,",
        "MISMATCH",
        kind="cuBLAS strides",
    ),
    Mutant(
        "unpack-launched-before-its-alltoall",
        "moe_layer",
        "overlapped",
        "nccl",
        r'(?s)(#if NCCL_VERSION_CODE[^\n]*\n\s*CHECK_NCCL\("back", ncclAlltoAll.*?#endif\n)'
        r"(\s*COCOVIZ_LAUNCH\(c_sch_back_unpack, 4, kThreads, 0, S->comm\)\(B, k\);\n)",
        r"\2\1",
        "MISMATCH|uninitialized read",
        kind="kernel before its producer",
    ),
    # ---- lamb, fused (host API: a cross-rank norm stays on ncclAllReduce), nccl
    Mutant(
        "allreduce-wrong-operator",
        "lamb",
        "fused",
        "nccl",
        r"(ncclAllReduce\(B\.p_sch_rn_wn, B\.p_sch_rn_wn, 2, ncclFloat32, )ncclSum",
        r"\g<1>ncclMax",
        "MISMATCH",
        kind="NCCL ops",
    ),
    Mutant(
        "reducescatter-wrong-datatype",
        "lamb",
        "fused",
        "nccl",
        r"(ncclReduceScatter\(B\.in_sch_g \+ \(0\), B\.v_sch_g1_rs \+ \(0\), 256, )ncclFloat32",
        r"\g<1>ncclInt32",
        "MISMATCH",
        kind="NCCL datatypes",
    ),
    Mutant(
        "norm-partials-never-finished",
        "lamb",
        "fused",
        "nccl",
        r"COCOVIZ_LAUNCH\(f_sch_rn_wn_finish_partials, 2, kThreads, 0, S->main\)\(B\);",
        "",
        "MISMATCH|uninitialized read",
        kind="skipped kernel",
    ),
    # ---- zero3_layer, shard_overlap (decomposed rings of grouped send/recv), nccl
    Mutant(
        "ring-send-to-the-wrong-peer",
        "zero3_layer",
        "shard_overlap",
        "nccl",
        r"(ncclSend\(B\.v_sch_wg \+ k \* 64, 64, ncclBfloat16, )\(tp \+ 3\) % 4",
        r"\g<1>(tp + 1) % 4",
        "watchdog|deadlock",
        kind="send/recv peers",
    ),
    Mutant(
        "accumulator-never-zeroed",
        "zero3_layer",
        "shard_overlap",
        "nccl",
        r"COCOVIZ_LAUNCH\(k_sch_y_zero, 1, kThreads, 0, S->main\)\(B, C, P, tp, 0\);",
        "",
        "MISMATCH|uninitialized read",
        kind="missing memset",
    ),
    Mutant(
        "gemm-overwrites-instead-of-accumulating",
        "zero3_layer",
        "shard_overlap",
        "nccl",
        r"const float alpha = 1, beta = 1;",
        "const float alpha = 1, beta = 0;",
        "MISMATCH",
        kind="cuBLAS scale",
    ),
    Mutant(
        "ring-one-step-short",
        "zero3_layer",
        "shard_overlap",
        "nccl",
        r"if \(step \+ 1 < 4\)",
        "if (step + 1 < 3)",
        "MISMATCH|uninitialized read",
        kind="off-by-one loop bound",
    ),
    Mutant(
        "removed-ring-step-wait",
        "zero3_layer",
        "shard_overlap",
        "nccl",
        r'if \(step > 0\) CHECK_CUDA\("y", cudaStreamWaitEvent\(S->compute, S->ev_ol_sch_ring_wg\[0\]\[step - 1\], 0\)\);',
        "",
        "hazard",
        kind="stream waits",
    ),
    # ---- pipeline_stage, fused (send/recv between pipeline stages), nccl
    Mutant(
        "pipeline-send-to-the-wrong-stage-rank",
        "pipeline_stage",
        "fused",
        "nccl",
        r"ncclSend\(B\.v_sch_sum_rs \+ \(32 \* k\), 32, ncclFloat16, ctx\.world_rank \+ ctx\.T,",
        "ncclSend(B.v_sch_sum_rs + (32 * k), 32, ncclFloat16, (ctx.world_rank + 1) % ctx.T + ctx.T,",
        "watchdog|deadlock",
        kind="send/recv peers",
        ranks="tp=2,pp=2",
    ),
    Mutant(
        "pipeline-reducescatter-wrong-datatype",
        "pipeline_stage",
        "fused",
        "nccl",
        r"(ncclReduceScatter\(B\.v_sch_layer \+ \(64 \* k\), B\.v_sch_sum_rs \+ \(32 \* k\), 32, )ncclFloat16",
        r"\g<1>ncclBfloat16",
        "MISMATCH",
        kind="NCCL datatypes",
        ranks="tp=2,pp=2",
    ),
    # ---- adam, fused, nccl: the shard kernel's arithmetic and state
    Mutant(
        "gradient-conversion-truncates",
        "adam",
        "fused",
        "nccl",
        r"const float v2 = static_cast<float>\(v1\);",
        "const float v2 = static_cast<float>(static_cast<int>(v1));",
        "MISMATCH",
        kind="dtype conversion",
    ),
    Mutant(
        "moment-update-not-stored",
        "adam",
        "fused",
        "nccl",
        r"::cocoviz::store_pack<8>\(B\.v_sch_m1 \+ \(i0\), st2\);",
        "",
        "MISMATCH",
        kind="skipped state update",
    ),
    Mutant(
        "wrong-scale-one-minus-beta",
        "adam",
        "fused",
        "nccl",
        r"const float v7 = v6 - v3;",
        "const float v7 = v3 - v6;",
        "MISMATCH",
        kind="wrong scale",
    ),
    Mutant(
        "elementwise-pack-offset",
        "adam",
        "fused",
        "nccl",
        r"load_pack<8>\(B\.in_sch_w \+ \(i0 \+ \(256\) \* tp\)\)",
        "load_pack<8>(B.in_sch_w + (i0 + 8 + (256) * tp))",
        "out of bounds|MISMATCH",
        kind="pack offsets",
    ),
    # ---- sgd, rs_c_ag, nccl
    Mutant(
        "allgather-wrong-datatype",
        "sgd",
        "rs_c_ag",
        "nccl",
        r"(ncclAllGather\(B\.v_sch_w1 \+ \(0\) \+ tp \* 256, B\.v_sch_w1 \+ \(0\), 256, )ncclFloat32",
        r"\g<1>ncclFloat16",
        "MISMATCH|in-place rule",
        kind="NCCL datatypes",
    ),
    # ---- megatron_mlp, fused, nccl-device: the LSA variant (run by the default check
    # since it runs every device-kernel variant; before, only with COCOVIZ_EMU_MULTIMEM=0)
    Mutant(
        "lsa-reduction-skips-a-peer",
        "megatron_mlp",
        "fused",
        "nccl-device",
        r"for \(int s = 1; s < kPeers; \+\+s\) \{(\n\s*const float y = ::cocoviz::CudaDt<cocoviz::DType::f16>::load\(x\[u\])",
        r"for (int s = 1; s < kPeers - 1; ++s) {\1",
        "MISMATCH",
        kind="off-by-one loop bound",
    ),
    Mutant(
        "lsa-gather-skips-a-peer",
        "megatron_mlp",
        "fused",
        "nccl-device",
        r"for \(int s = 0; s < kPeers; \+\+s\) ::cocoviz::store_pack<8>\(out0_peer\[s\]",
        "for (int s = 0; s < kPeers - 1; ++s) ::cocoviz::store_pack<8>(out0_peer[s]",
        "MISMATCH|uninitialized read",
        kind="send/recv peers",
    ),
    Mutant(
        "dropout-mask-at-the-shard-index",
        "megatron_mlp",
        "fused",
        "nccl-device",
        r"dropout_keep\(C\.key_sch_out_0, static_cast<uint64_t>\(v2\)",
        "dropout_keep(C.key_sch_out_0, static_cast<uint64_t>(i)",
        "MISMATCH",
        kind="generator index",
    ),
    # ---- tail_sizes (tests/programs): 45-element shards, 5 packs and a tail of 5 on rank
    # 0, element-wise on the other ranks; both device-kernel variants
    Mutant(
        "lsa-tail-one-element-short",
        "tail_sizes.coco",
        "fused",
        "nccl-device",
        r"for \(int64_t i = scalar_from; i < 45; i \+= stride\)",
        "for (int64_t i = scalar_from; i < 44; i += stride)",
        "MISMATCH|uninitialized read",
        kind="element-wise tails",
    ),
    Mutant(
        "multimem-tail-starts-one-late",
        "tail_sizes.coco",
        "fused",
        "nccl-device",
        r"scalar_from = 40 \+ first;",
        "scalar_from = 41 + first;",
        "MISMATCH|uninitialized read",
        kind="element-wise tails",
        nth=2,
    ),
    Mutant(
        "multimem-tail-unfenced",
        "tail_sizes.coco",
        "fused",
        "nccl-device",
        r"if \(scalar_from < 45\) ::cocoviz::fence_proxy_alias\(\);",
        "",
        "fence|multimem",
        kind="barriers (multimem)",
    ),
    Mutant(
        "arc-tail-one-element-short",
        "tail_sizes.coco",
        "ar_c",
        "nccl",
        r"for \(int64_t i = scalar_from; i < 180; i \+= stride\)",
        "for (int64_t i = scalar_from; i < 179; i += stride)",
        "MISMATCH|uninitialized read",
        kind="element-wise tails",
    ),
    # ---- ulysses_attention, bf16_wire (alltoalls around attention), nccl
    Mutant(
        "alltoall-unpack-permuted",
        "ulysses_attention",
        "bf16_wire",
        "nccl",
        r"COCOVIZ_ST\(B\.v_sch_vb, \(0\) \+ \(o \* 64 \+ r \* 16\)",
        "COCOVIZ_ST(B.v_sch_vb, (0) + (o * 64 + (3 - r) * 16)",
        "MISMATCH",
        kind="pack offsets",
    ),
    # ---- pipeline_stage, fused: a tp-group collective on the world communicator
    Mutant(
        "allgather-on-the-world-communicator",
        "pipeline_stage",
        "fused",
        "nccl",
        r"(ncclAllGather\(B\.v_sch_out_s \+ \(32 \* k\), B\.v_sch_out \+ \(64 \* k\), 32, ncclFloat16, )ctx\.nccl_group",
        r"\g<1>ctx.nccl_world",
        "deadlock|out of bounds",
        kind="NCCL communicator",
        ranks="tp=2,pp=2",
    ),
    # ---- megatron_mlp, fused, nccl-device: the host-API fallback (nccl_host), which runs
    # where a rank lacks the device API (run by the default check since it runs every
    # lowering the tree holds; before, only with COCOVIZ_EMU_DEVICE_API=0)
    Mutant(
        "fallback-allgather-chunk-offset",
        "megatron_mlp",
        "fused",
        "nccl-device",
        r"ncclAllGather\(B\.v_nccl_host_out_s \+ \(16 \* k\), B\.v_nccl_host_out \+ \(64 \* k\),",
        "ncclAllGather(B.v_nccl_host_out_s + (16 * k), B.v_nccl_host_out + (64 * ((k + 1) % 4)),",
        "MISMATCH",
        kind="chunk bounds",
        scope="nccl_host",
    ),
    # ---- code both programs share (scope "file"): a block reduction without its barrier
    Mutant(
        "block-reduce-missing-syncthreads",
        "transformer_block",
        "fused",
        "nccl",
        r"(COCOVIZ_ST\(sh, threadIdx\.x\) = is_max \? \(o > m \? o : m\) : m \+ o;\n    \}\n)    __syncthreads\(\);\n",
        r"\1",
        "race",
        kind="barriers (__syncthreads)",
        scope="file",
    ),
]


KILLED_BY = {
    "rule or hazard": re.compile(r"cocoviz emulation: \[rank \d+\] (?!note:)"),
    "failed call": re.compile(r"call .* failed at "),
    "mismatch": re.compile(r"MISMATCH"),
}
"""What kills a mutant: the emulation's report (a rule, a hazard, the watchdog, a
deadlock, an uninitialized read, a race), a failed CUDA/cuBLAS/NCCL call, a check mismatch."""


def mutate(cu: str, m: Mutant) -> str:
    """The program source with the n-th match of the pattern in the mutant's scope (a
    namespace of the program, or the whole file) replaced."""
    start, end = 0, len(cu)
    if m.scope != "file":
        start = cu.index(f"namespace {m.scope} {{")
        end = cu.index(f"}}  // namespace {m.scope}", start)
    found = list(re.finditer(m.pattern, cu[start:end]))
    assert len(found) >= m.nth, f"{m.id}: pattern not found {m.nth} time(s): {m.pattern}"
    at = found[m.nth - 1]
    return cu[: start + at.start()] + at.expand(m.replacement) + cu[start + at.end() :]


def tree_files(m: Mutant) -> dict[str, str]:
    if m.sample.endswith(".coco"):
        return emit_text((PROGRAMS / m.sample).read_text(), m.schedule, "cuda", m.mode, m.ranks)
    return emit_files(m.sample, m.schedule, "cuda", m.mode, ranks=m.ranks)


def kill_reason(returncode: int, out: str) -> str | None:
    """What killed a mutant (the kind and the report's first line), or None when it
    survived."""
    if returncode == 0:
        return None
    for reason, rx in KILLED_BY.items():
        found = rx.search(out)
        if found is not None:
            line = out[out.rfind("\n", 0, found.start()) + 1 :].split("\n", 1)[0]
            return f"{reason}: {line.strip()[:240]}"
    return None


def check_emulated(tree: Path) -> subprocess.CompletedProcess[str]:
    return run_emulated(
        tree, "--check", "--iters", "1", "--warmup", "0", env={"COCOVIZ_EMU_TIMEOUT": "10"}
    )


TREES = sorted({(m.sample, m.schedule, m.mode, m.ranks) for m in MUTANTS})
"""The distinct trees the mutants are applied to."""


def build_mutant(base: Path, tree: Path, m: Mutant, lib: Path) -> None:
    """The built tree copied, the program source mutated and only it recompiled: the
    stamp is set to the mutated tree's sum first, so make rebuilds the object whose source
    is newer (emu/<program>.o) and relinks, and keeps emu/main.o."""
    shutil.copytree(base, tree, ignore=shutil.ignore_patterns("dump", ".built", ".passed"))
    prog = next(p for p in tree.glob("*.cu") if p.name != "main.cu")
    prog.write_text(mutate(prog.read_text(), m))
    built_from = re.search(r"^BUILT_FROM := (.*)$", (tree / "Makefile").read_text(), re.M)
    if built_from is not None:
        s = subprocess.run(
            f"cat {built_from.group(1)} | cksum",
            shell=True,
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        )
        stamp = tree / f"{prog.stem}-emu.stamp"
        stamp.write_text(s.stdout)
    res = make(tree, "emulate", f"EMU_LIB={lib}", EMU_TEST_FLAGS)
    assert res.returncode == 0, f"mutant {m.id} does not build:\n" + res.stdout + res.stderr


@pytest.mark.build
@pytest.mark.parametrize("m", MUTANTS, ids=[m.id for m in MUTANTS])
def test_emulation_catches_mutant(m: Mutant, emu_cache: Path, tmp_path: Path) -> None:
    base = build_emulated(tree_files(m), emu_cache)
    tree = tmp_path / "mutant"
    build_mutant(base, tree, m, emulation_lib(emu_cache))
    run = check_emulated(tree)
    out = run.stdout + run.stderr
    reason = kill_reason(run.returncode, out)
    expected = any(c in out for c in m.caught_by.split("|"))
    print(
        f"{m.id}: {reason or 'survived'}"
        + ("" if expected or not reason else f" (expected {m.caught_by!r})")
    )
    if m.survives:
        assert reason is None, (
            f"mutant {m.id}, listed as a survivor, is now killed ({reason}): move it out of "
            f"the survivors here and in docs/codegen.md\n{out[-4000:]}"
        )
        return
    assert reason is not None, f"mutant {m.id} survived (exit {run.returncode}):\n{out[-6000:]}"


@pytest.mark.build
@pytest.mark.parametrize(
    "tree", TREES, ids=["-".join(x).replace("=", "").replace(",", "") for x in TREES]
)
def test_unmutated_tree_passes(tree: tuple[str, str, str, str], emu_cache: Path) -> None:
    """The control: each tree the mutants start from passes the same check, so what kills
    a mutant is its mistake."""
    sample, schedule, mode, ranks = tree
    m = Mutant("control", sample, schedule, mode, "", "", "", ranks=ranks)
    run = check_emulated(build_emulated(tree_files(m), emu_cache))
    assert run.returncode == 0 and kill_reason(1, run.stdout + run.stderr) is None, (
        run.stdout + run.stderr
    )


def test_mutants_cover_the_classes_samples_and_modes() -> None:
    ids = [m.id for m in MUTANTS]
    assert len(set(ids)) == len(ids) >= 40
    samples = {m.sample for m in MUTANTS if not m.sample.endswith(".coco")}
    assert len(samples) >= 6, samples
    assert {m.mode for m in MUTANTS} == {"nccl", "nccl-device"}
    kinds = {m.kind for m in MUTANTS}
    for k in (
        "NCCL offsets", "NCCL counts", "NCCL ops", "NCCL datatypes", "stream waits", "events",
        "cuBLAS transpose flags", "cuBLAS leading dimensions", "cuBLAS strides", "chunk bounds",
        "send/recv peers", "pack offsets", "barriers (LSA)", "barriers (multimem)",
        "element-wise tails",
    ):  # fmt: skip
        assert k in kinds, k


def test_every_pattern_matches_the_emitted_tree() -> None:
    """Each mutant changes its tree (a pattern the emitter no longer produces would make a
    mutant that cannot fail)."""
    for m in MUTANTS:
        files = tree_files(m)
        name = next(n for n in files if n.endswith(".cu") and n != "main.cu")
        assert mutate(files[name], m) != files[name], m.id


def test_kill_rate() -> None:
    """At least 95% of the mutants killed; every survivor listed with its reason in
    docs/codegen.md (and nothing else listed there)."""
    survivors = [m for m in MUTANTS if m.survives]
    rate = 1 - len(survivors) / len(MUTANTS)
    assert rate >= 0.95, f"kill rate {rate:.1%}; survivors: {[m.id for m in survivors]}"
    docs = DOCS.read_text()
    section = docs[docs.index("### What the emulated check cannot see") :]
    section = section[: section.find("\n#", 1)]
    listed = set(re.findall(r"^- `([a-z0-9-]+)`", section, re.M))
    assert listed == {m.id for m in survivors}, (listed, [m.id for m in survivors])
