"""Kernels of the emitter's lowering (docs/codegen.md, what each construct becomes): a
stage's units, and the elementwise kernels (with their reductions), row kernels and
matmuls they are issued as."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, cast

from cocoviz.emit import plan as pl
from cocoviz.emit.body import BodyBuilder, Unit, _with_chunks, view_of
from cocoviz.emit.collectives import CollectiveLowering
from cocoviz.emit.plan import EmitError
from cocoviz.ir.nodes import (
    COLLECTIVES,
    PERMUTES,
    READS_OTHER_ELEMENTS,
    REDUCTIONS,
    ROUTING,
    ROWWISE,
    Expr,
    Op,
    Stage,
)
from cocoviz.ir.types import TensorType, block_dim, shape_values

REDUCE_BLOCKS = 1024
"""Per-block partials of a two-phase reduction (CUDA grid size of reduction kernels)."""

_RED_KIND: dict[Op, Any] = {Op.SUM: "sum", Op.NORM: "sumsq", Op.AMAX: "absmax"}


class KernelLowering(CollectiveLowering):
    """Units, and the kernels, row kernels and matmuls they become."""

    def make_units(self, s: Stage) -> list[Unit]:
        e = s.expr
        op = e.op
        chunks = self.chunks_of.get(s.name)
        if op in COLLECTIVES:
            return [Unit("coll", s.name, s.name, e, s.ty, chunks)]
        body = e.args[1] if op is Op.UPDATE else e
        out: list[Unit] = []
        counter = [0]

        def temp(x: Expr, ty: TensorType) -> Expr:
            """`x` computed into a temporary of type `ty` by its own unit."""
            counter[0] += 1
            name = f"{s.name}.t{counter[0]}"
            self.lifted_types[name] = ty
            out.append(Unit("ew", name, s.name, x, ty, chunks))
            return Expr(Op.REF, name=name, ty=ty, span=x.span)

        if op is Op.MATMUL:
            # an operand `transpose(x, …)` is copied into a temporary first (exact: the
            # GEMM reads the same values the reference does; docs/codegen.md)
            operands: list[Expr] = []
            for a in e.args:
                if a.op in PERMUTES:
                    if chunks:
                        raise EmitError(
                            f"matmul '{s.name}' reads a {a.op.value} inside an overlapped "
                            "group; the emitter cannot chunk it",
                            s.span,
                        )
                    x = a.args[0]
                    if x.op is not Op.REF and x.type.dtype.compute != x.type.dtype:
                        raise EmitError(
                            f"the emitter needs the operand of {a.op.value} in matmul "
                            f"'{s.name}' to be a named value (a {x.type.dtype.value} "
                            "expression would be rounded before the GEMM reads it)",
                            x.span or s.span,
                            hint=f"name it first: t = <the operand>, then "
                            f"matmul({a.op.value}(t, …), …)",
                        )
                    if x.op is not Op.REF:
                        x = temp(x, x.type)
                    a = temp(dataclasses.replace(a, args=(x,)), a.type)
                elif a.op is not Op.REF:
                    raise EmitError(
                        f"the emitter needs each operand of matmul '{s.name}' to be a named "
                        "value or a transpose of one",
                        a.span or s.span,
                        hint="name it first: t = <the operand>, then matmul(t, …)",
                    )
                operands.append(a)
            self._uses_matmul = True
            mm = dataclasses.replace(e, args=tuple(operands))
            return [*out, Unit("matmul", s.name, s.name, mm, s.ty, chunks)]

        def lift(x: Expr, top: bool) -> Expr:
            args = tuple(lift(a, False) for a in x.args)
            x2 = dataclasses.replace(x, args=args) if args != x.args else x
            if x2.op in ROUTING:
                # a stage of its own (docs/language.md, routing): its operands are read
                # at data-dependent positions of their stored arrays, so each is named
                if chunks:
                    raise EmitError(
                        f"stage '{s.name}' routes by index ({x2.op.value}) inside an "
                        "overlapped group; chunking it is not supported yet",
                        s.span,
                    )
                x2 = dataclasses.replace(x2, args=tuple(
                    temp(a, _compute(a.type))
                    if a.op is not Op.REF or a.name in self.param_names
                    else a
                    for a in x2.args
                ))  # fmt: skip
            elif x2.op in READS_OTHER_ELEMENTS:
                # a permute or a reduction along a dimension reads its operand's stored
                # array at other positions than its own element, so the operand is a
                # named value and the node is the top of its unit
                if chunks:
                    raise EmitError(
                        f"stage '{s.name}' has a {x2.op.value} inside an overlapped group; "
                        "the emitter cannot chunk it",
                        s.span,
                    )
                (a,) = x2.args
                if a.op is not Op.REF or a.name in self.param_names:
                    x2 = dataclasses.replace(x2, args=(temp(a, _compute(a.type)),))
                if not top:
                    return temp(x2, _compute(x2.type))
            if top:
                return x2
            if x2.op in REDUCTIONS or x2.op in ROWWISE:
                counter[0] += 1
                name = f"{s.name}.t{counter[0]}"
                ty = x2.type
                if x2.op in ROWWISE:
                    ty = dataclasses.replace(ty, dtype=ty.dtype.compute)
                self.lifted_types[name] = ty
                kind: Literal["red", "row"] = "red" if x2.op in REDUCTIONS else "row"
                if kind == "red" and x2.args[0].type.layout.is_sliced and chunks:
                    raise EmitError(
                        f"stage '{s.name}' reduces a value inside an overlapped group; "
                        "the emitter cannot chunk a whole-tensor reduction",
                        s.span,
                    )
                out.append(Unit(kind, name, s.name, x2, ty, chunks))
                return Expr(Op.REF, name=name, ty=ty, span=x.span)
            return x2

        top = lift(body, True)
        if top.op in REDUCTIONS:
            kind: Literal["ew", "red", "row"] = "red"
        elif top.op in ROWWISE:
            kind = "row"
        else:
            kind = "ew"
        if top.op in ROWWISE or top.op in REDUCTIONS:
            # arguments of the top op may themselves hold lifted ops: lift them as args
            args = tuple(lift(a, False) if a.op in REDUCTIONS | ROWWISE else a for a in top.args)
            top = dataclasses.replace(top, args=args)
        out.append(Unit(kind, s.name, s.name, top, s.ty, chunks))
        return out

    def lower_units(
        self, stages: Sequence[str], chunks: int | None, label: str, fused: bool = False
    ) -> list[pl.Step]:
        steps: list[pl.Step] = []
        units = [u for s in stages for u in self.units[s]]
        cur: list[Unit] = []
        cur_space: pl.Space | None = None

        def flush() -> None:
            nonlocal cur, cur_space
            if cur:
                assert cur_space is not None
                steps.extend(self.kernel(cur, cur_space, chunks))
            cur, cur_space = [], None

        for u in units:
            if u.kind in ("ew", "red"):
                space = self.space_of(u, chunks)
                if cur and (space != cur_space or not self.joins(u, cur, space)):
                    flush()
                if not cur:
                    cur_space = space
                cur.append(u)
                continue
            flush()
            if u.kind == "row":
                steps.append(self.row_kernel(u, chunks))
            elif u.kind == "matmul":
                steps.append(self.matmul(u, chunks))
            else:
                steps.extend(self.collective_steps(u, chunks))
        flush()
        return steps

    def space_of(self, u: Unit, chunks: int | None) -> pl.Space:
        if u.kind == "red":
            arg = u.expr.args[0]
            v = view_of(arg.type, self.G, None)
            return pl.Space(v, False)
        v = self.view(u.value)
        if chunks:
            return pl.Space(v if v.kind == "chunked" else _with_chunks(v, chunks), True)
        return pl.Space(v, False)

    def joins(self, u: Unit, cur: list[Unit], space: pl.Space) -> bool:
        members = {c.value: c for c in cur}
        if u.expr.op in READS_OTHER_ELEMENTS and any(n in members for n in u.expr.refs()):
            return False  # it reads its operand at other elements than its own
        for name in u.expr.refs():
            m = members.get(name)
            if m is None:
                continue
            if m.kind == "red":
                return False
            if self.view(name) != space.view:
                return False
        for e in u.expr.walk():
            if (
                e.op is Op.REF
                and e.name in members
                and shape_values(e.type.shape) != space.view.shape
            ):
                return False
        return True

    def kernel(self, units: list[Unit], space: pl.Space, chunks: int | None) -> list[pl.Step]:
        stage_names = tuple(dict.fromkeys(u.stage for u in units))
        cname = self.names.fresh(f"{self.ns}_{stage_names[0]}", "k_")
        bb = BodyBuilder(self, space, cname)
        reductions: list[pl.Reduction] = []
        finishes: list[pl.Step] = []
        for u in units:
            if u.kind == "red":
                arg = u.expr.args[0]
                v, dt = bb.expr(arg)
                acc_dt = u.ty.dtype
                if dt.compute != acc_dt.compute:
                    v = bb.operand_conv(v, dt, acc_dt)
                pname = self.names.fresh(f"{self.ns}_{u.value}", "p_")
                self.buffers[pname] = pl.Buffer(
                    pname, u.value, acc_dt.compute, REDUCE_BLOCKS, u.ty.pstage, "partial"
                )
                self.buffer_order.append(pname)
                red = pl.Reduction(_RED_KIND[u.expr.op], v, pname, acc_dt.compute)
                reductions.append(red)
                fname = self.names.fresh(f"{self.ns}_{u.value}_finish", "f_")
                finishes.append(
                    pl.ReduceFinish(
                        fname,
                        u.stage,
                        red,
                        arg.type.layout.is_sliced,
                        self.buffer_of(u.value).cname,
                        self.buffer_of(u.value).dtype,
                        u.ty.pstage,
                    )
                )
                self.stage_kernels.setdefault(u.stage, []).append(fname)
                if arg.type.layout.is_sliced:
                    self.stage_colls.setdefault(u.stage, []).append(
                        f"{u.stage}.reduce (allreduce of 1 value)"
                    )
                continue
            v, dt = bb.expr(u.expr)
            v = bb.operand_conv(v, dt, u.ty.dtype)
            r = bb.round_to(v, u.ty.dtype)
            bb.bound[u.value] = r
            if u.value in self.value_buffer:
                bb.store(u.value, r, u.ty.dtype)
        for u in units:
            self.stage_kernels.setdefault(u.stage, []).append(cname)
        pstage = units[0].ty.pstage
        k = pl.Kernel(cname, stage_names, space, tuple(bb.stmts), tuple(reductions), pstage)
        return [k, *finishes]

    def row_kernel(self, u: Unit, chunks: int | None) -> pl.RowKernel:
        e = u.expr
        space = self.space_of(u, chunks)
        cname = self.names.fresh(f"{self.ns}_{u.value}", "r_")
        cdt = e.type.dtype.compute
        xb = BodyBuilder(self, space, cname, "x")
        x = xb.operand_conv(*xb.expr(e.args[0]), e.type.dtype)
        gb = BodyBuilder(self, space, cname, "g")
        gamma = beta = ""
        if e.op in (Op.LAYERNORM, Op.RMSNORM):
            gamma = gb.operand_conv(*gb.expr(e.args[1]), e.type.dtype)
        if e.op is Op.LAYERNORM:
            beta = gb.operand_conv(*gb.expr(e.args[2]), e.type.dtype)
        sb = BodyBuilder(self, space, cname, "s")
        y = "y"
        r = sb.round_to(y, u.ty.dtype)
        sb.store(u.value, r, u.ty.dtype)
        row_len = space.view.shape[-1]
        eps = float(e.value) if e.value is not None else 0.0
        self.stage_kernels.setdefault(u.stage, []).append(cname)
        return pl.RowKernel(
            cname,
            (u.stage,),
            cast(Any, e.op.value),
            space,
            row_len,
            tuple(xb.stmts),
            x,
            tuple(gb.stmts),
            tuple(sb.stmts),
            y,
            gamma,
            beta,
            eps,
            cdt,
            u.ty.pstage,
        )

    def matmul(self, u: Unit, chunks: int | None) -> pl.Matmul:
        e = u.expr
        a, b = e.args
        assert a.name is not None and b.name is not None
        at, bt = a.type, b.type
        if len(bt.shape) > 2:
            return self.batched_matmul(u, chunks)
        K = bt.shape[0].value
        N = bt.shape[1].value
        av, bv, cv = self.view(a.name), self.view(b.name), self.view(u.value)
        k_loc = K // self.G if (av.kind == "block" and av.inner == 1) else K
        n_loc = N // self.G if (bv.kind == "block" and bv.inner == 1) else N
        if at.layout.is_sliced and av.kind == "flat" and len(at.shape) == 1:
            raise EmitError(f"matmul '{u.stage}': a flat-sliced vector operand is not supported")
        m_loc = av.count // k_loc
        if bv.count != k_loc * n_loc or cv.count != m_loc * n_loc:
            raise EmitError(
                f"matmul '{u.stage}': per-rank shapes do not line up "
                f"(a {av.count}, b {bv.count}, c {cv.count} elements)",
            )
        a_off = c_off = pl.ZERO
        m = m_loc
        if chunks:
            if m_loc % chunks:
                raise EmitError(
                    f"matmul '{u.stage}': {m_loc} rows do not split into {chunks} chunks"
                )
            m = m_loc // chunks
            a_off = pl.Offset(per_chunk=m * k_loc)
            c_off = pl.Offset(per_chunk=m * n_loc)
        self.note_read(a.name, "matmul", False)
        self.note_read(b.name, "matmul", False)
        cname = self.names.fresh(f"{self.ns}_{u.value}", "mm_")
        self.stage_kernels.setdefault(u.stage, []).append(cname + " (cuBLAS GEMM)")
        return pl.Matmul(
            cname,
            u.stage,
            self.buffer_of(a.name).cname,
            self.buffer_of(b.name).cname,
            self.buffer_of(u.value).cname,
            m,
            n_loc,
            k_loc,
            u.ty.dtype,
            a_off,
            c_off,
            u.ty.pstage,
        )

    def batched_matmul(self, u: Unit, chunks: int | None) -> pl.Matmul:
        """``a[..., M, K] × b[..., K, N]``: one GEMM per index of the rank's broadcast
        batch, each operand at its own batch strides (0 where it is broadcast); a
        replicated operand of a result sliced on a batch dimension is read at the
        rank's block of that dimension (docs/codegen.md, matmul)."""
        e = u.expr
        a, b = e.args
        assert a.name is not None and b.name is not None
        G = self.G
        out = _local_shape(u.ty, G)
        r = len(out)
        K = chunks or 1
        if chunks and (r < 3 or out[0] % K or len(_local_shape(a.type, G)) != r):
            raise EmitError(
                f"matmul '{u.stage}': a batched matmul is chunked along its first batch "
                f"dimension, which its left operand must have and {K} must divide",
                e.span,
            )
        d_out = block_dim(u.ty.layout, u.ty.shape, G)
        batch_d = d_out if d_out is not None and d_out < r - 2 else None
        ops = []
        for x in (a, b):
            stored = _local_shape(x.type, G)
            strides = _strides(stored)
            eff = list(stored)
            per_rank = 0
            j = None if batch_d is None else batch_d - r + len(stored)
            if x.type.layout.is_replicated and j is not None and j >= 0 and stored[j] != 1:
                eff[j] = stored[j] // G
                per_rank = eff[j] * strides[j]
            ops.append((stored, strides, eff, per_rank))
        (a_st, a_str, a_eff, a_rank), (b_st, b_str, b_eff, b_rank) = ops
        m, n, k_loc = out[-2], out[-1], a_eff[-1]
        if b_eff[-2] != k_loc or a_eff[-2] != m or b_eff[-1] != n:
            raise EmitError(
                f"matmul '{u.stage}': per-rank shapes do not line up "
                f"(a {tuple(a_eff)}, b {tuple(b_eff)}, c {tuple(out)})",
                e.span,
            )
        c_str = _strides(out)
        dims: list[pl.BatchDim] = []
        for i in range(r - 2):
            # chunk k of a group that chunks dimension 0: block k of the first batch dimension
            extent = out[i] // K if i == 0 else out[i]
            if extent == 1:
                continue
            ja, jb = i - r + len(a_st), i - r + len(b_st)
            sa = a_str[ja] if ja >= 0 and a_eff[ja] != 1 else 0
            sb = b_str[jb] if jb >= 0 and b_eff[jb] != 1 else 0
            if chunks and i == 0 and sb:
                raise EmitError(
                    f"matmul '{u.stage}': its right operand has the chunked first batch "
                    "dimension; only its left operand may be chunked",
                    e.span,
                )
            dims.append(pl.BatchDim(extent, sa, sb, c_str[i]))
        merged: list[pl.BatchDim] = []
        for bd in dims:
            if merged:
                p = merged[-1]
                if (
                    p.a_stride == bd.a_stride * bd.extent
                    and p.b_stride == bd.b_stride * bd.extent
                    and p.c_stride == bd.c_stride * bd.extent
                ):
                    merged[-1] = pl.BatchDim(
                        p.extent * bd.extent, bd.a_stride, bd.b_stride, bd.c_stride
                    )
                    continue
            merged.append(bd)
        self.note_read(a.name, "matmul", False)
        self.note_read(b.name, "matmul", False)
        cname = self.names.fresh(f"{self.ns}_{u.value}", "mm_")
        self.stage_kernels.setdefault(u.stage, []).append(cname + " (cuBLAS batched GEMM)")
        return pl.Matmul(
            cname,
            u.stage,
            self.buffer_of(a.name).cname,
            self.buffer_of(b.name).cname,
            self.buffer_of(u.value).cname,
            m,
            n,
            k_loc,
            u.ty.dtype,
            pl.Offset(per_rank=a_rank, per_chunk=out[0] // K * a_str[0] if chunks else 0),
            pl.Offset(per_chunk=out[0] // K * c_str[0]) if chunks else pl.ZERO,
            u.ty.pstage,
            b_offset=pl.Offset(per_rank=b_rank),
            batch=tuple(merged) or (pl.BatchDim(1, 0, 0, 0),),
        )


def _compute(ty: TensorType) -> TensorType:
    """`ty` in its compute dtype: a temporary inside a stage is not rounded (the stage
    rounds once, as the reference does)."""
    return dataclasses.replace(ty, dtype=ty.dtype.compute)


def _local_shape(ty: TensorType, group: int) -> list[int]:
    """The shape of a rank's array of a value of type `ty` (its block, when sliced)."""
    shape = list(shape_values(ty.shape))
    d = block_dim(ty.layout, ty.shape, group)
    if d is not None:
        shape[d] //= group
    return shape


def _strides(shape: Sequence[int]) -> list[int]:
    """Row-major element strides."""
    out = [1] * len(shape)
    for j in range(len(shape) - 2, -1, -1):
        out[j] = out[j + 1] * shape[j + 1]
    return out
