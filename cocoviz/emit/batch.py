"""Batched cross-rank scalar reductions (issue 15): consecutive cross-rank finishes whose
partials are ready at the same point share one allreduce of a small array.

A cross-rank `ReduceFinish` turns a kernel's per-block partials into one value, sums
(or maxes) it across ranks with a one-element allreduce, and stores the final scalar.
LAMB's two norms are two such finishes, each its own allreduce. Here a finish F is
deferred past the elementwise kernels that follow it on the same stream and pipeline
stage when none of them touches F's partials or result (so the kernels compute the same
values), up to the next cross-rank finish with the same accumulator type and reduction;
such a run of finishes becomes one `FinishBatch`: the partials of finish j go to slot j
of a small ``pack`` buffer, one allreduce of the pack, then each final scalar from its
slot. Every value is reduced by the same operations in the same order as before (the
allreduce is elementwise), so the results are bit-identical; only the number of
allreduces and launches drops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence

from cocoviz.batching import batch_runs
from cocoviz.emit import plan as pl


def _key(s: pl.Step) -> Hashable | None:
    """Cross-rank finishes batch with those of the same stream, pipeline stage,
    accumulator type and reduction (sum or max)."""
    if not (isinstance(s, pl.ReduceFinish) and s.cross_rank):
        return None
    op = "max" if s.reduction.kind == "absmax" else "sum"
    return (s.stream, s.pstage, s.reduction.acc_dtype, op)


def _touched(k: pl.Kernel) -> set[str]:
    """Buffers a kernel reads or writes (loads, scalar loads, stores, its partials)."""
    out = {s.buffer for s in (*k.pre, *k.body) if s.buffer}
    out |= {r.partial for r in k.reductions}
    return out


def batch_finishes(
    steps: Sequence[pl.Step],
    root: Callable[[str], str],
    new_batch: Callable[[tuple[pl.ReduceFinish, ...]], tuple[str, str]],
) -> list[pl.Step]:
    """``steps`` with every run of batchable cross-rank finishes as one `FinishBatch`
    (`cocoviz.batching.batch_runs`): a finish waits past kernels of its stream and stage
    that touch none of the run's partials or results.

    ``root`` maps a buffer to the buffer whose memory it uses (aliases resolved);
    ``new_batch`` names a batch and allocates its pack buffer: (step name, pack). Chunk loops
    are batched inside each item."""

    def may_pass(t: pl.Step, run: list[pl.Step]) -> bool:
        first = run[0]
        if not (isinstance(t, pl.Kernel) and t.stream == first.stream):
            return False
        guarded = set()
        for f in run:
            assert isinstance(f, pl.ReduceFinish)
            guarded |= {root(f.result), root(f.reduction.partial)}
        return t.pstage == first.pstage and not ({root(b) for b in _touched(t)} & guarded)

    def merge(run: list[pl.Step]) -> pl.Step:
        fs = tuple(f for f in run if isinstance(f, pl.ReduceFinish))
        cname, pack = new_batch(fs)
        s = fs[0]
        return pl.FinishBatch(cname, fs, pack, s.reduction.acc_dtype, s.pstage, s.stream)

    inner = [
        dataclasses.replace(
            s,
            items=tuple(
                pl.ChunkItem(it.label, it.stream, tuple(batch_finishes(it.steps, root, new_batch)))
                for it in s.items
            ),
        )
        if isinstance(s, pl.ChunkLoop)
        else s
        for s in steps
    ]
    return batch_runs(inner, _key, may_pass, merge)
