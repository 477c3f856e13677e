"""Shared machinery of the schedule transformations.

A transformation is a frozen dataclass whose fields are its arguments. Its `rewrite`
checks the preconditions (raising `ScheduleError` in the user's terms) and returns an
`Edit`: the new stage list with the stages it built or changed marked dirty. `finish`
then re-types only the dirty stages and, downstream, the users whose operand types
changed (`cocoviz.ir.transforms.retype`), and verifies the IR invariants; a broken
invariant is an `InternalError` that names the step.

`Index` answers the graph queries the transformations need (positions, reads, users,
ordering edges, groups) for one Program. It is built once per Program object and reads
of a stage are cached per expression object, so that a long schedule on a large program
does not walk every expression after every step.
"""

from __future__ import annotations

import abc
import dataclasses
import operator
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any, ClassVar

from cocoviz.errors import ScheduleError, Span, did_you_mean
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
    StepCall,
)
from cocoviz.ir.types import REPLICATED, TensorType

# --- caches keyed by object identity, dropped with the object ------------------------------

_READS: dict[int, tuple[weakref.ref[Expr], frozenset[str]]] = {}


def _dropper(cache: dict[int, Any], key: int) -> Callable[[object], None]:
    """A weakref callback removing `key` from `cache` (bound now: safe at shutdown)."""

    def drop(_ref: object) -> None:
        cache.pop(key, None)

    return drop


def reads_of(stage: Stage) -> frozenset[str]:
    """Names a stage's expression reads (cached per expression object)."""
    e = stage.expr
    key = id(e)
    hit = _READS.get(key)
    if hit is not None and hit[0]() is e:
        return hit[1]
    names = frozenset(e.refs())
    _READS[key] = (weakref.ref(e, _dropper(_READS, key)), names)
    return names


# The index of a program lives on the program itself (a private attribute outside the
# dataclass fields, so equality, hashing and `dataclasses.replace` ignore it): the index
# holds its program, so a cache anywhere else would keep every program alive.
_INDEX_ATTR = "_cocoviz_index"


def cached_index(program: Program) -> Index | None:
    """The index already built for `program`, if any."""
    idx: Index | None = program.__dict__.get(_INDEX_ATTR)
    return idx if idx is not None and idx.program is program else None  # not a copy's


def index(
    program: Program, parent: Program | None = None, replaced: Iterable[str] | None = None
) -> Index:
    """The (cached) `Index` of a program. With `parent`, a program this one was made
    from by a few edits, the index is derived from the parent's instead of rebuilt;
    `replaced` says that only those stages changed (same names, same order)."""
    hit = cached_index(program)
    if hit is not None:
        return hit
    base = cached_index(parent) if parent is not None else None
    idx = Index(program, base, None if replaced is None else set(replaced))
    object.__setattr__(program, _INDEX_ATTR, idx)  # Program is frozen
    return idx


