"""`cocoviz run --mpi`'s fast paths and summary, without launching MPI.

- The pooled evaluation of the MPI worker (`ops.stage_value_pooled`: `out=` buffers,
  in-place ops, recycled temporaries) gives `ops.stage_value`'s values bit for bit, on
  every stage of every sample × schedule and on values at the edges (NaN, inf, f16
  overflow and subnormals, bf16), including from buffers recycled dirty.
- The summary of a timed run is of one iteration, the median-makespan one: built here
  from constructed events, not from timing luck.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_mpi_run import SMALL

from cocoviz.errors import BuildError
from cocoviz.exec import ops
from cocoviz.exec.mpi_run import MpiRun, measured_iteration
from cocoviz.exec.mpi_worker import Event, iteration_report, median_iteration
from cocoviz.exec.reference import run_reference
from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.schedule.steps import apply_block, find_block

SAMPLES = Path(__file__).resolve().parent.parent / "samples"



# ------------------------------------------------------------- pooled evaluation


class _Checked:
    """Wraps `ops.stage_value`: every call also runs the pooled path on the same context
    and asserts the same dtype, shape and bits. The pooled buffer goes straight back to
    the pool, so later stages compute into recycled memory holding stale values."""

    def __init__(self) -> None:
        self.plain = ops.stage_value
        self.pool = ops.BufferPool()
        self.calls = 0

    def __call__(self, e: Any, ctx: Any) -> np.ndarray:
        want = self.plain(e, ctx)
        got, base = ops.stage_value_pooled(e, ctx, self.pool)
        assert got.dtype == want.dtype and got.shape == want.shape, e
        assert np.array_equal(
            np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8)
        ), e
        if base is not None:
            base.fill(np.nan if base.dtype.kind == "f" else 7)  # stale garbage for the next
            self.pool.give(base)
        self.calls += 1
        return want


CASES: list[tuple[str, str | None]] = [
    (name, sched)
    for name in sorted(SMALL)
    for sched in [None, *(b.name for b in load_file(SAMPLES / f"{name}.coco").schedules)]
]


@pytest.mark.parametrize(("name", "schedule"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_pooled_stage_values_are_bit_identical(name, schedule, monkeypatch):
    ranks = "tp=2,pp=2" if name == "pipeline_stage" else "4"
    p0 = load_file(SAMPLES / f"{name}.coco", SMALL[name], RanksOverride.parse(ranks))
    prog = apply_block(p0, find_block(p0, schedule)) if schedule else p0
    checked = _Checked()
    monkeypatch.setattr(ops, "stage_value", checked)
    run_reference(prog)
    assert checked.calls > 0


EDGE = """program t
ranks 2
dim N = 64
param s: f32 = 70000.0, tiny: f32 = 1e-6
input x : f32[N] replicated
input h : f16[N] sliced
input b : bf16[N] replicated
input y : f32[N] sliced
a = cast(f16, x * s)
c = sqrt(x - 0.5) + log(x - 0.25)
d = rsqrt(x - 0.5) * sigmoid(c) - relu(-x) + tanh(x) / exp(x)
e = cast(f16, h * tiny) + h
f = b * b - b
g = max(slice(x), y) - min(y, y * y) + pow(y, x * 0.5)
k = abs(-d) * d
o = gelu(x) + -x
q = where(x < 0.5, x, -x) + y / slice(x)
"""


def test_pooled_edges_are_bit_identical(monkeypatch):
    checked = _Checked()
    monkeypatch.setattr(ops, "stage_value", checked)
    prog = load_program(EDGE, "t.coco")
    res = run_reference(prog)
    assert checked.calls >= 9
    # the edges are there: f16 overflow to inf, NaN from sqrt/log of negatives
    assert np.isinf(res.global_value("a")).any()
    assert np.isnan(res.global_value("c")).any()


def test_pool_recycles_by_shape_and_dtype():
    pool = ops.BufferPool()
    a = pool.take((4,), np.dtype(np.float32))
    pool.give(a)
    pool.give(a[:2])  # a view: never pooled
    assert pool.take((4,), np.dtype(np.float32)) is a
    assert pool.take((4,), np.dtype(np.float32)) is not a
    assert pool.take((4,), np.dtype(np.float16)).dtype == np.float16


# ------------------------------------------------------------ summary of one iteration


def test_median_iteration_is_the_slowest_ranks_median():
    # per iteration, the slowest rank: [10, 30, 20, 12] -> sorted 10, 12, 20, 30 -> 20 (it 2)
    assert median_iteration([[10.0, 30.0, 20.0, 5.0], [1.0, 2.0, 3.0, 12.0]]) == 2
    assert median_iteration([[3.0, 1.0, 2.0]]) == 2
    assert median_iteration([[5.0]]) == 0
    assert median_iteration([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]) == 1
    with pytest.raises(ValueError):
        median_iteration([[], []])


PROG = """program t
ranks 2
dim N = 8
input g : f32[N] local
input w : f32[N] replicated
g1 = allreduce(+, g)
w1 = update(w, w - 0.1 * g1)
output w1
"""


def _iteration(comm: float, compute: float, slack: float = 0.0) -> tuple[float, list[Event]]:
    """One rank's iteration: the allreduce for `comm`, then the update for `compute`;
    the makespan (barrier to barrier) a little later."""
    evs = [
        Event("g1", "comm", "allreduce", 0.0, comm, 64),
        Event("w1", "compute", "compute", comm, comm + compute),
    ]
    return comm + compute + 0.001 + slack, evs


def test_summary_is_of_the_median_iteration_and_communication_fits_its_makespan():
    prog = load_program(PROG, "t.coco")
    # iterations 0..2: the last one has a long allreduce (a stall), longer than the
    # median makespan itself; reporting its events with the median makespan (as before)
    # would give communication > makespan.
    shapes = [(0.004, 0.006), (0.005, 0.006), (0.015, 0.006)]
    per_rank = []
    for r in range(2):
        its = [_iteration(c, k, slack=0.0005 * r) for c, k in shapes]
        per_rank.append(([m for m, _ in its], [e for _, e in its]))
    it = median_iteration([ms for ms, _ in per_rank])
    assert it == 1
    results = [iteration_report(ms, evs, it) for ms, evs in per_rank]
    makespan, events, iteration = measured_iteration(results)
    assert iteration == 1
    assert makespan == max(ms[1] for ms, _ in per_rank)
    run = MpiRun(2, 1.0, makespan, events, {}, iteration)
    s = run.timeline(prog).summary
    # every figure is iteration 1's
    assert s.comm_s == pytest.approx(0.005)
    assert s.exposed_comm_s == pytest.approx(0.005)
    assert s.overlap_fraction == pytest.approx(0.0)
    rows = {row.name: row for row in s.stages}
    assert rows["g1"].busy_s == pytest.approx(0.005)
    assert rows["w1"].busy_s == pytest.approx(0.006)
    assert s.comm_s <= s.makespan_s <= makespan
    # the last iteration's communication alone exceeds the reported makespan
    assert shapes[-1][0] > makespan


def test_ranks_reporting_different_iterations_are_an_error():
    ms, evs = [1.0, 2.0], [[], []]
    with pytest.raises(BuildError):
        measured_iteration([iteration_report(ms, evs, 0), iteration_report(ms, evs, 1)])
