"""The shard geometry of a decomposed group (cocoviz/ir/shards.py, docs/schedules.md,
`decompose`), checked without MPI: G simulated ranks run the ring with the reference's
per-rank arrays, and each rank's result equals the reference's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cocoviz.exec import ops, verify
from cocoviz.exec.reference import run_reference
from cocoviz.exec.shard_pipeline import run_gemm
from cocoviz.ir.lower import RanksOverride, load_program
from cocoviz.ir.nodes import Program
from cocoviz.ir.shards import shard_plan
from cocoviz.ir.transforms import Decompose
from cocoviz.schedule import apply_block

GATHERS = {
    # name: (declarations, stages) — the allgather is xg, the matmul h
    "left rows (flat)": (
        "input x : {t}[S, B, H] sliced\ninput w : {t}[H, F] sliced(1)",
        "xg = allgather(x)\nh = matmul(xg, w)",
    ),
    "left rows, strided (sliced(1))": (
        "input x : {t}[B, S, H] sliced(1)\ninput w : {t}[H, F] replicated",
        "xg = allgather(x)\nh = matmul(xg, w)",
    ),
    "left contraction": (
        "input x : {t}[S, H] sliced(1)\ninput w : {t}[H, F] replicated",
        "xg = allgather(x)\nh = matmul(xg, w)",
    ),
    "right contraction (ZeRO-3)": (
        "input x : {t}[S, H] local\ninput w : {t}[H, F] sliced",
        "xg = allgather(w)\nh = matmul(x, xg)",
    ),
    "right columns": (
        "input x : {t}[S, H] replicated\ninput w : {t}[H, F] sliced(1)",
        "xg = allgather(w)\nh = matmul(x, xg)",
    ),
}

SCATTERS = {
    "scatter": (
        "input a : {t}[S, F] sliced(1)\ninput w : {t}[F, H] sliced",
        "h = matmul(a, w)\nxg = reducescatter(+, h)",
    ),
    "scatter 3-D, max": (
        "input a : {t}[B, S, F] sliced(2)\ninput w : {t}[F, H] sliced",
        "h = matmul(a, w)\nxg = reducescatter(max, h)",
    ),
}


def _program(decls: str, stages: str, G: int, dtype: str) -> Program:
    # a scatter's matmul h is read only by its reducescatter xg: not an output
    outputs = "xg" if "reducescatter" in stages else "xg, h"
    text = (
        f"program p\nranks {G}\ndim B = 2, S = {4 * G}, H = {2 * G}, F = {3 * G}\n"
        f"{decls.format(t=dtype)}\n{stages}\noutput {outputs}\n"
    )
    return load_program(text, "p.coco")


def _ring_gather(run, plan, G: int) -> list[np.ndarray]:
    """Each rank's matmul result, computed shard by shard around the ring."""
    mm = run.program.stage(plan.matmul)
    source = run.program.stage(plan.collective).expr.args[0].name
    fixed_name = mm.expr.args[1 - plan.operand].name
    out = []
    for r in range(G):
        acc = np.full(run.storage(plan.matmul, r).size, np.nan, np.float32)  # written by step 0
        fixed = run.storage(fixed_name, r).astype(np.float32).ravel()
        for s in range(G):
            c = plan.shard_at(r, s)
            shard = run.storage(source, c).astype(np.float32).ravel()
            if plan.operand == 0:
                run_gemm(plan.gemms[c], shard, fixed, acc, s == 0)
            else:
                run_gemm(plan.gemms[c], fixed, shard, acc, s == 0)
        out.append(ops.round_to(acc, mm.ty.dtype))
    return out


@pytest.mark.parametrize("G", [2, 4, 8])
@pytest.mark.parametrize("case", sorted(GATHERS))
def test_gather_geometry(case: str, G: int) -> None:
    p = Decompose(items=("xg", "h")).apply(_program(*GATHERS[case], G, "f32"))
    plan = shard_plan(p, p.groups[0])
    assert plan.kind == "gather"
    run = run_reference(p)
    for r, got in enumerate(_ring_gather(run, plan, G)):
        want = run.storage("h", r).ravel()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"rank {r}")


@pytest.mark.parametrize("G", [2, 4, 8])
@pytest.mark.parametrize("case", sorted(SCATTERS))
def test_scatter_geometry(case: str, G: int) -> None:
    p = Decompose(items=("h", "xg")).apply(_program(*SCATTERS[case], G, "f32"))
    plan = shard_plan(p, p.groups[0])
    assert plan.kind == "scatter"
    run = run_reference(p)
    combine = np.maximum if "max" in case else np.add
    for r in range(G):
        total = None
        for j in range(1, G + 1):  # the accumulator of block r starts at rank r + 1
            q = (r + j) % G
            assert plan.shard_at(q, j - 1) == r
            block = np.empty(plan.shard_numel, np.float32)
            a = run.storage("a", q).astype(np.float32).ravel()
            w = run.storage("w", q).astype(np.float32).ravel()
            run_gemm(plan.gemms[r], a, w, block, True)
            total = block if total is None else combine(total, block)
        want = run.storage("xg", r).ravel()
        np.testing.assert_allclose(total, want, rtol=1e-5, atol=1e-5, err_msg=f"rank {r}")


def test_ring_neighbours() -> None:
    p = Decompose(items=("xg", "h")).apply(_program(*GATHERS["left rows (flat)"], 4, "f32"))
    plan = shard_plan(p, p.groups[0])
    for r in range(4):
        for s in range(3):  # what r sends at step s is what its receiver needs at s + 1
            assert plan.shard_at(plan.send_to(r), s + 1) == plan.shard_at(r, s)


CASES = Path(__file__).parent / "programs" / "decompose_cases.coco"


@pytest.mark.parametrize("ranks", ["2", "4", "8"])
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_verify_passes_for_every_decomposed_schedule(ranks: str, dt: str) -> None:
    text = CASES.read_text().replace("f32[", f"{dt}[")
    original = load_program(text, "decompose_cases.coco", ranks=RanksOverride.parse(ranks))
    for block in original.schedules:
        scheduled = apply_block(original, block)
        assert any(g.by_shard for g in scheduled.groups)
        report = verify.verify_programs(original, scheduled)
        assert report.ok, report.format_report()
