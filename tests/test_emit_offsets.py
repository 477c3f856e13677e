"""The element offsets the emitter's plan gives each chunk's GEMM and collective, checked
against the layout they must implement — computed here from docs/schedules.md and
docs/codegen.md, not from the emitter — rather than pinned by golden text alone.

docs/schedules.md (overlap): chunks are K equal contiguous blocks of rows of the first
item's output; in chunk k, rank r holds the global elements from k·numel/K + r·numel/(K·G)
on, stored chunk by chunk (chunk k of a rank's slice at k·numel/(K·G)). NCCL's layouts
(docs/codegen.md): a reduce-scatter of `count` gives rank r block r of the `G·count`
elements from the send offset; an all-gather puts rank r's `count` elements at block r
of the receive range; an all-reduce combines `count` elements at the same offsets.

Each offset is evaluated as the emitted C++ evaluates it: the renderer's text of the
`Offset` with `tp` and `k` bound.
"""

from __future__ import annotations

import pytest

from cocoviz.emit import plan as pl
from cocoviz.emit.lower import lower_emit
from cocoviz.emit.render import Renderer
from cocoviz.ir.lower import load_program
from cocoviz.schedule import apply_block

G = 4


def _at(o: pl.Offset, rank: int, k: int) -> int:
    """The offset as the emitted code computes it, for rank `rank` (tp) in chunk `k`."""
    text = Renderer.offset(None, o)  # type: ignore[arg-type]  # uses no state
    return int(eval(text, {"__builtins__": {}}, {"tp": rank, "k": k}))  # noqa: S307


def _loop(text: str, block: str) -> pl.ChunkLoop:
    prog = load_program(text, "t.coco")
    scheduled = apply_block(prog, next(b for b in prog.schedules if b.name == block))
    steps = lower_emit(scheduled, None).scheduled.steps
    loops = [s for s in steps if isinstance(s, pl.ChunkLoop)]
    assert len(loops) == 1
    return loops[0]


def _steps(loop: pl.ChunkLoop) -> list[pl.Step]:
    return [s for it in loop.items for s in it.steps]


def _mm_program(m: int, kd: int, n: int) -> str:
    return f"""program ol
ranks {G}
dim M = {m}, KD = {kd}, N = {n}
input x : f32[M, KD] local
input w : f32[KD, N] replicated
p = matmul(x, w)
s = allreduce(+, p)
y = s * 2
output y
schedule rs {{ split(s); reorder(s); fuse(s_rs, y); overlap(p, s_rs, chunks=CHUNKS) }}
schedule ar {{ overlap(p, s, chunks=CHUNKS) }}
"""


SIZES = [(16, 8, 8, 2), (16, 8, 8, 4), (32, 4, 12, 2), (48, 8, 4, 3)]


@pytest.mark.parametrize(("m", "kd", "n", "chunks"), SIZES)
def test_chunked_gemm_reads_and_writes_chunk_k_of_the_rows(
    m: int, kd: int, n: int, chunks: int
) -> None:
    text = _mm_program(m, kd, n).replace("CHUNKS", str(chunks))
    for block in ("rs", "ar"):
        if block == "rs" and (m * n // chunks) % G:
            continue
        loop = _loop(text, block)
        assert loop.chunks == chunks
        (mm,) = [s for s in _steps(loop) if isinstance(s, pl.Matmul)]
        rows = m // chunks
        assert (mm.m, mm.n, mm.k) == (rows, n, kd)
        for k in range(chunks):
            for r in range(G):
                # x and p are local: storage is the whole [M, KD] / [M, N] array
                assert _at(mm.a_offset, r, k) == k * rows * kd
                assert _at(mm.c_offset, r, k) == k * rows * n
                assert _at(mm.b_offset, r, k) == 0


@pytest.mark.parametrize(
    ("m", "kd", "n", "chunks"), [s for s in SIZES if s[0] * s[2] // s[3] % G == 0]
)
def test_chunked_reducescatter_and_allgather_follow_the_chunk_layout(
    m: int, kd: int, n: int, chunks: int
) -> None:
    numel = m * n
    K = chunks
    loop = _loop(_mm_program(m, kd, n).replace("CHUNKS", str(chunks)), "rs")
    colls = {s.op: s for s in _steps(loop) if isinstance(s, pl.Collective)}
    rs, ag = colls["reducescatter"], colls["allgather"]
    part = numel // (K * G)  # what one rank holds of one chunk
    assert rs.count == ag.count == part
    for k in range(K):
        for r in range(G):
            first = k * numel // K + r * part  # docs/schedules.md: rank r's part of chunk k
            # reduce-scatter: rank r receives block r of the send range (p is local: its
            # storage index is the global index), into chunk k of its slice storage
            assert _at(rs.send_offset, r, k) + r * rs.count == first
            assert _at(rs.recv_offset, r, k) == k * part
            # all-gather: rank r sends chunk k of its slice storage, which lands at block r
            # of the receive range of the replicated result (storage index = global index)
            assert _at(ag.send_offset, r, k) == k * part
            assert _at(ag.recv_offset, r, k) + r * ag.count == first


@pytest.mark.parametrize(("m", "kd", "n", "chunks"), SIZES)
def test_chunked_allreduce_combines_chunk_k(m: int, kd: int, n: int, chunks: int) -> None:
    numel = m * n
    loop = _loop(_mm_program(m, kd, n).replace("CHUNKS", str(chunks)), "ar")
    (ar,) = [s for s in _steps(loop) if isinstance(s, pl.Collective)]
    assert ar.op == "allreduce"
    assert ar.count == numel // chunks
    for k in range(chunks):
        for r in range(G):
            assert _at(ar.send_offset, r, k) == k * numel // chunks
            assert _at(ar.recv_offset, r, k) == k * numel // chunks


def test_offsets_render_every_term() -> None:
    """The renderer's text holds each term once, with its multiplier: the checks above
    would not see a term the sizes there make zero."""
    o = pl.Offset(const=5, per_rank=3, per_chunk=7)
    for r in range(3):
        for k in range(3):
            assert _at(o, r, k) == 5 + 3 * r + 7 * k
    assert _at(pl.ZERO, 2, 2) == 0
