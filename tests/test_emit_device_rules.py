"""The real-hardware rules of the nccl-device lowering as the emitter writes them
(docs/codegen.md, "On real hardware: the rules and their sources"), read from the emitted
source and the plan — no build: tests/test_emulate_device_api.py runs them.

- a tree with a device-API kernel also holds the `--collectives nccl` lowering of the
  same schedule (namespace ``nccl_host``), which the scheduled program hands every call to
  where the ranks agreed to fall back; the run's JSON line names the lowering;
- the capability checks, the SM count and multimem are agreed over MPI before
  ``ncclDevCommCreate``;
- every device-API kernel of a program runs on one stream (a plan that does otherwise is
  refused);
- each stream that runs GEMMs has its own cuBLAS workspace, set after every
  ``cublasSetStream``."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from emit_support import emit_files, scheduled

from cocoviz.emit import plan as pl
from cocoviz.emit.lower import device_steps, lower_emit, one_device_stream
from cocoviz.emit.manifest import _steps
from cocoviz.emit.plan import EmitError


def sched_part(cu: str) -> str:
    """The scheduled program's namespace of an emitted .cu."""
    start = cu.index("namespace sch {")
    return cu[start : cu.index("}  // namespace sch\n", start)]


def test_fallback_is_the_nccl_lowering_of_the_same_schedule() -> None:
    p, ref = scheduled("megatron_mlp", "fused", ranks="4")
    device = lower_emit(p, ref, "nccl-device")
    host = lower_emit(p, ref, "nccl")
    assert device.fallback is not None and host.fallback is None
    assert device_steps(device.scheduled.steps) and not device_steps(device.fallback.steps)
    # the same steps, streams, buffers and events as --collectives nccl, under its own names
    as_nccl = json.dumps(_steps(device.fallback.steps)).replace("nccl_host", "sch")
    assert as_nccl == json.dumps(_steps(host.scheduled.steps))
    assert len(device.fallback.buffers) == len(host.scheduled.buffers)
    # no device-API kernel, no fallback
    p, ref = scheduled("lamb", "fused", ranks="4")
    assert lower_emit(p, ref, "nccl-device").fallback is None


def test_scheduled_program_hands_every_call_to_the_fallback() -> None:
    files = emit_files("adam", "fused", "cuda", "nccl-device", ranks="4")
    cu = files["adam.cu"]
    sch = sched_part(cu)
    assert "namespace nccl_host {" in cu and cu.index("namespace nccl_host {") < cu.index(
        "namespace sch {"
    )
    for call in (
        "nccl_host::destroy(S->fallback, ctx)",
        "nccl_host::init(S->fallback, ctx, seed)",
        "nccl_host::run(S->fallback, ctx, P)",
        "return nccl_host::stream(S->fallback)",
        "return nccl_host::output(S->fallback, k)",
        'if (S->fallback != nullptr) return "nccl";',
        'return "nccl-device";',
    ):
        assert call in sch, call
    assert "F->fallback = nccl_host::create(ctx);" in sch
    assert '"lowering\\": \\"%s\\"' in files["main.cu"] and "sch::lowering(S)" in files["main.cu"]
    manifest = json.loads(files["manifest.json"])
    assert manifest["fallback"]["collectives"] == "nccl"


def test_capabilities_grid_and_multimem_are_agreed_before_the_device_communicator() -> None:
    sch = sched_part(emit_files("adam", "fused", "cuda", "nccl-device", ranks="4")["adam.cu"])
    create = sch[sch.index("State* create(const Ctx& ctx) {") :]
    order = [
        "ncclCommQueryProperties(ctx.nccl_group, &props)",
        "ncclCommWindowRegister(ctx.nccl_group, B.in_sch_g",
        "if (!props.deviceApiSupport) {",
        "} else if (S->win_in_sch_g == nullptr) {",
        "if (!every_rank(ctx, lacks == nullptr)) return fall_back(S, ctx, lacks);",
        "sms = least_over_ranks(ctx, sms);",
        "S->multimem = every_rank(ctx, props.multimemSupport",
        "ncclDevCommCreate(ctx.nccl_group, &reqs, &S->dev)",
        "if (!every_rank(ctx, !split_domain)) {",
    ]
    at = [create.index(s) for s in order]
    assert at == sorted(at), order
    # the multimem kernel: NCCL's NVLS barrier form and orders, the proxy fence before its end
    mc = sch[sch.index("d_sch_g1_rs_device_mc(") :]
    mc = mc[: mc.index("\n}\n")]
    assert "ncclTeamTagLsa(), blockIdx.x, /*multimem=*/true);" in mc
    first, last = mc.index("memory_order_acquire"), mc.index("memory_order_release")
    assert first < mc.index("multimem_ld_reduce_add") < mc.index("multimem_st") < last
    assert mc.index("::cocoviz::fence_proxy_alias();") < last
    assert "memory_order_acq_rel" not in mc


def test_device_kernels_on_two_streams_are_refused() -> None:
    p, ref = scheduled("megatron_mlp", "fused", ranks="4")
    steps = lower_emit(p, ref, "nccl-device").scheduled.steps
    one_device_stream(steps)  # the emitter's own plan: one stream

    def moved(s: pl.Step) -> pl.Step:
        if isinstance(s, pl.ChunkLoop):
            items = tuple(
                dataclasses.replace(it, steps=tuple(moved(x) for x in it.steps)) for it in s.items
            )
            return dataclasses.replace(s, items=items)
        return s

    dev = device_steps(steps)[0]
    other = dataclasses.replace(dev, cname="d_sch_other", stream="compute")
    with pytest.raises(EmitError, match="must run on one stream; this is a cocoviz bug"):
        one_device_stream((*[moved(s) for s in steps], other))


@pytest.mark.parametrize(
    ("name", "schedule", "mode"),
    [("megatron_mlp", "fused", "nccl-device"), ("transformer_block", "fused", "nccl")],
)
def test_every_gemm_stream_has_its_own_cublas_workspace(
    name: str, schedule: str, mode: str
) -> None:
    cu = emit_files(name, schedule, "cuda", mode)[f"{name}.cu"]
    for part in re.split(r"\n// =+ ", cu)[1:]:
        streams = set(re.findall(r"cublasSetStream\(ctx\.blas, S->(\w+)\)", part))
        allocated = set(re.findall(r"cudaMalloc\(&S->blas_ws_(\w+), S->blas_ws_bytes\)", part))
        assert streams == allocated, (streams, allocated)
        calls = re.findall(r"cublasSet(Stream|Workspace)\(ctx\.blas, S->(\w+)", part)
        # every cublasSetStream is followed at once by its stream's workspace
        for (kind, stream), (next_kind, ws) in zip(calls[::2], calls[1::2], strict=True):
            assert (kind, next_kind) == ("Stream", "Workspace")
            assert ws == f"blas_ws_{stream}"
    assert "major >= 9 ? 32 : 4" in cu and "cudaDevAttrComputeCapabilityMajor" in cu
