"""The names steps make, for the error on a name a step has not made yet (docs/schedules.md,
"Names").

Two steps add stages, and `Index.fresh` names them from a stage of the program: `split(s)`
names the reducescatter half of allreduce `s` `s_rs` (the allgather half keeps `s`), and
`reorder(ag)` names each sliced live-out `m` it moves across the allgather (or alltoall)
`ag` `m_s` (the gather right after it keeps `m`); either adds `_2`, `_3`, … when the name
is taken. Fused and overlapped groups and `decompose` name no stage.

A step that names a stage the program lacks is asked here which steps would make it: the
names are read back to the stage each suffix grows from, the steps that could make it
from there are applied to the program, and the first (one step, or a split and the
reorder across its allgather) whose result holds the name is the answer. The test over
every sample's schedule blocks (tests/test_headless_edges.py) keeps this in step with
the steps. What is
reported is therefore what applying those steps gives, never a guess from the spelling.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from cocoviz.errors import CocovizError, InternalError
from cocoviz.ir.nodes import Op, Program
from cocoviz.ir.transforms.base import Index, Transformation, index

SUFFIXES = ("_rs", "_s")
"""What `split` (`<stage>_rs`) and `reorder` (`<stage>_s`) add to a stage's name."""
FRESH = re.compile(r"_(?:[2-9]|[1-9]\d+)")
"""`Index.fresh`'s `_K` (K ≥ 2) after a taken name."""
MAX_TRIES = 8
"""Candidate step sequences applied at most, so a large program's error stays quick."""


def _ancestors(idx: Index, name: str, *ops: Op) -> list[str]:
    """Stages with one of the operations `ops` that `name` depends on, nearest (latest)
    first."""
    seen: set[str] = set()
    todo = [name]
    found: list[str] = []
    while todo:
        n = todo.pop()
        for p in idx.preds(n):
            if p in seen:
                continue
            seen.add(p)
            todo.append(p)
            if idx.stage(p).expr.op in ops:
                found.append(p)
    found.sort(key=idx.position, reverse=True)
    return found


def _candidates(idx: Index, name: str) -> Iterator[tuple[Transformation, ...]]:
    from cocoviz.ir.transforms.reorder import Reorder
    from cocoviz.ir.transforms.split import Split

    # every way to read `name` as <base><suffix>[_K]: a base may itself end in _s or _rs
    for base, suffix in _readings(name):
        if not idx.is_stage(base):
            continue
        if suffix == "_rs":
            if idx.stage(base).expr.op is Op.ALLREDUCE:
                yield (Split(stage=base),)
            continue
        for ag in _ancestors(idx, base, Op.ALLGATHER, Op.ALLTOALL):
            yield (Reorder(gather=ag),)
        for ar in _ancestors(idx, base, Op.ALLREDUCE):
            yield (Split(stage=ar), Reorder(gather=ar))


def _readings(name: str) -> list[tuple[str, str]]:
    """(base, suffix) for every way `name` ends in a suffix a step adds."""
    out: list[tuple[str, str]] = []
    for suffix in SUFFIXES:
        for m in re.finditer(re.escape(suffix), name):
            base, rest = name[: m.start()], name[m.end() :]
            if base and (rest == "" or FRESH.fullmatch(rest)):
                out.append((base, suffix))
    return out


def made_by(program: Program, name: str) -> tuple[Transformation, ...] | None:
    """The steps that, applied to `program`, make a stage called `name` (None if no step
    sequence tried does, or `name` is already bound)."""
    idx = index(program)
    if idx.is_bound(name):
        return None
    for k, steps in enumerate(_candidates(idx, name)):
        if k >= MAX_TRIES:
            break
        p = program
        try:
            for s in steps:
                p = s.run_unverified(p)
        except (CocovizError, InternalError):  # a hint never turns the user's error into another
            continue
        if index(p).is_stage(name):
            return steps
    return None


def not_made_yet(program: Program, name: str, step: str) -> tuple[str, str] | None:
    """(message, hint) for `step` naming `name`, which `program` lacks and other steps
    would make; None when no step makes it."""
    steps = made_by(program, name)
    if steps is None:
        return None
    shown = "; ".join(str(s) for s in steps)
    made = "makes it, and has" if len(steps) == 1 else "make it, and have"
    return (
        f"no stage named '{name}' yet: {shown} {made} not been applied",
        f"apply {shown} first: {shown}; {step}",
    )
