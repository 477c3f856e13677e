"""The step palette: which steps apply to a stage, and why the others do not.

`cocoviz apply --explain STAGE` and the TUI's palette read the same list: the steps of
`cocoviz.ir.transforms.candidate_steps`, the overlap groups through the stage and the
`decompose` pairs it is part of. Legal steps come first, each kind in the order
`candidate_steps` offers it (decompose after overlap).

An overlap group is a chain of consecutive items — stages or fused groups, each reading
its predecessor — through the stage's item (docs/schedules.md, `overlap`). Offered: the
two-item overlaps with the stage's neighbours, legal or refused with their reason (as
every step), and the legal longer chains that overlap communication, up to
`MAX_CHAIN_ITEMS` items and `MAX_OFFERED` chains, the most collectives first, then the
fewest items (`overlap_chains`). At most `MAX_CHECKS` longer chains are checked, so the
palette stays fast on large programs (it is computed on every step in the TUI); refused
longer chains are left out, as they would bury the list. A fused group is named by its
first stage. An `overlap` is offered without `chunks=`, so it is checked with the K the
cost model picks on the session's hardware — the K that applying it will use.

`decompose(a, b)` is offered for an allgather and a matmul that reads it, and for a
matmul and the reducescatter (or the allreduce, refused: split it first) of its result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cocoviz.errors import CocovizError
from cocoviz.ir.nodes import COLLECTIVES, Group, GroupKind, Op, Program, StepCall
from cocoviz.ir.transforms import Transformation, candidate_steps
from cocoviz.ir.transforms.base import Index, index
from cocoviz.ir.transforms.decompose import Decompose
from cocoviz.ir.transforms.overlap import DEFAULT_CHUNKS, Overlap
from cocoviz.sim.hardware import Hardware

if TYPE_CHECKING:
    from cocoviz.sim.workload import Context

__all__ = [
    "MAX_CHAIN_ITEMS",
    "MAX_CHECKS",
    "MAX_OFFERED",
    "PaletteEntry",
    "overlap_chains",
    "palette",
]

MAX_CHAIN_ITEMS = 8
"""The most items an offered overlap group has."""

MAX_OFFERED = 6
"""The most overlap groups of three or more items offered for one stage (the best first,
see `overlap_chains`)."""

MAX_CHECKS = 24
"""The most overlap groups of three or more items checked for one stage."""

MAX_PATHS = 64
"""The most paths of items followed from a stage in each direction."""


@dataclass(frozen=True)
class PaletteEntry:
    """One step offered for a stage: the step applied, whether it is legal and why not,
    the text shown (`label`, when it differs from the step), and the step as applying it
    records it (`resolved`: an overlap with its chunk count; when it differs)."""

    step: str
    ok: bool
    reason: str = ""
    label: str = ""
    resolved: str = ""

    @property
    def shown(self) -> str:
        return self.label or self.step


def palette(program: Program, stage: str, hw: Hardware) -> list[PaletteEntry]:
    """Every step the palette offers for `stage` of `program` (a stage or an input),
    legal or not. Raises ScheduleError when there is no such stage or input."""
    candidates = candidate_steps(program, stage)
    pairs = [t for t in candidates if isinstance(t, Overlap)]  # with the neighbours
    entries: list[PaletteEntry] = []
    for t in candidates:
        if not isinstance(t, Overlap):
            entries.append(_plain(program, t))
        elif t is pairs[0]:  # the overlaps and decompositions where the pairs were
            entries += _overlaps(program, stage, pairs, hw)
            entries += [_plain(program, d) for d in _decompositions(index(program), stage)]
    seen: set[str] = set()
    unique = []
    for e in entries:
        if e.step not in seen:
            seen.add(e.step)
            unique.append(e)
    return sorted(unique, key=lambda e: not e.ok)  # stable: each kind as offered


def _plain(program: Program, t: Transformation) -> PaletteEntry:
    why = _refusal(program, t)
    return PaletteEntry(str(t), why is None, why or "")


def _refusal(program: Program, t: Transformation) -> str | None:
    """Why `t` does not apply to `program` (its message without the step's name, and its
    hint), or None when it does."""
    try:
        t.check(program)
    except CocovizError as err:
        why = err.message.removeprefix(f"{t.name}: ")
        if err.hint:
            why += f" ({err.hint})"
        return why
    return None


# --- overlap ------------------------------------------------------------------------------


def _overlaps(
    program: Program, stage: str, pairs: list[Overlap], hw: Hardware
) -> list[PaletteEntry]:
    """The legal overlap groups through `stage` (see `overlap_chains`), then the two-item
    overlaps with its neighbours that are refused, with their reason."""
    idx = index(program)
    model = _ChunkModel(program, hw)
    legal: list[Overlap] = []
    legal_sets: set[frozenset[str]] = set()
    longer = checked = 0
    for chain in overlap_chains(program, stage):
        if len(chain) > 2:
            if longer == MAX_OFFERED or checked == MAX_CHECKS:
                continue  # the two-item ones are all checked: they are shown either way
            checked += 1
        # two chunks is the count every divisibility rule refuses least often: a chain
        # refused with it is refused with any count, and the model need not run for it
        if _refusal(program, Overlap(items=chain, chunks=2)) is not None:
            continue
        resolved = Overlap(items=chain, chunks=model.k(chain))
        if resolved.k != 2 and _refusal(program, resolved) is not None:
            continue  # pragma: no cover - the model picks a count the rules accept
        legal.append(resolved)
        legal_sets.add(frozenset(chain))
        longer += len(chain) > 2
    out = [_legal_overlap(t) for t in legal]
    for t in pairs:
        named = frozenset(_named(idx, n) for n in t.items)
        if len(named) < 2 or named in legal_sets:
            continue  # one fused group, no overlap; or offered above, by its first stage
        resolved = Overlap(items=t.items, chunks=model.k(t.items))
        why = _refusal(program, resolved)
        if why is None:  # pragma: no cover - the chains hold every legal pair
            out.append(_legal_overlap(resolved))
        else:
            out.append(PaletteEntry(str(StepCall("overlap", t.items)), False, why))
    return out


def _legal_overlap(t: Overlap) -> PaletteEntry:
    """A legal overlap, offered without `chunks=` (applying it picks the same K)."""
    shown = str(StepCall("overlap", t.items))
    return PaletteEntry(shown, True, "", f"{shown}  model: K={t.k}", str(t))


def overlap_chains(program: Program, stage: str) -> list[tuple[str, ...]]:
    """The overlap groups the palette tries for `stage`, best first: every chain of
    consecutive items through the stage's item, each reading its predecessor — the
    two-item ones with its neighbours, and those of up to `MAX_CHAIN_ITEMS` items that
    overlap communication (a collective, or a fused group with one: without any,
    chunking only adds launches). The most collectives first, then the fewest items,
    then by position. Items are stages and fused groups (named by their first stage)
    outside overlapped groups; none when the stage is in one."""
    idx = index(program)
    if not idx.is_stage(stage):
        return []
    start = _item(idx, stage)
    if start is None:
        return []
    before = _paths(idx, start, forward=False)  # each from the stage's item, backwards
    after = _paths(idx, start, forward=True)
    talks: dict[str, bool] = {}

    def comm(item: str) -> bool:
        if item not in talks:
            talks[item] = any(_op(idx, m) in COLLECTIVES for m in _members(idx, item))
        return talks[item]

    ranked: list[tuple[int, int, list[int], tuple[str, ...]]] = []
    for b in before:
        for a in after:
            n = len(b) + len(a) - 1
            if n < 2 or n > MAX_CHAIN_ITEMS:
                continue
            chain = (*reversed(b), *a[1:])
            talking = sum(map(comm, chain))
            if n > 2 and not talking:
                continue
            ranked.append((-talking, n, [idx.position(i) for i in chain], chain))
    ranked.sort()
    return [r[-1] for r in ranked]


def _item(idx: Index, name: str) -> str | None:
    """The item holding stage `name`, by its name (see `_named`); None inside an
    overlapped group."""
    g = idx.group_of(name)
    if g is None:
        return name
    if g.kind is GroupKind.OVERLAPPED:
        return None
    return next(g.stages())


def _named(idx: Index, name: str) -> str:
    """How a chain names the item holding stage `name`: the stage, or the first stage
    of its group."""
    g = idx.group_of(name)
    return name if g is None else next(g.stages())


def _members(idx: Index, item: str) -> list[str]:
    g = idx.group_of(item)
    return [item] if g is None else list(g.stages())


def _next_items(idx: Index, item: str, forward: bool) -> list[str]:
    """The items that read `item` (forward) or that it reads, by position."""
    found: set[str] = set()
    for m in _members(idx, item):
        near = idx.users(m) if forward else [r for r in idx.reads(m) if idx.is_stage(r)]
        for n in near:
            it = _item(idx, n)
            if it is not None and it != item:
                found.add(it)
    return sorted(found, key=idx.position)


def _paths(idx: Index, start: str, forward: bool) -> list[tuple[str, ...]]:
    """Paths of items from `start` (included) of at most `MAX_CHAIN_ITEMS`, at most
    `MAX_PATHS` of them (the shortest first)."""
    out: list[tuple[str, ...]] = []
    level: list[tuple[str, ...]] = [(start,)]
    while level and len(out) < MAX_PATHS:
        out += level[: MAX_PATHS - len(out)]
        if len(level[0]) == MAX_CHAIN_ITEMS:
            break
        level = [(*p, it) for p in level for it in _next_items(idx, p[-1], forward)]
        del level[MAX_PATHS:]
    return out


class _ChunkModel:
    """The K the cost model picks for an overlap (what `chunk_chooser` gives when the
    step is applied: `cocoviz.schedule.chunks.best_chunks`, or the default when no count
    is legal), for the overlaps of one palette on one simulator context, remembered
    across palettes by what decides it: the group's operations as the simulator lowers
    them and its stages' types (the same group in the next step, or in another layer of
    a stack, is not simulated again)."""

    def __init__(self, program: Program, hw: Hardware) -> None:
        self.program = program
        self.hw = hw
        self._ctx: Context | None = None

    def k(self, chain: tuple[str, ...]) -> int:
        """The model's K for `overlap(*chain)`."""
        from cocoviz.schedule.chunks import CHUNK_CHOICES
        from cocoviz.sim.warnings import chunk_times
        from cocoviz.sim.workload import Context, chunks_legal, lower_overlap

        idx = index(self.program)
        if not all(idx.is_stage(n) for n in chain):
            return DEFAULT_CHUNKS  # the check says which is unknown
        if self._ctx is None:
            self._ctx = Context(self.program, self.hw, "nccl")
        ctx = self._ctx
        items: list[str | Group] = []
        for n in chain:  # as best_chunks names them
            g = idx.group_of(n)
            item: str | Group = g if g is not None and g.kind is GroupKind.FUSED else n
            if item not in items:
                items.append(item)
        group = Group(GroupKind.OVERLAPPED, tuple(items), None)
        counts = [c for c in CHUNK_CHOICES if c >= 2 and chunks_legal(ctx, group, c)]
        if not counts:
            return DEFAULT_CHUNKS
        key = (
            self.hw,
            self.program.grid,
            tuple(idx.stage(n).ty for n in group.stages()),
            tuple(
                (op.spec, op.stream, op.kind, op.pstage, op.dest)
                for op in lower_overlap(ctx, group, 1)[0]
            ),
        )
        k = _KS.get(key)
        if k is None:
            times = chunk_times(ctx, group, counts)
            k = min(times, key=lambda c: (times[c], c))
            while len(_KS) >= _KS_KEPT:
                _KS.pop(next(iter(_KS)), None)
            _KS[key] = k
        return k


