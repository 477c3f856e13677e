"""The tuner: enumerate legal schedules of a program and rank them by the model.

For each ``allreduce`` of the program, in program order, the tuner tries the schedules
CoCoNet's paper names and their overlapped variants, built step by step with the
schedule transformations (a step that does not apply is skipped):

- as written (AR-C), and with the computation after the allreduce fused (AR-fuse(C));
- ``split`` alone (RS-AG-C);
- ``split``, ``reorder`` (with the region extended by side computations such as LAMB's
  ``norm(w)``), ``asslice`` of the updated inputs, ``dce`` (RS-C-AG);
- that, fused into one collective (``fuse(RS-C-AG)``), or with a send fused into the
  computation on the receiver (``fuse(P2P-C)``);
- ``overlap`` of every sub-chain of the producer → collective → … → allgather chain,
  with 2, 4, 8 and 16 chunks;
- ``decompose`` of the producer matmul and the reducescatter a split made (unfused and
  fused).

Then, for each ``allgather`` and ``reducescatter`` not yet in a group (the program's
own, and those the splits made), in program order: as it is, ``decompose`` of it and the
matmul next to it (an allgather → the matmul reading it, the matmul making it → a
reducescatter), and row-chunked ``overlap`` of the same pair (2–16 chunks), so the
shard-decomposed overlap, the row-chunked one and none are ranked by predicted time
wherever ``decompose`` is legal.

The best choice for one collective is kept while the next is tuned (coordinate descent),
and the program's own ``schedule`` blocks are evaluated too. Each candidate is ranked by
the simulated makespan (``cocoviz.sim.timeline.makespan``).

Every candidate is built with ``cocoviz.schedule.steps``, the path every caller takes,
so an ``overlap`` written without ``chunks=`` (in a schedule block) gets the K the model
picks on ``hw`` here as in ``apply``, ``emit`` and the TUI.

That search runs on the whole program when it has one region with something to choose.
A program of several (`cocoviz.schedule.regions`: the stretches between clean cuts that
no candidate step crosses, such as the layers of a stack) is searched region by region:
each class of regions that are the same up to renaming once, and the best of each put
together (`cocoviz.schedule.structured`, docs/cost-model.md, The tuner).

`tune` prints nothing: it reports through ``progress`` (a `TuneProgress` after each
candidate), stops when ``budget_s`` is spent or ``stop()`` says so, and then returns the
best schedules found so far (`TuneResult.complete` False), so that a worker thread can
run it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cocoviz.ir.nodes import (
    Op,
    Program,
)
from cocoviz.schedule.chunks import CHUNK_CHOICES
from cocoviz.schedule.files import save_sched
from cocoviz.schedule.search import (
    Candidate,
    Monitor,
    Search,
    TuneProgress,
    TuneResult,
    schedule_label,
    try_apply,
)
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.timeline import makespan

__all__ = [
    "CHUNK_CHOICES",
    "Candidate",
    "Crossover",
    "SweepPoint",
    "SweepResult",
    "TuneProgress",
    "TuneResult",
    "block_of",
    "main_dimension",
    "schedule_label",
    "sweep",
    "sweep_values",
    "tune",
    "write_schedule",
]


def tuned_collectives(program: Program) -> int:
    """The collectives the search tries steps for (as the program is written)."""
    return sum(
        1 for s in program.stages if s.expr.op in (Op.ALLREDUCE, Op.ALLGATHER, Op.REDUCESCATTER)
    )


def tune(
    program: Program,
    hw: Hardware,
    *,
    collectives: str = "nccl",
    progress: Callable[[TuneProgress], None] | None = None,
    budget_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    structured: bool | None = None,
) -> TuneResult:
    """Rank legal schedules of ``program`` (as loaded, before any schedule block).

    ``progress`` gets a `TuneProgress` after each candidate; the search ends early, with
    the best schedules found so far, once ``budget_s`` seconds are spent or ``stop()``
    returns true (both checked between candidates). ``structured``: None searches region
    by region when the program has more than one region with something to choose, True
    always (a program of one region is then searched under canonical names), False never
    (the whole program at once: slow on deep programs)."""
    monitor = Monitor(progress, budget_s, stop)
    if structured is not False:
        from cocoviz.schedule.regions import find_regions
        from cocoviz.schedule.structured import tune_by_region

        regions = find_regions(program)
        if structured or sum(1 for r in regions if r.tuned) > 1:
            result = tune_by_region(program, hw, collectives, regions, monitor)
            if result is not None:
                return result
    return _tune_whole(program, hw, collectives, monitor)


def _tune_whole(program: Program, hw: Hardware, collectives: str, monitor: Monitor) -> TuneResult:
    monitor.plan(tuned_collectives(program))
    search = Search(program, hw, collectives, monitor)
    search.run()
    if monitor.reason is None:
        search.blocks()
    monitor.regions_done = 1
    monitor.report()
    return TuneResult(
        program.name,
        hw.name,
        search.as_written.time_s,
        [c for c, _ in search.ranked()],
        search.evaluated,
        stopped=monitor.reason,
        kinds=1 if tuned_collectives(program) else 0,
    )


def write_schedule(candidate: Candidate, path: Path, header: str | None = None) -> None:
    """Write a candidate as a ``.sched`` file (the versioned header, a comment, one step a
    line), atomically; an OutputError when the system refuses."""
    comment = f"{header or candidate.name}: predicted {candidate.time_s * 1e6:.1f} us"
    save_sched(path, candidate.steps, f"{comment}, written by cocoviz tune")


# ---------------------------------------------------------------------------------------
# Sweeps: when does a schedule pay?


@dataclass(frozen=True)
class SweepPoint:
    """One size of a sweep: the tuner's best schedule and each canonical schedule's time
    (the program as written, then its ``schedule`` blocks, by title)."""

    value: int
    baseline_s: float
    best: Candidate
    canonical: tuple[tuple[str, float], ...]
    decomposed: Candidate | None = None
    """The tuner's best schedule with a group decomposed by shard (None: none legal)."""
    undecomposed: Candidate | None = None
    """Its best schedule without one."""

    @property
    def decompose_pays(self) -> bool:
        """Whether the best decomposed schedule beats every schedule without one."""
        return (
            self.decomposed is not None
            and self.undecomposed is not None
            and self.decomposed.time_s < self.undecomposed.time_s
        )

    @property
    def winner(self) -> str:
        """The fastest canonical schedule (the first listed on a tie)."""
        return min(self.canonical, key=lambda item: item[1])[0]

    def time_of(self, title: str) -> float:
        return dict(self.canonical)[title]


