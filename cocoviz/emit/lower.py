"""Lowering a scheduled Program to the backend-neutral plan of `cocoviz.emit.plan`.

The steps, per program:

1. **Views.** Every value gets a `View` of its per-rank storage (replicated, local,
   flat or block sliced; values sliced inside an overlapped group are *chunked*).
2. **Units.** Each stage becomes one unit (elementwise, reduction, row-wise, matmul,
   collective); nested reductions and nested row-wise ops are lifted into temporaries
   stored in the compute type, so that one rounding per stage still holds.
3. **Kernels.** Units are issued in the contracted order of the program's groups.
   Consecutive elementwise/reduction units of one fused group over the same iteration
   space share one kernel; a unit that reads a reduction of the open kernel, reads a
   member at another index, or is row-wise starts a new phase (kernel). A reduction
   is finished after its kernel (partials → cross-rank step → final value).
4. **Storage.** Fused members read only inside their kernel at the same element live
   in registers; the rest get buffers. `update` writes into its target (a sliced value
   of a replicated target is written at its global positions, so the following
   allgather runs in place); a collective whose input is dead afterwards runs in place.
5. **Overlap.** An overlapped group becomes a `ChunkLoop`: per chunk, each item on the
   compute or the communication stream, released by events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cocoviz.emit import plan as pl
from cocoviz.emit.batch import batch_finishes
from cocoviz.emit.names import NameTable, file_stem
from cocoviz.emit.overlap import GroupLowering
from cocoviz.emit.plan import Collectives, EmitError
from cocoviz.errors import UsageError
from cocoviz.exec.dumps import inexact_reason
from cocoviz.ir.graph import contracted_order
from cocoviz.ir.nodes import COLLECTIVES, Expr, Group, Op, Program

__all__ = ["Collectives", "EmitError", "lower_emit", "lower_program"]


UNSIGNED_ARGS = frozenset({Op.SQRT, Op.RSQRT, Op.LOG, Op.POW})
"""Operations whose first argument must not be negative (a real result)."""
SIGN_ERASING = frozenset({Op.ABS, Op.RELU, Op.EXP, Op.SIGMOID})
"""Operations whose result is not negative whatever the sign of their argument."""


def unsigned_inputs(p: Program) -> frozenset[str]:
    """Inputs that reach the first argument of sqrt, rsqrt, log or pow through any chain
    of stages (but not through abs, relu, exp or sigmoid): `--check` and check-tree draw
    them without a sign, so that Adam's `sqrt(v)` stays a number (docs/codegen.md,
    inputs and dumps)."""
    deps: dict[str, set[str]] = {}
    roots: set[str] = set()

    def refs(e: Expr, into: set[str], signless: bool = False) -> None:
        # `signless`: the names an argument's sign reaches (not through abs, relu, exp or
        # sigmoid, whose results have no sign left)
        if signless and e.op in SIGN_ERASING:
            return
        if e.op is Op.REF and e.name is not None:
            into.add(e.name)
        for a in e.args:
            refs(a, into, signless)

    def walk(e: Expr) -> None:
        if e.op in UNSIGNED_ARGS and e.args:
            refs(e.args[0], roots, signless=True)
        for a in e.args:
            walk(a)

    for s in p.stages:
        into: set[str] = set()
        refs(s.expr, into)
        deps[s.name] = into
        walk(s.expr)
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(deps.get(n, ()))
    return frozenset(i.name for i in p.inputs if i.name in seen)


class _ProgramLowerer(GroupLowering):
    """One program's lowering: storage (`cocoviz.emit.storage`), collectives
    (`cocoviz.emit.collectives`), kernels (`cocoviz.emit.kernels`) and groups
    (`cocoviz.emit.overlap`), issued in the contracted order of the groups."""

    def lower(self) -> pl.ProgramPlan:
        p = self.p
        inputs: list[pl.InputInit] = []
        updates = p.updates()
        unsigned = unsigned_inputs(p)
        for i in p.inputs:
            v = self.view(i.name)
            b = self.new_buffer(i.name, "input", i.ty.dtype, v.count, i.ty.pstage)
            inputs.append(
                pl.InputInit(
                    b.cname, i.name, i.ty.dtype, v, i.ty.pstage, i.ty.layout.is_local,
                    updated=i.name in updates, nonnegative=i.name in unsigned,
                )
            )  # fmt: skip
        for s in p.stages:
            self.units[s.name] = self.make_units(s)
        self.assign_storage()
        order = contracted_order(p, p.groups)
        if order is None:
            raise EmitError("the program's groups form a cycle; this is a cocoviz bug")
        steps: list[pl.Step] = []
        for item in order:
            if isinstance(item, Group):
                steps.extend(self.lower_group(item))
            else:
                steps.extend(self.lower_units([item], None, f"stage {item}"))
        steps = batch_finishes(steps, self._root_buffer, self._new_batch)
        one_device_stream(steps)
        def spec(name: str, stage: str) -> pl.OutputSpec:
            ty = self.type_of(stage)
            v = self.view(stage)
            gshape = (self.G, *v.shape) if ty.layout.is_local else v.shape
            if v.dp == "local":  # the stack of every dp replica's (docs/language.md, rank grids)
                gshape = (self.D, *gshape)
            b = self.buffer_of(stage)
            return pl.OutputSpec(
                name, b.cname, ty.dtype, v, ty.pstage, gshape, b.addressing == "global",
                normwise=inexact_reason(p, stage) is not None,
            )  # fmt: skip

        outputs = [spec(o, o) for o in p.outputs]
        updated = [spec(i.name, updates[i.name]) for i in p.inputs if i.name in updates]
        stages = []
        for s in p.stages:
            g = self.group_of.get(s.name)
            stages.append(
                pl.StageInfo(
                    name=s.name,
                    op=s.expr.op.value,
                    layout=str(s.ty.layout),
                    kernels=tuple(self.stage_kernels.get(s.name, ())),
                    collectives=tuple(self.stage_colls.get(s.name, ())),
                    streams=tuple(sorted(self.stage_streams.get(s.name, {"main"}))),
                    group=g.kind.value if g else None,
                    chunks=self.chunks_of.get(s.name),
                    stored=s.name in self.value_buffer,
                    shards=self.shards_of.get(s.name),
                )
            )
        bufs = [self.buffers[c] for c in self.buffer_order]
        bufs = [
            dataclasses.replace(b, symmetric=True) if b.cname in self.symmetric else b for b in bufs
        ]
        reg = {self._root_buffer(c) for c in registered_buffers(steps)}
        bufs = [dataclasses.replace(b, registered=True) if b.cname in reg else b for b in bufs]
        return pl.ProgramPlan(
            cname=self.ns,
            title=self.title,
            buffers=tuple(bufs),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            steps=tuple(_hoisted(s) for s in steps),
            keys=tuple(self.keys.values()),
            dropouts=tuple(self.dropouts.values()),
            stages=tuple(stages),
            uses_matmul=self._uses_matmul,
            uses_device_api=self._uses_device,
            updated=tuple(updated),
            chunk_loops=self._chunk_loops,
        )


    def _root_buffer(self, cname: str) -> str:
        b = self.buffers.get(cname)
        while b is not None and b.alias is not None and b.alias != b.cname:
            cname = b.alias
            b = self.buffers.get(cname)
        return cname

    def _new_batch(self, fs: tuple[pl.ReduceFinish, ...]) -> tuple[str, str]:
        """Names a `FinishBatch` of ``fs`` and allocates its pack (one value per finish)."""
        stages = [f.stage for f in fs]
        cname = self.names.fresh(f"{self.ns}_{'_'.join(stages)}_finish", "f_")
        pack = self.names.fresh(f"{self.ns}_{'_'.join(stages)}", "p_")
        acc = fs[0].reduction.acc_dtype
        self.buffers[pack] = pl.Buffer(pack, stages[0], acc, len(fs), fs[0].pstage, "partial")
        self.buffer_order.append(pack)
        note = f"allreduce of {len(fs)} values: {', '.join(stages)}, batched"
        for f in fs:
            colls = self.stage_colls.get(f.stage, [])
            self.stage_colls[f.stage] = [
                f"{f.stage}.reduce ({note})" if c == f"{f.stage}.reduce (allreduce of 1 value)" else c
                for c in colls
            ]
            kernels = self.stage_kernels.setdefault(f.stage, [])
            self.stage_kernels[f.stage] = [cname if k == f.cname else k for k in kernels]
        return cname, pack


REGISTERED_OPS = frozenset({"allreduce", "reducescatter", "allgather"})
"""Collectives NCCL's symmetric kernels serve (NCCL >= 2.27, registered windows)."""


