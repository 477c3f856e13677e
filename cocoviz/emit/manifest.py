"""``manifest.json``: what each stage of the program became, so a reader can see that
fusion and overlap really happened (docs/codegen.md)."""

from __future__ import annotations

import json
import math
from typing import Any

from cocoviz.emit import plan as pl
from cocoviz.emit.targets import TargetSpec

SM_COUNT = {"sm_80": 108, "sm_90": 132, "sm_100": 148}
"""SMs of the arch's reference GPU (A100, H100/H200, B200): the CTA count the manifest
states for a device-API kernel; the program caps its grid at the SM count it finds."""


class _Gpu:
    """The CUDA facts of each collective step: registered buffers, CUDA graph, CTAs and
    pack width (docs/codegen.md, reading manifest.json). ``graph``: whether the steps
    belong to the iteration the launcher captures as a CUDA graph (the scheduled program's;
    `--check`'s unscheduled program runs from the host)."""

    def __init__(self, plan: pl.EmitPlan, arch: str) -> None:
        from cocoviz.emit.render import CudaRenderer, EmitOptions

        self.renderer = CudaRenderer(plan, EmitOptions(target="cuda", arch=arch))
        self.sms = SM_COUNT.get(arch.split()[0] if arch else "sm_90", 132)
        bufs = [b for prog in plan.plans for b in prog.buffers]
        self.alias = {b.cname: b.alias for b in bufs if b.alias}
        self.registered = {b.cname for b in bufs if b.registered or b.symmetric}

    def _registered(self, names: list[str]) -> bool:
        roots = []
        for n in names:
            while n in self.alias and self.alias[n] != n:
                n = self.alias[n] or n
            roots.append(n)
        return bool(roots) and all(r in self.registered for r in roots)

    def facts(self, s: pl.Step, graph: bool) -> dict[str, Any]:
        if isinstance(s, pl.DeviceCollective):
            dev = self.renderer.step(s)["dev"]
            return {
                "buffers_registered": True,
                "registration": "ncclMemAlloc + ncclCommWindowRegister (symmetric window)",
                "cuda_graph": graph,
                "ctas": min(dev["ctas"], self.sms),
                "ctas_needed": dev["ctas"],
                "cta_rule": "min(the fewest SMs of any rank, CTAs the message needs), one grid on"
                " every rank; one LSA barrier per CTA",
                "threads_per_cta": 256,
                "pack_width": dev["width"] if dev["vec"] else 1,
                "pack_bytes": 16 if dev["vec"] else None,
                "unroll_packs": dev["unroll"],
                "multimem_variant": dev["multimem"],
            }
        if isinstance(s, pl.Collective):
            names = [b for b in (s.send, s.recv, s.staging) if b]
        elif isinstance(s, pl.ReduceFinish):
            names = [s.reduction.partial]
        elif isinstance(s, pl.FinishBatch):
            names = [s.pack]
        else:
            names = []
        if self._registered(names):
            return {
                "buffers_registered": True,
                "registration": "ncclMemAlloc + ncclCommWindowRegister (NCCL_WIN_COLL_SYMMETRIC,"
                " NCCL >= 2.27): NCCL may choose its symmetric kernels",
                "cuda_graph": graph,
                "ctas": None,
                "cta_rule": "NCCL's choice",
                "pack_width": None,
            }
        return {
            "buffers_registered": False,
            "registration": "cudaMalloc (NCCL's host API on unregistered buffers)",
            "cuda_graph": graph,
            "ctas": None,
            "cta_rule": "NCCL's choice",
            "pack_width": None,
        }


