"""Shared machinery of the schedule transformations.

A transformation is a frozen dataclass whose fields are its arguments. Its `rewrite`
checks the preconditions (raising `ScheduleError` in the user's terms) and returns an
`Edit`: the new stage list with the stages it built or changed marked dirty. `finish`
then re-types only the dirty stages and, downstream, the users whose operand types
changed (`cocoviz.ir.transforms.retype`), and verifies the IR invariants; a broken
invariant is an `InternalError` that names the step.

`Index` answers the graph queries the transformations need (positions, reads, users,
ordering edges, groups) for one Program. It is built once per Program object, from the
index of the program a step rewrote for what the step changed (the rewrite says where:
`Edit.window`), and reads of a stage are cached per expression object, so that a step
on a large program costs what it changes, not the program's size (see `_Tables`).
"""

from __future__ import annotations

import dataclasses
import operator
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from cocoviz.ir.graph import stage_reads
from cocoviz.ir.nodes import (
    COLLECTIVES,
    Expr,
    Group,
    GroupKind,
    Input,
    Op,
    Param,
    Program,
    Stage,
    expr_reads,
)
from cocoviz.ir.types import REPLICATED, TensorType

# The index of a program lives on the program itself (a private attribute outside the
# dataclass fields, so equality, hashing and `dataclasses.replace` ignore it): the index
# holds its program, so a cache anywhere else would keep every program alive.
_INDEX_ATTR = "_cocoviz_index"

Window = tuple[int, int, int]
"""(lo, hi_new, hi_old) between an old and a new stage tuple: `new[:lo]` and `old[:lo]`
hold the same stage objects, and so do `new[hi_new:]` and `old[hi_old:]`."""


def cached_index(program: Program) -> Index | None:
    """The index already built for `program`, if any."""
    idx: Index | None = program.__dict__.get(_INDEX_ATTR)
    return idx if idx is not None and idx._program() is program else None  # not a copy's


def index(
    program: Program,
    parent: Program | None = None,
    replaced: Iterable[str] | None = None,
    window: Window | None = None,
    groups_sorted: bool | None = None,
) -> Index:
    """The (cached) `Index` of a program. With `parent`, a program this one was made
    from by a few edits, the index is derived from the parent's instead of rebuilt;
    `replaced` says that only those stages changed (same names, same order), `window`
    where the stage tuples differ (found by comparing them when not given), and
    `groups_sorted` that the groups are in the order of their first stages."""
    hit = cached_index(program)
    if hit is not None:
        return hit
    base = cached_index(parent) if parent is not None else None
    rep = None if replaced is None else set(replaced)
    idx = Index(program, base, rep, window, groups_sorted)
    object.__setattr__(program, _INDEX_ATTR, idx)  # Program is frozen
    return idx


# --- the tables behind the indexes of a line of programs ---------------------------------
#
# A long schedule makes a line of programs, each from the one before by a small edit. Their
# indexes share one set of mutable tables (`_Tables`: positions, group membership, users),
# which each derived index edits in place for what its step changed, logging how to undo
# it; the tables then answer for the newest index only. An older index asked later (the
# program a step was checked against, a program of the TUI's undo history) takes them back
# by undoing the log down to its version, or builds its own when the log no longer reaches
# it. That makes a step's index cost what the step changed, not the program's size.
#
# Positions are stored without renumbering every stage after an insertion: a stage before
# `split` is stored as its position, one at or after it as its position minus the stage
# count (its distance from the end, which an edit before it does not change). An edit moves
# `split` to its window, converting the stages in between: a schedule that works through a
# program in order converts each stage about once. Each index keeps the positions it was
# asked for (`_Positions`), so a lookup is a dict hit after the first.

# The tables are shared, so every access holds `_LOCK`: a UI queries the programs of its
# history in worker threads (simulating, emitting) while it applies steps in its own.
_LOCK = threading.RLock()
_VERSIONS = count(1)
_LOG_LIMIT = 16
"""Edits the tables can undo: an index more steps back rebuilds its own tables."""
_CARRY = 64
"""Positions a derived index takes over from its parent's lookups (at most)."""


