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
from typing import Any

from cocoviz.errors import InputError, InternalError, ScheduleError
from cocoviz.ir.infer import Inferencer, infer_program
from cocoviz.ir.nodes import Group, GroupKind, Op, Program
from cocoviz.ir.transforms.base import Edit, Index, index, reads_of
from cocoviz.ir.types import REPLICATED, TensorType

FULL_VERIFY_LIMIT = 400


class TypeFailure(ScheduleError):
    """Re-typing stage `stage` raised `error` (an InputError from the layout rules); the
    step that caused it turns it into its own refusal (`base.Transformation.apply`)."""

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
        i = idx.pos.get(key)
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
    prog = edit.program
    old = index(before)
    idx = index(prog, parent=before)
    env = _Env(idx)
    inf = Inferencer(prog.grid, env, set(idx.inputs))
    heap = [idx.pos[n] for n in edit.dirty if n in idx.pos]
    for name in edit.changed_inputs:
        heap.extend(idx.pos[u] for u in idx.users(name))
    heapq.heapify(heap)
    stages = list(prog.stages)
    done: set[int] = set()
    retyped: list[str] = []
    while heap:
        i = heapq.heappop(heap)
        if i in done:
            continue
        done.add(i)
        s = stages[i]
        try:
            expr = inf.infer(s.expr)
        except InputError as err:
            raise TypeFailure(s.name, err) from None
        env[s.name] = expr.type
        stages[i] = dataclasses.replace(s, expr=expr)
        retyped.append(s.name)
        before_ty = old.type_of(s.name) if old.is_stage(s.name) else None
        if before_ty != expr.type:
            heap.extend(idx.pos[u] for u in idx.users(s.name) if idx.pos[u] not in done)
            heapq.heapify(heap)
    out = dataclasses.replace(prog, stages=tuple(stages)) if retyped else prog
    index(out, parent=prog, replaced=retyped)
    _check_updates(out, retyped)
    if verify:
        mode = os.environ.get("COCOVIZ_VERIFY", "")
        full = mode == "full" or (mode != "fast" and len(out.stages) <= FULL_VERIFY_LIMIT)
        if full:
            verify_program(out, step)
        else:
            verify_touched(out, step, set(retyped) | edit.moved, edit.removed)
    return out


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


def verify_touched(program: Program, step: object, touched: set[str], removed: set[str]) -> None:
    """The invariants restricted to what a step touched, plus the cheap global ones."""
    idx = index(program)
    _check_names(program, idx, step, fast=touched)
    for name in removed:
        if name in idx.pos:
            continue
        users = idx.users(name)
        if users:
            raise _broken(step, f"'{users[0]}' reads '{name}', which the step removed")
    _check_refs(program, idx, step, [n for n in touched if n in idx.pos])
    _check_groups(program, idx, step, near={idx.pos[n] for n in touched if n in idx.pos})


def _check_names(program: Program, idx: Index, step: object, fast: set[str] | None = None) -> None:
    n = len(program.dims) + len(program.params) + len(program.inputs) + len(program.stages)
    if fast is not None:
        clash = any(t in idx.inputs or t in idx.params or t in idx.dims for t in fast)
        bad = len(idx.pos) != len(program.stages) or clash
    else:
        bad = len(idx.pos) != len(program.stages) or len(program.names()) != n
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
        if o not in idx.pos:
            raise _broken(step, f"output '{o}' is not a stage")
    if len(idx.outputs) != len(program.outputs):
        raise _broken(step, "an output is listed twice")


def _check_refs(program: Program, idx: Index, step: object, names: list[str]) -> None:
    for name in names:
        i = idx.pos[name]
        s = program.stages[i]
        if s.expr.ty is None:
            raise _broken(step, f"stage '{name}' is untyped")
        for r in reads_of(s):
            j = idx.pos.get(r)
            if j is None:
                if r not in idx.inputs and r not in idx.params:
                    raise _broken(step, f"'{name}' reads '{r}', which is not defined")
            elif j >= i:
                raise _broken(step, f"'{name}' reads '{r}', which comes after it")
        tgt = idx.update_target.get(name)
        if tgt is not None:
            for u in idx.users(tgt):
                if u != name and idx.pos[u] > i:
                    raise _broken(step, f"'{u}' reads '{tgt}' after its update '{name}'")
        for r in reads_of(s):
            upd = idx.updates.get(r)
            if upd is not None and upd != name and idx.pos[upd] < i:
                raise _broken(step, f"'{name}' reads '{r}' after its update '{upd}'")


def _check_groups(program: Program, idx: Index, step: object, near: set[int] | None = None) -> None:
    """Groups hold existing stages, are disjoint, and each is a contiguous run of the
    stage order in item order. With a topological stage order (checked by `_check_refs`)
    that makes every group convex and the contracted graph acyclic. With `near` (the
    positions a step touched), only the groups that reach those positions are checked
    in full."""
    seen: set[str] = set()
    check: set[int] | None = None
    if near is not None:
        check = set()
        for p in range(
            max(min(near, default=0) - 1, 0), min(max(near, default=-2) + 2, len(program.stages))
        ):
            gi = idx.group_index.get(program.stages[p].name)
            if gi is not None:
                check.add(gi)
        if idx.grouped != len(idx.group_index):
            check = None
    for gi, g in enumerate(program.groups):
        if check is not None and gi not in check:
            continue
        _check_group_shape(g, step, top=True)
        names = list(g.stages())
        for n in names:
            if n not in idx.pos:
                raise _broken(step, f"a {g.kind.value} group holds '{n}', which is not a stage")
            if n in seen:
                raise _broken(step, f"'{n}' is in two groups")
            seen.add(n)
        lo = idx.pos[names[0]]
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