class Index:
    """Graph queries over one Program (stage positions, reads, users, ordering edges)."""

    pos: dict[str, int]
    inputs: dict[str, Input]
    params: dict[str, Param]
    dims: set[str]
    outputs: set[str]
    group_index: dict[str, int]
    grouped: int
    updates: dict[str, str]
    update_target: dict[str, str]

    def __init__(
        self, program: Program, parent: Index | None = None, replaced: set[str] | None = None
    ) -> None:
        self.program = program
        self.stages = program.stages
        self._window = (0, len(program.stages), len(program.stages))
        if parent is not None and replaced is not None:
            self.pos = parent.pos
        elif parent is not None:
            self._window = _changed_window(parent.stages, program.stages)
            lo, hi_new, hi_old = self._window
            stages = program.stages
            if hi_new == hi_old and list(map(_name, parent.stages[lo:hi_old])) == list(
                map(_name, stages[lo:hi_new])
            ):
                # the same names at the same positions: shared (an index never changes it)
                self.pos = parent.pos
            else:
                # positions before `lo` are the parent's; from `lo` on (up to `hi_new` when
                # the window kept its length, else to the end) they are set again (in C:
                # a long schedule renumbers the tail of a deep program at every step)
                self.pos = pos = dict(parent.pos)
                for s in parent.stages[lo:hi_old]:
                    del pos[s.name]
                end = hi_new if hi_new == hi_old else len(stages)
                pos.update(zip(map(_name, stages[lo:end]), count(lo)))
        else:
            self.pos = dict(zip(map(_name, program.stages), count()))
        pp = parent.program if parent is not None else None
        if parent is not None and pp is not None and pp.inputs is program.inputs:
            self.inputs = parent.inputs
        else:
            self.inputs = {i.name: i for i in program.inputs}
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
        if parent is not None and pp is not None and pp.groups is program.groups:
            self.group_index = parent.group_index
            self.grouped = parent.grouped
        else:
            self.group_index = group_index = {}
            grouped = 0  # group memberships; more than len(group_index) if shared
            for gi, g in enumerate(program.groups):
                todo = list(g.items)
                while todo:
                    it = todo.pop()
                    if isinstance(it, str):
                        group_index[it] = gi
                        grouped += 1
                    else:
                        todo.extend(it.items)
            self.grouped = grouped
        self._users: dict[str, set[str]] | None = None
        self._users_over: dict[str, set[str]] = {}
        if parent is None:
            self._scan_updates()
        else:
            self._derive(parent, replaced)

    def _scan_updates(self) -> None:
        self.updates = {}  # target input → update stage
        self.update_target = {}  # update stage → target input
        for s in self.stages:
            if s.expr.op is Op.UPDATE:
                tgt = s.expr.args[0].name
                if tgt is not None:
                    self.updates.setdefault(tgt, s.name)
                    self.update_target[s.name] = tgt

    def _derive(self, parent: Index, replaced: set[str] | None) -> None:
        """Users and updates from the parent's, adjusted for the stages that differ."""
        gone: list[Stage] = []
        new: list[Stage] = []
        if replaced is not None:
            for n in replaced:
                j = self.pos[n]
                new.append(self.stages[j])
                gone.append(parent.stages[j])
        else:
            lo, hi_new, hi_old = self._window
            old_window = {id(s) for s in parent.stages[lo:hi_old]}
            new_window = {id(s) for s in self.stages[lo:hi_new]}
            new = [s for s in self.stages[lo:hi_new] if id(s) not in old_window]
            gone = [s for s in parent.stages[lo:hi_old] if id(s) not in new_window]
        if any(s.expr.op is Op.UPDATE for s in gone + new):
            self._scan_updates()
        else:
            self.updates = parent.updates
            self.update_target = parent.update_target
        # the read edges (name read, stage) that differ; a stage re-typed or rebuilt with
        # the same reads changes none, and the parent's dicts are then shared (the dicts
        # and sets of an index are never changed once built: an edit copies them)
        before = {(r, s.name) for s in gone for r in reads_of(s)}
        after = {(r, s.name) for s in new for r in reads_of(s)}
        dropped, added = before - after, after - before
        base = parent._all_users()
        if not dropped and not added:
            self._users, self._users_over = base, parent._users_over
            return
        # the changed entries go to a small overlay over the parent's dict instead of a
        # copy of it (a long schedule on a deep program edits a few names per step);
        # the overlay is folded into a new dict once it grows
        over = dict(parent._users_over)
        copied: set[str] = set()

        def own(r: str) -> set[str]:
            if r not in copied:
                copied.add(r)
                cur = over.get(r)
                over[r] = set(base.get(r, ()) if cur is None else cur)
            return over[r]

        for r, n in dropped:
            own(r).discard(n)
        for r, n in added:
            own(r).add(n)
        if len(over) > _USERS_OVERLAY:
            base, over = {**base, **over}, {}
        self._users, self._users_over = base, over

    def _all_users(self) -> dict[str, set[str]]:
        """The users of each name, but for the names of the overlay (`_users_over`),
        whose entries replace these."""
        if self._users is None:
            users: dict[str, set[str]] = {}
            for s in self.stages:
                for r in reads_of(s):
                    users.setdefault(r, set()).add(s.name)
            self._users = users
        return self._users

    # --- lookups -------------------------------------------------------------------
    def stage(self, name: str) -> Stage:
        return self.stages[self.pos[name]]

    def is_stage(self, name: str) -> bool:
        return name in self.pos

    def is_bound(self, name: str) -> bool:
        return name in self.pos or name in self.inputs or name in self.params or name in self.dims

    def type_of(self, name: str) -> TensorType:
        if name in self.pos:
            return self.stage(name).ty
        if name in self.inputs:
            return self.inputs[name].ty
        p = self.params[name]
        return TensorType(p.dtype, (), REPLICATED, None)

    def reads(self, name: str) -> frozenset[str]:
        return reads_of(self.stage(name))

    def group_of(self, name: str) -> Group | None:
        gi = self.group_index.get(name)
        return None if gi is None else self.program.groups[gi]

    # --- edges -----------------------------------------------------------------------
    def users(self, name: str) -> list[str]:
        """Stages that read `name` (data edges), in program order."""
        found = self._users_over.get(name)
        if found is None:
            found = self._all_users().get(name)
        if not found:
            return []
        if len(found) == 1:
            return list(found)
        return sorted(found, key=self.pos.__getitem__)

    def preds(self, name: str) -> set[str]:
        """Stages that must run before stage `name`: data and update-ordering edges."""
        out = {r for r in self.reads(name) if r in self.pos}
        tgt = self.update_target.get(name)
        if tgt is not None:
            out.update(u for u in self.users(tgt) if u != name)
        return out

    def succs(self, name: str) -> set[str]:
        """Stages that must run after stage `name`."""
        out = set(self.users(name))
        for r in self.reads(name):
            u = self.updates.get(r)
            if u is not None and u != name:
                out.add(u)
        return out

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