class _Undo:
    """How to take the tables back to `version`: the old values of the entries an edit
    changed (None: absent)."""

    __slots__ = ("version", "n", "split", "grouped", "pos", "groups", "all_groups", "users")

    def __init__(self, tables: _Tables) -> None:
        self.version = tables.version
        self.n = tables.n
        self.split = tables.split
        self.grouped = tables.grouped
        self.pos: dict[str, int | None] = {}
        self.groups: dict[str, Group | None] = {}
        self.all_groups: dict[str, Group] | None = None  # the whole table, when replaced
        self.users: dict[str, set[str] | None] = {}


def _restore(table: dict[str, Any], old: dict[str, Any]) -> None:
    for k, v in old.items():
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v


class _Tables:
    """Stage positions, group membership and users of the program of the index whose
    `version` this is (see above)."""

    __slots__ = ("pos", "n", "split", "groups", "grouped", "users", "version", "log")

    def __init__(self, program: Program) -> None:
        stages = program.stages
        self.pos: dict[str, int] = dict(zip(map(_name, stages), count()))
        self.n = len(stages)
        self.split = self.n  # every stage stored as its position
        self.groups, self.grouped = _group_table(program.groups)
        self.users: dict[str, set[str]] | None = None  # built when first asked for
        self.version = next(_VERSIONS)
        self.log: list[_Undo] = []

    def undo(self) -> None:
        rec = self.log.pop()
        _restore(self.pos, rec.pos)
        if rec.all_groups is not None:
            self.groups = rec.all_groups
        else:
            _restore(self.groups, rec.groups)
        if self.users is not None:
            _restore(self.users, rec.users)
        self.n, self.split, self.grouped = rec.n, rec.split, rec.grouped
        self.version = rec.version


def _group_table(groups: Sequence[Group]) -> tuple[dict[str, Group], int]:
    """Stage → its top-level group, and the group memberships (more than the table's
    length if a stage is in two groups; the last one wins)."""
    table: dict[str, Group] = {}
    grouped = 0
    for g in groups:
        todo = list(g.items)
        while todo:
            it = todo.pop()
            if isinstance(it, str):
                table[it] = g
                grouped += 1
            else:
                todo.extend(it.items)
    return table, grouped


class _Positions(dict[str, int]):
    """The positions an index was asked for; a miss is looked up in the tables."""

    __slots__ = ("_index",)

    def __init__(self, idx: Index, known: dict[str, int] | None = None) -> None:
        super().__init__(known or {})
        self._index = weakref.ref(idx)  # the index holds this: no cycle

    def __missing__(self, name: str) -> int:
        idx = self._index()
        if idx is None:  # pragma: no cover - the index holds its positions
            raise KeyError(name)
        p = idx._locate(name)
        self[name] = p
        return p


