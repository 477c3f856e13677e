"""Vectorized elementwise kernels (CUDA target): which accesses become packs, and that
the packed path computes what the element-wise path computes.

There is no GPU here, so the second part interprets the rendered statements of every
kernel of every sample × canonical schedule twice — element by element (the scalar path
of the emitted kernel) and pack by pack with the scalar tail (its vectorized path) — with
symbolic values and numeric indices over aliased memory, and compares the final memory
and every reduction contribution."""

from __future__ import annotations

from typing import Any

import pytest
from emit_support import AVG_PROGRAM, cases, emit_files, scheduled, text_programs

from cocoviz.emit import plan as pl
from cocoviz.emit.lower import lower_emit
from cocoviz.emit.render import CudaRenderer, EmitOptions, vectorize
from cocoviz.ir.nodes import Program

TP, K = 1, 1
"""The rank and chunk the interpreter runs as (k = 1 exercises chunk offsets)."""


def _kernel(cu: str, name: str) -> str:
    start = cu.index(f"__global__ void {name}(")
    return cu[start : cu.index("\n}\n", start)]


def test_fused_shard_kernel_is_packed_with_per_element_broadcast_and_dropout() -> None:
    cu = emit_files("megatron_mlp", "fused", "cuda", small=False)["megatron_mlp.cu"]
    k = _kernel(cu[cu.index("namespace sch {") :], "k_sch_out_s")
    assert "pack_aligned<8>(B.v_sch_sum_rs + ((1572864) * k))" in k
    assert "load_pack<8>(B.v_sch_sum_rs + (i0 + (1572864) * k))" in k
    assert "load_pack<8>(B.in_sch_r + (i0 + (1572864) * tp + (12582912) * k))" in k
    assert "store_pack<8>(B.v_sch_out_s + (i0 + (1572864) * k), " in k
    packed = k[k.index("#pragma unroll") : k.index("scalar_from = 1572864")]
    # the bias is read at its broadcast index, dropout at the element's global index
    assert "const int64_t i = i0 + j;" in packed
    assert "COCOVIZ_LD(B.in_sch_b, v4)" in packed and "dropout_keep(" in packed
    assert "for (int64_t i = scalar_from; i < 1572864; i += stride)" in k


def _body(kind: str, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "dst": "", "a": "", "b": "", "c": "", **kw}


def test_vectorize_width_and_refusals() -> None:
    f64 = [
        _body("load", dst="v1", a="i", buffer="x", storage="double", size=8),
        _body("store", a="i", b="v1", buffer="y", storage="double", size=8),
    ]
    vec = vectorize(f64, [], 1000)
    assert vec is not None and vec["width"] == 2
    assert vectorize(f64, [], 1) is None  # fewer elements than one pack
    bcast = [
        _body("index_bcast", dst="v1", a="i", terms=[(1, 16, 1)]),
        _body("load", dst="v2", a="v1", buffer="b", storage="__half", size=2),
        _body("store", a="v1", b="v2", buffer="y", storage="__half", size=2),
    ]
    assert vectorize(bcast, [], 1000) is None  # no unit-stride access


# ------------------------------------------------------------------ interpreter