def registered_buffers(steps: Sequence[pl.Step]) -> list[str]:
    """Buffers (before alias resolution) that host-API NCCL collectives of ``steps``
    read or write within the tp group: the send, receive and staging buffers of an
    allreduce, reducescatter or allgather, and the partials or pack of a cross-rank scalar
    reduction. They are allocated with ncclMemAlloc and registered as symmetric windows.
    Send/recv between pipeline stages, broadcast, reduce and alltoall are not (NCCL's
    symmetric kernels do not serve them)."""
    out: list[str] = []
    for s in steps:
        if isinstance(s, pl.ChunkLoop):
            for it in s.items:
                out += registered_buffers(it.steps)
        elif isinstance(s, pl.Collective) and s.op in REGISTERED_OPS and s.comm == "group":
            out += [b for b in (s.send, s.recv, s.staging) if b]
        elif isinstance(s, pl.ReduceFinish) and s.cross_rank:
            out.append(s.reduction.partial)
        elif isinstance(s, pl.FinishBatch):
            out.append(s.pack)
    return out


def device_steps(steps: Sequence[pl.Step]) -> list[pl.DeviceCollective]:
    """The device-API kernels of ``steps``, chunk loops included, in issue order."""
    out: list[pl.DeviceCollective] = []
    for s in steps:
        if isinstance(s, pl.ChunkLoop):
            for it in s.items:
                out += device_steps(it.steps)
        elif isinstance(s, pl.DeviceCollective):
            out.append(s)
    return out


