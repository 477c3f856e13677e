"""The tuner's search: candidate schedules for each collective, built step by step and
ranked by the model (the rules are in ``cocoviz.schedule.tune``'s docstring and
docs/cost-model.md, The tuner).

``Search`` evaluates candidates, ``Monitor`` carries the progress callback, the budget
and the stop request, and the labels (``schedule_label``) name a schedule as the tuner
prints it. Both the whole-program search (``cocoviz.schedule.tune``) and the search
region by region (``cocoviz.schedule.structured``) are built on this module.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from cocoviz.errors import CocovizError
from cocoviz.ir.collectives import collective
from cocoviz.ir.graph import contracted_order
from cocoviz.ir.nodes import (
    COLLECTIVES,
    ELEMENTWISE,
    REDUCTIONS,
    ROWWISE,
    Group,
    GroupKind,
    Op,
    Program,
    Stage,
)
from cocoviz.schedule.chunks import CHUNK_CHOICES
from cocoviz.schedule.steps import apply_steps
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.timeline import makespan

_ELIGIBLE = ELEMENTWISE | ROWWISE | REDUCTIONS | {Op.UPDATE, Op.SEND, Op.REF, Op.CONST}


@dataclass(frozen=True)
class Candidate:
    """One schedule: its steps, a CoCoNet-style name, and the predicted time."""

    steps: tuple[str, ...]
    name: str
    time_s: float
    block: str | None = None
    """The program's schedule block that gives the same program, if any."""
    decomposed: bool = False
    """Whether the schedule holds a group decomposed by shard (``decompose``)."""

    @property
    def title(self) -> str:
        return self.name if self.block is None else f"{self.name} [{self.block}]"


@dataclass
class TuneResult:
    program: str
    hardware: str
    baseline_s: float
    candidates: list[Candidate] = field(default_factory=list)
    evaluated: int = 0
    """Candidates simulated (a region's candidates count once for all regions like it)."""
    stopped: str | None = None
    """Why the search ended early: ``"budget"`` (``budget_s`` spent) or ``"stopped"``
    (``stop()`` said so); None when it ran to the end."""
    regions: int = 1
    """The regions the program was searched in (1: as a whole)."""
    kinds: int = 1
    """Classes of regions the same up to renaming that had something to choose."""

    @property
    def complete(self) -> bool:
        """Whether every candidate was tried (else the candidates are the best found
        before the search stopped)."""
        return self.stopped is None

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def best_where(self, decomposed: bool) -> Candidate | None:
        """The fastest candidate with (or without) a group decomposed by shard."""
        return next((c for c in self.candidates if c.decomposed is decomposed), None)


@dataclass(frozen=True)
class TuneProgress:
    """How far a tune is: handed to ``tune``'s ``progress`` callback after each
    candidate it simulates."""

    evaluated: int
    regions_done: int
    """Regions whose search has ended (of `regions`)."""
    regions: int
    elapsed_s: float
    remaining_s: float | None
    """An estimate of the time left (None until there is one)."""
    phase: str = "search"
    """``"search"`` while candidates are simulated; ``"check"`` once the regions' best
    schedule is put together and checked on the whole program (no estimate then)."""


# ---------------------------------------------------------------------------------------
# Labels


def _token(stage: Stage) -> str:
    op = stage.expr.op
    if op is Op.MATMUL:
        return "MM"
    return collective(op).label if op in COLLECTIVES else "C"


def _group_label(g: Group, by_name: dict[str, Stage], position: dict[str, int]) -> str:
    if g.kind is GroupKind.FUSED:
        members = sorted(g.stages(), key=position.__getitem__)
        toks = _join_tokens([t if t != "C" else 1 for t in (_token(by_name[m]) for m in members)])
        toks = ["C" if t.startswith("C") else t for t in toks]  # one kernel
        if toks == ["C"]:
            return "C"
        return f"fuse({'-'.join(toks)})"
    parts = [
        _group_label(it, by_name, position) if isinstance(it, Group) else _token(by_name[it])
        for it in g.items
    ]
    if g.by_shard:
        parts.append("DEC")  # decomposed by shard around the ring: one step per rank
    elif g.chunks is not None:
        parts.append(f"K={g.chunks}")
    return f"ol({', '.join(parts)})"


