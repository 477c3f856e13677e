"""Runs of batchable steps, for the emitter and the cost model alike.

The emitter batches consecutive cross-rank scalar reductions into one allreduce
(`cocoviz.emit.batch`) and the simulator predicts that program
(`cocoviz.sim.workload.batch_reductions`); both walk their own step type with this one
rule, so the model batches exactly what the emitter does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")


def batch_runs(
    items: Sequence[T],
    key: Callable[[T], Hashable | None],
    may_pass: Callable[[T, list[T]], bool],
    merge: Callable[[list[T]], T],
) -> list[T]:
    """`items` with each run of two or more items of one key (None: never batched)
    replaced by ``merge(run)``.

    A run starts at an item with a key and takes the next items of that key; items in
    between for which ``may_pass(item, run so far)`` holds move ahead of the merged item
    (the run waits past them); the first item that neither joins nor passes ends the run,
    and the passed items after its last member stay where they were.
    """
    out: list[T] = []
    i = 0
    while i < len(items):
        first = items[i]
        k = key(first)
        if k is None:
            out.append(first)
            i += 1
            continue
        run = [first]
        moved: list[T] = []
        pending: list[T] = []
        j = i + 1
        while j < len(items):
            t = items[j]
            if key(t) == k:
                moved += pending
                pending = []
                run.append(t)
            elif may_pass(t, run):
                pending.append(t)
            else:
                break
            j += 1
        out += moved
        out.append(first if len(run) == 1 else merge(run))
        i = j - len(pending)
    return out