_KS: dict[object, int] = {}
_KS_KEPT = 4096


# --- decompose ----------------------------------------------------------------------------

_GATHERS = (Op.ALLGATHER,)
_SCATTERS = (Op.REDUCESCATTER, Op.ALLREDUCE)  # an allreduce: refused, split it first


def _decompositions(idx: Index, stage: str) -> list[Decompose]:
    """The `decompose` pairs `stage` is part of: an allgather and a matmul reading it,
    or a matmul and the reducescatter (or allreduce, refused: split it first) of its
    result."""
    op = idx.stage(stage).expr.op
    pairs: list[tuple[str, str]] = []
    if op in _GATHERS:
        pairs += [(stage, u) for u in idx.users(stage) if _op(idx, u) is Op.MATMUL]
    if op is Op.MATMUL:
        reads = sorted((r for r in idx.reads(stage) if idx.is_stage(r)), key=idx.position)
        pairs += [(r, stage) for r in reads if _op(idx, r) in _GATHERS]
        pairs += [(stage, u) for u in idx.users(stage) if _reduces(idx, u, stage)]
    if op in _SCATTERS:
        arg = idx.stage(stage).expr.args[0]
        if arg.op is Op.REF and arg.name is not None and idx.is_stage(arg.name):
            if _op(idx, arg.name) is Op.MATMUL:
                pairs.append((arg.name, stage))
    return [Decompose(items=p) for p in pairs]


def _op(idx: Index, name: str) -> Op:
    return idx.stage(name).expr.op


def _reduces(idx: Index, stage: str, value: str) -> bool:
    """Whether `stage` is a reducescatter or allreduce of `value` itself."""
    e = idx.stage(stage).expr
    return e.op in _SCATTERS and e.args[0].op is Op.REF and e.args[0].name == value
