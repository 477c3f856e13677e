"""Decomposed groups of the emitter's lowering (docs/codegen.md, decomposed groups): a
`decompose` group (`overlapped shards=G`) becomes a `ChunkLoop` over the G steps of its
ring (`pl.Shards`), the geometry of `cocoviz.ir.shards.shard_plan`:

- gather (`xg = allgather(x)` read by `h = matmul(…)`): a staging area of G slots of one
  shard each (xg's own buffer when its layout is the slots', x flat or sliced(0)), slot tp
  this rank's part; at step s the shard k = (tp + s) mod G is multiplied (compute stream)
  while it goes on to rank tp − 1 and the next one arrives from tp + 1 (a `RingExchange`,
  communication stream); after the loop the slots are unpacked into xg's layout when
  something else reads xg, and an f32 accumulator (a contraction split of f16/bf16) is
  rounded once into h;
- scatter (`p = matmul(…)`, `ps = reducescatter(op, p)`): at step s block k = (tp − s − 1)
  mod G of p is computed (compute stream), combined with the accumulator received from
  rank tp − 1 in the compute type (`RingCombine`) and sent on to tp + 1 (communication
  stream); the last step's block is rounded once into this rank's part of ps; p is never
  stored. A fused group the reducescatter starts runs on ps after the loop.

The loop's events are the dependencies of the algorithm, listed where the steps are
built (`ring_edges`): a GEMM waits for its shard to arrive (gather), a combine for the
accumulator it adds, an exchange for the combine that wrote what it sends (scatter)."""

from __future__ import annotations

from typing import Any

from cocoviz.emit import plan as pl
from cocoviz.emit.body import BodyBuilder
from cocoviz.emit.collectives import _ROP
from cocoviz.emit.kernels import KernelLowering
from cocoviz.emit.plan import EmitError
from cocoviz.ir.nodes import Group, Stage
from cocoviz.ir.shards import Gemm, ShardPlan, shard_plan
from cocoviz.ir.types import DType

Dep = tuple[int, int, bool]
"""(after, before, carried): step `before` of an iteration waits for step `after` of the
same iteration, or of the previous one when `carried`."""


