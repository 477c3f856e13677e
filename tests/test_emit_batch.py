"""Batched cross-rank scalar reductions (issue 15, `cocoviz.emit.batch`): LAMB's two norms
share one allreduce of two values, a finish whose result a later kernel reads is not
deferred past it, and the batched program's outputs are bit-identical to the unbatched
lowering's (the emulated CUDA program and the C++/MPI program, multi-rank, --dump)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import emulation_cache
from emit_support import (
    build_emulated,
    emit_files,
    emit_text,
    make,
    need_mpicxx,
    scheduled,
    write,
)

import cocoviz.emit.lower as lower_mod
from cocoviz.emit import plan as pl
from cocoviz.emit.emitter import emit

LAMB = "lamb"


def _finishes(steps: tuple[pl.Step, ...]) -> list[pl.Step]:
    out: list[pl.Step] = []
    for s in steps:
        if isinstance(s, pl.ChunkLoop):
            for it in s.items:
                out += _finishes(it.steps)
        elif isinstance(s, (pl.ReduceFinish, pl.FinishBatch)):
            out.append(s)
    return out


def _plan(name: str, schedule: str) -> pl.EmitPlan:
    p, ref = scheduled(name, schedule, True, "4")
    return lower_mod.lower_emit(p, ref, "nccl")


@pytest.mark.parametrize("schedule", ["rs_c_ag", "fused"])
def test_lamb_norms_share_one_allreduce(schedule: str) -> None:
    plan = _plan(LAMB, schedule)
    fins = _finishes(plan.scheduled.steps)
    assert len(fins) == 1 and isinstance(fins[0], pl.FinishBatch), fins
    assert [f.stage for f in fins[0].finishes] == ["rn", "wn"]
    files = emit_files(LAMB, schedule, "cuda")
    cu = files["lamb.cu"]
    pack = fins[0].pack
    assert cu.count(f"ncclAllReduce(B.{pack}, B.{pack}, 2,") == 1
    assert cu.count("ncclAllReduce(B.p_") == 1  # no one-value allreduce left
    man = json.loads(files["manifest.json"])
    batch = [s for s in man["scheduled"]["steps"] if s["kind"] == "finishes"]
    assert batch and batch[0]["batched_values"] == 2 and batch[0]["stages"] == ["rn", "wn"]
    stages = {s["name"]: s for s in man["scheduled"]["stages"]}
    assert "allreduce of 2 values: rn, wn, batched" in stages["rn"]["collectives"][0]
    cpp = emit_files(LAMB, schedule, "cpu")["lamb.cpp"]
    assert cpp.count(f"(B.{pack}, B.{pack}, 2, ::cocoviz::ReduceOp::sum,") == 1


DEPENDENT = """
program dep
ranks 4
dim N = 1024
input x : f32[N] sliced(0)
a = norm(x)
y = x * a
b = norm(y)
c = norm(x)
output b
output c
"""


def test_a_finish_read_by_the_next_kernel_is_not_deferred() -> None:
    """y reads a's result, so a's finish stays before y's kernel; b and c are
    independent of each other and batch."""
    files = emit_text(DEPENDENT, None, "cuda")
    cu = files["dep.cu"]
    assert cu.count("ncclAllReduce(") == 2, cu
    assert "allreduce of 2 values: b, c, batched" in files["manifest.json"]


def _unbatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lower_mod, "batch_finishes", lambda steps, *a: list(steps))


def _run(tree: Path, *args: str) -> None:
    res = subprocess.run(
        [str(tree / "run.sh"), *args, "--check", "--iters", "2", "--warmup", "0",
         "--dump", str(tree / "dump")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["check"] == "pass"


def _same_dumps(a: Path, b: Path) -> None:
    names = sorted(p.name for p in (a / "dump").iterdir())
    assert names and names == sorted(p.name for p in (b / "dump").iterdir())
    for n in names:
        assert (a / "dump" / n).read_bytes() == (b / "dump" / n).read_bytes(), n


@pytest.mark.build
def test_batched_is_bit_identical_emulated(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cache = emulation_cache(tmp_path_factory)
    cache.mkdir(exist_ok=True)
    batched = build_emulated(emit_files(LAMB, "rs_c_ag", "cuda", ranks="4"), cache)
    _unbatched(monkeypatch)
    plain_files = emit_files(LAMB, "rs_c_ag", "cuda", ranks="4")
    assert plain_files["lamb.cu"].count("ncclAllReduce(B.p_") == 2
    plain = build_emulated(plain_files, cache)
    for t in (batched, plain):
        _run(t, "--emulate")
    _same_dumps(batched, plain)


@pytest.mark.build
def test_batched_is_bit_identical_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    need_mpicxx()
    trees = []
    for name, patch in (("batched", False), ("plain", True)):
        if patch:
            _unbatched(monkeypatch)
        p, ref = scheduled(LAMB, "rs_c_ag", True, "4")
        files = emit(p, ref, target="cpu", schedule_name="rs_c_ag").files
        d = tmp_path / name
        write(d, files)
        res = make(d)
        assert res.returncode == 0, res.stdout + res.stderr
        _run(d)
        trees.append(d)
    _same_dumps(*trees)


def test_model_prices_one_batched_allreduce() -> None:
    """The cost model predicts the emitted program: LAMB's norms are one `.reduce` op
    of both values, and the prediction is no slower than two one-value allreduces."""
    import cocoviz.sim.timeline as tl
    from cocoviz.sim.hardware import load_profile
    from cocoviz.sim.predict import simulate

    p, _ = scheduled(LAMB, "rs_c_ag", False)
    hw = load_profile("h100-dgx")
    reduces = [s for s in simulate(p, hw, warnings=False).summary.stages if s.kind == "reduce"]
    assert [s.name for s in reduces] == ["rn.reduce + wn.reduce"]
    batched = tl.makespan(p, hw)
    orig = tl.batch_reductions
    try:
        tl.batch_reductions = lambda ctx, ops: list(ops)  # type: ignore[assignment]
        plain = tl.makespan(p, hw)
    finally:
        tl.batch_reductions = orig
    assert batched < plain