_name = operator.attrgetter("name")

_USERS_OVERLAY = 256
"""Names whose users an index keeps beside its parent's dict before it folds them in."""


def _changed_window(old: tuple[Stage, ...], new: tuple[Stage, ...]) -> tuple[int, int, int]:
    """(lo, hi_new, hi_old): `new[:lo]` and `old[:lo]` hold the same stage objects, and
    so do `new[hi_new:]` and `old[hi_old:]` (compared by identity, in C)."""
    n = min(len(old), len(new))
    prefix = _first_differing(old, new, n)
    suffix = min(_first_differing(reversed(old), reversed(new), n), n - prefix)
    return prefix, len(new) - suffix, len(old) - suffix


def _first_differing(old: Iterable[Stage], new: Iterable[Stage], n: int) -> int:
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
    that only moved (checked, not re-typed)."""

    program: Program
    dirty: set[str] = field(default_factory=set)
    changed_inputs: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)


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


@dataclass(frozen=True, kw_only=True)
class Transformation(abc.ABC):
    """Base of every schedule step. Subclasses are frozen dataclasses whose fields are
    the step's arguments and define `name`, `rewrite` and `step`."""

    name: ClassVar[str]
    signature: ClassVar[str]
    makes_groups: ClassVar[bool] = False
    """Whether the step builds the group it changes (fuse, overlap) and checks it; after
    any other step, the groups whose stages changed are checked again."""
    call: StepCall | None = field(default=None, compare=False, repr=False)

    # --- the interface ----------------------------------------------------------------
    def check(self, program: Program) -> None:
        """Raise `ScheduleError` when the step does not apply to `program`."""
        self._run(program, verify=False)

    def apply(self, program: Program) -> Program:
        """The program after this step (checked first, IR invariants verified after)."""
        return self._run(program, verify=True)

    def resolve(
        self, program: Program, choose_chunks: ChunkChooser | None = None
    ) -> Transformation:
        """This step with its defaults chosen for `program` (overlap's chunk count by
        `choose_chunks`, which the schedule layer hands in: the cost model); the resolved
        step is what history and `.sched` record."""
        return self

    @abc.abstractmethod
    def rewrite(self, program: Program) -> Edit:
        """The rewritten program (not yet re-typed or verified); raises ScheduleError."""

    @abc.abstractmethod
    def step(self) -> StepCall:
        """The step as written, with defaults resolved (e.g. the chunk count)."""

    def __str__(self) -> str:
        return str(self.step())

    # --- shared plumbing --------------------------------------------------------------
    def run_unverified(self, program: Program) -> Program:
        """The program after this step, checked but without the IR invariant checks
        (for replaying a step whose result is compared with a known program)."""
        return self._run(program, verify=False)

    def _run(self, program: Program, verify: bool) -> Program:
        from cocoviz.ir.transforms.retype import TypeFailure, finish

        edit = self.rewrite(program)
        try:
            out = finish(program, edit, self, verify=verify)
        except TypeFailure as tf:
            user = self.type_error(tf, program)
            if user is not None:
                raise user from None
            from cocoviz.errors import InternalError

            raise InternalError(
                f"step `{self}`: re-typing '{tf.stage}' failed after the step: {tf.error.message}"
            ) from None
        if out.groups and not self.makes_groups:
            self._check_changed_groups(program, out)
        return out

    def _check_changed_groups(self, before: Program, after: Program) -> None:
        """Groups whose stages the step changed (re-typed, rewrote, removed) still obey
        the rules of the step that made them (e.g. slicing an input read inside an
        overlapped group can make it illegal there)."""
        from cocoviz.ir.transforms.grouping import group_error

        old, new = index(before), index(after)
        # the stages that are not the same objects as before, found in the window where
        # the stage lists differ (outside it they are the same objects)
        lo, hi, _ = _changed_window(before.stages, after.stages)
        changed = {
            s.name
            for s in after.stages[lo:hi]
            if not (old.is_stage(s.name) and old.stage(s.name) is s)
        }
        before_ids = {id(g) for g in before.groups}
        unchanged: set[Group] | None = None
        exact = new.grouped == len(new.group_index)  # no stage in two groups
        touched = {new.group_index[n] for n in changed if n in new.group_index}
        for gi, g in enumerate(after.groups):
            if id(g) not in before_ids:
                if unchanged is None:
                    unchanged = set(before.groups)
                if g not in unchanged:
                    touched.add(gi)  # a new group
                    continue
            if exact:
                continue  # touched already holds it if one of its stages changed
            if any(n in changed or n not in new.pos for n in g.stages()):
                touched.add(gi)
        for gi in sorted(touched):
            g = after.groups[gi]
            err = group_error(after, gi)
            if err is None:
                continue
            reason = err.message.split(": ", 1)[-1]
            members = ", ".join(g.stages())
            raise self.error(
                f"it would break the {g.kind.value} group {{{members}}}: {reason}",
                hint=f"apply {self.name} before fusing or overlapping these stages",
                notes=[("the stage that would break it", err.span)] if err.span else [],
            )

    def type_error(self, failure: object, program: Program) -> ScheduleError | None:
        """Turn a re-typing failure into a user error (steps whose legality is defined
        by the layout rules, e.g. reorder); None makes it an internal error."""
        return None

    @property
    def span(self) -> Span | None:
        return self.call.span if self.call is not None else None

    def arg_span(self, i: int) -> Span | None:
        if self.call is None or i >= len(self.call.arg_spans):
            return self.span
        return self.call.arg_spans[i] or self.span

    def error(
        self,
        message: str,
        stage: Stage | None = None,
        hint: str | None = None,
        notes: Sequence[tuple[str, Span | None]] = (),
        note: str | None = None,
        arg: int | None = None,
    ) -> ScheduleError:
        """A schedule error at the step (or at the stage when the step has no source
        location), with a note at the offending stage."""
        span = self.arg_span(arg) if arg is not None else self.span
        all_notes: list[tuple[str, Span | None]] = []
        if span is None and stage is not None:
            span = stage.span
        elif stage is not None and stage.span is not None:
            all_notes.append((note or f"'{stage.name}' is defined here", stage.span))
        all_notes.extend((n, s) for n, s in notes if s is not None)
        return ScheduleError(f"{self.name}: {message}", span, hint, all_notes)

    def lookup_stage(self, program: Program, name: str, arg: int) -> Stage:
        """The stage `name` (argument `arg` of the step), or a did-you-mean error."""
        idx = index(program)
        if idx.is_stage(name):
            return idx.stage(name)
        if name in idx.inputs:
            raise self.error(
                f"'{name}' is an input, not a stage", arg=arg, hint=self.signature_hint()
            )
        if name in idx.params:
            raise self.error(f"'{name}' is a param, not a stage", arg=arg)
        hint = did_you_mean(name, [s.name for s in idx.stages])  # in program order
        raise self.error(f"no stage named '{name}'", arg=arg, hint=hint or self.stages_hint(idx))

    def stages_hint(self, idx: Index) -> str:
        names = [s.name for s in idx.stages[:13]]  # in program order
        shown = ", ".join(names[:12]) + (", …" if len(names) > 12 else "")
        return f"the stages are {shown}"

    def signature_hint(self) -> str:
        return f"usage: {self.signature}"


def flat_items(groups: Sequence[Group]) -> Iterator[str]:
    for g in groups:
        yield from g.stages()


def is_fused(g: Group | None) -> bool:
    return g is not None and g.kind is GroupKind.FUSED