class ShardLowering(KernelLowering):
    """Decomposed (`overlapped shards=G`) groups."""

    def lower_decomposed(self, g: Group) -> list[pl.Step]:
        sp = shard_plan(self.p, g)
        self._chunk_loops += 1
        if self.collectives == "nccl-device":
            self.stage_colls.setdefault(sp.collective, []).append(
                "nccl-device does not apply (a decomposed group): its ring exchanges run as "
                "ncclSend/ncclRecv on NCCL's host API"
                + (", and so does the rest of the fused group it starts" if _fused(g) else "")
            )
        if sp.kind == "gather":
            pre, items, deps, post = self._gather(sp)
        else:
            pre, items, deps, post = self._scatter(sp, g)
        flat = [st for it in items for st in it.steps]
        for it in items:
            for st in it.steps:
                name = getattr(st, "stage", "")
                self.stage_streams.setdefault(name, set()).add(st.stream)
        for st in pre + post:
            for name in getattr(st, "stages", ()):
                self.stage_streams.setdefault(name, set()).add(st.stream)
        stages = tuple(s.name for s in self.p.stages if s.name in set(g.stages()))
        cname = self.names.fresh(f"{self.ns}_ring_{stages[0]}", "ol_")
        loop = pl.ChunkLoop(
            cname,
            stages,
            sp.group,
            tuple(items),
            self.type_of(stages[0]).pstage,
            edges=ring_edges(flat, deps, self.p.grid.pp),
            streams=tuple(dict.fromkeys(st.stream for st in flat)),
            shards=pl.Shards(sp.kind, sp.mode, sp.collective, sp.matmul),
        )
        return [*pre, loop, *post]

    # ---- gather: xg = allgather(x), h = matmul(… xg …)
    def _gather(
        self, sp: ShardPlan
    ) -> tuple[list[pl.Step], list[pl.ChunkItem], list[Dep], list[pl.Step]]:
        ag, mm = self.p.stage(sp.collective), self.p.stage(sp.matmul)
        x = ag.expr.args[0].name
        assert x is not None
        G, n, dt = sp.group, sp.shard_numel, ag.ty.dtype
        xv = self.view(x)
        if xv.kind not in ("flat", "block"):
            raise EmitError(
                f"allgather '{ag.name}': '{x}' is stored {xv.kind}; the emitter decomposes the "
                "gather of a value stored in its layout (flat or block-sliced)",
                ag.span,
                hint="keep it out of chunked overlapped groups",
            )
        xbuf, gbuf = self.buffer_of(x), self.buffer_of(ag.name)
        groot = gbuf.alias or gbuf.cname
        # the slots are xg's own layout when x is flat or sliced(0): rank j's part is block j
        direct = xv.kind == "flat" or (xv.kind == "block" and xv.outer == 1)
        staging = groot if direct else self._ring_buffer(ag, "slots", dt, G * n, "staging")
        in_place = xbuf.alias == groot and xbuf.addressing == "global" and direct
        pre: list[pl.Step] = []
        post: list[pl.Step] = []
        if not in_place:
            pre.append(self._own_slot(ag, x, staging, n))
        self.note_read(x, "ring", False)
        h = mm.name
        acc = self.buffer_of(h).cname
        acc_dt: DType | None = None
        if sp.mode == "accumulate":
            # partial products add up in C: zeroed first, then beta = 1 at every step (the
            # plan's Gemm.accumulate, c > 0, assumes shard 0 comes first; around the ring
            # rank r starts with shard r)
            if dt.is_half:
                acc_dt = dt.compute
                acc = self._ring_buffer(mm, "acc", acc_dt, self.view(h).count, "acc")
            pre.append(self._fill_zero(mm, acc, acc_dt or dt, self.view(h).count))
        a, b = (arg.name for arg in mm.expr.args)
        assert a is not None and b is not None
        bufs = [
            staging if sp.operand == 0 else self.buffer_of(a).cname,
            staging if sp.operand == 1 else self.buffer_of(b).cname,
        ]
        slot = [n if sp.operand == i else 0 for i in (0, 1)]
        gemm = self._gemm(
            mm, sp.gemms, bufs[0], bufs[1], acc, slot, acc_dt, sp.mode == "accumulate"
        )
        for name in (a, b):
            if name != ag.name:
                self.note_read(name, "matmul", False)
        xch = pl.RingExchange(
            self.names.fresh(f"{self.ns}_{ag.name}_ring", "x_"),
            ag.name,
            staging,
            "shard",
            staging,
            "next",
            n,
            dt,
            -1,
            G,
            ag.ty.pstage,
            "comm",
        )
        self.stage_colls.setdefault(ag.name, []).append(
            f"{xch.cname} (ring: send shard k to tp - 1, receive the next from tp + 1, "
            f"{G - 1} steps)"
        )
        if acc_dt is not None:
            post.append(self._round_into(mm, acc, acc_dt))
        if not direct and self._read_outside(ag.name, {mm.name}):
            post.append(self._unpack(ag, staging, n))
        items = [
            pl.ChunkItem(f"{ag.name} (ring exchange)", "comm", (xch,)),
            pl.ChunkItem(mm.name, "compute", (gemm,)),
        ]
        # the GEMM of step s multiplies the shard the exchange of step s − 1 received
        return pre, items, [(0, 1, True)], post

    # ---- scatter: p = matmul(a, w), ps = reducescatter(op, p) [fused group after]
    def _scatter(
        self, sp: ShardPlan, g: Group
    ) -> tuple[list[pl.Step], list[pl.ChunkItem], list[Dep], list[pl.Step]]:
        mm, rs = self.p.stage(sp.matmul), self.p.stage(sp.collective)
        G, n, dt = sp.group, sp.shard_numel, mm.ty.dtype
        # f16/bf16 accumulators travel in their own dtype, rounded at each hop as NCCL's
        # reduce-scatter rounds them (half the bytes of an f32 accumulator); integers keep
        # their wide compute type, so `avg` divides the exact sum
        acc_dt = dt if dt.is_half else dt.compute
        partial = self._ring_buffer(mm, "block", dt, n, "temp")
        acc = self._ring_buffer(rs, "acc", acc_dt, 2 * n, "acc")
        received = self._ring_buffer(rs, "recv", acc_dt, n, "acc")
        a, b = (arg.name for arg in mm.expr.args)
        assert a is not None and b is not None
        self.note_read(a, "matmul", False)
        self.note_read(b, "matmul", False)
        gemm = self._gemm(
            mm, sp.gemms, self.buffer_of(a).cname, self.buffer_of(b).cname, partial, [0, 0]
        )
        assert rs.expr.rop is not None
        rop: Any = _ROP[rs.expr.rop]
        out = self.buffer_of(rs.name)
        combine = pl.RingCombine(
            self.names.fresh(f"{self.ns}_{rs.name}_combine", "k_"),
            rs.name,
            partial,
            dt,
            received,
            acc,
            acc_dt,
            out.cname,
            out.dtype,
            n,
            rop,
            G,
            rs.ty.pstage,
            "compute",
        )
        self.stage_kernels.setdefault(rs.name, []).append(combine.cname)
        xch = pl.RingExchange(
            self.names.fresh(f"{self.ns}_{rs.name}_ring", "x_"),
            rs.name,
            acc,
            "parity",
            received,
            "none",
            n,
            acc_dt,
            1,
            G,
            rs.ty.pstage,
            "comm",
        )
        self.stage_colls.setdefault(rs.name, []).append(
            f"{xch.cname} (ring: send the {acc_dt.value} accumulator to tp + 1, receive the "
            f"next from tp - 1, {G - 1} steps; {combine.cname} combines)"
        )
        items = [
            pl.ChunkItem(mm.name, "compute", (gemm, combine)),
            pl.ChunkItem(f"{rs.name} (ring exchange)", "comm", (xch,)),
        ]
        # the exchange sends what the combine wrote; the combine of step s adds the
        # accumulator the exchange of step s − 1 received
        deps: list[Dep] = [(1, 2, False), (2, 1, True)]
        post: list[pl.Step] = []
        fused = _fused(g)
        if fused is not None:
            # the fused group after the reducescatter, as a fused group runs, on ps
            members = [s.name for s in self.p.stages if s.name in set(fused.stages())]
            rest = [m for m in members if m != rs.name]
            post = self.lower_units(rest, None, "fused " + ", ".join(rest), fused=True)
        return [], items, deps, post

    # ---- steps
    def _gemm(
        self,
        mm: Stage,
        gemms: tuple[Gemm, ...],
        a: str,
        b: str,
        c: str,
        slot: list[int],
        c_dtype: DType | None = None,
        accumulate: bool = False,
    ) -> pl.Matmul:
        """The GEMM of shard k: `gemms[k]`, whose offsets are affine in k (the IR's
        geometry), plus `slot` elements per shard where an operand is the shard slots."""
        g0 = gemms[0]
        for f in ("m", "n", "k", "lda", "ldb", "ldc", "a_stride", "b_stride", "c_stride", "batch"):
            if any(getattr(g, f) != getattr(g0, f) for g in gemms):
                raise EmitError(f"matmul '{mm.name}': the shards' GEMMs differ in {f}; a bug")
        offs = [_per_shard(mm.name, gemms, f) for f in ("a_off", "b_off", "c_off")]
        a_off = pl.Offset(offs[0].const, 0, offs[0].per_chunk + slot[0])
        b_off = pl.Offset(offs[1].const, 0, offs[1].per_chunk + slot[1])
        batch: tuple[pl.BatchDim, ...] = ()
        if g0.batch > 1:
            batch = (pl.BatchDim(g0.batch, g0.a_stride, g0.b_stride, g0.c_stride),)
        cname = self.names.fresh(f"{self.ns}_{mm.name}", "mm_")
        api = "cuBLAS batched GEMM" if batch else "cuBLAS GEMM"
        self.stage_kernels.setdefault(mm.name, []).append(f"{cname} ({api} per shard)")
        return pl.Matmul(
            cname,
            mm.name,
            a,
            b,
            c,
            g0.m,
            g0.n,
            g0.k,
            mm.ty.dtype,
            a_off,
            offs[2],
            mm.ty.pstage,
            "compute",
            b_off,
            batch,
            lda=g0.lda,
            ldb=g0.ldb,
            ldc=g0.ldc,
            accumulate=accumulate,
            c_dtype=c_dtype,
        )

    def _kernel(self, stage: Stage, what: str, view: pl.View, body: list[pl.Stmt]) -> pl.Kernel:
        cname = self.names.fresh(f"{self.ns}_{stage.name}_{what}", "k_")
        self.stage_kernels.setdefault(stage.name, []).append(cname)
        space = pl.Space(view, False)
        return pl.Kernel(cname, (stage.name,), space, tuple(body), (), stage.ty.pstage)

    def _own_slot(self, ag: Stage, x: str, staging: str, n: int) -> pl.Kernel:
        """This rank's part of x into its slot (tp) of the staging area."""
        view = self.view(x)
        bb = BodyBuilder(self, pl.Space(view, False), f"{ag.name}_own")
        v = bb.read(x, self.type_of(x))
        at = bb.emit(None, kind="index_affine", a="i", n1=n)
        dt = ag.ty.dtype
        bb.stmts.append(pl.Stmt(kind="store", buffer=staging, a=at, b=v, dtype=dt))
        return self._kernel(ag, "own", view, bb.stmts)

    def _fill_zero(self, mm: Stage, buf: str, dt: DType, count: int) -> pl.Kernel:
        view = pl.View("local", (count,), count)
        bb = BodyBuilder(self, pl.Space(view, False), f"{mm.name}_zero")
        z = bb.emit(None, kind="const", literal="0.0", dtype=dt)
        bb.stmts.append(pl.Stmt(kind="store", buffer=buf, a="i", b=z, dtype=dt))
        return self._kernel(mm, "zero", view, bb.stmts)

    def _round_into(self, mm: Stage, acc: str, acc_dt: DType) -> pl.Kernel:
        """The f32 accumulator of a contraction split rounded once into the result."""
        view = self.view(mm.name)
        dt = mm.ty.dtype
        bb = BodyBuilder(self, pl.Space(view, False), f"{mm.name}_round")
        v = bb.emit(None, kind="load", buffer=acc, a="i", dtype=acc_dt)
        v = bb.round_to(bb.operand_conv(v, acc_dt, dt), dt)
        out = self.buffer_of(mm.name).cname
        bb.stmts.append(pl.Stmt(kind="store", buffer=out, a="i", b=v, dtype=dt))
        return self._kernel(mm, "round", view, bb.stmts)

    def _unpack(self, ag: Stage, staging: str, n: int) -> pl.Kernel:
        """The slots (rank j's part in slot j) into xg's global layout: element (o, j, q)
        of a sliced(d) part, j = r·blk + jj along d, comes from slot r."""
        x = ag.expr.args[0].name
        assert x is not None
        xv, gv = self.view(x), self.view(ag.name)
        G, blk, inner = self.G, xv.blk, xv.inner
        terms = (
            (xv.extent * inner, xv.outer, blk * inner),
            (blk * inner, G, n),
            (inner, blk, inner),
            (1, inner, 1),
        )
        bb = BodyBuilder(self, pl.Space(gv, False), f"{ag.name}_unpack")
        at = bb.emit(None, kind="index_bcast", a="i", terms=terms)
        dt = ag.ty.dtype
        v = bb.emit(None, kind="load", buffer=staging, a=at, dtype=dt)
        out = self.buffer_of(ag.name).cname
        bb.stmts.append(pl.Stmt(kind="store", buffer=out, a="i", b=v, dtype=dt))
        return self._kernel(ag, "unpack", gv, bb.stmts)

    def _ring_buffer(self, stage: Stage, what: str, dt: DType, count: int, role: Any) -> str:
        """A buffer of the ring (not any value's storage)."""
        name = self.names.fresh(f"{self.ns}_{stage.name}_{what}", "s_")
        self.buffers[name] = pl.Buffer(name, stage.name, dt, count, stage.ty.pstage, role)
        self.buffer_order.append(name)
        return name

    def _read_outside(self, value: str, inside: set[str]) -> bool:
        return value in self.p.outputs or any(u not in inside for u in self.users.get(value, []))