def one_device_stream(steps: Sequence[pl.Step]) -> None:
    """Every device-API kernel of a program runs on one stream. They share one device
    communicator, whose LSA barrier `b` is one counter per peer in device memory (NCCL's
    ``ncclLsaBarrierSession`` keeps its epoch there between kernels): two such kernels
    running at once would advance it out of step (docs/codegen.md). The emitter never
    puts them on two streams; a plan that does is a bug."""
    streams = sorted({s.stream for s in device_steps(steps)})
    if len(streams) > 1:
        names = ", ".join(s.cname for s in device_steps(steps))
        raise EmitError(
            f"the device-API kernels {names} would run on the streams {', '.join(streams)}: "
            "they share one device communicator and must run on one stream; this is a cocoviz bug"
        )


def _hoisted(step: pl.Step) -> pl.Step:
    """`step` with the loop-invariant statements of its kernel bodies moved into ``pre``
    (`cocoviz.emit.plan.hoist`), so both targets evaluate them once per launch."""
    if isinstance(step, (pl.Kernel, pl.DeviceCollective)) and not step.pre:
        pre, body = pl.hoist(step.body)
        return dataclasses.replace(step, pre=pre, body=body)
    if isinstance(step, pl.ChunkLoop):
        items = tuple(
            dataclasses.replace(it, steps=tuple(_hoisted(s) for s in it.steps)) for it in step.items
        )
        return dataclasses.replace(step, items=items)
    return step


# ------------------------------------------------------------------------- entry