@dataclass(frozen=True)
class Crossover:
    """From ``value`` on, ``winner`` is the fastest canonical schedule, where ``loser``
    was at the size before."""

    value: int
    winner: str
    loser: str


@dataclass
class SweepResult:
    program: str
    hardware: str
    dim: str
    points: list[SweepPoint] = field(default_factory=list)

    @property
    def decompose_tried(self) -> bool:
        """Whether ``decompose`` was legal at some size."""
        return any(pt.decomposed is not None for pt in self.points)

    @property
    def decompose_pays_at(self) -> list[int]:
        """The sizes at which the decomposition beats every schedule without one."""
        return [pt.value for pt in self.points if pt.decompose_pays]

    @property
    def decompose_pays_from(self) -> int | None:
        """The size from which the decomposition pays at every larger size of the sweep
        (None when it does not pay at the largest)."""
        start: int | None = None
        for pt in self.points:
            if not pt.decompose_pays:
                start = None
            elif start is None:
                start = pt.value
        return start

    @property
    def crossovers(self) -> list[Crossover]:
        out: list[Crossover] = []
        for before, after in zip(self.points, self.points[1:], strict=False):
            if after.winner != before.winner:
                out.append(Crossover(after.value, after.winner, before.winner))
        return out


def canonical_schedules(
    program: Program, hw: Hardware, collectives: str = "nccl"
) -> tuple[tuple[str, float], ...]:
    """The program as written and each of its schedule blocks that applies, with the
    model's time; a block that gives the program as written shares its row."""
    rows: dict[Program, tuple[str, float]] = {
        program: (schedule_label(program), makespan(program, hw, collectives))
    }
    for sched in program.schedules:
        p = try_apply(program, tuple(str(st) for st in sched.steps), hw)
        if p is None:
            continue
        title = f"{schedule_label(p)} [{sched.name}]"
        rows[p] = (title, rows[p][1] if p in rows else makespan(p, hw, collectives))
    return tuple(rows.values())


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _dims_of(shape_texts: Sequence[str], dims: dict[str, int]) -> set[str]:
    return {n for text in shape_texts for n in _NAME.findall(text) if n in dims}


def main_dimension(program: Program) -> str | None:
    """The dimension a crossover sweep varies: among the dimensions of the program's
    largest collective (by bytes), the one the fewest inputs use, so a token or element
    count rather than a model width that every weight has; the larger one on a tie.
    None when no collective's shape names a dimension."""
    dims = program.shape_env
    colls = [s for s in program.stages if s.is_collective]
    if not colls:
        return None
    largest = max(colls, key=lambda s: s.ty.numel * s.ty.dtype.itemsize)
    named = _dims_of([size.text for size in largest.ty.shape], dims)
    if not named:
        return None
    uses = {
        d: sum(d in _dims_of([size.text for size in i.ty.shape], dims) for i in program.inputs)
        for d in named
    }
    return min(sorted(named), key=lambda d: (uses[d], -dims[d]))


def sweep_values(value: int, below: int = 6, above: int = 2) -> tuple[int, ...]:
    """The sizes a crossover sweep around ``value`` takes: ``value`` times 2^k for k
    from -``below`` (as far as ``value`` divides) to +``above``."""
    if value < 1:
        return ()
    down = 0
    while down < below and value % (1 << (down + 1)) == 0:
        down += 1
    return tuple(value >> k for k in range(down, 0, -1)) + tuple(
        value << k for k in range(above + 1)
    )


def block_of(title: str) -> str | None:
    """The schedule block a canonical schedule's title names (``fused`` of
    ``fuse(RS-C-AG) [fused]``); None for the program as written."""
    m = re.search(r" \[(\w+)\]$", title)
    return m.group(1) if m else None


def sweep(
    load: Callable[[int], Program],
    dim: str,
    values: Sequence[int],
    hw: Hardware,
    *,
    collectives: str = "nccl",
    progress: Callable[[int], None] | None = None,
) -> SweepResult:
    """Tune the program at each size of ``dim`` (``load(value)`` gives the program with
    that size) and predict its canonical schedules there; each point keeps the tuner's
    best schedule with a decomposition and without one, so the sweep says from which
    size ``decompose`` pays (`SweepResult.decompose_pays_from`)."""
    first = load(values[0]) if values else None
    result = SweepResult(first.name if first else "", hw.name, dim)
    for i, value in enumerate(values):
        program = first if i == 0 and first is not None else load(value)
        tuned = tune(program, hw, collectives=collectives)
        result.points.append(
            SweepPoint(
                value,
                tuned.baseline_s,
                tuned.best,
                canonical_schedules(program, hw, collectives),
                tuned.best_where(decomposed=True),
                tuned.best_where(decomposed=False),
            )
        )
        if progress is not None:
            progress(i + 1)
    return result
