"""nccl-tests' bus-bandwidth factors (its doc/PERFORMANCE.md, which docs/cost-model.md
follows) for every collective the model prices, alltoall included: the bytes a rank puts
on the wire per byte of the buffer."""

from __future__ import annotations

import pytest

from cocoviz.sim.collectives import bus_factor


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_bus_factor_of_each_collective(n: int) -> None:
    assert bus_factor("allreduce", n) == pytest.approx(2 * (n - 1) / n)
    for coll in ("reducescatter", "allgather", "alltoall"):
        assert bus_factor(coll, n) == pytest.approx((n - 1) / n), coll
    for coll in ("broadcast", "reduce"):
        assert bus_factor(coll, n) == 1.0, coll


def test_one_rank_moves_nothing_extra() -> None:
    for coll in ("allreduce", "reducescatter", "allgather", "alltoall", "broadcast"):
        assert bus_factor(coll, 1) == 1.0