def _index(s: dict[str, Any], env: dict[str, Any]) -> int:
    a = env[s["a"]]
    if s["kind"] == "index_affine":
        return int(a + s["n1"] * TP + s["n2"] * K + s["n3"])
    if s["kind"] == "index_bcast":
        return int(sum(((a // rs) % rd) * os_ for rs, rd, os_ in s["terms"]))
    n1, n2, n3 = s["n1"], s["n2"], s["n3"]
    if s["kind"] == "index_block_g":
        return int((a // n1) * n3 + (TP * s["blk"] + (a % n1) // n2) * n2 + a % n2)
    return int(((a // n1) * n3 + ((a % n1) // n2 - TP * n3)) * n2 + a % n2)


class Memory:
    """Per-rank storage with aliases resolved; unwritten elements are symbols."""

    def __init__(self, p: pl.ProgramPlan) -> None:
        self.base: dict[str, tuple[str, int]] = {}
        for b in p.buffers:
            o = b.offset
            off = o.const + o.per_rank * TP + o.per_chunk * K
            self.base[b.cname] = (b.alias or b.cname, off)
        self.cells: dict[tuple[str, int], object] = {}

    def addr(self, buf: str, idx: int) -> tuple[str, int]:
        root, off = self.base[buf]
        return root, off + idx

    def load(self, buf: str, idx: int) -> object:
        a = self.addr(buf, idx)
        return self.cells.get(a, ("init", *a))

    def store(self, buf: str, idx: int, v: object) -> None:
        self.cells[self.addr(buf, idx)] = v


def _run(
    body: list[dict[str, Any]],
    i: int,
    mem: Memory,
    packs: dict[str, list[object]] | None = None,
    j: int = 0,
) -> dict[str, Any]:
    env: dict[str, Any] = {"i": i, "tp": TP, "k": K}
    for s in body:
        kind = s["kind"]
        if kind.startswith("index_"):
            env[s["dst"]] = _index(s, env)
        elif kind == "load":
            env[s["dst"]] = mem.load(s["buffer"], env[s["a"]])
        elif kind == "load_scalar":
            env[s["dst"]] = mem.load(s["buffer"], 0)
        elif kind == "vload":
            assert packs is not None
            env[s["dst"]] = packs[s["pack"]][j]
        elif kind == "store":
            # a value hoisted before the loop (a constant) stays symbolic, as operands do
            mem.store(s["buffer"], env[s["a"]], env.get(s["b"], s["b"]))
        elif kind == "vstore":
            assert packs is not None
            packs[s["pack"]][j] = env.get(s["b"], s["b"])
        else:
            args = tuple(env.get(x, x) for x in (s["a"], s["b"], s["c"]))
            env[s["dst"]] = (kind, s["op"], s["literal"], s["buffer"], *args)
    return env


def _scalar(k: dict[str, Any], mem: Memory, start: int = 0) -> dict[int, tuple[object, ...]]:
    acc = {}
    for i in range(start, k["count"]):
        env = _run(k["body"], i, mem)
        acc[i] = tuple(env[r["var"]] for r in k["reductions"])
    return acc


def _vector(k: dict[str, Any], mem: Memory) -> dict[int, tuple[object, ...]]:
    v = k["vec"]
    w = v["width"]
    acc = {}
    for q in range(v["groups"]):
        i0 = q * w
        packs: dict[str, list[object]] = {}
        for p in v["packs"]:
            n1, n2, n3 = p["terms"]
            at = i0 + n1 * TP + n2 * K + n3
            packs[p["name"]] = [
                mem.load(p["buffer"], at + j) if p["load"] else None for j in range(w)
            ]
        for j in range(w):
            env = _run(v["body"], i0 + j, mem, packs, j)
            acc[i0 + j] = tuple(env[r["var"]] for r in k["reductions"])
        for p in v["packs"]:
            if not p["load"]:
                n1, n2, n3 = p["terms"]
                at = i0 + n1 * TP + n2 * K + n3
                for j in range(w):
                    mem.store(p["buffer"], at + j, packs[p["name"]][j])
    acc.update(_scalar(k, mem, v["end"]))
    return acc


def _plans(program: Program, reference: Program) -> tuple[pl.EmitPlan, dict[str, Any]]:
    plan = lower_emit(program, reference)
    return plan, CudaRenderer(plan, EmitOptions(target="cuda")).context()


def _check_all_kernels(program: Program, reference: Program) -> int:
    plan, ctx = _plans(program, reference)
    vectorized = 0
    for p, c in ((plan.scheduled, ctx["sched"]), (plan.reference, ctx["ref"])):
        if p is None:
            continue
        for k in c["kernels"]:
            if k["kind"] != "kernel" or not k["vec"]:
                continue
            vectorized += 1
            m1, m2 = Memory(p), Memory(p)
            acc1 = _scalar(k, m1)
            acc2 = _vector(k, m2)
            assert m1.cells == m2.cells, k["cname"]
            assert acc1 == acc2, k["cname"]
    return vectorized


@pytest.mark.parametrize(("name", "schedule"), cases())
def test_packed_path_computes_what_the_element_wise_path_computes(name: str, schedule: str) -> None:
    program, reference = scheduled(name, schedule)
    assert _check_all_kernels(program, reference) > 0


@pytest.mark.parametrize("schedule", [None, "chunked", "fused"])
def test_packed_avg_kernels_compute_what_the_element_wise_path_computes(
    schedule: str | None,
) -> None:
    program, reference = text_programs(AVG_PROGRAM, schedule)
    assert _check_all_kernels(program, reference) > 0
