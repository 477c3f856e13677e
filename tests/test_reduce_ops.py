"""Every reduce operator of the language (docs/language.md: `+ * max min avg`) through the
reference collectives, `split`, `reorder`, `fuse`, `overlap`, `decompose` and `verify`.

A step that rewrites a collective must keep its operator (docs/schedules.md: `split`
turns `allreduce(op, x)` into `reducescatter(op, x)` and an allgather); these tests fail
when a step, or the reference, uses `+` (or any other fixed operator) instead of the one
written. The expected values are computed here with numpy from the per-rank inputs, not
taken from the reference.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cocoviz.exec import verify
from cocoviz.exec.reference import run_reference
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Op, Program, ReduceOp
from cocoviz.schedule import apply_block

OPS = list(ReduceOp)
DTYPES = ["f32", "i32"]
G = 4


def _program(op: ReduceOp, dtype: str, schedules: str = "") -> Program:
    text = f"""program reduce_ops
ranks {G}
dim R = 8, N = 16
input g : {dtype}[R, N] local
input w : {dtype}[R, N] replicated
g1 = allreduce({op.value}, g)
y = g1 + w
output y
{schedules}
"""
    return load_program(text, "reduce_ops.coco")


def _blocks(op: ReduceOp, dtype: str) -> dict[str, Program]:
    text = """
schedule split { split(g1) }
schedule rs_c_ag { split(g1); reorder(g1) }
schedule fused { split(g1); reorder(g1); fuse(g1_rs, y) }
"""
    p = _program(op, dtype, text)
    return {b.name: apply_block(p, b) for b in p.schedules}


def _expected(op: ReduceOp, per_rank: np.ndarray, dtype: str) -> np.ndarray:
    """The reduction over ranks (axis 0), computed independently of cocoviz."""
    wide = per_rank.astype(np.float64 if dtype.startswith("f") else np.int64)
    if op is ReduceOp.SUM:
        r = wide.sum(axis=0)
    elif op is ReduceOp.PROD:
        r = wide.prod(axis=0)
    elif op is ReduceOp.MAX:
        r = wide.max(axis=0)
    elif op is ReduceOp.MIN:
        r = wide.min(axis=0)
    else:  # avg: the sum divided by G, truncating for integers (docs/language.md)
        s = wide.sum(axis=0)
        r = s / G if dtype.startswith("f") else np.sign(s) * (np.abs(s) // G)
    if dtype == "i32":  # the reduction wraps as int32 arithmetic does
        r = (r.astype(np.int64) + 2**31) % 2**32 - 2**31
    return r


def _assert_reduced(op: ReduceOp, dtype: str, got: np.ndarray, per_rank: np.ndarray) -> None:
    want = _expected(op, per_rank, dtype)
    if dtype.startswith("f"):
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS, ids=[o.name.lower() for o in OPS])
def test_reference_collectives_reduce_with_the_written_operator(op: ReduceOp, dtype: str) -> None:
    """allreduce, reducescatter and reduce in the reference against numpy."""
    text = f"""program colls
ranks {G}
dim R = 8, N = 16
input g : {dtype}[R, N] local
a = allreduce({op.value}, g)
s = reducescatter({op.value}, g)
r = reduce({op.value}, g, root=1)
output a, s, r
"""
    p = load_program(text, "colls.coco")
    res = run_reference(p, seed=3)
    per_rank = np.stack([res.storage("g", k) for k in range(G)])
    for name in ("a", "s"):
        _assert_reduced(op, dtype, res.global_value(name), per_rank)
    # the root holds the result; docs/language.md: reduce leaves it on rank `root`
    _assert_reduced(op, dtype, res.storage("r", 1), per_rank)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS, ids=[o.name.lower() for o in OPS])
def test_split_keeps_the_operator(op: ReduceOp, dtype: str) -> None:
    scheduled = _blocks(op, dtype)
    for name, p in scheduled.items():
        rs = next(s for s in p.stages if s.expr.op is Op.REDUCESCATTER)
        assert rs.expr.rop is op, (name, rs.expr.rop)
        assert not any(s.expr.op is Op.ALLREDUCE for s in p.stages), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS, ids=[o.name.lower() for o in OPS])
def test_split_reorder_fuse_verify_with_every_operator(op: ReduceOp, dtype: str) -> None:
    """The scheduled programs agree with the original in the reference; and the original's
    output is the independent reduction of the inputs plus w."""
    original = _program(op, dtype)
    res = run_reference(original, seed=5)
    per_rank = np.stack([res.storage("g", k) for k in range(G)])
    w = res.global_value("w").astype(np.float64 if dtype.startswith("f") else np.int64)
    y = res.global_value("y")
    want = _expected(op, per_rank, dtype) + w
    if dtype.startswith("f"):
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-5, atol=1e-6)
    else:
        want = (want + 2**31) % 2**32 - 2**31
        np.testing.assert_array_equal(y.astype(np.int64), want)
    for name, p in _blocks(op, dtype).items():
        report = verify.verify_programs(original, p, seed=5)
        assert report.ok, (name, report.format_report())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS, ids=[o.name.lower() for o in OPS])
def test_a_wrong_operator_is_caught_by_verify(op: ReduceOp, dtype: str) -> None:
    """The check above can fail: the split program with its reducescatter's operator
    replaced by any other one does not verify."""
    original = _program(op, dtype)
    split = _blocks(op, dtype)["split"]
    for other in OPS:
        if other is op:
            continue
        stages = tuple(
            dataclasses.replace(s, expr=dataclasses.replace(s.expr, rop=other))
            if s.expr.op is Op.REDUCESCATTER
            else s
            for s in split.stages
        )
        wrong = dataclasses.replace(split, stages=stages)
        report = verify.verify_programs(original, wrong, seed=5)
        assert not report.ok, (op, other)


@pytest.mark.parametrize("op", OPS, ids=[o.name.lower() for o in OPS])
def test_overlap_and_decompose_keep_the_operator(op: ReduceOp) -> None:
    """A matmul and the reducescatter of its result, overlapped by rows and decomposed by
    shard (docs/schedules.md): both keep the written operator and verify."""
    text = f"""program mm_rs
ranks {G}
dim M = 16, K = 8, N = 8
input x : f32[M, K] local
input w : f32[K, N] replicated
p = matmul(x, w)
s = allreduce({op.value}, p)
y = s * 2
output y
schedule ol {{ split(s); reorder(s); fuse(s_rs, y); overlap(p, s_rs, chunks=2) }}
schedule dec {{ split(s); reorder(s); decompose(p, s_rs) }}
"""
    original = load_program(text, "mm_rs.coco")
    for b in original.schedules:
        p = apply_block(original, b)
        rs = next(s for s in p.stages if s.expr.op is Op.REDUCESCATTER)
        assert rs.expr.rop is op, (b.name, rs.expr.rop)
        report = verify.verify_programs(original, p, seed=7)
        assert report.ok, (b.name, report.format_report())