class PositionsView(Mapping[str, int]):
    """`Index.pos`: stage name → position, as a read-only mapping."""

    def __init__(self, idx: Index) -> None:
        self._idx = idx

    def __getitem__(self, name: str) -> int:
        return self._idx.position(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._idx.is_stage(name)

    def __iter__(self) -> Iterator[str]:
        return iter([s.name for s in self._idx.stages])

    def __len__(self) -> int:
        return self._idx.distinct_stages()


class Index:
    """Graph queries over one Program (stage positions, reads, users, ordering edges)."""

    inputs: dict[str, Input]
    input_names: set[str]
    """The inputs' names (for inference; shared like `inputs`)."""
    params: dict[str, Param]
    dims: set[str]
    outputs: set[str]
    updates: dict[str, str]
    update_target: dict[str, str]
    position: Callable[[str], int]
    """The position of stage `name` (KeyError if it is not a stage); a C-level dict
    lookup after the first time, for sort keys and inner loops."""

    def __init__(
        self,
        program: Program,
        parent: Index | None = None,
        replaced: set[str] | None = None,
        window: Window | None = None,
        groups_sorted: bool | None = None,
    ) -> None:
        # The program holds its index (`index`), so the index holds it weakly: a cycle
        # would leave every program a schedule goes through to the cyclic collector,
        # whose passes over a large program then cost more than the steps.
        self._program = weakref.ref(program)
        self.stages = program.stages
        self.groups = program.groups
        pp = parent.program if parent is not None else None
        if parent is not None and pp is not None and pp.inputs is program.inputs:
            self.inputs = parent.inputs
            self.input_names = parent.input_names
        else:
            self.inputs = {i.name: i for i in program.inputs}
            self.input_names = set(self.inputs)
        if parent is not None and pp is not None and pp.params is program.params:
            self.params = parent.params
            self.dims = parent.dims
        else:
            self.params = {p.name: p for p in program.params}
            self.dims = {d.name for d in program.dims}
        if parent is not None and pp is not None and pp.outputs is program.outputs:
            self.outputs = parent.outputs
        else:
            self.outputs = set(program.outputs)
        self._groups_sorted = groups_sorted
        self._preds: dict[str, frozenset[str]] = {}
        self._succs: dict[str, frozenset[str]] = {}
        if parent is None:
            self._tables_ = _Tables(program)
            self._version = self._tables_.version
            self._set_positions(None)
            self._scan_updates()
        else:
            self._derive(parent, replaced, window)

    @property
    def program(self) -> Program:
        """The program (alive while its index is used: the caller holds it)."""
        p = self._program()
        if p is None:  # pragma: no cover - an index is reached through its program
            raise ReferenceError("the program of this index is gone")
        return p

    def _set_positions(self, known: dict[str, int] | None) -> None:
        self._positions = _Positions(self, known)
        self.position = self._positions.__getitem__

    # --- the shared tables --------------------------------------------------------------
    def _tables(self) -> _Tables:
        """The tables, answering for this index (taken back, or rebuilt, if a derived
        index changed them). The caller holds `_LOCK`."""
        t = self._tables_
        if t.version == self._version:
            return t
        v = self._version
        if any(rec.version == v for rec in t.log):
            while t.version != v:
                t.undo()
            return t
        t = self._tables_ = _Tables(self.program)
        self._version = t.version
        return t

    def _locate(self, name: str) -> int:
        with _LOCK:
            t = self._tables()
            v = t.pos[name]
            return v if v >= 0 else v + t.n

    def _scan_updates(self) -> None:
        self.updates = {}  # target input → update stage
        self.update_target = {}  # update stage → target input
        for s in self.stages:
            if s.expr.op is Op.UPDATE:
                tgt = s.expr.args[0].name
                if tgt is not None:
                    self.updates.setdefault(tgt, s.name)
                    self.update_target[s.name] = tgt

    def _derive(self, parent: Index, replaced: set[str] | None, window: Window | None) -> None:
        with _LOCK:
            self._derive_locked(parent, replaced, window)

    def _derive_locked(
        self, parent: Index, replaced: set[str] | None, window: Window | None
    ) -> None:
        """Take over the parent's tables, edited for the stages and groups that differ."""
        t = parent._tables()
        pp = parent.program
        old_stages, stages = parent.stages, self.stages
        gone: list[Stage] = []
        new: list[Stage] = []
        moved = False  # whether positions changed
        if replaced is not None:
            for n in replaced:
                j = parent.position(n)
                new.append(stages[j])
                gone.append(old_stages[j])
            lo = hi_new = hi_old = 0
        else:
            if window is None:
                window = _changed_window(old_stages, stages)
            lo, hi_new, hi_old = window
            old_window = old_stages[lo:hi_old]
            new_window = stages[lo:hi_new]
            old_ids = set(map(id, old_window))
            new_ids = set(map(id, new_window))
            new = [s for s in new_window if id(s) not in old_ids]
            gone = [s for s in old_window if id(s) not in new_ids]
            moved = hi_new != hi_old or list(map(_name, old_window)) != list(map(_name, new_window))
        if any(s.expr.op is Op.UPDATE for s in gone) or any(s.expr.op is Op.UPDATE for s in new):
            self._scan_updates()
        else:
            self.updates = parent.updates
            self.update_target = parent.update_target
        # the read edges (name read, stage) that differ; a stage re-typed or rebuilt with
        # the same reads changes none (and then, if nothing else changed either, the two
        # indexes share the tables' version, whatever builds the users table later)
        before = {(r, s.name) for s in gone for r in stage_reads(s)}
        after = {(r, s.name) for s in new for r in stage_reads(s)}
        dropped, added = before - after, after - before
        regrouped = pp.groups is not self.groups
        # the positions the parent was asked for (while there are few; a snapshot, as
        # another thread may be adding to them) still hold where no stage moved: the next
        # lookups are mostly of the same stages
        carried = dict(parent._positions) if len(parent._positions) <= _CARRY else {}
        if not moved and not regrouped and not dropped and not added:
            # nothing the tables hold changed: shared, positions and all
            self._tables_, self._version = t, parent._version
            self._set_positions(carried)
            if self._groups_sorted is None:
                self._groups_sorted = parent._groups_sorted
            return
        rec = _Undo(t)
        known: dict[str, int] = carried
        if moved:
            self._move_positions(t, rec, old_stages, window or (0, 0, 0))
            # the window's stages, and the carried ones outside it (shifted)
            d = hi_new - hi_old
            known = dict(zip(map(_name, stages[lo:hi_new]), count(lo)))
            for k, v in carried.items():
                if v < lo:
                    known[k] = v
                elif v >= hi_old:
                    known[k] = v + d
        if t.users is not None and (dropped or added):
            _edit_users(t.users, rec.users, dropped, added)
        if regrouped:
            self._regroup(t, rec, pp.groups, self.groups)
        elif self._groups_sorted is None:
            # a step that moves grouped stages makes new groups (fuse, overlap); the
            # others keep the stages' order, and so the groups'
            self._groups_sorted = parent._groups_sorted
        t.log.append(rec)
        if len(t.log) > _LOG_LIMIT:
            del t.log[0]
        t.version = next(_VERSIONS)
        self._tables_, self._version = t, t.version
        self._set_positions(known)

    def _move_positions(
        self, t: _Tables, rec: _Undo, old_stages: tuple[Stage, ...], window: Window
    ) -> None:
        lo, hi_new, hi_old = window
        pos = t.pos
        n_old = t.n
        # move `split` into the window: the stages between it and the window change sides
        if t.split < lo:
            conv = list(map(_name, old_stages[t.split : lo]))
            base = t.split
        elif t.split > hi_old:
            conv = list(map(_name, old_stages[hi_old : t.split]))
            base = hi_old - n_old
        else:
            conv, base = [], 0
        old_names = list(map(_name, old_stages[lo:hi_old]))
        new_names = list(map(_name, self.stages[lo:hi_new]))
        saved = rec.pos  # every entry's value before any of them changes
        saved.update(zip(conv, map(pos.get, conv), strict=True))
        saved.update(zip(old_names, map(pos.get, old_names), strict=True))
        saved.update(zip(new_names, map(pos.get, new_names), strict=True))
        pos.update(zip(conv, count(base)))
        for nm in old_names:
            pos.pop(nm, None)
        # the window's stages go before `split`, where the next edit is likely to be
        pos.update(zip(new_names, count(lo)))
        t.split = hi_new
        t.n = len(self.stages)

    def _regroup(
        self, t: _Tables, rec: _Undo, old: tuple[Group, ...], new: tuple[Group, ...]
    ) -> None:
        """Group membership edited for the groups that differ."""
        if t.grouped == len(t.groups):  # no stage in two groups: edited in place
            lo, hi_new, hi_old = _changed_window(old, new)  # identity, in C
            old_ids = set(map(id, old[lo:hi_old]))
            new_ids = set(map(id, new[lo:hi_new]))
            table, saved = t.groups, rec.groups
            for g in old[lo:hi_old]:
                if id(g) not in new_ids:
                    for nm in g.stages():
                        if nm not in saved:
                            saved[nm] = table.get(nm)
                        if table.pop(nm, None) is not None:
                            t.grouped -= 1
            for g in new[lo:hi_new]:
                if id(g) not in old_ids:
                    for nm in g.stages():
                        if nm not in saved:
                            saved[nm] = table.get(nm)
                        table[nm] = g
                        t.grouped += 1
            if t.grouped == len(table):
                return
            _restore(table, saved)  # a stage in two groups: the whole table instead
            saved.clear()
        rec.all_groups = t.groups
        t.groups, t.grouped = _group_table(new)

    # --- lookups -------------------------------------------------------------------
    @property
    def pos(self) -> PositionsView:
        """Stage name → position (a mapping; `position` is the fast lookup)."""
        return PositionsView(self)

    def find(self, name: str) -> int | None:
        """The position of stage `name`, None if it is not a stage."""
        try:
            return self.position(name)
        except KeyError:
            return None

    def stage(self, name: str) -> Stage:
        return self.stages[self.position(name)]

    def is_stage(self, name: str) -> bool:
        if name in self._positions:
            return True
        with _LOCK:
            return name in self._tables().pos

    def distinct_stages(self) -> int:
        """How many distinct stage names (fewer than stages if a name is bound twice)."""
        with _LOCK:
            return len(self._tables().pos)

    def is_bound(self, name: str) -> bool:
        return (
            self.is_stage(name) or name in self.inputs or name in self.params or name in self.dims
        )

    def type_of(self, name: str) -> TensorType:
        if self.is_stage(name):
            return self.stage(name).ty
        if name in self.inputs:
            return self.inputs[name].ty
        p = self.params[name]
        return TensorType(p.dtype, (), REPLICATED, None)

    def reads(self, name: str) -> frozenset[str]:
        return expr_reads(self.stages[self.position(name)].expr)

    # --- groups ------------------------------------------------------------------------
    def group_of(self, name: str) -> Group | None:
        """The top-level group holding stage `name`, if any."""
        with _LOCK:
            return self._tables().groups.get(name)

    def group_table(self) -> dict[str, Group]:
        """Stage → its top-level group (a copy)."""
        with _LOCK:
            return dict(self._tables().groups)

    @property
    def groups_exact(self) -> bool:
        """Whether no stage is in two groups."""
        with _LOCK:
            t = self._tables()
            return t.grouped == len(t.groups)

    @property
    def groups_sorted(self) -> bool:
        """Whether the groups are in the order of their first stages (as `regroup`
        keeps them)."""
        if self._groups_sorted is None:
            firsts = [self.find(next(g.stages(), "")) for g in self.groups]
            found = [p for p in firsts if p is not None]
            self._groups_sorted = len(found) == len(firsts) and all(
                a < b for a, b in zip(found, found[1:], strict=False)
            )
        return self._groups_sorted

    # --- edges -----------------------------------------------------------------------
    def _build_users(self, t: _Tables) -> dict[str, set[str]]:
        """The users table, built once for a line of programs (the caller holds `_LOCK`)."""
        # one pass over every stage of a large program: a set made only for a name not
        # seen yet
        users: dict[str, set[str]] = {}
        known = users.get
        for s in self.stages:
            name = s.name
            for r in expr_reads(s.expr):
                found = known(r)
                if found is None:
                    users[r] = {name}
                else:
                    found.add(name)
        t.users = users
        t.log.clear()  # the logged edits did not keep the users
        return users

    def users(self, name: str) -> list[str]:
        """Stages that read `name` (data edges), in program order."""
        with _LOCK:
            t = self._tables()
            table = t.users if t.users is not None else self._build_users(t)
            found = table.get(name)
            if not found:
                return []
            out = list(found)
        if len(out) > 1:
            out.sort(key=self.position)
        return out

    def preds(self, name: str) -> frozenset[str]:
        """Stages that must run before stage `name`: data and update-ordering edges."""
        hit = self._preds.get(name)  # asked again and again by the region searches
        if hit is None:
            reads = self.reads(name)
            with _LOCK:
                out = self._tables().pos.keys() & reads  # the reads that are stages, in C
            tgt = self.update_target.get(name)
            if tgt is not None:
                out.update(u for u in self.users(tgt) if u != name)
            hit = self._preds[name] = frozenset(out)
        return hit

    def succs(self, name: str) -> frozenset[str]:
        """Stages that must run after stage `name`."""
        hit = self._succs.get(name)
        if hit is None:
            out = set(self.users(name))
            for r in self.reads(name):
                u = self.updates.get(r)
                if u is not None and u != name:
                    out.add(u)
            hit = self._succs[name] = frozenset(out)
        return hit

    # --- names -----------------------------------------------------------------------
    def fresh(self, base: str, taken: Iterable[str] = ()) -> str:
        """`base`, or `base_2`, `base_3`, … when bound in the program or the source."""
        extra = set(taken)

        def free(n: str) -> bool:
            return not self.is_bound(n) and n not in self.program.source_names and n not in extra

        if free(base):
            return base
        k = 2
        while not free(f"{base}_{k}"):
            k += 1
        return f"{base}_{k}"


def _edit_users(
    users: dict[str, set[str]],
    saved: dict[str, set[str] | None],
    dropped: set[tuple[str, str]],
    added: set[tuple[str, str]],
) -> None:
    """Apply the changed read edges to the users table, saving each entry's old set (the
    sets are replaced, never changed in place, so the saved ones stay intact)."""
    copied: set[str] = set()

    def own(r: str) -> set[str]:
        if r not in copied:
            copied.add(r)
            cur = users.get(r)
            if r not in saved:
                saved[r] = cur
            users[r] = set() if cur is None else set(cur)
        return users[r]

    for r, n in dropped:
        own(r).discard(n)
    for r, n in added:
        own(r).add(n)
    for r in copied:
        if not users[r]:
            del users[r]


_name = operator.attrgetter("name")


def _changed_window(old: Sequence[Any], new: Sequence[Any]) -> Window:
    """(lo, hi_new, hi_old): `new[:lo]` and `old[:lo]` hold the same objects, and so do
    `new[hi_new:]` and `old[hi_old:]` (compared by identity, in C)."""
    n = min(len(old), len(new))
    prefix = _first_differing(old, new, n)
    suffix = min(_first_differing(reversed(old), reversed(new), n), n - prefix)
    return prefix, len(new) - suffix, len(old) - suffix


def _first_differing(old: Iterable[Any], new: Iterable[Any], n: int) -> int:
    """The first index where the objects differ (n when none does among the first n): a
    lazy scan in C that stops there (`indexOf` counts without making an int per item)."""
    try:
        return operator.indexOf(map(operator.is_not, old, new), True)
    except ValueError:
        return n


# --- edits ---------------------------------------------------------------------------


@dataclass
class Edit:
    """What a rewrite produced: the new program (dirty stages not yet re-typed), the
    stages to re-type, inputs whose type changed, names that no longer exist, and stages
    that only moved (checked, not re-typed). `window` is where the new stage tuple differs
    from the old one (None: found by comparing them), and `groups_sorted` says that the
    new program's groups are in the order of their first stages: both spare the index of
    the new program a pass over the whole program.

    `typed` are stages the rewrite built already typed, as re-typing would have typed
    them (`retype.typed_stage`, against the new program's values): they are checked, and
    their users re-typed where a type changed, but the stages themselves are not typed
    again. A rewrite that types everything it builds so spares `finish` a second program."""

    program: Program
    dirty: set[str] = field(default_factory=set)
    changed_inputs: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)
    window: Window | None = None
    groups_sorted: bool | None = None
    typed: set[str] = field(default_factory=set)


