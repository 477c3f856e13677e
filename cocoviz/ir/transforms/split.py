"""`split(s)`: an allreduce becomes a reducescatter followed by an allgather."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from cocoviz.ir.infer import Inferencer
from cocoviz.ir.nodes import Expr, Op, Program, Stage, StepCall, ref
from cocoviz.ir.transforms.base import (
    Edit,
    Index,
    describe_stage,
    index,
    splice,
)
from cocoviz.ir.transforms.retype import _Env, typed_stage
from cocoviz.ir.transforms.step import Transformation
from cocoviz.ir.types import dp_view


@dataclass(frozen=True, kw_only=True)
class Split(Transformation):
    """Split an allreduce into its two halves (AllReduce = AllGather ∘ ReduceScatter).

    rewrite:
        sum = allreduce(+, layer)
    becomes
        sum_rs = reducescatter(+, layer)     # sliced: each rank holds 1/G of the sum
        sum = allgather(sum_rs)              # the same replicated value as before

    The allgather keeps the name, so every reader of `sum` is unchanged; the
    reducescatter gets `<s>_rs` (or `<s>_rs_2`, … when that name is taken).

    fails when: `s` is not an allreduce; its element count does not divide by the group
    size G; it is part of an overlapped group (split before overlapping).
    """

    name: ClassVar[str] = "split"
    signature: ClassVar[str] = "split(STAGE)  — STAGE is an allreduce"
    stage: str

    def step(self) -> StepCall:
        return StepCall("split", (self.stage,))

    def rewrite(self, program: Program) -> Edit:
        idx = index(program)
        s = self.lookup_stage(program, self.stage, 0)
        e = s.expr
        if e.op is not Op.ALLREDUCE:
            hint = self._halves(idx, s) or "split applies to an allreduce"
            raise self.error(
                f"{describe_stage(s)} is not an allreduce",
                stage=s,
                hint=hint + self._allreduces(program),
            )
        G = program.grid.group
        n = s.ty.numel
        if e.tag == "dp":  # over dp: a tp rank's part, over the D ranks of its dp group
            G, n = program.grid.dp, dp_view(e.args[0].type, G).numel
        if n % G:
            raise self.error(
                f"{describe_stage(s)} has {n} elements, which do not divide by the {G} ranks "
                "of its group, so it cannot be reduce-scattered",
                stage=s,
                hint="change a size with -D, or the rank count with --ranks",
            )
        if idx.group_of(s.name) is not None:
            raise self.error(
                f"'{s.name}' is in an overlapped group; split it before overlapping",
                stage=s,
            )
        rs_name = idx.fresh(f"{s.name}_rs")
        rs = Stage(
            rs_name, Expr(Op.REDUCESCATTER, e.args, rop=e.rop, tag=e.tag, span=e.span), s.span
        )
        ag = dataclasses.replace(
            s, expr=Expr(Op.ALLGATHER, (ref(rs_name, e.span),), tag=e.tag, span=e.span)
        )
        # typed here, so that the step makes one program: both read only values that
        # come before `s`, and the allgather the reducescatter
        env = _Env(idx)
        inf = Inferencer(program.grid, env, idx.input_names)
        rs = typed_stage(inf, rs)
        env[rs_name] = rs.ty
        ag = typed_stage(inf, ag)
        i = idx.position(s.name)
        new, window = splice(program, i, i + 1, (rs, ag))
        return Edit(new, typed={rs_name, s.name}, window=window)

    @staticmethod
    def _halves(idx: Index, s: Stage) -> str | None:
        """For a reducescatter whose result an allgather gathers (or that allgather): the
        two stages already are an allreduce split in two; None for any other stage (an
        allgather the program wrote of its own is no half of anything)."""
        e = s.expr
        if e.op is Op.ALLGATHER and e.args and e.args[0].op is Op.REF:
            rs, ag = e.args[0].name, s.name
        elif e.op is Op.REDUCESCATTER:
            users = [
                u
                for u in idx.users(s.name)
                if (x := idx.stage(u).expr).op is Op.ALLGATHER
                and x.args[0].op is Op.REF
                and x.args[0].name == s.name
            ]
            if not users:
                return None
            rs, ag = s.name, users[0]
        else:
            return None
        if rs is None or not idx.is_stage(rs) or idx.stage(rs).expr.op is not Op.REDUCESCATTER:
            return None
        return (
            f"'{rs}' (reducescatter) and '{ag}' (allgather) already are an allreduce split in two"
        )

    def _allreduces(self, program: Program) -> str:
        names = [s.name for s in program.stages if s.expr.op is Op.ALLREDUCE]
        return f"; the allreduces here are {', '.join(names)}" if names else ""