def label_parts(program: Program) -> list[str | int]:
    """The parts of `schedule_label` in issue order: a group's label or a stage's token,
    with an ungrouped compute stage as ``1`` (runs of them are counted when joined, also
    across the parts of consecutive regions)."""
    by_name = {s.name: s for s in program.stages}
    position = {s.name: i for i, s in enumerate(program.stages)}
    order = contracted_order(program, program.groups) or [s.name for s in program.stages]
    parts: list[str | int] = []
    for item in order:
        if isinstance(item, Group):
            parts.append(_group_label(item, by_name, position))
        else:
            tok = _token(by_name[item])
            parts.append(1 if tok == "C" else tok)
    return parts


def _join_tokens(parts: Sequence[str | int]) -> list[str]:
    out: list[str] = []
    run = 0
    for part in parts:
        if isinstance(part, int):
            run += part
            continue
        if run:
            out.append("C" if run == 1 else f"C×{run}")
            run = 0
        out.append(part)
    if run:
        out.append("C" if run == 1 else f"C×{run}")
    return out


def join_label(parts: Sequence[str | int]) -> str:
    """The label of `label_parts` (of one program, or of regions put together)."""
    return "-".join(_join_tokens(parts)) or "(empty)"


def schedule_label(program: Program) -> str:
    """A CoCoNet-style name for the structure of a program: ``MM-AR-C``,
    ``fuse(RS-C-AG)``, ``ol(MM, fuse(RS-C-AG), K=4)``, ``ol(AG, MM, DEC)`` (decomposed by
    shard). ``C`` is one compute kernel (a stage or a fused group), ``C×n`` n separate
    kernels."""
    return join_label(label_parts(program))


# ---------------------------------------------------------------------------------------
# Building schedules


def try_apply(program: Program, steps: Sequence[str], hw: Hardware) -> Program | None:
    """`steps` applied as every caller applies them (`overlap`'s default K from the
    model on `hw`), or None when one is refused."""
    try:
        return applied(program, steps, hw)
    except CocovizError:
        return None


