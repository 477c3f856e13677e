"""`dce()`: remove stages whose values nothing needs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from cocoviz.ir.graph import stage_reads
from cocoviz.ir.nodes import Op, Program, StepCall
from cocoviz.ir.transforms.base import Edit, drop_from_groups, index
from cocoviz.ir.transforms.step import Transformation


@dataclass(frozen=True, kw_only=True)
class DCE(Transformation):
    """Dead-code elimination.

    rewrite:
        y = allgather(y_s)      # read by nothing, not an output
        z = y * 2               # read by nothing, not an output
    becomes nothing: both stages are removed (repeatedly, until every remaining stage is
    read, is an output, is an update, or is the allgather that completes the sliced
    update of a replicated input — that one only `asslice` removes).

    A stage removed from a group leaves the group; a group left with one item dissolves.

    fails when: never (with nothing to remove it is a no-op).
    """

    name: ClassVar[str] = "dce"
    signature: ClassVar[str] = "dce()"

    def step(self) -> StepCall:
        return StepCall("dce")

    def dead(self, program: Program) -> list[str]:
        """The stages dce would remove, in program order."""
        idx = index(program)
        uses: dict[str, int] = {}
        for s in program.stages:
            for r in stage_reads(s):
                uses[r] = uses.get(r, 0) + 1
        keep = idx.outputs | set(idx.update_target)
        for s in program.stages:
            # The gather of a sliced update of a replicated input writes the input's
            # storage: it completes the update (only asslice may remove it).
            e = s.expr
            if e.op is Op.ALLGATHER and e.args[0].op is Op.REF:
                tgt = idx.update_target.get(e.args[0].name or "")
                # over dp, the input's dp layout is the one the gather completes
                ty = idx.inputs[tgt].ty if tgt is not None else None
                if ty is not None and (ty.dp if e.tag == "dp" else ty.layout).is_replicated:
                    keep.add(s.name)
        dead: set[str] = set()
        for s in reversed(program.stages):
            if s.name in keep or uses.get(s.name, 0):
                continue
            dead.add(s.name)
            for r in stage_reads(s):
                uses[r] -= 1
        return [s.name for s in program.stages if s.name in dead]

    def rewrite(self, program: Program) -> Edit:
        dead = set(self.dead(program))
        if not dead:
            return Edit(program)
        stages = tuple(s for s in program.stages if s.name not in dead)
        groups = drop_from_groups(program.groups, dead)
        return Edit(dataclasses.replace(program, stages=stages, groups=groups), removed=dead)
