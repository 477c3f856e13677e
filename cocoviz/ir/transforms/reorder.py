"""`reorder(ag[, c1, …])`: move computation from after an allgather (or an alltoall) to
before it."""

from __future__ import annotations

import dataclasses
import heapq
import re
from dataclasses import dataclass
from typing import ClassVar

from cocoviz.errors import CocovizError, InputError, ScheduleError
from cocoviz.ir.graph import stage_reads
from cocoviz.ir.infer import Inferencer
from cocoviz.ir.nodes import COLLECTIVES, Expr, Op, Program, Stage, StepCall, ref
from cocoviz.ir.transforms.asslice import AsSlice
from cocoviz.ir.transforms.base import (
    Edit,
    Index,
    describe_stage,
    index,
    splice,
    substitute,
)
from cocoviz.ir.transforms.retype import TypeFailure, _Env, finish, typed_stage
from cocoviz.ir.transforms.step import Transformation
from cocoviz.ir.types import Layout, TensorType, shape_values

MOVABLE = "elementwise, row-wise and reduction stages, update, send, and a listed matmul"


class _Downstream:
    """Which stages are downstream of `root` (data and ordering edges), computed by a
    forward sweep over the stage order only as far as it is asked about."""

    def __init__(self, idx: Index, root: str) -> None:
        self.idx = idx
        self.start = idx.position(root)
        self.upto = self.start
        self.down = {root}

    def __call__(self, name: str) -> bool:
        idx = self.idx
        i = idx.position(name)
        if i <= self.start:
            return name in self.down
        down = self.down
        while self.upto < i:
            self.upto += 1
            s = idx.stages[self.upto]
            # `down` holds stage names only, so the data edges in are the reads it holds
            # (no `preds` to build for every stage swept); an update's ordering edges
            # come from `preds`
            if not down.isdisjoint(stage_reads(s)) or (
                s.name in idx.update_target and not down.isdisjoint(idx.preds(s.name))
            ):
                down.add(s.name)
        return name in down


