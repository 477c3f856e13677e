"""`chunked_matmul_times` cuts the producer matmul into K row chunks that cover every row
(docs/cost-model.md, "Chunks": each chunk is its own GEMM): when K does not divide the
rows, the chunks differ by at most one row and their rows add up to the whole — checked
here by pricing each chunk's GEMM with `matmul_time` on the expected row counts."""

from __future__ import annotations

import pytest

from cocoviz.sim.compute import chunk_efficiency, chunked_matmul_times, matmul_time
from cocoviz.sim.hardware import load_profile


# 4·4224 + 3 rows in 4 chunks: three of 4225 rows, one of 4224 — on h100-dgx the 4225th
# row costs a wave more, so a chunking that dropped the remainder would be priced lower
@pytest.mark.parametrize(
    ("m", "chunks"), [(4 * 4224 + 3, 4), (3 * 4224 + 2, 3), (10, 4), (7, 3), (8, 8)]
)
def test_chunks_cover_every_row(m: int, chunks: int) -> None:
    hw = load_profile("h100-dgx")
    n, k = 4096, 4096
    # the rows, as evenly as possible: m // chunks each, one more for the first m % chunks
    rows = [m // chunks + (1 if i < m % chunks else 0) for i in range(chunks)]
    assert sum(rows) == m
    got = chunked_matmul_times(hw, m, n, k, "f16", chunks)
    want = tuple(matmul_time(hw, r, n, k, "f16") for r in rows)
    assert got == pytest.approx(want, rel=1e-12)


def test_a_dropped_row_would_be_seen() -> None:
    """The check above distinguishes a chunk of one row fewer: the GEMM times differ."""
    hw = load_profile("h100-dgx")
    assert matmul_time(hw, 4225, 4096, 4096) > matmul_time(hw, 4224, 4096, 4096)
    assert 0 < chunk_efficiency(hw, 4 * 4224 + 3, 4096, 4096, "f16", 4) <= 1.0