def _fused(g: Group) -> Group | None:
    """The fused group a decomposed reducescatter starts, if any."""
    return next((it for it in g.items if isinstance(it, Group)), None)


def _per_shard(matmul: str, gemms: tuple[Gemm, ...], field: str) -> pl.Offset:
    """`field` of the GEMM of shard k as ``const + per_chunk·k``."""
    vals = [getattr(g, field) for g in gemms]
    per = vals[1] - vals[0] if len(vals) > 1 else 0
    if any(v != vals[0] + c * per for c, v in enumerate(vals)):
        raise EmitError(f"matmul '{matmul}': the shards' {field} is not affine in the shard; a bug")
    return pl.Offset(const=vals[0], per_chunk=per)


def ring_edges(steps: list[pl.Step], deps: list[Dep], pp: int) -> tuple[pl.ChunkEdge, ...]:
    """The events of one step of a decomposed group, from the dependencies its lowering
    lists (`Dep`), by the rule of `cocoviz.emit.overlap.chunk_edges`: an event where the two
    steps run on different streams (on one stream, stream order suffices), used on the
    ranks of the pipeline stage that issues both."""
    out: list[pl.ChunkEdge] = []
    for after, before, carried in deps:
        if steps[after].stream == steps[before].stream:
            continue
        pst = steps[before].pstage
        stages = None if pp == 1 or pst is None else (pst,)
        out.append(pl.ChunkEdge(after, before, stages, carried))
    return tuple(out)
