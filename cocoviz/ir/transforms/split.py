"""`split(s)`: an allreduce becomes a reducescatter followed by an allgather."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from cocoviz.ir.infer import Inferencer
from cocoviz.ir.nodes import Expr, Op, Program, Stage, StepCall, ref
from cocoviz.ir.transforms.base import Edit, Transformation, describe_stage, index, splice
from cocoviz.ir.transforms.retype import _Env, typed_stage


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
            hint = "split applies to an allreduce"
            if e.op is Op.REDUCESCATTER or e.op is Op.ALLGATHER:
                hint = f"'{s.name}' is already one half of a split allreduce"
            raise self.error(
                f"{describe_stage(s)} is not an allreduce",
                stage=s,
                hint=hint + self._allreduces(program),
            )
        G = program.grid.group
        n = s.ty.numel
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
        rs = Stage(rs_name, Expr(Op.REDUCESCATTER, e.args, rop=e.rop, span=e.span), s.span)
        ag = dataclasses.replace(s, expr=Expr(Op.ALLGATHER, (ref(rs_name, e.span),), span=e.span))
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

    def _allreduces(self, program: Program) -> str:
        names = [s.name for s in program.stages if s.expr.op is Op.ALLREDUCE]
        return f"; the allreduces here are {', '.join(names)}" if names else ""
