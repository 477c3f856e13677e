"""Collectives of the emitter's lowering (docs/codegen.md, what each construct becomes):
a collective stage becomes an NCCL/MPI call on named buffers
(`cocoviz.emit.plan.Collective`), an `avg` a sum and a division kernel, and a
reducescatter → compute → allgather group under ``--collectives nccl-device`` one
device-API kernel."""

from __future__ import annotations

import dataclasses
from typing import Any

from cocoviz.emit import plan as pl
from cocoviz.emit.body import BodyBuilder, Unit, _with_chunks
from cocoviz.emit.names import c_double
from cocoviz.emit.plan import EmitError
from cocoviz.emit.storage import Storage
from cocoviz.ir.collectives import Blocks, alltoall_copies, collective
from cocoviz.ir.nodes import COLLECTIVES, READS_OTHER_ELEMENTS, Op, ReduceOp
from cocoviz.ir.types import DType, shape_values

_ROP = {
    ReduceOp.SUM: "sum",
    ReduceOp.PROD: "prod",
    ReduceOp.MAX: "max",
    ReduceOp.MIN: "min",
    ReduceOp.AVG: "avg",
}


class CollectiveLowering(Storage):
    """Collective stages and nccl-device groups."""

    def collective_steps(self, u: Unit, chunks: int | None) -> list[pl.Step]:
        """The collective of `u`; an `avg` becomes a `sum` plus a division kernel."""
        c = self.collective(u, chunks)
        if c.rop != "avg":
            return [c]
        return self.avg_steps(u, c, chunks)

    def avg_steps(self, u: Unit, c: pl.Collective, chunks: int | None) -> list[pl.Step]:
        """`avg` as (widen →) `sum` collective → divide-by-G kernel (semantics notes: the
        sum combined in the compute type, divided by G truncating for integers, rounded
        once). NCCL's own ncclAvg pre-multiplies every input by 1/G rounded to the dtype
        (floats) and sums integers in their storage type before dividing, so it is not
        used. f16/bf16/i32 travel widened to their compute type in a staging buffer (no
        f16 overflow of the sum, no i32 wrap-around before the division)."""
        e = u.expr
        src = e.args[0].name
        assert src is not None
        dt = c.dtype
        acc = dt.compute
        sv, dv = self.view(src), self.view(u.value)
        K = chunks or 1
        per_send = sv.count // K
        steps: list[pl.Step] = []
        names: list[str] = []
        rs = c.op == "reducescatter"
        if acc != dt:
            staging = self.names.fresh(f"{self.ns}_{u.value}_sum", "s_")
            self.buffers[staging] = pl.Buffer(
                staging, u.value, acc, sv.count, u.ty.pstage, "staging"
            )
            self.buffer_order.append(staging)
            wname = self.names.fresh(f"{self.ns}_{u.value}_widen", "k_")
            wb = BodyBuilder(self, self._coll_space(sv, chunks), wname)
            L = wb.L
            v = wb.emit(None, kind="load", buffer=c.send, a=L, dtype=dt)
            v = wb.operand_conv(v, dt, acc)
            wb.stmts.append(pl.Stmt(kind="store", buffer=staging, a=L, b=v, dtype=acc))
            steps.append(pl.Kernel(wname, (u.stage,), wb.space, tuple(wb.stmts), (), u.ty.pstage))
            names.append(wname)
            send_off = pl.Offset(per_chunk=per_send) if chunks else pl.ZERO
            recv_off = send_off
            if rs and c.comm == "dp":
                recv_off = pl.Offset(per_dp=c.count)
            elif rs:
                recv_off = pl.Offset(per_rank=c.count, per_chunk=send_off.per_chunk)
            steps.append(
                dataclasses.replace(
                    c,
                    rop="sum",
                    send=staging,
                    recv=staging,
                    dtype=acc,
                    send_offset=send_off,
                    recv_offset=recv_off,
                    inplace=True,
                    avg=True,
                )  # fmt: skip
            )
            src_buf = staging
        else:
            steps.append(dataclasses.replace(c, rop="sum", avg=True))
            src_buf = c.recv
        dname = self.names.fresh(f"{self.ns}_{u.value}_avg", "k_")
        db = BodyBuilder(self, self._coll_space(dv, chunks), dname)
        L = db.L
        idx = L
        if src_buf != c.recv and rs and c.comm == "dp":
            # this rank's reduced block sits at staging + dp·count (kernels have no dp
            # index: an alias of the staging buffer at it)
            part = self.names.fresh(f"{self.ns}_{u.value}_sum_dp", "s_")
            self.buffers[part] = pl.Buffer(
                part, u.value, acc, c.count, u.ty.pstage, "staging",
                alias=src_buf, offset=pl.Offset(per_dp=c.count),
            )  # fmt: skip
            self.buffer_order.append(part)
            src_buf = part
        elif src_buf != c.recv and rs:
            # this rank's reduced block sits at staging + k·(send per chunk) + tp·count
            idx = db.emit(
                None, kind="index_affine", a="i", n1=c.count, n2=per_send if chunks else 0
            )
        v = db.emit(None, kind="load", buffer=src_buf, a=idx, dtype=acc)
        group = self.D if c.comm == "dp" else self.G
        g = db.emit(None, kind="const", literal=c_double(group), dtype=acc)
        q = db.emit(None, kind="binary", op="div", a=v, b=g, dtype=acc)
        q = db.operand_conv(q, acc, dt)
        q = db.round_to(q, dt)
        db.stmts.append(pl.Stmt(kind="store", buffer=c.recv, a=L, b=q, dtype=dt))
        steps.append(pl.Kernel(dname, (u.stage,), db.space, tuple(db.stmts), (), u.ty.pstage))
        names.append(dname)
        self.stage_kernels.setdefault(u.stage, []).extend(names)
        colls = self.stage_colls[u.stage]
        colls[-1] = colls[-1][:-1] + f" of avg: sum in {acc.value}, then {dname} divides by G)"
        return steps

    @staticmethod
    def _coll_space(v: pl.View, chunks: int | None) -> pl.Space:
        """The iteration space of a kernel over a collective's buffer (chunk k of it)."""
        return pl.Space(_with_chunks(v, chunks), True) if chunks else pl.Space(v, False)

    def collective(self, u: Unit, chunks: int | None) -> pl.Collective:
        e = u.expr
        op = e.op
        src = e.args[0].name
        assert src is not None
        self.note_read(src, "collective", False)
        sbuf, dbuf = self.buffer_of(src), self.buffer_of(u.value)
        sv, dv = self.view(src), self.view(u.value)
        rop: Any = _ROP[e.rop] if e.rop is not None else None
        cname = self.names.fresh(f"{self.ns}_{u.value}", "c_")
        dt = u.ty.dtype
        K = chunks or 1
        common: dict[str, Any] = dict(cname=cname, stage=u.stage, dtype=dt, pstage=u.ty.pstage)
        if e.tag == "dp":
            # over the D ranks with this rank's pp and tp index, on its tp part
            # (docs/language.md, rank grids)
            if chunks:
                raise EmitError(
                    f"{op.value} over dp '{u.stage}' inside an overlapped group is not "
                    "supported yet (code generation: the chunk loops cut a tp rank's value "
                    "only)",
                    self.p.stage(u.stage).span,
                    hint="leave the collective over dp out of the overlap(…) group",
                )
            common["comm"] = "dp"
        desc = op.value
        if op is Op.ALLREDUCE:
            n = dv.count // K
            off = pl.Offset(per_chunk=n) if chunks else pl.ZERO
            c = pl.Collective(
                op="allreduce",
                rop=rop,
                send=sbuf.cname,
                recv=dbuf.cname,
                count=n,
                send_offset=off,
                recv_offset=off,
                inplace=dbuf.alias == sbuf.cname,
                **common,
            )
        elif op is Op.REDUCESCATTER:
            n = dv.count // K
            c = pl.Collective(
                op="reducescatter",
                rop=rop,
                send=sbuf.cname,
                recv=dbuf.cname,
                count=n,
                send_offset=pl.Offset(per_chunk=sv.count // K) if chunks else pl.ZERO,
                recv_offset=pl.Offset(per_chunk=n) if chunks else pl.ZERO,
                inplace=dbuf.alias == sbuf.cname,
                **common,
            )
        elif op is Op.ALLGATHER:
            n = sv.count // K
            inplace = (
                sbuf.alias is not None
                and sbuf.alias == (dbuf.alias or dbuf.cname)
                and (sbuf.addressing == "global" or e.tag == "dp")
            )
            if sv.kind == "block" and e.tag != "dp":  # over dp: the flat parts of a tp part
                staging = self._staging(u, "gather", dv.count)
                c = pl.Collective(
                    op="allgather",
                    rop=None,
                    send=sbuf.cname,
                    recv=dbuf.cname,
                    count=n,
                    permute=sv,
                    staging=staging,
                    **common,
                )
                desc = "allgather + permute"
            else:
                c = pl.Collective(
                    op="allgather",
                    rop=None,
                    send=sbuf.cname,
                    recv=dbuf.cname,
                    count=n,
                    send_offset=pl.Offset(per_chunk=n) if chunks else pl.ZERO,
                    recv_offset=pl.Offset(per_chunk=dv.count // K) if chunks else pl.ZERO,
                    inplace=inplace,
                    **common,
                )
        elif op is Op.ALLTOALL:
            # in a group that chunks dimension 0, chunk k is block k of both rank arrays
            pack, unpack = self._alltoall_permutes(e, K)
            c = pl.Collective(
                op="alltoall",
                rop=None,
                send=sbuf.cname,
                recv=dbuf.cname,
                count=sv.count // (K * self.G),
                send_offset=pl.Offset(per_chunk=sv.count // K) if chunks else pl.ZERO,
                recv_offset=pl.Offset(per_chunk=dv.count // K) if chunks else pl.ZERO,
                permute=unpack,
                staging=self._staging(u, "recv", dv.count) if unpack else "",
                pack=pack,
                pack_staging=self._staging(u, "send", sv.count) if pack else "",
                **common,
            )
            desc = "alltoall" + (" + pack" if pack else "") + (" + unpack" if unpack else "")
        elif collective(op).rooted:  # the whole buffer, to or from the root
            if sv.count != dv.count:
                raise EmitError(
                    f"{op.value} '{u.stage}' of a sliced value is not supported by the emitter"
                )
            n = dv.count // K
            off = pl.Offset(per_chunk=n) if chunks else pl.ZERO
            c = pl.Collective(
                op=op.value,
                rop=rop if collective(op).reduces else None,
                send=sbuf.cname,
                recv=dbuf.cname,
                count=n,
                send_offset=off,
                recv_offset=off,
                root=int(e.value or 0),
                **common,
            )
        elif op is Op.SEND:
            n = dv.count // K
            off = pl.Offset(per_chunk=n) if chunks else pl.ZERO
            src_stage = self.type_of(src).pstage or 0
            c = pl.Collective(
                op="send",
                rop=None,
                send=sbuf.cname,
                recv=dbuf.cname,
                count=n,
                send_offset=off,
                recv_offset=off,
                peer_pstage=src_stage,
                comm="world",
                cname=cname,
                stage=u.stage,
                dtype=dt,
                pstage=None,
            )
            desc = f"send stage {src_stage} → {src_stage + 1}"
        else:
            raise EmitError(f"the emitter has no lowering of {op.value} '{u.stage}'")
        self.stage_colls.setdefault(u.stage, []).append(f"{cname} ({desc})")
        return c

    def _staging(self, u: Unit, what: str, count: int) -> str:
        name = self.names.fresh(f"{self.ns}_{u.value}_{what}", "s_")
        self.buffers[name] = pl.Buffer(name, u.value, u.ty.dtype, count, u.ty.pstage, "staging")
        self.buffer_order.append(name)
        return name

    def _alltoall_permutes(self, e: Any, chunks: int) -> tuple[pl.View | None, pl.View | None]:
        """The block views an alltoall's pack and unpack copy along, for one of `chunks`
        blocks of dimension 0 (None: the blocks are contiguous already;
        `alltoall_copies`, docs/codegen.md)."""
        G = self.G
        x = e.args[0]
        shape = list(shape_values(x.type.shape))
        shape[0] //= chunks
        pack, unpack = alltoall_copies(tuple(shape), int(e.tag), int(e.value), G)

        def view(b: Blocks | None) -> pl.View | None:
            if b is None:
                return None
            count = b.outer * (b.extent // G) * b.inner
            return pl.View("block", (b.outer, b.extent, b.inner), count, b.outer, b.extent, b.inner)

        return view(pack), view(unpack)

    # ---- nccl-device
    def _device_fallback(self, members: list[str]) -> None:
        if any(self.p.stage(m).expr.op in COLLECTIVES for m in members):
            self.stage_colls.setdefault(members[0], []).append(
                "nccl-device does not apply (the group is not reducescatter → elementwise "
                "compute → allgather); lowered on NCCL's host API"
            )

    def device_fused(self, members: list[str], chunks: int | None) -> list[pl.Step] | None:
        """RS → compute → AG as one NCCL device-API kernel; None when the group is not of
        that form (the host-NCCL lowering is used instead)."""
        ops = [self.p.stage(m).expr.op for m in members]
        if not ops or ops[0] is not Op.REDUCESCATTER or Op.ALLGATHER not in ops:
            return None
        if any(self.p.stage(m).expr.tag == "dp" for m in members):
            # the device communicator and its windows are the tp group's: a collective over
            # dp runs on NCCL's host API (docs/cost-model.md prices it so)
            self.stage_colls.setdefault(members[0], []).append(
                "nccl-device does not apply (a collective over dp: the device communicator "
                "is the tp group's); lowered on NCCL's host API"
            )
            return None
        rs = members[0]
        compute = [m for m, o in zip(members, ops, strict=True) if o not in COLLECTIVES]
        gathers = [m for m, o in zip(members, ops, strict=True) if o is Op.ALLGATHER]
        if any(o in COLLECTIVES and o not in (Op.REDUCESCATTER, Op.ALLGATHER) for o in ops):
            return None
        # a node that reads its operand at other elements than its own (a transpose, a
        # reduction along a dimension) needs a kernel of its own: not this one, which
        # computes its members element by element (docs/codegen.md)
        if any(
            u.kind != "ew" or u.expr.op in READS_OTHER_ELEMENTS
            for m in compute
            for u in self.units[m]
        ):
            return None
        rs_e = self.p.stage(rs).expr
        src = rs_e.args[0].name
        assert src is not None and rs_e.rop is not None
        sv = self.view(src)
        if sv.kind not in ("local", "replicated"):
            return None
        shard_view = self.view(rs)
        space = pl.Space(shard_view, bool(chunks))
        cname = self.names.fresh(f"{self.ns}_{rs}_device", "d_")
        bb = BodyBuilder(self, space, cname)
        l_var, e_var = bb.L, bb.E
        prologue = tuple(bb.stmts)
        bb.stmts.clear()
        # the reduced shard element is computed by the kernel into `shard`
        bb.bound[rs] = "shard"
        self.note_read(rs, cname, True)
        for m in compute:
            for u in self.units[m]:
                v, dt = bb.expr(u.expr)
                v = bb.operand_conv(v, dt, u.ty.dtype)
                r = bb.round_to(v, u.ty.dtype)
                bb.bound[u.value] = r
                if u.value in self.value_buffer and u.value not in {
                    self.p.stage(g).expr.args[0].name for g in gathers
                }:
                    bb.store(u.value, r, u.ty.dtype)
        gath: list[tuple[str, str, DType]] = []
        for g in gathers:
            val = self.p.stage(g).expr.args[0].name
            assert val is not None
            if val not in bb.bound:
                return None
            dst = self.buffer_of(g)
            self.symmetric.add(dst.alias or dst.cname)
            gath.append((bb.bound[val], dst.alias or dst.cname, dst.dtype))
            self.stage_kernels.setdefault(g, []).append(cname)
        sbuf = self.buffer_of(src)
        self.symmetric.add(sbuf.alias or sbuf.cname)
        self.note_read(src, "device", False)
        self._uses_device = True
        for m in members:
            self.stage_kernels.setdefault(m, []).append(cname)
        self.stage_colls.setdefault(rs, []).append(
            f"{cname} (NCCL device API: LSA reduce-scatter + fused compute + all-gather)"
        )
        rop: Any = _ROP[rs_e.rop]
        return [
            pl.DeviceCollective(
                cname,
                tuple(members),
                rop,
                sbuf.alias or sbuf.cname,
                sbuf.dtype,
                self.buffer_of(rs).cname if rs in self.value_buffer else "",
                space,
                prologue,
                l_var,
                e_var,
                tuple(bb.stmts),
                tuple(gath),
                self.type_of(rs).pstage,
            )
        ]