def _steps(
    steps: tuple[pl.Step, ...], gpu: _Gpu | None = None, graph: bool = False
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in steps:
        d: dict[str, Any] = {"kind": s.kind, "name": s.cname, "stream": s.stream}
        if s.pstage is not None:
            d["pipeline_stage"] = s.pstage
        if isinstance(s, pl.Kernel):
            d["stages"] = list(s.stages)
            d["elements"] = s.space.launch_count
            if s.reductions:
                d["reductions"] = [r.kind for r in s.reductions]
        elif isinstance(s, pl.RowKernel):
            d.update(stages=list(s.stages), op=s.op, rows=s.space.launch_count // s.row_len)
        elif isinstance(s, pl.ReduceFinish):
            d.update(stages=[s.stage], cross_rank=s.cross_rank)
            if gpu is not None and s.cross_rank:
                d["allreduce"] = gpu.facts(s, graph)
        elif isinstance(s, pl.FinishBatch):
            d.update(
                stages=[f.stage for f in s.finishes],
                cross_rank=True,
                batched_values=len(s.finishes),
            )
            if gpu is not None:
                d["allreduce"] = gpu.facts(s, graph)
        elif isinstance(s, pl.Matmul):
            d.update(stages=[s.stage], m=s.m, n=s.n, k=s.k, api="cublasGemmEx")
            if s.batch:
                gemms = math.prod(b.extent for b in s.batch)
                d.update(batch=gemms, api="cublasGemmStridedBatchedEx")
            if s.accumulate:
                acc = (s.c_dtype or s.dtype).value
                d.update(accumulate=f"C += A x B (beta = 1) into an {acc} accumulator")
        elif isinstance(s, pl.RingExchange):
            d.update(
                stages=[s.stage],
                count=s.count,
                dtype=s.dtype.value,
                send_to=_ring_peer(s.to),
                recv_from=_ring_peer(-s.to),
                steps=f"0 .. {s.steps - 2} (every step but the last)",
                api="ncclSend + ncclRecv in ncclGroupStart/End on the tp group"
                if gpu is not None
                else "MPI_Isend + MPI_Irecv on the tp group, waited for where the next step needs them",
            )
        elif isinstance(s, pl.RingCombine):
            d.update(
                stages=[s.stage],
                elements=s.count,
                reduce_op=s.rop,
                accumulator=s.acc_dtype.value,
                last_step=f"rounded once into this rank's part of {s.stage}",
            )
        elif isinstance(s, pl.Collective):
            d.update(stages=[s.stage], op=s.op, count=s.count, in_place=s.inplace)
            if s.rop:
                d["reduce_op"] = "avg: sum, then a kernel divides by G" if s.avg else s.rop
            if gpu is not None:
                d.update(gpu.facts(s, graph))
        elif isinstance(s, pl.DeviceCollective):
            d.update(stages=list(s.stages), api="NCCL device API (LSA)", reduce_op=s.rop)
            if gpu is not None:
                d.update(gpu.facts(s, graph))
        elif isinstance(s, pl.ChunkLoop) and s.shards is not None:
            sh = s.shards
            gather = sh.pattern == "gather"
            d.update(
                kind="shards",
                stages=list(s.stages),
                shards=s.chunks,
                pattern=sh.pattern,
                mode=sh.mode,
                shard_at_step="(tp + s) mod G" if gather else "(tp - s - 1) mod G",
                per_step=[
                    {"item": it.label, "stream": it.stream, "steps": _steps(it.steps, gpu, graph)}
                    for it in s.items
                ],
                events=[
                    {"after": e.after, "before": e.before, "carried": e.carried} for e in s.edges
                ],
            )
        elif isinstance(s, pl.ChunkLoop):
            d.update(
                stages=list(s.stages),
                chunks=s.chunks,
                per_chunk=[
                    {"item": it.label, "stream": it.stream, "steps": _steps(it.steps, gpu, graph)}
                    for it in s.items
                ],
            )
        out.append(d)
    return out


def _program(
    p: pl.ProgramPlan,
    predicted: dict[str, float] | None,
    gpu: _Gpu | None = None,
    graph: bool = False,
) -> dict[str, Any]:
    stages = []
    for s in p.stages:
        d: dict[str, Any] = {
            "name": s.name,
            "op": s.op,
            "layout": s.layout,
            "kernels": list(s.kernels),
            "collectives": list(s.collectives),
            "streams": list(s.streams),
            "stored": s.stored,
        }
        if s.group:
            d["group"] = s.group
        if s.chunks:
            d["chunks"] = s.chunks
        if s.shards:
            d["shards"] = s.shards
        if predicted and s.name in predicted:
            d["predicted_us"] = round(predicted[s.name], 3)
        stages.append(d)
    return {
        "stages": stages,
        "steps": _steps(p.steps, gpu, graph),
        "buffers": [
            {
                "name": b.cname,
                "value": b.source,
                "dtype": b.dtype.value,
                "elements_per_rank": b.count,
                "role": b.role,
                **({"alias_of": b.alias} if b.alias else {}),
                **({"symmetric_window": True} if b.symmetric else {}),
                **({"registered_window": True} if b.registered and not b.symmetric else {}),
            }
            for b in p.buffers
        ],
        "kernels": sum(1 for _ in _kernel_names(p.steps)),
        "chunk_loops": p.chunk_loops,
    }


def _kernel_names(steps: tuple[pl.Step, ...]) -> list[str]:
    out: list[str] = []
    for s in steps:
        if isinstance(s, pl.ChunkLoop):
            for it in s.items:
                out.extend(_kernel_names(it.steps))
        elif isinstance(s, (pl.Kernel, pl.RowKernel, pl.DeviceCollective, pl.RingCombine)):
            out.append(s.cname)
    return out


def _ring_peer(offset: int) -> str:
    return f"tp {'-' if offset < 0 else '+'} {abs(offset)} (mod G)"


def manifest(
    plan: pl.EmitPlan,
    target: TargetSpec,
    arch: str,
    files: list[str],
    predicted: dict[str, float] | None = None,
    predicted_note: str | None = None,
) -> str:
    data: dict[str, Any] = {
        "tool": "cocoviz",
        "program": plan.program,
        "target": target.name,
        "ranks": {"tp": plan.tp, "pp": plan.pp, "world": plan.world},
        "dims": dict(plan.dims),
        "schedule": {"name": plan.schedule_name, "steps": list(plan.schedule_steps)},
        "collectives": plan.collectives if target.gpu else "mpi",
        "files": sorted(files),
    }
    if plan.has_dp:  # a grid with a dp axis: world = dp·tp·pp (docs/codegen.md, rank grids)
        data["ranks"] = {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "world": plan.world}
    gpu = _Gpu(plan, arch) if target.gpu else None
    data["scheduled"] = _program(plan.scheduled, predicted, gpu, graph=gpu is not None)
    if target.gpu:
        data["arch"] = arch
        data["iteration"] = {
            "cuda_graph": True,
            "launches": "one iteration of the scheduled program is captured as a CUDA graph"
            " (its kernels, GEMMs and NCCL calls on every stream) and launched with"
            " cudaGraphLaunch each iteration; with --no-graph, or where the capture fails,"
            " every call is made from the host; the run's JSON line says which ('graph')",
        }
    if plan.fallback is not None:
        data["fallback"] = {
            "collectives": "nccl",
            "when": "a rank lacks NCCL's device API, a window for a buffer peers access, or an"
            " NVLink (LSA) domain holding its whole group: the ranks agree over MPI before"
            " ncclDevCommCreate and every rank runs this lowering; the run's JSON line says"
            " which ran ('lowering')",
            "kernels": sum(1 for _ in _kernel_names(plan.fallback.steps)),
        }
    if plan.reference is not None:
        data["unscheduled"] = _program(plan.reference, None, gpu)
    if predicted:
        data["predicted_us"] = {k: round(v, 3) for k, v in predicted.items()}
    if predicted_note:
        data["predicted_note"] = predicted_note
    return json.dumps(data, indent=2) + "\n"
