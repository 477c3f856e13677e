"""`fuse(a, b, …)`: run stages as one kernel, or as one fused collective."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cocoviz.ir.collectives import collective
from cocoviz.ir.nodes import COLLECTIVES, Group, GroupKind, Op, Program, Stage, StepCall
from cocoviz.ir.transforms.base import Edit, Index, describe_stage, index
from cocoviz.ir.transforms.grouping import cycle_through_groups, hull, regroup, render_cycle
from cocoviz.ir.transforms.reorder import group_reorder_hint
from cocoviz.ir.transforms.step import Transformation

PATTERNS = (
    "computation only; reducescatter → computation → allgathers; computation → send; "
    "send → computation on the receiver"
)


@dataclass(frozen=True, kw_only=True)
class Fuse(Transformation):
    """Fuse stages into one group: one kernel, or one fused collective.

    rewrite (megatron_mlp, after split(sum); reorder(sum)):
        sum_rs = reducescatter(+, layer)
        out_s = dropout(sum_rs + b, 0.1) + slice(r)
        out = allgather(out_s)
    becomes
        fused {
          sum_rs = reducescatter(+, layer)
          out_s = dropout(sum_rs + b, 0.1) + slice(r)
          out = allgather(out_s)
        }

    The group is the convex hull of the listed stages over data and ordering edges
    (every stage on a path between two of them joins); an existing fused group it touches
    is absorbed, until nothing changes. Its communication must be one of: none;
    reducescatter → computation that reads the reducescatter's result, values from
    outside the group or group computation → allgathers of group values (or none: the
    result stays sliced); computation → send; send → computation on the receiving
    pipeline stage; plus any implicit scalar reductions (norms of slices).

    fails when: fewer than two stages are named; the group would hold a matmul (use
    overlap), an unsplit allreduce (split first), a broadcast or reduce, two collectives,
    or communication in another order; it would touch an overlapped group; it would
    close a cycle through an existing fused group.
    """

    name: ClassVar[str] = "fuse"
    makes_groups: ClassVar[bool] = True
    signature: ClassVar[str] = "fuse(STAGE, STAGE, …)"
    stages: tuple[str, ...]

    def step(self) -> StepCall:
        return StepCall("fuse", self.stages)

    def rewrite(self, program: Program) -> Edit:
        idx = index(program)
        if len(self.stages) < 2:
            raise self.error(
                "name at least two stages; the group is every stage on a path between them",
                hint=self.signature_hint(),
            )
        listed: list[Stage] = []
        for k, n in enumerate(self.stages):
            s = self.lookup_stage(program, n, k)
            if any(m.name == n for m in listed):
                raise self.error(f"'{n}' is listed twice", arg=k)
            listed.append(s)
        members, absorbed = self._members(idx, {s.name for s in listed})
        self._check_pattern(idx, members)
        cyc = cycle_through_groups(idx, members)
        if cyc is not None:
            path, group = cyc
            raise self.error(
                "the group would close a cycle through the existing "
                f"{group.kind.value} group {{{', '.join(group.stages())}}}: "
                f"{render_cycle(path, group)} (that group runs as one unit, so it would have "
                "to run both after and before the new one)",
                stage=idx.stage(path[1]),
                hint="include that group's stages in this fuse, or fuse fewer stages",
            )
        order = sorted(members, key=idx.position)
        group = Group(GroupKind.FUSED, tuple(order))
        return regroup(program, idx, group, absorbed)

    def _members(self, idx: Index, listed: set[str]) -> tuple[set[str], dict[int, Group]]:
        members = set(listed)
        absorbed: dict[int, Group] = {}  # by id
        while True:
            members = hull(idx, members)
            grew = False
            for m in sorted(members, key=idx.position):
                g = idx.group_of(m)
                if g is None or id(g) in absorbed:
                    continue
                if g.kind is GroupKind.OVERLAPPED:
                    raise self.error(
                        f"'{m}' is in an overlapped group; fuse stages before overlapping them",
                        stage=idx.stage(m),
                    )
                absorbed[id(g)] = g
                new = set(g.stages()) - members
                if new:
                    members |= new
                    grew = True
            if not grew:
                return members, absorbed

    def _check_pattern(self, idx: Index, members: set[str]) -> None:
        order = sorted(members, key=idx.position)
        stages = [idx.stage(n) for n in order]
        for s in stages:
            op = s.expr.op
            if op is Op.MATMUL:
                raise self.error(
                    f"{describe_stage(s)} is a matmul; a fused group holds no matmul",
                    stage=s,
                    hint=f"use overlap({s.name}, …) to stream its chunks into the next stage",
                )
            if op is Op.ALLREDUCE:
                raise self.error(
                    f"{describe_stage(s)} is an unsplit allreduce, which cannot take computation "
                    "inside it",
                    stage=s,
                    hint=f"split first: split({s.name}), then reorder({s.name})",
                )
            if op in COLLECTIVES and not collective(op).fusable:
                raise self.error(
                    f"{describe_stage(s)} cannot be fused; fusable communication: {PATTERNS}",
                    stage=s,
                )
        rss = [s for s in stages if s.expr.op is Op.REDUCESCATTER]
        sends = [s for s in stages if s.expr.op is Op.SEND]
        ags = [s for s in stages if s.expr.op is Op.ALLGATHER]
        firsts = rss + sends
        if len(firsts) > 1 or (sends and ags):
            a, b = (firsts[0], firsts[1]) if len(firsts) > 1 else (sends[0], ags[0])
            a, b = sorted((a, b), key=lambda s: idx.position(s.name))
            raise self.error(
                f"the group would hold two collectives, {a.expr.op.value} '{a.name}' and "
                f"{b.expr.op.value} '{b.name}'; a fused group holds one reducescatter (with "
                "the allgathers that end it) or one send",
                stage=b,
                hint="fuse them separately; overlap(…) pipelines consecutive collectives",
            )
        if ags and not rss:
            g = ags[0]
            raise self.error(
                f"allgather '{g.name}' can end a fused group only after a reducescatter in the "
                f"same group; fusable communication: {PATTERNS}",
                stage=g,
            )
        if rss:
            self._check_rs(idx, members, rss[0], ags)
        if sends:
            self._check_send(idx, members, stages, sends[0])

    def _check_rs(self, idx: Index, members: set[str], rs: Stage, ags: list[Stage]) -> None:
        inside = sorted(idx.reads(rs.name) & members)
        if inside:
            raise self.error(
                f"the reducescatter '{rs.name}' reads '{inside[0]}' from inside the group; in "
                "a fused collective the reducescatter comes first",
                stage=rs,
                hint=f"leave '{inside[0]}' out of the group",
            )
        for g in ags:
            src = idx.reads(g.name)
            if not src & members:
                raise self.error(
                    f"allgather '{g.name}' gathers '{', '.join(sorted(src))}', which is not "
                    "computed in the group",
                    stage=g,
                )
            readers = [u for u in idx.users(g.name) if u in members]
            if readers:
                raise self.error(
                    f"'{readers[0]}' reads the allgather '{g.name}' inside the group; the "
                    "allgathers end a fused collective",
                    stage=idx.stage(readers[0]),
                    hint=group_reorder_hint(idx, members, rs),
                )

    def _check_send(self, idx: Index, members: set[str], stages: list[Stage], send: Stage) -> None:
        operand_inside = bool(idx.reads(send.name) & members)
        readers = [u for u in idx.users(send.name) if u in members]
        if operand_inside and readers:
            raise self.error(
                f"the group computes both before the send '{send.name}' and after it ('"
                f"{readers[0]}'); fuse computation → send or send → computation",
                stage=idx.stage(readers[0]),
            )
        side = send.expr.args[0].type.pstage if operand_inside else send.ty.pstage
        where = "sending" if operand_inside else "receiving"
        for s in stages:
            if s is send or s.ty.pstage is None or s.ty.pstage == side:
                continue
            raise self.error(
                f"'{s.name}' runs on pipeline stage {s.ty.pstage}, but the group computes on "
                f"the {where} stage {side}",
                stage=s,
            )