@dataclass(frozen=True, kw_only=True)
class Reorder(Transformation):
    """Move computation across an allgather, so that it runs on slices.

    rewrite (megatron_mlp, after split(sum)):
        sum_rs = reducescatter(+, layer)
        sum = allgather(sum_rs)
        out = dropout(sum + b, 0.1) + r
    becomes
        sum_rs = reducescatter(+, layer)
        out_s = dropout(sum_rs + b, 0.1) + slice(r)   # 1/G of the work
        out = allgather(out_s)

    Inside the region, reads of `ag` read its operand; replicated operands of the
    sliced shape become `slice(x)`; broadcast operands (the bias `b[H]`) stay whole. A
    sliced live-out `c` (read outside the region, an output, or an update) is computed as
    `c_s` and gathered into `c` right after; scalar live-outs (norms) keep their names.
    `ag` is deleted when nothing reads it any more, unless it gathers the sliced update
    of a replicated input (it writes the input's storage). A `send` in the region sends
    the slice, and the gather runs on the next pipeline stage.

    Across an alltoall (`qh = alltoall(q, from=0, to=1)`) the same rewrite moves the
    region onto the operand's slicing: members read `q` instead of `qh` (replicated
    operands become `slice(x, 0)`), and a sliced live-out `c` is computed as `c_s` and
    re-sliced by `c = alltoall(c_s, from=0, to=1)`. The global values do not change, so
    neither do the bits; what changes is what travels (a `cast(f16, …)` moved ahead of
    the alltoall halves its bytes) and which kernels can fuse.

    Default region (`reorder(ag)`): the movable stages reachable from `ag` whose every
    predecessor downstream of `ag` is in the region, stopping at values that have to be
    gathered anyway (a stage reading a region value that is also read outside the region
    or is an output is left out, since moving it would add a second allgather). An
    output that is the update of a replicated input `t` does not stop the region when
    `asslice(t)` after the reorder would delete its gather: every reader of `t` is in
    the region and reads `slice(t)` there, and no reader of the update is outside it
    (the updated-state pattern, RMSprop's `output w1, s1`; docs/schedules.md). A listed
    region is taken as given and may include stages not downstream of `ag` whose
    outside operands are replicated or scalar (LAMB's `wn = norm(w)`).

    fails when: `ag` is not an allgather or alltoall; the region is empty, not closed (a stage lies
    between two of its members, or between `ag` and a member, but is not in it), not
    connected to `ag`, or holds a stage that cannot move (a collective other than send,
    a matmul whose left operand is not in the region, a grouped stage, a stage after the
    update of an input that `ag`'s operand reads: on slices it would read the input
    after the update; across an alltoall, a matmul or a send); a member reads a local
    value; a member is not legal on its new
    layout (docs/language.md, layout inference).
    """

    name: ClassVar[str] = "reorder"
    signature: ClassVar[str] = "reorder(ALLGATHER[, STAGE, …])"
    gather: str
    region: tuple[str, ...] = ()

    def step(self) -> StepCall:
        return StepCall("reorder", (self.gather, *self.region))

    # --- region ------------------------------------------------------------------------
    def rewrite(self, program: Program) -> Edit:
        idx = index(program)
        ag = self.lookup_stage(program, self.gather, 0)
        if ag.expr.op not in (Op.ALLGATHER, Op.ALLTOALL):
            hint = f"reorder moves computation across an allgather or alltoall{_gathers(program)}"
            if ag.expr.op is Op.ALLREDUCE:
                hint = f"split it first: split({ag.name}), then reorder({ag.name})"
            raise self.error(
                f"{describe_stage(ag)} is not an allgather or alltoall", stage=ag, hint=hint
            )
        if idx.group_of(ag.name) is not None:
            raise self.error(
                f"'{ag.name}' is in a {idx.group_of(ag.name).kind.value} group; "  # type: ignore[union-attr]
                "reorder before fusing or overlapping",
                stage=ag,
            )
        down = _Downstream(idx, ag.name)
        region = self._listed(idx, ag, down) if self.region else self._default(idx, ag, down)
        self._check_operands(idx, ag, region)
        return self._rewrite(program, idx, ag, region, down)

    def _movable(self, idx: Index, s: Stage, listed: bool) -> str | None:
        """Why `s` cannot move (None when it can)."""
        op = s.expr.op
        if self._alltoall(idx) and op in (Op.SEND, Op.MATMUL):
            return (
                f"{describe_stage(s)} does not move across an alltoall (computation that "
                "is elementwise or row-wise on both layouts does)"
            )
        if op in COLLECTIVES and op is not Op.SEND:
            return f"{describe_stage(s)} is a collective; movable: {MOVABLE}"
        if op is Op.MATMUL and not listed:
            return f"{describe_stage(s)} is a matmul, which moves only when listed"
        g = idx.group_of(s.name)
        if g is not None:
            return f"'{s.name}' is in a {g.kind.value} group; reorder before fusing or overlapping"
        return None

    def _reads_overwritten(self, idx: Index, s: Stage) -> str | None:
        """Why `s` cannot read the allgather's operand directly: an input the operand
        reads is updated in place before `s` (None when no such update)."""
        ag = idx.stage(self.gather)
        if self.gather not in idx.reads(s.name):
            return None
        for r in sorted(ag.expr.args[0].refs()):
            upd = idx.updates.get(r)
            if upd is not None and upd != s.name and idx.position(upd) < idx.position(s.name):
                return (
                    f"'{s.name}' comes after '{upd}', which updates '{r}' in place: on "
                    f"slices it would read '{r}' after the update"
                )
        return None

    def _default(self, idx: Index, ag: Stage, down: _Downstream) -> list[str]:
        reach, first_reason = self._forward(idx, ag, down)
        # Stop at values that are gathered anyway — except the update of a replicated
        # input whose gather `asslice` of that input would remove. That exemption is
        # confirmed on the rewritten program (the input must be read only as slices of
        # the same slicing there); an input it fails for stops the region again.
        vetoed: set[str] = set()
        while True:
            region = self._stop_at_gathered(idx, ag, down, reach, vetoed)
            relied = {
                idx.update_target[m]
                for m in region
                if m in idx.outputs
                and idx.users(m)
                and self._gather_removable(idx, m, region, vetoed)
            }
            if not relied:
                break
            bad = relied - self._asslice_removes(idx, ag, region, down, relied)
            if not bad:
                break
            vetoed |= bad
        if not region:
            if first_reason is not None:
                s, why = first_reason
                raise self.error(
                    f"nothing can move across '{ag.name}': {why}",
                    stage=s,
                    hint=f"movable: {MOVABLE}",
                )
            raise self.error(
                f"nothing reads '{ag.name}', so there is nothing to move across it", stage=ag
            )
        return sorted(region, key=idx.position)

    def _forward(
        self, idx: Index, ag: Stage, down: _Downstream
    ) -> tuple[set[str], tuple[Stage, str] | None]:
        """The movable stages reachable from `ag` whose every predecessor downstream of
        `ag` is among them, and the first reader of `ag` that cannot move (with why)."""
        region: set[str] = set()
        heap = [idx.position(u) for u in idx.users(ag.name)]
        heapq.heapify(heap)
        seen: set[int] = set()
        first_reason: tuple[Stage, str] | None = None
        while heap:
            i = heapq.heappop(heap)
            if i in seen:
                continue
            seen.add(i)
            s = idx.stages[i]
            why = self._movable(idx, s, listed=False) or self._reads_overwritten(idx, s)
            if why is None and not self._closed_under(idx, s.name, ag.name, region, down):
                why = "some of its inputs stay after the allgather"
            if why is not None:
                if first_reason is None and ag.name in idx.reads(s.name):
                    first_reason = (s, why)
                continue
            region.add(s.name)
            for u in idx.users(s.name):
                heapq.heappush(heap, idx.position(u))
        return region, first_reason

    def _stop_at_gathered(
        self, idx: Index, ag: Stage, down: _Downstream, reach: set[str], vetoed: set[str]
    ) -> set[str]:
        """`reach` less the stages that read a value gathered anyway (read outside the
        region, or an output whose gather `asslice` cannot remove), and what then stops
        being closed, until nothing changes."""
        region = set(reach)
        while True:
            live = {
                m
                for m in region
                if any(u not in region for u in idx.users(m))
                or (m in idx.outputs and not self._gather_removable(idx, m, region, vetoed))
            }
            drop = {m for m in region if idx.reads(m) & live}
            if not drop:
                return region
            region -= drop
            for m in sorted(region, key=idx.position):
                if not self._closed_under(idx, m, ag.name, region, down):
                    region.discard(m)

    def _alltoall(self, idx: Index) -> bool:
        """Whether the step moves computation across an alltoall: the result's slicing
        moves from `to` back to the operand's `from`, and the live-outs are re-sliced by
        an alltoall instead of gathered."""
        return idx.stage(self.gather).expr.op is Op.ALLTOALL

    def _gather_removable(self, idx: Index, m: str, region: set[str], vetoed: set[str]) -> bool:
        """Whether region member `m` is the update of a replicated input `t` that only
        region members read, so that after the reorder `asslice(t)` may delete m's
        gather (docs/schedules.md, reorder: the updated-state pattern)."""
        t = idx.update_target.get(m)
        if t is None or t in vetoed or t not in idx.inputs or self._alltoall(idx):
            return False
        if idx.stage(self.gather).expr.tag == "dp":
            return False  # asslice does not slice over dp (docs/schedules.md, asslice)
        return idx.inputs[t].ty.layout.is_replicated and all(u in region for u in idx.users(t))

    def _asslice_removes(
        self, idx: Index, ag: Stage, region: set[str], down: _Downstream, inputs: set[str]
    ) -> set[str]:
        """Those of `inputs` whose update's gather `asslice` removes after this reorder."""
        members = sorted(region, key=idx.position)
        try:
            self._check_operands(idx, ag, members)
            edit = self._rewrite(idx.program, idx, ag, members, down)
            after = finish(idx.program, edit, self, verify=False)
        except CocovizError:
            return set()
        ok: set[str] = set()
        for t in sorted(inputs):
            try:
                sliced = AsSlice(tensors=(t,)).rewrite(after).program
            except CocovizError:
                continue
            # The gather is gone when the update took its name back.
            upd = idx.updates[t]
            if any(s.name == upd and s.expr.op is Op.UPDATE for s in sliced.stages):
                ok.add(t)
        return ok

    @staticmethod
    def _closed_under(idx: Index, name: str, ag: str, region: set[str], down: _Downstream) -> bool:
        return all(p == ag or p in region or not down(p) for p in idx.preds(name))

    def _listed(self, idx: Index, ag: Stage, down: _Downstream) -> list[str]:
        members: list[Stage] = []
        for k, n in enumerate(self.region, start=1):
            s = self.lookup_stage(idx.program, n, k)
            if n == ag.name:
                raise self.error(
                    f"'{n}' is the allgather itself; list the stages to move across it", arg=k
                )
            if any(m.name == n for m in members):
                raise self.error(f"'{n}' is listed twice", arg=k)
            members.append(s)
        names = {m.name for m in members}
        for s in members:
            why = self._movable(idx, s, listed=True)
            if why is None and s.expr.op is Op.MATMUL:
                left = s.expr.args[0]
                if not (left.op is Op.REF and (left.name in names or left.name == ag.name)):
                    why = (
                        f"matmul '{s.name}' moves only when its left operand is in the region "
                        "(it is then sliced by rows)"
                    )
            if why is not None:
                raise self.error(f"cannot move '{s.name}': {why}", stage=s)
            why = self._reads_overwritten(idx, s)
            if why is not None:
                raise self.error(
                    f"cannot move '{s.name}': {why}",
                    stage=s,
                    hint=f"leave '{s.name}' out of the region, or write it before the update",
                )
        # Closed: nothing outside the region lies on a path from `ag` or a member to a member.
        order = sorted(names, key=idx.position)
        lo = idx.position(ag.name)
        hi = idx.position(order[-1])
        reach = {ag.name} | names  # reached from ag or a member
        between: set[str] = set()
        for i in range(min(lo, idx.position(order[0])), hi + 1):
            n = idx.stages[i].name
            if n in reach:
                continue
            if idx.preds(n) & reach:
                reach.add(n)
                between.add(n)
        for m in order:
            bad = sorted((idx.preds(m) & between), key=idx.position)
            if bad:
                hull = self._hull(idx, names, between)
                culprit = idx.stage(bad[0])
                src = [p for p in idx.preds(culprit.name) if p in reach]
                frm = min(src, key=idx.position) if src else ag.name
                raise self.error(
                    f"the region is not closed: {describe_stage(culprit)} lies between "
                    f"'{frm}' and '{m}' but is not in it",
                    stage=culprit,
                    hint=f"list it too: reorder({', '.join([ag.name, *hull])})",
                )
        if not any(ag.name in idx.reads(m.name) for m in members):
            raise self.error(
                f"no listed stage reads '{ag.name}': the region is not connected to it",
                hint=f"its readers are {', '.join(idx.users(ag.name)) or 'none'}",
            )
        for s in members:
            if down(s.name):
                continue
            for r in sorted(idx.reads(s.name)):
                if r in names or r in idx.params:
                    continue
                t = idx.type_of(r)
                if not (t.layout.is_replicated or t.is_scalar):
                    raise self.error(
                        f"'{s.name}' does not depend on '{ag.name}', so it may join the region "
                        f"only if its other operands are replicated or scalar, but '{r}' is "
                        f"{t.layout}",
                        stage=s,
                    )
        return order

    @staticmethod
    def _hull(idx: Index, names: set[str], between: set[str]) -> list[str]:
        """The listed names plus the stages between them that lead back into them."""
        need = set(names)
        for i in range(len(idx.stages) - 1, -1, -1):
            n = idx.stages[i].name
            if n in between and idx.succs(n) & need:
                need.add(n)
        return sorted(need, key=idx.position)

    def _check_operands(self, idx: Index, ag: Stage, region: list[str]) -> None:
        inside = set(region)
        for m in region:
            for r in sorted(idx.reads(m)):
                if r in inside or r == ag.name or r in idx.params:
                    continue
                t = idx.type_of(r)
                if (t.dp if ag.expr.tag == "dp" else t.layout).is_local:
                    rest = [n for n in region if n != m]
                    leave = f"reorder({', '.join([ag.name, *rest])})" if rest else None
                    raise self.error(
                        f"'{m}' reads '{r}', which is local ({t}): on slices it would combine "
                        "sliced and local values",
                        stage=idx.stage(m),
                        hint=f"reduce '{r}' first (allreduce or reducescatter)"
                        + (f", or leave '{m}' out: {leave}" if leave else ""),
                    )

    # --- rewrite -----------------------------------------------------------------------
    def _rewrite(
        self, program: Program, idx: Index, ag: Stage, region: list[str], down: _Downstream
    ) -> Edit:
        operand = ag.expr.args[0]
        ag_shape = shape_values(ag.ty.shape)
        # across an allgather over dp the members move onto dp slices of the tp parts
        # (docs/language.md, rank grids); over tp onto tp slices
        over_dp = ag.expr.tag == "dp"
        dim = operand.type.dp.dim if over_dp else operand.type.layout.dim
        whole = operand.type.layout if over_dp else None
        env = _Env(idx)
        inf = Inferencer(program.grid, env, idx.input_names)
        # typed as re-typing the new stages would type them (`Edit.typed`): the new
        # names below read the types the old names have here
        exprs: dict[str, Expr] = {}
        for m in region:
            s = idx.stage(m)
            e = substitute(s.expr, {ag.name: operand})
            if not down(m):
                e = self._slice_whole(idx, e, set(region), ag_shape, dim, whole)
            try:
                typed = inf.infer(e)
            except InputError as err:
                raise self._illegal(s, err) from None
            self._check_same_value(idx, ag, s, typed.type, over_dp)
            env[m] = typed.type
            exprs[m] = typed
        renames: dict[str, str] = {}
        taken: set[str] = set()
        inside = set(region)
        for m in region:
            t = env[m]
            live = (
                m in idx.outputs
                or m in idx.update_target
                or any(u not in inside for u in idx.users(m))
            )
            if live and (t.dp if over_dp else t.layout).is_sliced:
                renames[m] = idx.fresh(f"{m}_s", taken)
                taken.add(renames[m])
        # the live-outs' new names, typed as the values they name
        new_refs = {m: Expr(Op.REF, name=n, ty=env[m]) for m, n in renames.items()}
        for m, n in renames.items():
            env[n] = env[m]
        replaced: dict[str, list[Stage]] = {}
        for m in region:
            s = idx.stage(m)
            e = substitute(exprs[m], new_refs) if new_refs else exprs[m]
            if m in renames:
                c_s = Stage(renames[m], e, s.span)
                moved = ref(renames[m], s.span)
                back = (
                    dataclasses.replace(ag.expr, args=(moved,), ty=None, span=s.expr.span)
                    if ag.expr.op is Op.ALLTOALL
                    else Expr(Op.ALLGATHER, (moved,), tag=ag.expr.tag, span=s.expr.span)
                )
                try:
                    gather = typed_stage(inf, Stage(m, back, s.span))
                except TypeFailure as failure:
                    raise self._illegal(s, failure.error) from None
                before = idx.type_of(m)
                after = gather.expr.type
                if (after.dp, after.layout) != (before.dp, before.layout):
                    raise self.error(
                        f"'{m}' would not come back as it was: {ag.expr.op.value} of its moved "
                        f"value gives {after}, where '{m}' is {before}",
                        stage=s,
                        hint="leave it out of the region (list the region explicitly)",
                    )
                replaced[m] = [c_s, gather]
            else:
                replaced[m] = [dataclasses.replace(s, expr=e)]
        # `ag` goes when nothing else reads it, unless it completes the sliced update
        # of a replicated input (it writes the input's storage; see dce).
        drop_ag = (
            ag.name not in idx.outputs
            and all(u in inside for u in idx.users(ag.name))
            and not _completes_update(idx, ag)
        )
        marks = sorted(idx.position(n) for n in replaced)
        if drop_ag:
            marks = sorted([*marks, idx.position(ag.name)])
        # only the stages from the first mark to the last change
        lo, hi = marks[0], marks[-1] + 1
        middle: list[Stage] = []
        prev = lo
        for i in marks:
            middle.extend(program.stages[prev:i])
            middle.extend(replaced.get(program.stages[i].name, ()))
            prev = i + 1
        new, window = splice(program, lo, hi, middle)
        built = set(region) | set(renames.values())
        return Edit(new, typed=built, removed={ag.name} if drop_ag else set(), window=window)

    @staticmethod
    def _slice_whole(
        idx: Index,
        e: Expr,
        region: set[str],
        shape: tuple[int, ...],
        dim: int | None,
        whole: Layout | None = None,
    ) -> Expr:
        """Replicated operands of the sliced shape read as slices (for members that do not
        depend on the allgather, where inference has no sliced value to align with)."""
        if e.op is Op.REF:
            n = e.name or ""
            if n in region or n in idx.params:
                return e
            t = idx.type_of(n)
            if whole is not None:  # over dp: a dp-replicated value of the same tp layout
                if t.dp.is_replicated and t.layout == whole and not t.is_scalar:
                    if shape_values(t.shape) == shape:
                        return Expr(Op.SLICE, (e,), value=dim, tag="dp", span=e.span)
                return e
            if t.layout.is_replicated and not t.is_scalar and shape_values(t.shape) == shape:
                return Expr(Op.SLICE, (e,), value=dim, span=e.span)
            return e
        if e.op is Op.SLICE or not e.args:
            return e
        if e.op is Op.UPDATE:
            return dataclasses.replace(
                e,
                args=(e.args[0], Reorder._slice_whole(idx, e.args[1], region, shape, dim, whole)),
            )
        args = tuple(Reorder._slice_whole(idx, a, region, shape, dim, whole) for a in e.args)
        return dataclasses.replace(e, args=args)

    def _check_same_value(
        self, idx: Index, ag: Stage, s: Stage, moved: TensorType, over_dp: bool
    ) -> None:
        """Refuse a member whose moved form computes another value: a value that was
        local (partial sums, e.g. an axis reduction along the sliced dimension after an
        alltoall) becoming whole, or a whole value becoming partial sums (a reduction
        along the dimension the allgather gathers). Moving a stage changes where its
        value is sliced, never whether it is complete (docs/schedules.md, reorder)."""
        before = idx.type_of(s.name)
        was = (before.dp if over_dp else before.layout).is_local
        now = (moved.dp if over_dp else moved.layout).is_local
        if was == now:
            return
        whole, partial = "the whole value", "partial sums on each rank (local)"
        raise self.error(
            f"'{s.name}' would hold {partial if now else whole} once moved before "
            f"'{ag.name}', where it holds {whole if now else partial}: it reduces along the "
            f"dimension the {ag.expr.op.value} {'gathers' if now else 'moves'}",
            stage=s,
            hint="leave it out of the region (list the region explicitly), or reduce along "
            "another dimension",
        )

    def _illegal(self, s: Stage, err: InputError) -> ScheduleError:
        return self.error(
            f"'{s.name}' would not be legal on slices: {err.message}",
            stage=s,
            hint=err.hint or "leave it out of the region (list the region explicitly)",
        )


