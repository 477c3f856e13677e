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
from collections.abc import Callable, Sequence

from cocoviz.emit import plan as pl


def _op_class(f: pl.ReduceFinish) -> str:
    return "max" if f.reduction.kind == "absmax" else "sum"


def _compatible(a: pl.ReduceFinish, b: pl.Step) -> bool:
    return (
        isinstance(b, pl.ReduceFinish)
        and b.cross_rank
        and b.stream == a.stream
        and b.pstage == a.pstage
        and b.reduction.acc_dtype is a.reduction.acc_dtype
        and _op_class(b) == _op_class(a)
    )


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
    """``steps`` with every run of batchable cross-rank finishes as one `FinishBatch`.

    ``root`` maps a buffer to the buffer whose memory it uses (aliases resolved);
    ``new_batch`` names a batch and allocates its pack buffer: (step name, pack). Chunk loops
    are batched inside each item."""
    out: list[pl.Step] = []
    i = 0
    while i < len(steps):
        s = steps[i]
        if isinstance(s, pl.ChunkLoop):
            items = tuple(
                pl.ChunkItem(it.label, it.stream, tuple(batch_finishes(it.steps, root, new_batch)))
                for it in s.items
            )
            out.append(dataclasses.replace(s, items=items))
            i += 1
            continue
        if not (isinstance(s, pl.ReduceFinish) and s.cross_rank):
            out.append(s)
            i += 1
            continue
        group: list[pl.ReduceFinish] = [s]
        guarded = {root(s.result), root(s.reduction.partial)}
        moved: list[pl.Step] = []
        pending: list[pl.Step] = []
        j = i + 1
        while j < len(steps):
            t = steps[j]
            if _compatible(s, t):
                assert isinstance(t, pl.ReduceFinish)
                moved += pending
                pending = []
                group.append(t)
                guarded |= {root(t.result), root(t.reduction.partial)}
                j += 1
            elif (
                isinstance(t, pl.Kernel)
                and t.stream == s.stream
                and t.pstage == s.pstage
                and not ({root(b) for b in _touched(t)} & guarded)
            ):
                pending.append(t)
                j += 1
            else:
                break
        out += moved
        if len(group) == 1:
            out.append(s)
        else:
            fs = tuple(group)
            cname, pack = new_batch(fs)
            out.append(pl.FinishBatch(cname, fs, pack, s.reduction.acc_dtype, s.pstage, s.stream))
        i = j - len(pending)
    return out
