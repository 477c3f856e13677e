"""The tuner region by region (docs/cost-model.md, The tuner: regions).

The program's regions (`cocoviz.schedule.regions`) are grouped into classes that are the
same up to renaming. Each class with something to choose is searched once, on its
canonical sub-program, by the whole-program search (`cocoviz.schedule.search.Search`); a
class without is simulated once. A schedule of the program picks one candidate per
class, the same for every member, and its predicted time is the sum of its regions'
times (`math.fsum`): the regions do not interact in the model, so the best schedule is
the best of each class put together. The tuner ranks

- that best schedule, the program as written,
- and, for each class and each of its other candidates, the best schedule with that
  class's regions changed to the candidate (what a change to every layer alike costs),

plus the program's schedule blocks. The best schedule is built on the whole program and
simulated there once: its time must be the sum (to 1e-9), as the program's time as
written must be; when either is not, or a step is refused on the whole program, the
caller falls back to the whole-program search.

A candidate's steps name the canonical sub-program (``split(v9)``, ``fuse(v9_rs, v13)``);
in a member region ``v<i>`` is that region's i-th name and a name a step made keeps its
suffix (``l3_ys_rs``). Where that suffixed name is taken in the program (the step would
have picked another), the steps are applied to the region and the canonical
sub-program side by side and the names paired by position.

Each class's search is kept, keyed by its canonical sub-program, the hardware and the
collectives' lowering (`_CACHE`): a program tuned again (in the TUI, a sweep, a larger
stack of the same layers) searches only the classes it has not seen.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cocoviz.errors import CocovizError
from cocoviz.ir.nodes import Input, Program
from cocoviz.schedule.regions import (
    CANONICAL,
    Region,
    RegionClass,
    canonical_form,
    classes_of,
    find_regions,
    renamed,
    stretches,
    sub_program,
)
from cocoviz.schedule.search import (
    Candidate,
    Monitor,
    Search,
    TuneResult,
    applied,
    join_label,
    label_parts,
    schedule_label,
)
from cocoviz.sim.hardware import Hardware
from cocoviz.sim.timeline import makespan

__all__ = ["InContext", "clear_cache", "tune_by_region", "tune_in_context"]

_TOLERANCE = 1e-9
"""How far the whole program's simulated time may be from the sum of its regions'."""

_Searched = tuple[list[tuple[Candidate, Program]], int]
_CACHE_KEPT = 64
_CACHE: OrderedDict[tuple[Program, Hardware, str], _Searched] = OrderedDict()
"""Finished searches of region classes: (canonical sub-program, hardware, collectives)
→ (candidates with their programs, fastest first; candidates simulated)."""
_CACHE_LOCK = threading.Lock()
"""Tunes may run in several threads at once (a UI's workers)."""


def clear_cache() -> None:
    """Forget every region class searched so far."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _cached(key: tuple[Program, Hardware, str]) -> _Searched | None:
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
        return hit


def _keep(key: tuple[Program, Hardware, str], searched: _Searched) -> None:
    with _CACHE_LOCK:
        _CACHE[key] = searched
        while len(_CACHE) > _CACHE_KEPT:
            _CACHE.popitem(last=False)


@dataclass
class _Kind:
    """One class of regions: its candidates, fastest first (one, as written, for a class
    with nothing to choose)."""

    cls: RegionClass
    ranked: list[tuple[Candidate, Program]]
    evaluated: int = 0
    search: Search | None = None
    parts: dict[int, list[str | int]] = field(default_factory=dict)
    keys: dict[Program, int] | None = None

    @property
    def written(self) -> int:
        """The index of the program as written."""
        return next(i for i, (c, _) in enumerate(self.ranked) if not c.steps)

    def label_parts(self, i: int) -> list[str | int]:
        hit = self.parts.get(i)
        if hit is None:
            hit = self.parts[i] = label_parts(self.ranked[i][1])
        return hit

    def index_of(self, key: Program) -> int | None:
        """The candidate whose program is `key` up to renaming."""
        if self.keys is None:
            self.keys = {}
            for i, (_, p) in enumerate(self.ranked):
                self.keys.setdefault(canonical_form(p)[0], i)
        return self.keys.get(key)


def tune_by_region(
    program: Program,
    hw: Hardware,
    collectives: str,
    regions: Sequence[Region],
    monitor: Monitor,
) -> TuneResult | None:
    """Tune ``program`` region by region (module docstring); None when the regions'
    times do not add up to the program's or a step is refused on the whole program (the
    caller then searches the whole program)."""
    if not regions:
        return None
    kinds = _search_classes(hw, collectives, regions, monitor)
    return _Combined(program, hw, collectives, regions, kinds, monitor).result()


def _search_classes(
    hw: Hardware, collectives: str, regions: Sequence[Region], monitor: Monitor
) -> list[_Kind]:
    """Each class of ``regions`` searched (or found in the cache)."""
    kinds: list[_Kind] = []
    searched: list[_Kind] = []
    monitor.stoppable = False  # every class as written, whatever the budget
    for cls in classes_of(regions):
        hit = _cached((cls.key, hw, collectives))
        if hit is not None:
            kinds.append(_Kind(cls, hit[0], hit[1]))
        elif cls.tuned:
            search = Search(cls.key, hw, collectives, monitor)
            search.start()
            kind = _Kind(cls, search.ranked(), search=search)
            kinds.append(kind)
            searched.append(kind)
        else:
            t = makespan(cls.key, hw, collectives)
            kinds.append(_Kind(cls, [(Candidate((), "", t), cls.key)]))
    monitor.plan(sum(k.cls.tuned for k in searched), len(regions))
    monitor.regions_done = len(regions) - sum(len(k.cls.members) for k in searched)
    monitor.report()
    monitor.stoppable = True
    # the classes that weigh most first: with a budget, the time goes where it pays
    weight = {id(k): -len(k.cls.members) * k.ranked[0][0].time_s for k in searched}
    for kind in sorted(searched, key=lambda k: weight[id(k)]):
        assert kind.search is not None
        if monitor.reason is None:
            kind.search.run()
        kind.ranked = kind.search.ranked()
        kind.evaluated = kind.search.evaluated
        if kind.search.finished:
            _keep((kind.cls.key, hw, collectives), (kind.ranked, kind.evaluated))
        monitor.regions_done += len(kind.cls.members)
        monitor.report()
    return kinds


@dataclass(frozen=True)
class InContext:
    """The best schedule of `tune_in_context`: the same candidates, each judged by
    simulating the whole program."""

    best: Candidate
    choices: tuple[int, ...]
    """For each region, its class's candidate (the index in the class's ranking)."""
    evaluated: int
    """Whole programs simulated."""
    applies: bool
    """Whether the best's steps, applied to the whole program, give the program that was
    simulated for it (the regions' scheduled parts put together)."""


def tune_in_context(
    program: Program,
    hw: Hardware,
    collectives: str = "nccl",
    *,
    exhaustive: bool = False,
    limit: int = 100_000,
) -> InContext:
    """The check of the region rule: the candidates the region-by-region search ranks
    for each region, each judged by simulating the whole program instead of adding up
    region times. Slow (a whole program per candidate), for tests and benchmarks.

    ``exhaustive=False``: region by region in program order, every candidate of a region
    with the regions before it at what was chosen for them and those after as written.
    ``exhaustive=True``: every combination of the regions' candidates (a ValueError when
    there are more than ``limit``)."""
    regions = find_regions(program)
    kinds = _search_classes(hw, collectives, regions, Monitor())
    comb = _Combined(program, hw, collectives, regions, kinds, Monitor())
    parts: dict[tuple[int, int], Program] = {}

    def part(r: int, i: int) -> Program:
        """Region r scheduled with candidate i: the candidate's program named as the
        region's (the steps applied to the region give it: `InContext.applies`)."""
        hit = parts.get((r, i))
        if hit is None:
            region, made = regions[r], kinds[comb.kind_of[r]].ranked[i][1]
            names: dict[str, str] = {}
            for n in [*(x.name for x in made.inputs), *(x.name for x in made.params)]:
                names[n] = region.real(n)
            for s in made.stages:
                names[s.name] = region.real(s.name)
            hit = parts[(r, i)] = renamed(made, names, program.name)
        return hit

    evaluated = 0

    def judge(choice: Sequence[int]) -> tuple[float, tuple[str, ...]]:
        nonlocal evaluated
        whole = _splice(program, [part(r, i) for r, i in enumerate(choice)])
        evaluated += 1
        steps = tuple(s for r, i in enumerate(choice) for s in comb.region_steps(r, i) or ())
        return makespan(whole, hw, collectives), steps

    written = [kinds[comb.kind_of[r]].written for r in range(len(regions))]
    tuned = [r for r in range(len(regions)) if regions[r].tuned]
    sizes = {r: len(kinds[comb.kind_of[r]].ranked) for r in tuned}
    if exhaustive:
        if math.prod(sizes.values()) > limit:
            raise ValueError(f"{math.prod(sizes.values())} combinations (more than {limit})")
        trials: Iterable[list[int]] = (
            _with(written, dict(zip(tuned, picks, strict=True)))
            for picks in itertools.product(*(range(sizes[r]) for r in tuned))
        )
    else:
        trials = []
    picked = list(written)
    best = (*judge(picked), tuple(picked))
    for trial in trials:
        found = (*judge(trial), tuple(trial))
        if (found[0], len(found[1]), found[1]) < (best[0], len(best[1]), best[1]):
            best = found
    if not exhaustive:
        for r in tuned:  # region by region, the regions before at their choice
            for i in range(sizes[r]):
                trial = _with(list(best[2]), {r: i})
                found = (*judge(trial), tuple(trial))
                if (found[0], len(found[1]), found[1]) < (best[0], len(best[1]), best[1]):
                    best = found
    t, steps, choice = best
    whole = _splice(program, [part(r, i) for r, i in enumerate(choice)])
    scheduled = applied(program, steps, hw)
    decomposed = any(g.by_shard for g in whole.groups)
    found_best = Candidate(steps, schedule_label(whole), t, None, decomposed)
    return InContext(found_best, choice, evaluated, scheduled == whole)


def _with(choice: list[int], changes: dict[int, int]) -> list[int]:
    out = list(choice)
    for r, i in changes.items():
        out[r] = i
    return out


def _splice(program: Program, parts: Sequence[Program]) -> Program:
    """The program made of its regions' (scheduled) parts, in order."""
    types = {i.name: i.ty for part in parts for i in part.inputs}
    inputs = tuple(
        i if types.get(i.name, i.ty) == i.ty else Input(i.name, types[i.name], i.span)
        for i in program.inputs
    )
    return dataclasses.replace(
        program,
        inputs=inputs,
        stages=tuple(s for part in parts for s in part.stages),
        groups=tuple(g for part in parts for g in part.groups),
    )


class _Combined:
    """Schedules of the program made of one candidate per class."""

    def __init__(
        self,
        program: Program,
        hw: Hardware,
        collectives: str,
        regions: Sequence[Region],
        kinds: list[_Kind],
        monitor: Monitor,
    ) -> None:
        self.program = program
        self.hw = hw
        self.collectives = collectives
        self.regions = regions
        self.kinds = kinds
        self.monitor = monitor
        of = {r.index: i for i, k in enumerate(kinds) for r in k.cls.members}
        self.kind_of = [of[r.index] for r in regions]
        self.members = [[r.index for r in k.cls.members] for k in kinds]
        self.taken = program.names() | set(program.source_names)
        self._unsuffixed: dict[str, set[str]] = {}
        self._rendered: dict[tuple[int, int], list[tuple[str, ...]] | None] = {}
        self._segments: dict[tuple[int, int], _Segment] = {}
        self.evaluated = sum(k.evaluated for k in kinds)
        if not any(k.cls.tuned for k in kinds):
            self.evaluated += 1  # the program as written, the one candidate

    def candidate(self, choice: Sequence[int]) -> Candidate | None:
        """The schedule that takes candidate ``choice[k]`` of each class k (None when
        its steps cannot be named in the program)."""
        n = len(self.regions)
        steps: list[tuple[str, ...]] = [()] * n
        times = [0.0] * n
        segments: list[_Segment] = [_EMPTY] * n
        decomposed = False
        for k, i in enumerate(choice):
            rendered = self._render(k, i)
            if rendered is None:
                return None
            cand = self.kinds[k].ranked[i][0]
            segment = self._segment(k, i)
            for r, found in zip(self.members[k], rendered, strict=True):
                steps[r] = found
                times[r] = cand.time_s
                segments[r] = segment
            decomposed = decomposed or cand.decomposed
        return Candidate(
            tuple(itertools.chain.from_iterable(steps)),
            _join_segments(segments),
            math.fsum(times),
            None,
            decomposed,
        )

    def region_steps(self, r: int, i: int) -> tuple[str, ...] | None:
        """The steps of candidate ``i`` of region ``r``'s class, named in region ``r``."""
        k = self.kind_of[r]
        rendered = self._render(k, i)
        return None if rendered is None else rendered[self.members[k].index(r)]

    def _segment(self, k: int, i: int) -> _Segment:
        hit = self._segments.get((k, i))
        if hit is None:
            hit = self._segments[(k, i)] = _segment_of(self.kinds[k].label_parts(i))
        return hit

    def _render(self, k: int, i: int) -> list[tuple[str, ...]] | None:
        """Candidate ``i`` of class ``k`` named in each member region (module docstring)."""
        if (k, i) in self._rendered:
            return self._rendered[(k, i)]
        kind = self.kinds[k]
        cand, made = kind.ranked[i]
        members = [self.regions[r] for r in self.members[k]]
        out: list[tuple[str, ...]] | None = []
        assert out is not None
        if not cand.steps:
            out = [() for _ in members]
        else:
            base = {s.name for s in kind.cls.key.stages}
            made_names = [s.name for s in made.stages if s.name not in base]
            matches = [CANONICAL.fullmatch(n) for n in made_names]
            derived = [(int(m[1]), m[2]) for m in matches if m is not None]
            unnamed = len(derived) < len(matches)  # a name not made from a stage's
            # one format string for all steps: {i} is a region's i-th name
            text = "\x00".join(cand.steps).replace("{", "{{").replace("}", "}}")
            template = CANONICAL.sub(lambda m: "{" + m[1] + "}" + m[2], text)
            for region in members:
                names = region.names
                if unnamed or any(names[j] in self._taken_before(sfx) for j, sfx in derived):
                    steps = self._lockstep(kind.cls.key, region, cand.steps)
                    if steps is None:
                        out = None
                        break
                    out.append(steps)
                else:
                    out.append(tuple(template.format(*names).split("\x00")))
        self._rendered[(k, i)] = out
        return out

    def _taken_before(self, suffix: str) -> set[str]:
        """The names in the program that end in ``suffix``, without it (a step making
        ``<name><suffix>`` would have to pick another name)."""
        hit = self._unsuffixed.get(suffix)
        if hit is None:
            n = len(suffix)
            hit = self._unsuffixed[suffix] = (
                {t[:-n] for t in self.taken if t.endswith(suffix)} if n else set(self.taken)
            )
        return hit

    def _lockstep(
        self, key: Program, region: Region, steps: Sequence[str]
    ) -> tuple[str, ...] | None:
        """Name ``steps`` in ``region`` by applying them to the region and to its canonical
        sub-program side by side, pairing the stages they make by position."""
        real = sub_program(self.program, region.stages)
        mapping = {f"v{i}": n for i, n in enumerate(region.names)}
        canon = key
        out: list[str] = []
        try:
            for step in steps:
                text = CANONICAL.sub(lambda m: mapping.get(m[0], m[0]), step)
                canon = applied(canon, [step], self.hw)
                real = applied(real, [text], self.hw)
                if len(canon.stages) != len(real.stages):
                    return None
                for a, b in zip(canon.stages, real.stages, strict=True):
                    mapping.setdefault(a.name, b.name)
                out.append(text)
        except CocovizError:
            return None
        return tuple(out)

    def result(self) -> TuneResult | None:
        self.monitor.phase = "check"
        self.monitor.report()
        kinds = self.kinds
        best = tuple(0 for _ in kinds)
        written = tuple(k.written for k in kinds)
        choices: dict[tuple[int, ...], None] = {best: None, written: None}
        for k, kind in enumerate(kinds):
            for i in range(1, len(kind.ranked)):
                choices[tuple(i if j == k else 0 for j in range(len(kinds)))] = None
        found: dict[tuple[int, ...], Candidate] = {}
        for choice in choices:
            c = self.candidate(choice)
            if c is None:
                if choice in (best, written):
                    return None
                continue
            found[choice] = c
        if not self._holds(found[best], found[written]):
            return None
        extra: list[Candidate] = []
        self._blocks(found, extra)
        ranked = sorted([*found.values(), *extra], key=lambda c: (c.time_s, len(c.steps), c.steps))
        monitor = self.monitor
        monitor.regions_done = len(self.regions)
        monitor.report()
        return TuneResult(
            self.program.name,
            self.hw.name,
            found[written].time_s,
            ranked,
            self.evaluated,
            stopped=monitor.reason,
            regions=len(self.regions),
            kinds=sum(1 for k in kinds if k.cls.tuned),
        )

    def _holds(self, best: Candidate, written: Candidate) -> bool:
        """Whether the whole program, as written and with the best schedule, takes the
        time its regions add up to (and the best schedule's steps apply to it)."""
        try:
            scheduled = applied(self.program, best.steps, self.hw)
        except CocovizError:
            return False
        for p, c in ((self.program, written), (scheduled, best)):
            t = makespan(p, self.hw, self.collectives)
            if abs(t - c.time_s) > _TOLERANCE * max(t, c.time_s):
                return False
        return True

    def _blocks(self, found: dict[tuple[int, ...], Candidate], extra: list[Candidate]) -> None:
        """The program's schedule blocks: a block that is one of the schedules ranked
        tags it (as the whole-program search does); another is ranked on its own."""
        if self.monitor.reason is not None:
            return
        for sched in self.program.schedules:
            block_steps = tuple(str(s) for s in sched.steps)
            try:
                p = applied(self.program, block_steps, self.hw)
            except CocovizError:
                continue
            choice = self._choice_of(p)
            hit = found.get(choice) if choice is not None else None
            if hit is not None:
                if hit.block is None:
                    found[choice] = Candidate(  # type: ignore[index]
                        block_steps, hit.name, hit.time_s, sched.name, hit.decomposed
                    )
                continue
            if any(c.steps == block_steps for c in extra):
                continue
            t = makespan(p, self.hw, self.collectives)
            decomposed = any(g.by_shard for g in p.groups)
            extra.append(Candidate(block_steps, schedule_label(p), t, sched.name, decomposed))
            self.evaluated += 1

    def _choice_of(self, p: Program) -> tuple[int, ...] | None:
        """The candidate of each class that a scheduled program holds in every member
        region (None when it holds something else, or differs between members)."""
        parts = stretches(p, [r.last for r in self.regions])
        if parts is None:
            return None
        by_name = {s.name: s for s in self.program.stages}
        choice: list[int | None] = [None] * len(self.kinds)
        for region, k, sub in zip(self.regions, self.kind_of, parts, strict=True):
            kind = self.kinds[k]
            unchanged = not sub.groups and sub.stages == tuple(by_name[n] for n in region.stages)
            i = kind.written if unchanged else kind.index_of(canonical_form(sub)[0])
            if i is None or choice[k] not in (None, i):
                return None
            choice[k] = i
        if any(i is None for i in choice):
            return None
        return tuple(i for i in choice if i is not None)


@dataclass(frozen=True)
class _Segment:
    """The label parts of one region's candidate, as `join_label` joins them across
    regions: the compute stages before its first other part, its other tokens (joined
    already), the compute stages after its last one (all in `lead` when it has none)."""

    lead: int
    middle: str | None
    trail: int


_EMPTY = _Segment(0, None, 0)


def _segment_of(parts: Sequence[str | int]) -> _Segment:
    named = [j for j, part in enumerate(parts) if not isinstance(part, int)]
    if not named:
        return _Segment(sum(int(part) for part in parts), None, 0)
    first, last = named[0], named[-1]
    lead = sum(int(part) for part in parts[:first])
    trail = sum(int(part) for part in parts[last + 1 :])
    return _Segment(lead, join_label(parts[first : last + 1]), trail)


def _join_segments(segments: Sequence[_Segment]) -> str:
    """`join_label` of the regions' parts put together."""
    tokens: list[str] = []
    run = 0
    for seg in segments:
        run += seg.lead
        if seg.middle is None:
            continue
        if run:
            tokens.append("C" if run == 1 else f"C×{run}")
        tokens.append(seg.middle)
        run = seg.trail
    if run:
        tokens.append("C" if run == 1 else f"C×{run}")
    return "-".join(tokens) or "(empty)"