def _completes_update(idx: Index, ag: Stage) -> bool:
    """Whether allgather `ag` gathers the sliced update of a replicated input."""
    x = ag.expr.args[0]
    tgt = idx.update_target.get(x.name or "") if x.op is Op.REF else None
    if tgt is None or tgt not in idx.inputs:
        return False
    ty = idx.inputs[tgt].ty
    return (ty.dp if ag.expr.tag == "dp" else ty.layout).is_replicated


def group_reorder_hint(idx: Index, members: set[str], rs: Stage) -> str | None:
    """For a fused collective whose computation reads an allgather inside the group
    (fuse's refusal, docs/schedules.md): the `reorder` across the allgather of its
    reducescatter `rs` that moves all of the group's computation, in the names it had
    before any reorder (a moved live-out `c_s` is named by its gather `c`), so that only
    the allgathers end the group. None when that allgather's name is not known (it is
    gone and `rs` is not named as `split` names it)."""
    gathers = [u for u in idx.users(rs.name) if _gathers_value(idx.stage(u), rs.name)]
    if gathers:
        ag = gathers[0]
    else:
        m = re.fullmatch(r"(.+)_rs(?:_\d+)?", rs.name)
        if m is None:
            return None
        ag = m.group(1)
    region: list[str] = []
    for n in sorted(members, key=idx.position):
        if idx.stage(n).expr.op in COLLECTIVES:
            continue
        name = next((u for u in idx.users(n) if _gathers_value(idx.stage(u), n)), n)
        if name not in region and name != ag:
            region.append(name)
    if not region:
        return None
    return (
        f"reorder({', '.join([ag, *region])}), in one step before fusing, moves all of the "
        "group's computation ahead of its allgathers"
    )


def _gathers_value(s: Stage, name: str) -> bool:
    """Whether `s` is `allgather(name)`."""
    x = s.expr.args[0] if s.expr.op is Op.ALLGATHER else None
    return x is not None and x.op is Op.REF and x.name == name


def _gathers(program: Program) -> str:
    names = [s.name for s in program.stages if s.expr.op is Op.ALLGATHER]
    return f"; the allgathers here are {', '.join(names)}" if names else ""
