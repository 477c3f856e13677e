"""Incremental re-typing after a step, and the IR invariant checks.

Re-typing the whole program after every step costs O(stages) expression walks, which
is too slow for a long schedule on a deep model. `finish` re-types only the stages a
step built or changed and, in program order, the users of any stage or input whose type
changed: the same rules as the source (`Inferencer`), applied where they can matter.

`verify_program` checks every invariant from scratch (re-typing the whole program with
`infer_program` must reproduce it exactly); programs up to `FULL_VERIFY_LIMIT` stages
get it after every step. Larger ones get the same checks restricted to what the step
touched, plus the cheap whole-program ones (names, outputs, groups). `COCOVIZ_VERIFY`
set to `full` or `fast` forces one or the other.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
from collections.abc import Iterable
from typing import Any

from cocoviz.errors import InputError, InternalError, ScheduleError
from cocoviz.ir.graph import stage_reads
from cocoviz.ir.infer import Inferencer, infer_program
from cocoviz.ir.nodes import Group, GroupKind, Op, Program, Stage
from cocoviz.ir.transforms.base import (
    Edit,
    Index,
    Window,
    _changed_window,
    edit_program,
    index,
)
from cocoviz.ir.types import REPLICATED, TensorType

FULL_VERIFY_LIMIT = 400


class TypeFailure(ScheduleError):
    """Re-typing stage `stage` raised `error` (an InputError from the layout rules); the
    step that caused it turns it into its own refusal (`step.Transformation.apply`)."""

    def __init__(self, stage: str, error: InputError) -> None:
        super().__init__(error.message, error.span, error.hint)
        self.stage = stage
        self.error = error


class _Env(dict[str, TensorType]):
    """The inference environment, read lazily from the program's index; re-typed
    stages are stored in the dict itself."""

    def __init__(self, idx: Index) -> None:
        super().__init__()
        self.idx = idx

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        idx = self.idx
        i = idx.find(key)
        if i is not None:
            return idx.stages[i].expr.ty
        if key in idx.inputs:
            return idx.inputs[key].ty
        p = idx.params.get(key)
        if p is not None:
            return TensorType(p.dtype, (), REPLICATED, None)
        return default


def finish(before: Program, edit: Edit, step: object, verify: bool = True) -> Program:
    """Re-type what `edit` touched, then (with `verify`) check the IR invariants."""
    return finish_edit(before, edit, step, verify)[0]


def finish_edit(
    before: Program, edit: Edit, step: object, verify: bool = True
) -> tuple[Program, Window]:
    """`finish`, also returning the window where the result's stages differ from
    `before`'s (the edit's, widened to the users re-typed outside it)."""
    prog = edit.program
    window = edit.window
    if window is None:
        window = _changed_window(before.stages, prog.stages)
    lo, hi_new, hi_old = window
    index(before)
    idx = index(prog, parent=before, window=window, groups_sorted=edit.groups_sorted)
    # the type a stage had before the step: outside the window, a stage is the object
    # `before` holds (not yet re-typed here); inside it, the old stage of that name
    old_window = {s.name: s for s in before.stages[lo:hi_old]}
    env = _Env(idx)
    inf = Inferencer(prog.grid, env, idx.input_names)
    position = idx.position
    heap = [position(n) for n in edit.dirty if idx.is_stage(n)]
    for name in edit.changed_inputs:
        heap.extend(map(position, idx.users(name)))
    stages = prog.stages
    typed = edit.typed  # in the window, typed by the rewrite: only their users may need it
    for name in typed:
        old = old_window.get(name)
        if old is None or old.ty != idx.stage(name).ty:
            heap.extend(p for p in map(position, idx.users(name)) if stages[p].name not in typed)
    heapq.heapify(heap)
    done: dict[int, Stage] = {}  # position → re-typed stage
    retyped: list[str] = []
    first, last = lo, hi_new - 1
    while heap:
        i = heapq.heappop(heap)
        if i in done:
            continue
        s = stages[i]
        try:
            expr = inf.infer(s.expr)
        except InputError as err:
            raise TypeFailure(s.name, err) from None
        env[s.name] = expr.type
        done[i] = dataclasses.replace(s, expr=expr)
        retyped.append(s.name)
        if lo <= i < hi_new:
            old = old_window.get(s.name)
            before_ty = old.ty if old is not None else None
        else:
            before_ty = s.ty
            first, last = min(first, i), max(last, i)
        if before_ty != expr.type:
            heap.extend(p for p in map(position, idx.users(s.name)) if p not in done)
            heapq.heapify(heap)
    out = prog
    if done:
        a, b = min(done), max(done) + 1
        middle = list(stages[a:b])
        for i, st in done.items():
            middle[i - a] = st
        out = edit_program(prog, stages=stages[:a] + tuple(middle) + stages[b:])
    index(out, parent=prog, replaced=retyped)
    # the stages the step typed or re-typed, in program order
    checked = sorted([*typed, *retyped], key=position) if typed else retyped
    _check_updates(out, checked)
    if verify:
        mode = os.environ.get("COCOVIZ_VERIFY", "")
        full = mode == "full" or (mode != "fast" and len(out.stages) <= FULL_VERIFY_LIMIT)
        if full:
            verify_program(out, step)
        else:
            made = _new_groups(before.groups, out.groups)
            verify_touched(out, step, set(checked) | edit.moved, edit.removed, made)
    d = hi_new - hi_old
    return out, (min(first, lo), max(last + 1, hi_new), max(last + 1, hi_new) - d)


def typed_stage(inf: Inferencer, stage: Stage) -> Stage:
    """`stage` typed by `inf`, for a rewrite that types the stages it builds (`Edit.typed`):
    `inf` must read the values the new program will hold (the rewrite stores each typed
    stage's type in its environment before typing the stages that read it). A failure is
    the `TypeFailure` re-typing the stage after the step would raise."""
    try:
        expr = inf.infer(stage.expr)
    except InputError as err:
        raise TypeFailure(stage.name, err) from None
    return dataclasses.replace(stage, expr=expr)


def _check_updates(program: Program, retyped: list[str]) -> None:
    """The program-level `update` rules (docs/language.md, layout inference) for the re-typed update stages."""
    idx = index(program)
    if len(idx.update_target) != len(idx.updates):
        seen: dict[str, str] = {}
        for u, t in idx.update_target.items():
            if t in seen:
                raise TypeFailure(
                    u, InputError(f"input '{t}' is updated twice (also by '{seen[t]}')")
                )
            seen[t] = u
    for name in retyped:
        if name not in idx.update_target:
            continue
        s = idx.stage(name)
        tgt = s.expr.args[0]
        if tgt.type.layout.is_replicated and s.ty.layout.is_sliced and not _gathered(idx, name):
            raise TypeFailure(
                name,
                InputError(
                    f"update of replicated '{tgt.name}' with a sliced value must be followed "
                    f"by an allgather of '{name}'",
                    s.span,
                ),
            )


def _gathered(idx: Index, name: str) -> bool:
    for u in idx.users(name):
        e = idx.stage(u).expr
        if e.op is Op.ALLGATHER and e.args[0].op is Op.REF and e.args[0].name == name:
            return True
    return False


# --- invariants ------------------------------------------------------------------------


def _broken(step: object, what: str) -> InternalError:
    where = f"after step `{step}`" if step is not None else "in the program"
    return InternalError(f"IR invariant broken {where}: {what}")


def verify_program(program: Program, step: object = None) -> None:
    """Every IR invariant, checked from scratch; raises InternalError naming the step."""
    try:
        retyped = infer_program(program)
    except InputError as err:
        raise _broken(step, f"the program no longer type-checks: {err.message}") from None
    for a, b in zip(program.stages, retyped.stages, strict=True):
        if a != b:
            raise _broken(step, f"stage '{a.name}' has stale types or is not in canonical form")
    idx = index(program)
    _check_names(program, idx, step)
    _check_refs(program, idx, step, [s.name for s in program.stages])
    _check_groups(program, idx, step)


def _new_groups(old: tuple[Group, ...], new: tuple[Group, ...]) -> list[Group]:
    """The groups of `new` that are not (the same objects as) groups of `old`."""
    if new is old:
        return []
    lo, hi_new, hi_old = _changed_window(old, new)
    kept = set(map(id, old[lo:hi_old]))
    return [g for g in new[lo:hi_new] if id(g) not in kept]


def verify_touched(
    program: Program,
    step: object,
    touched: set[str],
    removed: set[str],
    groups: Iterable[Group] = (),
) -> None:
    """The invariants restricted to what a step touched (stages, and `groups` it made),
    plus the cheap global ones."""
    idx = index(program)
    _check_names(program, idx, step, fast=touched)
    for name in removed:
        if idx.is_stage(name):
            continue
        users = idx.users(name)
        if users:
            raise _broken(step, f"'{users[0]}' reads '{name}', which the step removed")
    near = [(n, p) for n in touched if (p := idx.find(n)) is not None]
    _check_refs(program, idx, step, [n for n, _ in near])
    _check_groups(program, idx, step, near={p for _, p in near}, made=groups)


def _check_names(program: Program, idx: Index, step: object, fast: set[str] | None = None) -> None:
    n = len(program.dims) + len(program.params) + len(program.inputs) + len(program.stages)
    if fast is not None:
        clash = any(t in idx.inputs or t in idx.params or t in idx.dims for t in fast)
        bad = idx.distinct_stages() != len(program.stages) or clash
    else:
        bad = idx.distinct_stages() != len(program.stages) or len(program.names()) != n
    if bad:
        seen: set[str] = set()
        for name in (
            [d.name for d in program.dims]
            + [p.name for p in program.params]
            + [i.name for i in program.inputs]
            + [s.name for s in program.stages]
        ):
            if name in seen:
                raise _broken(step, f"'{name}' is bound twice")
            seen.add(name)
    for o in program.outputs:
        if not idx.is_stage(o):
            raise _broken(step, f"output '{o}' is not a stage")
    if len(idx.outputs) != len(program.outputs):
        raise _broken(step, "an output is listed twice")


def _check_refs(program: Program, idx: Index, step: object, names: list[str]) -> None:
    for name in names:
        i = idx.position(name)
        s = program.stages[i]
        if s.expr.ty is None:
            raise _broken(step, f"stage '{name}' is untyped")
        for r in stage_reads(s):
            j = idx.find(r)
            if j is None:
                if r not in idx.inputs and r not in idx.params:
                    raise _broken(step, f"'{name}' reads '{r}', which is not defined")
            elif j >= i:
                raise _broken(step, f"'{name}' reads '{r}', which comes after it")
        tgt = idx.update_target.get(name)
        if tgt is not None:
            for u in idx.users(tgt):
                if u != name and idx.position(u) > i:
                    raise _broken(step, f"'{u}' reads '{tgt}' after its update '{name}'")
        for r in stage_reads(s):
            upd = idx.updates.get(r)
            if upd is not None and upd != name and idx.position(upd) < i:
                raise _broken(step, f"'{name}' reads '{r}' after its update '{upd}'")


def _check_groups(
    program: Program,
    idx: Index,
    step: object,
    near: set[int] | None = None,
    made: Iterable[Group] = (),
) -> None:
    """Groups hold existing stages, are disjoint, and each is a contiguous run of the
    stage order in item order. With a topological stage order (checked by `_check_refs`)
    that makes every group convex and the contracted graph acyclic. With `near` (the
    positions a step touched), only the groups that reach those positions, and the
    groups the step `made`, are checked in full."""
    seen: set[str] = set()
    groups: Iterable[Group] = program.groups
    if near is not None and idx.groups_exact:
        near_groups: dict[int, Group] = {}
        for p in range(
            max(min(near, default=0) - 1, 0), min(max(near, default=-2) + 2, len(program.stages))
        ):
            g = idx.group_of(program.stages[p].name)
            if g is not None:
                near_groups[id(g)] = g
        for g in made:
            near_groups[id(g)] = g
        # in program order (the groups are kept in the order of their first stages)
        groups = sorted(near_groups.values(), key=lambda g: idx.find(next(g.stages(), "")) or 0)
    for g in groups:
        _check_group_shape(g, step, top=True)
        names = list(g.stages())
        for n in names:
            if not idx.is_stage(n):
                raise _broken(step, f"a {g.kind.value} group holds '{n}', which is not a stage")
            if n in seen:
                raise _broken(step, f"'{n}' is in two groups")
            seen.add(n)
        lo = idx.position(names[0])
        run = [s.name for s in program.stages[lo : lo + len(names)]]
        if run != names:
            raise _broken(
                step, f"the {g.kind.value} group of '{names[0]}' is not contiguous in order"
            )


def _check_group_shape(g: Group, step: object, top: bool) -> None:
    if g.kind is GroupKind.FUSED:
        if g.chunks is not None or any(isinstance(i, Group) for i in g.items):
            raise _broken(step, "a fused group holds a group or a chunk count")
    else:
        if not top or g.chunks is None or g.chunks < 1:
            raise _broken(step, "an overlapped group is nested or has no chunk count")
        for it in g.items:
            if isinstance(it, Group):
                _check_group_shape(it, step, top=False)
    if len(g.items) < 2:
        raise _broken(step, f"a {g.kind.value} group has fewer than two items")
