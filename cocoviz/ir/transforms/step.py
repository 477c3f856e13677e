"""The schedule step: `Transformation`, the base of every step, and what every step's
checks share — re-checking the groups a step changed (`group_error`: by the rules of the
step that made each group) and naming the step that makes a name the program lacks yet.

Both need the concrete steps (fuse, overlap and decompose re-check the groups they make;
split and reorder make names), which are built on this class: each step class registers
itself by name when it is defined (`step_class`), and the package imports every step
module before any of its modules, so this module imports none of them. Below it,
`cocoviz.ir.transforms.base` holds the index and edit machinery and
`cocoviz.ir.transforms.retype` the re-typing of an edit.

Names steps make (docs/schedules.md, "Names"): two steps add stages, and `Index.fresh`
names them from a stage of the program: `split(s)` names the reducescatter half of
allreduce `s` `s_rs` (the allgather half keeps `s`), and `reorder(ag)` names each sliced
live-out `m` it moves across the allgather (or alltoall) `ag` `m_s` (the gather right
after it keeps `m`); either adds `_2`, `_3`, … when the name is taken. Fused and
overlapped groups and `decompose` name no stage. A step that names a stage the program
lacks is asked which steps would make it: the names are read back to the stage each
suffix grows from, the steps that could make it from there are applied to the program,
and the first (one step, or a split and the reorder across its allgather) whose result
holds the name is the answer. The test over every sample's schedule blocks
(tests/test_headless_edges.py) keeps this in step with the steps. What is reported is
therefore what applying those steps gives, never a guess from the spelling.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cocoviz.errors import CocovizError, InternalError, ScheduleError, Span, did_you_mean
from cocoviz.ir.nodes import Group, GroupKind, Op, Program, Stage, StepCall
from cocoviz.ir.transforms.base import (
    ChunkChooser,
    Edit,
    Index,
    Window,
    index,
)
from cocoviz.ir.transforms.retype import TypeFailure, finish_edit

_STEP_CLASSES: dict[str, type[Transformation]] = {}


def step_class(name: str) -> Callable[..., Transformation]:
    """The step class called `name` (registered when its module was imported: importing
    any module of this package imports them all first), to be called with its fields."""
    cls = _STEP_CLASSES.get(name)
    if cls is None:
        raise InternalError(f"no schedule step class '{name}' is registered")
    return cls


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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            _STEP_CLASSES[cls.name] = cls

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
        try:
            # a rewrite that types the stages it builds (`Edit.typed`) fails as re-typing does
            edit = self.rewrite(program)
            out, window = finish_edit(program, edit, self, verify=verify)
        except TypeFailure as tf:
            user = self.type_error(tf, program)
            if user is not None:
                raise user from None
            from cocoviz.errors import InternalError

            raise InternalError(
                f"step `{self}`: re-typing '{tf.stage}' failed after the step: {tf.error.message}"
            ) from None
        if out.groups and not self.makes_groups:
            self._check_changed_groups(program, out, window)
        return out

    def _check_changed_groups(self, before: Program, after: Program, window: Window) -> None:
        """Groups whose stages the step changed (re-typed, rewrote, removed) still obey
        the rules of the step that made them (e.g. slicing an input read inside an
        overlapped group can make it illegal there). `window` is where the stage tuples
        differ: outside it they hold the same objects."""
        new = index(after)
        lo, hi_new, hi_old = window
        old_stages = {s.name: s for s in before.stages[lo:hi_old]}
        changed = {s.name for s in after.stages[lo:hi_new] if old_stages.get(s.name) is not s}
        touched: dict[int, Group] = {}
        for n in changed:
            g = new.group_of(n)
            if g is not None:
                touched[id(g)] = g
        exact = new.groups_exact
        if after.groups is not before.groups or not exact:
            # groups rebuilt (a stage removed from one) or overlapping: look at them all
            before_ids = {id(g) for g in before.groups}
            unchanged: set[Group] | None = None
            for g in after.groups:
                if id(g) not in before_ids:
                    if unchanged is None:
                        unchanged = set(before.groups)
                    if g not in unchanged:
                        touched[id(g)] = g  # a new group
                        continue
                if exact:
                    continue  # touched already holds it if one of its stages changed
                if any(n in changed or not new.is_stage(n) for n in g.stages()):
                    touched[id(g)] = g
        if not touched:
            return
        for gi, g in enumerate(after.groups):
            if id(g) not in touched:
                continue
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
        made = not_made_yet(program, name, str(self.call or self))
        if made is not None:  # a name split or reorder makes (transforms/step.py, "names steps make")
            raise self.error(made[0], arg=arg, hint=made[1])
        hint = did_you_mean(name, [s.name for s in idx.stages])  # in program order
        raise self.error(f"no stage named '{name}'", arg=arg, hint=hint or self.stages_hint(idx))

    def stages_hint(self, idx: Index) -> str:
        names = [s.name for s in idx.stages[:13]]  # in program order
        shown = ", ".join(names[:12]) + (", …" if len(names) > 12 else "")
        return f"the stages are {shown}"

    def signature_hint(self) -> str:
        return f"usage: {self.signature}"


def group_error(program: Program, gi: int) -> ScheduleError | None:
    """Why group `gi` of `program` is not what the `fuse` and `overlap` steps would make
    of its stages in `program` without it (same rules, members and stage order); None
    when it is. Groups from source text, and groups whose stages a later step re-typed,
    are checked so: every group obeys the rules its step checked."""
    Fuse, Overlap, Decompose = step_class("fuse"), step_class("overlap"), step_class("decompose")
    g = program.groups[gi]
    steps: list[Transformation]
    if g.kind is GroupKind.FUSED:
        steps = [Fuse(stages=tuple(map(str, g.items)))]
    else:
        inner = [it for it in g.items if isinstance(it, Group)]
        steps = [Fuse(stages=tuple(map(str, f.items))) for f in inner]
        items = tuple(next(it.stages()) if isinstance(it, Group) else it for it in g.items)
        if g.by_shard:
            steps.append(Decompose(items=items))
        else:
            steps.append(Overlap(items=items, chunks=g.chunks))
    p = dataclasses.replace(program, groups=program.groups[:gi] + program.groups[gi + 1 :])
    index(program)
    index(p, parent=program, window=(0, 0, 0))  # derived from the program's: the same stages
    for t in steps:
        try:
            p = t.run_unverified(p)
        except ScheduleError as err:
            return err
    first = next(g.stages())
    made = next((h for h in p.groups if first in set(h.stages())), None)
    if made != g:
        extra = sorted(set(made.stages()) - set(g.stages())) if made is not None else []
        why = (
            f"it must also hold {', '.join(extra)} (every stage on a path between two of its "
            "stages)"
            if extra
            else f"{steps[-1]} would group its stages differently"
        )
        return ScheduleError(f"{steps[-1].name}: {why}")
    if p.stages != program.stages:  # identical stages compare by identity, in C
        return ScheduleError(f"{steps[-1].name}: the stages of the group do not run consecutively")
    return None


# --- names steps make ------------------------------------------------------------------
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
    Reorder, Split = step_class("reorder"), step_class("split")
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