_PROGRAM_FIELDS = tuple(f.name for f in dataclasses.fields(Program))


def edit_program(program: Program, **changes: Any) -> Program:
    """`dataclasses.replace(program, **changes)`, without its walk over the class's
    field table (every step makes a program, and the walk cost more than the stage
    tuple it usually changes)."""
    d = program.__dict__
    return Program(**{f: changes[f] if f in changes else d[f] for f in _PROGRAM_FIELDS})


def splice(
    program: Program, lo: int, hi: int, middle: Sequence[Stage], **changes: Any
) -> tuple[Program, Window]:
    """`program` with stages `lo:hi` replaced by `middle` (and other fields changed),
    and the window of the edit."""
    stages = program.stages[:lo] + tuple(middle) + program.stages[hi:]
    return edit_program(program, stages=stages, **changes), (lo, lo + len(middle), hi)


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """`e` with every reference to a key of `mapping` replaced (types left stale)."""
    if e.op is Op.REF:
        return mapping.get(e.name or "", e)
    if not e.args:
        return e
    args = tuple(substitute(a, mapping) for a in e.args)
    if all(a is b for a, b in zip(args, e.args, strict=True)):
        return e
    return dataclasses.replace(e, args=args)


def rename_refs(e: Expr, renames: dict[str, str]) -> Expr:
    """`e` with references renamed (keeping each node's type)."""
    if e.op is Op.REF:
        new = renames.get(e.name or "")
        return dataclasses.replace(e, name=new) if new is not None else e
    if not e.args:
        return e
    args = tuple(rename_refs(a, renames) for a in e.args)
    if all(a is b for a, b in zip(args, e.args, strict=True)):
        return e
    return dataclasses.replace(e, args=args)