def applied(program: Program, steps: Sequence[str], hw: Hardware) -> Program:
    """`apply_steps`, with the cyclic collector paused while the steps run (a step makes
    no cycles). `apply_steps` itself keeps the collector off the objects alive before it
    by freezing them, unless some are frozen already, which it asks the collector; that
    question walks every frozen object, and the CLI freezes the loaded program: on a
    96-layer stack it cost more than the steps, hundreds of times in a tune."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return apply_steps(program, steps, hw)
    finally:
        if collecting:
            gc.enable()


def _stage_names(program: Program) -> set[str]:
    return {s.name for s in program.stages}


def _compute_region(program: Program, start: str) -> list[str]:
    """Eligible compute stages downstream of ``start`` (through eligible stages), plus
    side stages that read only inputs and params and feed the region (LAMB's norm(w))."""
    ctx_users: dict[str, list[str]] = {}
    for s in program.stages:
        for r in set(s.expr.refs()):
            ctx_users.setdefault(r, []).append(s.name)
    region: list[str] = []
    seen = {start}
    todo = [start]
    while todo:
        n = todo.pop()
        for u in ctx_users.get(n, ()):
            if u in seen:
                continue
            seen.add(u)
            if program.stage(u).expr.op in _ELIGIBLE and program.stage(u).expr.op is not Op.SEND:
                region.append(u)
                todo.append(u)
    stages = _stage_names(program)
    inside = set(region)
    for s in program.stages:
        if s.name in inside or s.name == start or s.expr.op not in _ELIGIBLE:
            continue
        reads = set(s.expr.refs())
        users = ctx_users.get(s.name, [])
        if not (reads & stages) and users and all(u in inside for u in users):
            region.append(s.name)
            inside.add(s.name)
    order = {s.name: i for i, s in enumerate(program.stages)}
    return sorted(region, key=order.__getitem__)


def _producer_matmul(program: Program, coll: str) -> str | None:
    arg = program.stage(coll).expr.args[0]
    if arg.op is Op.REF and arg.name in _stage_names(program):
        if program.stage(arg.name).expr.op is Op.MATMUL:
            return arg.name
    return None


def _item_of(program: Program, name: str) -> str | Group:
    g = program.group_of(name)
    return g if g is not None and g.kind is GroupKind.FUSED else name


def _chain(program: Program, start: str, limit: int = 5) -> list[str]:
    """Items (named by a member) from ``start`` on, each the one consumer of the last."""
    users: dict[str, set[str]] = {}
    for s in program.stages:
        for r in set(s.expr.refs()):
            users.setdefault(r, set()).add(s.name)
    chain = [start]
    item = _item_of(program, start)
    while len(chain) < limit:
        members = set(item.stages()) if isinstance(item, Group) else {item}
        outs: list[str | Group] = []
        for m in members:
            for u in users.get(m, ()):
                if u not in members:
                    it = _item_of(program, u)
                    if it not in outs:
                        outs.append(it)
        if len(outs) != 1:
            break
        item = outs[0]
        name = item if isinstance(item, str) else next(iter(item.stages()))
        if isinstance(item, str) and program.stage(item).expr.op is Op.MATMUL:
            break
        chain.append(name)
    return chain


def _rs_fusions(program: Program, rs: str) -> Iterator[list[str]]:
    """Fuse steps for a split collective: RS → C → AG, or a send with its computation."""
    region = _compute_region(program, rs)
    users: dict[str, list[str]] = {}
    for s in program.stages:
        for r in set(s.expr.refs()):
            users.setdefault(r, []).append(s.name)
    gathers = [
        u
        for n in [rs, *region]
        for u in users.get(n, ())
        if program.stage(u).expr.op is Op.ALLGATHER
    ]
    gathers = list(dict.fromkeys(gathers))
    if gathers:
        yield [f"fuse({', '.join([rs, *region, *gathers])})"]
        yield [f"fuse({', '.join([rs, *gathers])})"]
    for s in program.stages:
        if s.expr.op is Op.SEND and (rs in set(s.expr.refs()) or set(s.expr.refs()) & set(region)):
            after = [u for u in users.get(s.name, ()) if program.stage(u).expr.op in _ELIGIBLE]
            if after:
                yield [f"fuse({', '.join([s.name, *after])})"]


def _overlaps(program: Program, coll: str) -> Iterator[list[str]]:
    mm = _producer_matmul(program, coll)
    chain = _chain(program, mm or coll)
    for i in range(len(chain)):
        for j in range(i + 2, len(chain) + 1):
            for k in CHUNK_CHOICES:
                yield [f"overlap({', '.join(chain[i:j])}, chunks={k})"]


def _decompositions(program: Program, coll: str) -> Iterator[list[str]]:
    """``decompose`` of a collective and the matmul next to it: an allgather and each
    matmul reading it, or the matmul making a reducescatter's operand and it (refused
    ones are skipped where they are applied)."""
    op = program.stage(coll).expr.op
    if op is Op.REDUCESCATTER:
        mm = _producer_matmul(program, coll)
        if mm is not None:
            yield [f"decompose({mm}, {coll})"]
    elif op is Op.ALLGATHER:
        for s in program.stages:
            if s.expr.op is Op.MATMUL and coll in {a.name for a in s.expr.args}:
                yield [f"decompose({coll}, {s.name})"]


def _pair_recipes(program: Program, coll: str) -> Iterator[list[str]]:
    """Step lists for an allgather or a reducescatter (each relative to ``program``):
    as it is, decomposed by shard with its matmul, and row-chunked overlaps of the
    same pair (and, for a reducescatter, of the chain after it)."""
    yield []
    for dec in _decompositions(program, coll):
        yield dec
        a, b = dec[0][len("decompose(") : -1].split(", ")
        for k in CHUNK_CHOICES:
            yield [f"overlap({a}, {b}, chunks={k})"]
    if program.stage(coll).expr.op is Op.REDUCESCATTER:
        yield from _overlaps(program, coll)


def _recipes(program: Program, coll: str, hw: Hardware) -> Iterator[list[str]]:
    """Step lists for one allreduce (each relative to ``program``)."""
    yield []
    region = _compute_region(program, coll)
    if len(region) >= 2:
        yield [f"fuse({', '.join(region)})"]
    for ol in _overlaps(program, coll):
        yield ol
        if len(region) >= 2:
            yield [f"fuse({', '.join(region)})", *ol]
    split = [f"split({coll})"]
    yield split
    after_split = try_apply(program, split, hw)
    if after_split is None:
        return
    reorders = [[f"reorder({coll})"]]
    if region:
        reorders.append([f"reorder({coll}, {', '.join(region)})"])
    seen: list[Program] = []
    for r in reorders:
        moved = try_apply(after_split, r, hw)
        if moved is None or moved in seen:
            continue
        seen.append(moved)
        yield from _after_reorder(moved, coll, split + r, hw)


def _after_reorder(moved: Program, coll: str, base: list[str], hw: Hardware) -> Iterator[list[str]]:
    """asslice (of inputs whose update is not an output: outputs keep their layout), dce,
    then fusions and overlaps."""
    outputs = set(moved.outputs)
    gathered_out = {
        ref
        for s in moved.stages
        if s.name in outputs and s.expr.op is Op.ALLGATHER
        for ref in s.expr.refs()
    }
    targets = [
        t
        for t, u in moved.updates().items()
        if moved.type_of(t).layout.is_replicated and u not in outputs and u not in gathered_out
    ]
    extra: list[str] = []
    if targets and try_apply(moved, [f"asslice({', '.join(targets)})"], hw) is not None:
        extra.append(f"asslice({', '.join(targets)})")
    else:
        for t in targets:
            if try_apply(moved, [*extra, f"asslice({t})"], hw) is not None:
                extra.append(f"asslice({t})")
    after = try_apply(moved, extra, hw)
    assert after is not None
    dced = try_apply(after, ["dce()"], hw)
    if dced is not None and dced != after:
        extra.append("dce()")
        after = dced
    rcag = base + extra
    yield rcag
    rs = f"{coll}_rs"
    if rs not in _stage_names(after):
        return
    for ol in _overlaps(after, rs):
        yield rcag + ol
    for dec in _decompositions(after, rs):
        yield rcag + dec
    for fz in _rs_fusions(after, rs):
        fused = try_apply(after, fz, hw)
        if fused is None:
            continue
        yield rcag + fz
        for ol in _overlaps(fused, rs):
            yield rcag + fz + ol
        for dec in _decompositions(fused, rs):
            yield rcag + fz + dec


# ---------------------------------------------------------------------------------------
# The search


class _Stopped(Exception):
    """The budget is spent or the caller asked to stop (raised between candidates)."""


_PRIOR_PER_COLLECTIVE = 40
"""Candidates a collective is expected to take before one has been searched (the
estimate of the time left)."""


class Monitor:
    """A tune's clock: counts candidates, reports progress, and stops the search when
    its budget is spent or its caller asks (`tick`, after each candidate)."""

    def __init__(
        self,
        progress: Callable[[TuneProgress], None] | None = None,
        budget_s: float | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        self.start = time.perf_counter()
        self.deadline = None if budget_s is None else self.start + budget_s
        self.progress = progress
        self.stop = stop
        self.reason: str | None = None
        """Why the search stopped ("budget", "stopped"), once it has."""
        self.stoppable = True
        """Whether `tick` may stop the search (off while the parts every result needs
        are simulated)."""
        self.evaluated = 0
        self.regions = 1
        self.regions_done = 0
        self.collectives = 0
        """Collectives to search (for the estimate of the time left)."""
        self.collectives_done = 0
        self.evaluated_in_done = 0
        """Candidates the searched collectives took."""
        self.phase = "search"

    def plan(self, collectives: int, regions: int = 1) -> None:
        self.collectives, self.regions = collectives, regions

    def collective_done(self, evaluated_since: int) -> None:
        self.collectives_done += 1
        self.evaluated_in_done += evaluated_since

    def remaining_s(self, elapsed: float) -> float | None:
        if self.evaluated < 4 or elapsed <= 0:
            return None
        per = (
            self.evaluated_in_done / self.collectives_done
            if self.collectives_done
            else _PRIOR_PER_COLLECTIVE
        )
        started = self.evaluated - self.evaluated_in_done  # in the collective under way
        left = max(0.0, (self.collectives - self.collectives_done) * per - started)
        return left * elapsed / self.evaluated

    def report(self) -> None:
        if self.progress is not None:
            elapsed = time.perf_counter() - self.start
            searching = self.phase == "search"
            self.progress(
                TuneProgress(
                    self.evaluated,
                    self.regions_done,
                    self.regions,
                    elapsed,
                    self.remaining_s(elapsed) if searching else None,
                    self.phase,
                )
            )

    def tick(self) -> None:
        """One more candidate simulated; raises `_Stopped` when the search must end."""
        self.evaluated += 1
        self.report()
        if self.reason is None:
            if self.stop is not None and self.stop():
                self.reason = "stopped"
            elif self.deadline is not None and time.perf_counter() > self.deadline:
                self.reason = "budget"
        if self.reason is not None and self.stoppable:
            raise _Stopped


class Search:
    """The coordinate descent over one program's collectives (module docstring). Every
    candidate it simulates is kept in `seen`, keyed by its program."""

    def __init__(self, program: Program, hw: Hardware, collectives: str, monitor: Monitor) -> None:
        self.program = program
        self.hw = hw
        self.collectives = collectives
        self.monitor = monitor
        self.seen: dict[Program, Candidate] = {}
        self.evaluated = 0
        self.finished = False
        """Whether the descent ran to its end."""
        self._current: Program = program
        self._current_steps: tuple[str, ...] = ()

    @property
    def as_written(self) -> Candidate:
        return self.seen[self.program]

    def evaluate(self, steps: Sequence[str], p: Program, block: str | None = None) -> Candidate:
        seen = self.seen
        hit = seen.get(p)
        if hit is not None:
            if hit.block is None and (block is not None or len(steps) < len(hit.steps)):
                seen[p] = Candidate(tuple(steps), hit.name, hit.time_s, block, hit.decomposed)
            return seen[p]
        t = makespan(p, self.hw, self.collectives)
        decomposed = any(g.by_shard for g in p.groups)
        c = Candidate(tuple(steps), schedule_label(p), t, block, decomposed)
        seen[p] = c
        self.evaluated += 1
        self.monitor.tick()
        return c

    def start(self) -> Candidate:
        """The program as written (every search begins with it)."""
        if self.program not in self.seen:
            self.evaluate((), self.program)
        return self.as_written

    def run(self) -> None:
        """The descent, to its end or until the monitor stops it."""
        try:
            self.start()
            program, hw = self.program, self.hw
            colls = [s.name for s in program.stages if s.expr.op is Op.ALLREDUCE]
            for coll in colls:
                if coll in _stage_names(self._current):
                    self._descend(coll, _recipes(self._current, coll, hw))
            current = self._current
            pairs = [
                s.name
                for s in current.stages
                if s.expr.op in (Op.ALLGATHER, Op.REDUCESCATTER)
                and current.group_of(s.name) is None
            ]
            for coll in pairs:
                current = self._current
                if coll in _stage_names(current) and current.group_of(coll) is None:
                    self._descend(coll, _pair_recipes(current, coll))
            self.finished = True
        except _Stopped:
            pass

    def _descend(self, coll: str, recipes: Iterator[list[str]]) -> None:
        """Keep the fastest of ``recipes`` for one collective (coordinate descent)."""
        before = self.evaluated
        best: tuple[float, Program, tuple[str, ...]] | None = None
        for steps in recipes:
            p = try_apply(self._current, steps, self.hw)
            if p is None:
                continue
            try:
                c = self.evaluate((*self._current_steps, *steps), p)
            except CocovizError:
                continue
            if best is None or c.time_s < best[0]:
                best = (c.time_s, p, (*self._current_steps, *steps))
        if best is not None:
            _, self._current, self._current_steps = best
        self.monitor.collective_done(self.evaluated - before)

    def blocks(self) -> None:
        """The program's own schedule blocks, tagged with their names."""
        try:
            for sched in self.program.schedules:
                block_steps = tuple(str(s) for s in sched.steps)
                p = try_apply(self.program, block_steps, self.hw)
                if p is not None:
                    self.evaluate(block_steps, p, sched.name)
        except _Stopped:
            pass

    def ranked(self) -> list[tuple[Candidate, Program]]:
        """Every candidate with its program, fastest first."""
        return sorted(
            ((c, p) for p, c in self.seen.items()),
            key=lambda cp: (cp[0].time_s, len(cp[0].steps), cp[0].steps),
        )