def _register_only(lw: _ProgramLowerer) -> frozenset[str]:
    """Fused members read only in registers of their own kernel (and not needed later)."""
    outputs = set(lw.p.outputs)
    updates = set(lw.p.updates().values())
    out: set[str] = set()
    for s in lw.p.stages:
        g = lw.group_of.get(s.name)
        if g is None or s.name in outputs or s.name in updates:
            continue
        if s.expr.op in COLLECTIVES or s.expr.op is Op.MATMUL:
            continue
        if lw.units[s.name][-1].kind != "ew":
            continue
        r = lw.reads.get(s.name)
        if r is None or r.elsewhere:
            continue
        kernels = set(lw.stage_kernels.get(s.name, ()))
        if r.in_kernel_register <= kernels:
            out.add(s.name)
    return frozenset(out)


def lower_program(
    program: Program,
    title: str,
    ns: str,
    collectives: Collectives,
    names: NameTable,
    param_cname: dict[str, str],
) -> pl.ProgramPlan:
    """Lower one program. Runs twice: the first pass finds which fused members are
    read only in registers, the second gives buffers only to the rest."""
    probe = _ProgramLowerer(program, title, ns, collectives, NameTable(), param_cname)
    probe.lower()
    reg = _register_only(probe)
    return _ProgramLowerer(program, title, ns, collectives, names, param_cname, reg).lower()


def _check_collective_operands(p: Program) -> None:
    """The emitter moves named buffers: a collective of an expression is refused with a
    diagnostic (the reference and `run` evaluate it; the emitter needs it named)."""
    for s in p.stages:
        if s.is_collective and s.expr.args and s.expr.args[0].name is None:
            op = s.expr.op.value
            raise EmitError(
                f"the emitter needs the operand of {op} '{s.name}' to be a named value",
                s.span,
                hint=f"name it first: t = <the operand>, then {s.name} = {op}(..., t)",
            )


def lower_emit(
    scheduled: Program,
    reference: Program | None,
    collectives: Collectives = "nccl",
    schedule_name: str | None = None,
    schedule_steps: Sequence[str] = (),
    seed: int = 0,
) -> pl.EmitPlan:
    """The plan for emitting `scheduled`, with `reference` (the unscheduled program)
    also lowered for ``--check`` unless it is the same program."""
    if collectives not in ("nccl", "nccl-device"):
        raise UsageError(f"unknown --collectives {collectives!r} (expected nccl or nccl-device)")
    if reference is not None and reference == scheduled:
        reference = None
    for p in (scheduled, reference):
        if p is not None:
            _check_collective_operands(p)
    names = NameTable()
    param_cname = {q.name: names.fresh(q.name, "prm_") for q in scheduled.params}
    params = tuple(
        pl.ParamSpec(param_cname[q.name], q.name, q.dtype, q.default) for q in scheduled.params
    )
    sched = lower_program(scheduled, "scheduled", "sch", collectives, names, param_cname)
    ref = None
    if reference is not None:
        for q in reference.params:
            if q.name not in param_cname:
                raise EmitError(f"param '{q.name}' exists only in the unscheduled program")
        ref = lower_program(reference, "unscheduled", "ref", "nccl", names, param_cname)
    fallback = None
    if sched.uses_device_api:
        # every rank runs this one instead where a rank lacks the device API, symmetric
        # windows or an NVLink domain spanning its group (docs/codegen.md)
        fallback = lower_program(
            scheduled, "scheduled, --collectives nccl (fallback)", "nccl_host", "nccl",
            names, param_cname,
        )  # fmt: skip
    g = scheduled.grid
    return pl.EmitPlan(
        program=scheduled.name,
        file_stem=file_stem(scheduled.name),
        tp=g.tp,
        pp=g.pp,
        is_grid=g.is_grid,
        dp=g.dp,
        has_dp=g.has_dp,
        dims=tuple((d.name, d.value) for d in scheduled.dims),
        params=params,
        scheduled=sched,
        reference=ref,
        collectives=collectives,
        schedule_name=schedule_name,
        schedule_steps=tuple(schedule_steps),
        seed=seed,
        fallback=fallback,
    )