def map_group(g: Group, fn: dict[str, str]) -> Group:
    items = tuple(map_group(i, fn) if isinstance(i, Group) else fn.get(i, i) for i in g.items)
    return dataclasses.replace(g, items=items)


def drop_from_groups(groups: Sequence[Group], removed: set[str]) -> tuple[Group, ...]:
    """Groups without the removed stages; a group left with fewer than two items is
    dissolved (an overlapped group's lone fused item becomes a top-level group)."""
    out: list[Group] = []

    def prune(g: Group) -> Group | str | None:
        items: list[Group | str] = []
        for it in g.items:
            if isinstance(it, Group):
                p = prune(it)
                if p is not None:
                    items.append(p)
            elif it not in removed:
                items.append(it)
        if len(items) >= 2:
            return dataclasses.replace(g, items=tuple(items))
        if len(items) == 1:
            return items[0]
        return None

    for g in groups:
        p = prune(g)
        if isinstance(p, Group):
            out.append(p)
    return tuple(out)


# --- errors ----------------------------------------------------------------------------


def op_word(stage: Stage) -> str:
    """How a stage's operation is called in messages."""
    op = stage.expr.op
    if op in COLLECTIVES:
        return op.value
    if op is Op.MATMUL:
        return "matmul"
    if op is Op.UPDATE:
        return "update"
    if op is Op.REF:
        return "copy"
    return f"{op.value}" if op not in (Op.ADD, Op.SUB, Op.MUL, Op.DIV) else "elementwise"


def describe_stage(stage: Stage) -> str:
    """`'sum' (allreduce, f16[B, S, H] replicated)`."""
    t = stage.expr.ty
    ty = f", {t}" if t is not None else ""
    return f"'{stage.name}' ({op_word(stage)}{ty})"


ChunkChooser = Callable[[Program, tuple[str, ...]], int]
"""Picks overlap's chunk count K for `program` and the overlapped items (the cost model,
from the schedule layer above the IR)."""


def flat_items(groups: Sequence[Group]) -> Iterator[str]:
    for g in groups:
        yield from g.stages()


def is_fused(g: Group | None) -> bool:
    return g is not None and g.kind is GroupKind.FUSED
