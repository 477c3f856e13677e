"""`asslice(t, …)`: store a replicated input sliced, for good (ZeRO-style state)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from cocoviz.errors import did_you_mean
from cocoviz.ir.nodes import Expr, GroupKind, Input, Op, Program, Stage, StepCall
from cocoviz.ir.transforms.base import (
    Edit,
    Index,
    drop_from_groups,
    index,
    map_group,
    rename_refs,
)
from cocoviz.ir.transforms.step import Transformation
from cocoviz.ir.types import Layout, same_slicing


@dataclass(frozen=True, kw_only=True)
class AsSlice(Transformation):
    """Store replicated inputs sliced, when every use reads only a slice of them.

    rewrite (Adam after split(g1); reorder(g1)):
        input m : f32[N] replicated
        m1_s = update(m, beta1 * slice(m) + (1 - beta1) * gf)
        m1 = allgather(m1_s)
        mh = m1_s / (1 - pow(beta1, t))
    becomes
        input m : f32[N] sliced
        m1 = update(m, beta1 * m + (1 - beta1) * gf)
        mh = m1 / (1 - pow(beta1, t))

    Every `slice(t)` becomes `t`. If the update's gather `c = allgather(c_s)` has no
    readers (it may be an output), it is deleted and `c_s` is renamed `c`: the same
    global value, now sliced.

    fails when: `t` is not an input, or not replicated; `t` is read other than through
    `slice(t)` or as the target of its update (a whole-tensor read needs the full
    tensor); its slices differ; the update writes a value that is not sliced the same
    way; the update's gather is in an overlapped group.
    """

    name: ClassVar[str] = "asslice"
    signature: ClassVar[str] = "asslice(INPUT, …)  — replicated inputs read only as slice(INPUT)"
    tensors: tuple[str, ...]

    def step(self) -> StepCall:
        return StepCall("asslice", self.tensors)

    def rewrite(self, program: Program) -> Edit:
        if not self.tensors:
            raise self.error("name at least one input", hint=self.signature_hint())
        prog = program
        changed: set[str] = set()
        dirty: set[str] = set()
        removed: set[str] = set()
        for k, t in enumerate(self.tensors):
            if t in self.tensors[:k]:
                raise self.error(f"'{t}' is listed twice", arg=k)
            nxt, d, r = self._one(prog, t, k)
            index(nxt, parent=prog)
            prog = nxt
            changed.add(t)
            dirty = (dirty - r) | d
            removed |= r
        return Edit(prog, dirty=dirty, changed_inputs=changed, removed=removed)

    def _one(self, program: Program, t: str, k: int) -> tuple[Program, set[str], set[str]]:
        idx = index(program)
        inp = self._lookup_input(idx, t, k)
        if program.grid.has_dp and _laid_out_over_dp(program, idx, t):
            raise self.error(
                f"asslice of '{t}', laid out or gathered over dp, is not supported yet "
                "(schedule layer: it changes layouts over tp only)",
                arg=k,
            )
        if not inp.ty.layout.is_replicated:
            raise self.error(f"input '{t}' is {inp.ty.layout}, not replicated", arg=k)
        layout: Layout | None = None
        first: Stage | None = None
        users = idx.users(t)
        upd = idx.updates.get(t)
        for u in users:
            s = idx.stage(u)
            for lay in self._uses(s, t):
                if lay is None:
                    raise self.error(
                        f"'{u}' reads all of '{t}', not a slice of it: every use must be "
                        f"slice({t}) or the target of its update",
                        stage=s,
                        hint=f"move '{u}' across the allgather first (reorder), so that it "
                        f"reads slice({t})",
                    )
                if layout is None:
                    layout, first = lay, s
                elif lay != layout:
                    assert first is not None
                    raise self.error(
                        f"'{t}' is sliced two ways: {layout} in '{first.name}' and {lay} in '{u}'",
                        stage=s,
                    )
        if upd is not None:
            us = idx.stage(upd)
            vt = us.expr.args[1].type
            ok = vt.layout.is_sliced and (
                layout is None
                or same_slicing(layout, inp.ty.shape, vt.layout, vt.shape, program.grid.group)
            )
            if not ok:
                want = f" like slice({t})" if layout is not None else ""
                raise self.error(
                    f"its update '{upd}' writes a {vt.layout} value into '{t}'; asslice needs "
                    f"the new value sliced{want}",
                    stage=us,
                    hint=f"reorder '{upd}' across the allgather first",
                )
            if layout is None:
                layout = vt.layout
        if layout is None:
            raise self.error(
                f"'{t}' is not read through slice({t}) and not updated with a sliced value, so "
                "there is no slicing to store it with",
                arg=k,
            )
        # The input is stored sliced; slice(t) becomes t.
        new_input = dataclasses.replace(inp, ty=dataclasses.replace(inp.ty, layout=layout))
        inputs = tuple(new_input if i.name == t else i for i in program.inputs)
        dirty = set(users)
        new_stage = {
            u: dataclasses.replace(idx.stage(u), expr=_unslice(idx.stage(u).expr, t)) for u in users
        }
        removed: set[str] = set()
        renames: dict[str, str] = {}
        if upd is not None:
            gather = self._dead_gather(idx, upd)
            if gather is not None:
                g = idx.group_of(gather)
                if g is not None and g.kind is GroupKind.OVERLAPPED:
                    raise self.error(
                        f"the gather '{gather}' of '{upd}' is in an overlapped group; asslice "
                        "before overlapping",
                        stage=idx.stage(gather),
                    )
                removed.add(gather)
                renames[upd] = gather
        stages: list[Stage] = []
        for s in program.stages:
            if s.name in removed:
                continue
            s = new_stage.get(s.name, s)
            if renames:
                e = rename_refs(s.expr, renames)
                if e is not s.expr:
                    dirty.add(s.name)
                    s = dataclasses.replace(s, expr=e)
                if s.name in renames:
                    s = dataclasses.replace(s, name=renames[s.name])
            stages.append(s)
        groups = drop_from_groups(program.groups, removed)
        if renames:
            groups = tuple(map_group(g, renames) for g in groups)
            dirty = {renames.get(n, n) for n in dirty}
        # An output that named the gather now names the renamed update: the same name.
        prog = dataclasses.replace(program, inputs=inputs, stages=tuple(stages), groups=groups)
        return prog, dirty, (removed - set(renames.values())) | set(renames)

    def _lookup_input(self, idx: Index, t: str, k: int) -> Input:
        if t in idx.inputs:
            return idx.inputs[t]
        if idx.is_stage(t):
            raise self.error(
                f"'{t}' is a stage; asslice takes program inputs",
                arg=k,
                hint=f"the inputs are {', '.join(idx.inputs)}",
            )
        raise self.error(
            f"no input named '{t}'",
            arg=k,
            hint=did_you_mean(t, idx.inputs) or f"the inputs are {', '.join(idx.inputs)}",
        )

    @staticmethod
    def _uses(s: Stage, t: str) -> list[Layout | None]:
        """The slicing of every read of `t` in `s` (None for a whole read); the target of
        an update is not a read."""
        out: list[Layout | None] = []

        def go(e: Expr, sliced_by: Layout | None) -> None:
            if e.op is Op.REF:
                if e.name == t:
                    out.append(sliced_by)
                return
            if e.op is Op.SLICE and e.args[0].op is Op.REF and e.args[0].name == t:
                out.append(e.type.layout)
                return
            args = e.args
            if e.op is Op.UPDATE and args[0].op is Op.REF and args[0].name == t:
                args = args[1:]
            for a in args:
                go(a, None)

        go(s.expr, None)
        return out

    @staticmethod
    def _dead_gather(idx: Index, upd: str) -> str | None:
        for u in idx.users(upd):
            e = idx.stage(u).expr
            if (
                e.op is Op.ALLGATHER
                and e.args[0].op is Op.REF
                and e.args[0].name == upd
                and not idx.users(u)
            ):
                return u
        return None


def _unslice(e: Expr, t: str) -> Expr:
    if e.op is Op.SLICE and e.args[0].op is Op.REF and e.args[0].name == t:
        return e.args[0]
    if not e.args:
        return e
    args = tuple(_unslice(a, t) for a in e.args)
    if all(a is b for a, b in zip(args, e.args, strict=True)):
        return e
    return dataclasses.replace(e, args=args)


def _laid_out_over_dp(program: Program, idx: Index, t: str) -> bool:
    """Whether input `t`, a reader of it or its update has a layout over dp other than
    replicated, or a collective over dp reads one of them (docs/language.md, rank grids)."""
    names = {t, *idx.users(t)}
    upd = idx.updates.get(t)
    if upd is not None:
        names |= {upd, *idx.users(upd)}
    for n in names:
        ty = idx.inputs[n].ty if n in idx.inputs else idx.stage(n).ty
        if not ty.dp.is_replicated:
            return True
        if n not in idx.inputs and idx.stage(n).expr.tag == "dp":
            return True
    return False
