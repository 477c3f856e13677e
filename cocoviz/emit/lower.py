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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from cocoviz.emit import plan as pl
from cocoviz.emit.names import NameTable, c_double, file_stem
from cocoviz.errors import CocovizError, UsageError
from cocoviz.ir.graph import contracted_order, users
from cocoviz.ir.nodes import (
    BINARY_CALLS,
    BINARY_INFIX,
    COLLECTIVES,
    COMPARISONS,
    REDUCTIONS,
    ROWWISE,
    UNARY_CALLS,
    Expr,
    Group,
    GroupKind,
    Op,
    Program,
    ReduceOp,
    Stage,
)
from cocoviz.ir.types import DType, Layout, TensorType, block_dim, shape_values

Collectives = Literal["nccl", "nccl-device"]

REDUCE_BLOCKS = 1024
"""Per-block partials of a two-phase reduction (CUDA grid size of reduction kernels)."""

_ROP = {
    ReduceOp.SUM: "sum",
    ReduceOp.PROD: "prod",
    ReduceOp.MAX: "max",
    ReduceOp.MIN: "min",
    ReduceOp.AVG: "avg",
}
_RED_KIND: dict[Op, Any] = {Op.SUM: "sum", Op.NORM: "sumsq", Op.AMAX: "absmax"}


class EmitError(CocovizError):
    """A program or schedule the emitter cannot lower (exit 1)."""


def compute_dtype(dt: DType) -> DType:
    """The dtype arithmetic runs in (semantics notes): f32 for f16/bf16/f32."""
    if dt.is_half or dt is DType.F32:
        return DType.F32
    if dt is DType.F64:
        return DType.F64
    return DType.I64


# --------------------------------------------------------------------------- views


def view_of(ty: TensorType, group: int, chunks: int | None = None) -> pl.View:
    """The per-rank storage view of a value of type `ty` (chunked when `chunks` is set
    and the value is sliced inside an overlapped group)."""
    shape = shape_values(ty.shape)
    n = 1
    for s in shape:
        n *= s
    lay: Layout = ty.layout
    if lay.is_replicated:
        return pl.View("replicated", shape, n)
    if lay.is_local:
        return pl.View("local", shape, n)
    if chunks:
        return pl.View("chunked", shape, n // group, chunks=chunks)
    d = block_dim(lay, ty.shape, group) if lay.dim is not None else None
    if d is None:
        return pl.View("flat", shape, n // group)
    outer = 1
    for s in shape[:d]:
        outer *= s
    inner = 1
    for s in shape[d + 1 :]:
        inner *= s
    return pl.View("block", shape, n // group, outer=outer, extent=shape[d], inner=inner)


def _with_chunks(v: pl.View, chunks: int) -> pl.View:
    return dataclasses.replace(v, chunks=chunks)


# --------------------------------------------------------------------------- units


@dataclass
class Unit:
    """One thing a stage (or a lifted sub-expression) computes."""

    kind: Literal["ew", "red", "row", "matmul", "coll"]
    value: str
    """The value it defines: a stage name or a temporary (``stage.tK``)."""
    stage: str
    expr: Expr
    ty: TensorType
    """Type of the value (temporaries: compute dtype)."""
    chunks: int | None = None


@dataclass
class _Reads:
    """Who reads a value, for deciding what lives in registers."""

    in_kernel_register: set[str] = field(default_factory=set)
    elsewhere: bool = False


# ---------------------------------------------------------------------- body builder


class BodyBuilder:
    """Builds the SSA statements of one kernel body over `space`."""

    def __init__(self, lw: _ProgramLowerer, space: pl.Space, kernel: str, prefix: str = "") -> None:
        self.lw = lw
        self.space = space
        self.kernel = kernel
        self.prefix = prefix
        self.stmts: list[pl.Stmt] = []
        self._n = 0
        self._cache: dict[tuple[object, ...], str] = {}
        self.bound: dict[str, str] = {}

    @property
    def L(self) -> str:  # noqa: N802 - the index names of plan.py
        """The element's index in per-rank storage (emitted on first use)."""
        return self._L()

    @property
    def E(self) -> str:  # noqa: N802
        """The element's global element index (emitted on first use)."""
        return self._E(self.space.view)

    # ---- helpers
    def var(self) -> str:
        self._n += 1
        return f"{self.prefix}v{self._n}"

    def emit(self, key: tuple[object, ...] | None, **kw: Any) -> str:
        if key is not None and key in self._cache:
            return self._cache[key]
        dst = self.var()
        self.stmts.append(pl.Stmt(dst=dst, **kw))
        if key is not None:
            self._cache[key] = dst
        return dst

    def _L(self) -> str:
        if self.space.in_chunk_loop:
            per_chunk = self.space.view.count // self.space.view.chunks
            return self.emit(("L",), kind="index_affine", a="i", n2=per_chunk)
        return "i"

    def _E(self, view: pl.View) -> str:
        if view.kind in ("replicated", "local"):
            return self.L
        if view.kind == "flat":
            return self.emit(("E",), kind="index_affine", a=self.L, n1=view.count)
        if view.kind == "chunked":
            c = view.count // view.chunks
            return self.emit(("E",), kind="index_affine", a="i", n1=c, n2=view.numel // view.chunks)
        return self.emit(
            ("E",),
            kind="index_block_g",
            a=self.L,
            n1=view.blk * view.inner,
            n2=view.inner,
            n3=view.extent * view.inner,
            terms=((view.blk, 0, 0),),
        )

    def element_index(self, shape: tuple[int, ...]) -> str:
        """Global element index of the current element broadcast to `shape`."""
        space_shape = self.space.view.shape
        if shape == space_shape:
            return self.E
        if not shape:
            return "0"
        terms: list[tuple[int, int, int]] = []
        off = len(space_shape) - len(shape)
        rs = 1
        res_strides = [0] * len(space_shape)
        for d in range(len(space_shape) - 1, -1, -1):
            res_strides[d] = rs
            rs *= space_shape[d]
        os_ = 1
        for d in range(len(shape) - 1, -1, -1):
            if shape[d] != 1:
                terms.append((res_strides[d + off], space_shape[d + off], os_))
            os_ *= shape[d]
        return self.emit(("bcast", shape), kind="index_bcast", a=self.E, terms=tuple(terms))

    def storage_index(self, name: str, ty: TensorType) -> str:
        view = self.lw.view(name)
        buf = self.lw.buffer_of(name)
        shape = shape_values(ty.shape)
        if not shape:
            return "0"
        if buf.addressing == "global":
            return self.element_index(shape)
        if view == self.space.view:
            return self.L
        g = self.element_index(shape)
        if view.kind in ("replicated", "local"):
            return g
        if view.kind == "flat":
            return self.emit(("flat_l", name), kind="index_affine", a=g, n1=-view.count)
        if view.kind == "block":
            return self.emit(
                ("block_l", name), kind="index_block_l", a=g,
                n1=view.extent * view.inner, n2=view.inner, n3=view.blk,
            )  # fmt: skip
        raise EmitError(
            f"'{name}' is sliced chunk by chunk inside an overlapped group and read at "
            "other positions; the emitter cannot index it",
            hint="keep values produced inside an overlapped group inside it",
        )

    def operand_conv(self, var: str, src: DType, dst: DType) -> str:
        """`var` (compute type of `src`) as a value of `dst` in `dst`'s compute type."""
        if src == dst:
            return var
        return self.emit(("conv", var, dst), kind="convert", a=var, dtype=dst, src_dtype=src)

    def round_to(self, var: str, dt: DType) -> str:
        if dt.is_half or dt is DType.I32:
            return self.emit(("round", var, dt), kind="round", a=var, dtype=dt)
        return var

    # ---- expressions
    def expr(self, e: Expr) -> tuple[str, DType]:
        """The SSA variable holding `e` in the compute type of its dtype."""
        op = e.op
        ty = e.type
        if op is Op.REF:
            assert e.name is not None
            return self.read(e.name, ty), ty.dtype
        if op is Op.CONST:
            assert e.value is not None
            return self.emit(
                ("const", e.value, ty.dtype),
                kind="const",
                literal=c_double(e.value),
                dtype=ty.dtype,
            ), ty.dtype
        if op is Op.SLICE:
            v, dt = self.expr(e.args[0])
            return v, dt
        if op is Op.CAST:
            v, dt = self.expr(e.args[0])
            assert e.dtype_arg is not None
            return self.operand_conv(v, dt, e.dtype_arg), e.dtype_arg
        if op is Op.DROPOUT:
            x = self.operand(e.args[0], ty.dtype)
            d = self.generator_index(e.args[0].type)
            assert e.tag is not None and e.value is not None
            key, const = self.lw.dropout(e.tag, float(e.value), ty.dtype)
            return self.emit(
                None, kind="dropout", a=x, b=d, buffer=key, c=const, dtype=ty.dtype
            ), ty.dtype
        if op in COMPARISONS:
            common = _common_dtype(e.args)
            a = self.operand(e.args[0], common)
            b = self.operand(e.args[1], common)
            return self.emit(
                None, kind="compare", op=op.name.lower(), a=a, b=b, dtype=common
            ), common
        if op is Op.WHERE:
            c = self.condition(e.args[0])
            a = self.operand(e.args[1], ty.dtype)
            b = self.operand(e.args[2], ty.dtype)
            return self.emit(None, kind="where", a=c, b=a, c=b, dtype=ty.dtype), ty.dtype
        if op is Op.NEG or op in UNARY_CALLS:
            a = self.operand(e.args[0], ty.dtype)
            return self.emit(None, kind="unary", op=op.name.lower(), a=a, dtype=ty.dtype), ty.dtype
        if op in BINARY_INFIX or op in BINARY_CALLS:
            a = self.operand(e.args[0], ty.dtype)
            b = self.operand(e.args[1], ty.dtype)
            return self.emit(
                None, kind="binary", op=op.name.lower(), a=a, b=b, dtype=ty.dtype
            ), ty.dtype
        raise AssertionError(f"unlifted {op.value} in a kernel body")

    def operand(self, e: Expr, dt: DType) -> str:
        if e.op is Op.CONST and e.value is not None:
            # a literal takes the operand dtype straight from its source value
            return self.emit(
                ("const", e.value, dt), kind="const", literal=c_double(e.value), dtype=dt
            )
        v, src = self.expr(e)
        return self.operand_conv(v, src, dt)

    def condition(self, e: Expr) -> str:
        if e.op in COMPARISONS:
            return self.expr(e)[0]
        v, dt = self.expr(e)
        zero = self.emit(("const", 0, dt), kind="const", literal="0.0", dtype=dt)
        return self.emit(None, kind="compare", op="ne", a=v, b=zero, dtype=dt)

    def generator_index(self, ty: TensorType) -> str:
        e = self.element_index(shape_values(ty.shape))
        if ty.layout.is_local:
            n = 1
            for s in shape_values(ty.shape):
                n *= s
            return self.emit(("gen_local", e), kind="index_affine", a=e, n1=n)
        return e

    def read(self, name: str, ty: TensorType) -> str:
        if name in self.lw.param_names:
            return self.emit(
                ("param", name), kind="param", buffer=self.lw.param_cname[name], dtype=ty.dtype
            )
        shape = shape_values(ty.shape)
        if (
            name in self.bound
            and shape == self.space.view.shape
            and self.lw.view(name) == self.space.view
        ):
            self.lw.note_read(name, self.kernel, register=True)
            return self.bound[name]
        self.lw.note_read(name, self.kernel, register=False)
        buf = self.lw.buffer_of(name)
        if not shape:
            return self.emit(
                ("load", name, "0"), kind="load_scalar", buffer=buf.cname, dtype=buf.dtype
            )
        idx = self.storage_index(name, ty)
        return self.emit(("load", name, idx), kind="load", buffer=buf.cname, a=idx, dtype=buf.dtype)

    def store(self, name: str, var: str, dt: DType) -> None:
        buf = self.lw.buffer_of(name)
        ty = self.lw.type_of(name)
        idx = self.storage_index(name, ty)
        v = self.operand_conv(var, dt, buf.dtype)
        self.stmts.append(pl.Stmt(kind="store", buffer=buf.cname, a=idx, b=v, dtype=buf.dtype))


def _common_dtype(args: Sequence[Expr]) -> DType:
    tensors = [a for a in args if not a.type.is_scalar]
    return (tensors[0] if tensors else args[0]).type.dtype


# ---------------------------------------------------------------------- the lowerer


class _ProgramLowerer:
    def __init__(
        self,
        program: Program,
        title: str,
        ns: str,
        collectives: Collectives,
        names: NameTable,
        param_cname: dict[str, str],
        register_only: frozenset[str] = frozenset(),
    ) -> None:
        self.p = program
        self.title = title
        self.ns = ns
        self.collectives = collectives
        self.names = names
        self.G = program.grid.group
        self.param_names = {q.name for q in program.params}
        self.param_cname = param_cname
        self.register_only = register_only
        self.users = users(program)
        self.types: dict[str, TensorType] = {i.name: i.ty for i in program.inputs}
        self.types.update({s.name: s.ty for s in program.stages})
        self.chunks_of: dict[str, int] = {}
        for g in program.groups:
            if g.kind is GroupKind.OVERLAPPED:
                assert g.chunks is not None
                for n in g.stages():
                    self.chunks_of[n] = g.chunks
        self.group_of: dict[str, Group] = {}
        for g in program.groups:
            for n in g.stages():
                self.group_of[n] = g
        self.views: dict[str, pl.View] = {}
        self.buffers: dict[str, pl.Buffer] = {}
        self.buffer_order: list[str] = []
        self.value_buffer: dict[str, str] = {}
        self.reads: dict[str, _Reads] = {}
        self.keys: dict[str, pl.Key] = {}
        self.dropouts: dict[tuple[float, DType], pl.DropoutConst] = {}
        self.stage_kernels: dict[str, list[str]] = {}
        self.stage_colls: dict[str, list[str]] = {}
        self.stage_streams: dict[str, set[str]] = {}
        self.symmetric: set[str] = set()
        self.units: dict[str, list[Unit]] = {}
        self.lifted_types: dict[str, TensorType] = {}
        self._uses_matmul = False
        self._uses_device = False
        self._chunk_loops = 0

    # ---- queries used by BodyBuilder
    def type_of(self, name: str) -> TensorType:
        if name in self.types:
            return self.types[name]
        return self.lifted_types[name]

    def view(self, name: str) -> pl.View:
        if name not in self.views:
            self.views[name] = view_of(
                self.type_of(name),
                self.G,
                self.chunks_of.get(self._stage_of(name))
                if self.type_of(name).layout.is_sliced
                else None,
            )
        return self.views[name]

    def _stage_of(self, value: str) -> str:
        return value.split(".", 1)[0] if value not in self.types else value

    def buffer_of(self, name: str) -> pl.Buffer:
        return self.buffers[self.value_buffer[name]]

    def note_read(self, name: str, kernel: str, register: bool) -> None:
        r = self.reads.setdefault(name, _Reads())
        if register:
            r.in_kernel_register.add(kernel)
        else:
            r.elsewhere = True

    def dropout(self, tag: str, p: float, dt: DType) -> tuple[str, str]:
        if tag not in self.keys:
            self.keys[tag] = pl.Key(self.names.fresh(f"{self.ns}_{tag}", "key_"), tag)
        if (p, dt) not in self.dropouts:
            self.dropouts[(p, dt)] = pl.DropoutConst(
                self.names.fresh(f"{self.ns}_p{len(self.dropouts)}_{dt.value}", "drop_"), p, dt
            )
        return self.keys[tag].cname, self.dropouts[(p, dt)].cname

    # ---- buffers
    def add_buffer(self, value: str, buf: pl.Buffer) -> pl.Buffer:
        self.buffers[buf.cname] = buf
        self.buffer_order.append(buf.cname)
        self.value_buffer[value] = buf.cname
        return buf

    def new_buffer(
        self, value: str, role: Literal["input", "stage", "temp", "partial", "acc", "staging"],
        dtype: DType, count: int, pstage: int | None, **kw: Any,
    ) -> pl.Buffer:  # fmt: skip
        prefix = {
            "input": "in_",
            "stage": "v_",
            "temp": "t_",
            "partial": "p_",
            "acc": "a_",
            "staging": "s_",
        }[role]
        cname = self.names.fresh(f"{self.ns}_{value}", prefix)
        return self.add_buffer(value, pl.Buffer(cname, value, dtype, count, pstage, role, **kw))

    def alias_buffer(
        self,
        value: str,
        target: str,
        offset: pl.Offset = pl.ZERO,
        addressing: Literal["local", "global"] = "local",
    ) -> pl.Buffer:
        t = self.buffer_of(target)
        root = t.alias or t.cname
        base = t.offset if t.alias else pl.ZERO
        off = pl.Offset(
            base.const + offset.const,
            base.per_rank + offset.per_rank,
            base.per_chunk + offset.per_chunk,
        )
        ty = self.type_of(value)
        cname = self.names.fresh(f"{self.ns}_{value}", "v_")
        return self.add_buffer(
            value,
            pl.Buffer(
                cname,
                value,
                ty.dtype,
                self.view(value).count,
                ty.pstage,
                "stage",
                alias=root,
                offset=off,
                addressing=addressing,
            ),
        )

    # ---- lowering
    def lower(self) -> pl.ProgramPlan:
        p = self.p
        inputs: list[pl.InputInit] = []
        for i in p.inputs:
            v = self.view(i.name)
            b = self.new_buffer(i.name, "input", i.ty.dtype, v.count, i.ty.pstage)
            inputs.append(
                pl.InputInit(b.cname, i.name, i.ty.dtype, v, i.ty.pstage, i.ty.layout.is_local)
            )
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
        outputs = []
        for o in p.outputs:
            ty = self.type_of(o)
            v = self.view(o)
            gshape = (self.G, *v.shape) if ty.layout.is_local else v.shape
            outputs.append(
                pl.OutputSpec(o, self.buffer_of(o).cname, ty.dtype, v, ty.pstage, gshape)
            )
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
                )
            )
        bufs = [self.buffers[c] for c in self.buffer_order]
        bufs = [
            dataclasses.replace(b, symmetric=True) if b.cname in self.symmetric else b for b in bufs
        ]
        return pl.ProgramPlan(
            cname=self.ns,
            title=self.title,
            buffers=tuple(bufs),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            steps=tuple(steps),
            keys=tuple(self.keys.values()),
            dropouts=tuple(self.dropouts.values()),
            stages=tuple(stages),
            uses_matmul=self._uses_matmul,
            uses_device_api=self._uses_device,
            chunk_loops=self._chunk_loops,
        )

    # ---- units
    def make_units(self, s: Stage) -> list[Unit]:
        e = s.expr
        op = e.op
        chunks = self.chunks_of.get(s.name)
        if op is Op.MATMUL:
            self._uses_matmul = True
            return [Unit("matmul", s.name, s.name, e, s.ty, chunks)]
        if op in COLLECTIVES:
            return [Unit("coll", s.name, s.name, e, s.ty, chunks)]
        body = e.args[1] if op is Op.UPDATE else e
        out: list[Unit] = []
        counter = [0]

        def lift(x: Expr, top: bool) -> Expr:
            args = tuple(lift(a, False) for a in x.args)
            x2 = dataclasses.replace(x, args=args) if args != x.args else x
            if top:
                return x2
            if x2.op in REDUCTIONS or x2.op in ROWWISE:
                counter[0] += 1
                name = f"{s.name}.t{counter[0]}"
                ty = x2.type
                if x2.op in ROWWISE:
                    ty = dataclasses.replace(ty, dtype=compute_dtype(ty.dtype))
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

    def assign_storage(self) -> None:
        """Buffers for stages and temporaries (in program order), with aliases."""
        outputs = set(self.p.outputs)
        updates = self.p.updates()
        for s in self.p.stages:
            for u in self.units[s.name]:
                if u.value != s.name:
                    ty = u.ty
                    v = self.view(u.value)
                    self.new_buffer(u.value, "temp", ty.dtype, v.count, ty.pstage)
            e = s.expr
            v = self.view(s.name)
            if e.op is Op.UPDATE:
                tgt = e.args[0].name
                assert tgt is not None
                tv = self.view(tgt)
                if tv == v:
                    self.alias_buffer(s.name, tgt)
                    continue
                if tv.kind == "replicated" and v.kind in ("flat", "chunked"):
                    self.alias_buffer(s.name, tgt, addressing="global")
                    continue
                raise EmitError(
                    f"update of '{tgt}' ({tv.kind}) by a {v.kind} value is not supported by the emitter",
                    s.span,
                )
            if e.op is Op.ALLGATHER:
                src = e.args[0].name
                assert src is not None
                sb = self.buffers.get(self.value_buffer.get(src, ""), None)
                if sb is not None and sb.addressing == "global" and sb.alias is not None:
                    self.add_buffer(
                        s.name,
                        pl.Buffer(
                            self.names.fresh(f"{self.ns}_{s.name}", "v_"),
                            s.name,
                            s.ty.dtype,
                            v.count,
                            s.ty.pstage,
                            "stage",
                            alias=sb.alias,
                        ),
                    )
                    continue
            if e.op in (Op.ALLREDUCE, Op.REDUCESCATTER) and s.name not in self.chunks_of:
                src = e.args[0].name
                assert src is not None
                if (
                    self.p.has_stage(src)
                    and self.users.get(src, []) == [s.name]
                    and src not in outputs
                    and src not in updates.values()
                    and src in self.value_buffer
                    and self.buffer_of(src).alias is None
                    and self.view(src).kind in ("local", "replicated")
                ):
                    off = pl.Offset(per_rank=v.count) if e.op is Op.REDUCESCATTER else pl.ZERO
                    self.alias_buffer(s.name, src, off)
                    continue
            if s.name in self.register_only:
                continue
            self.new_buffer(s.name, "stage", s.ty.dtype, v.count, s.ty.pstage)

    # ---- issuing
    def lower_group(self, g: Group) -> list[pl.Step]:
        if g.kind is GroupKind.FUSED:
            members = [s.name for s in self.p.stages if s.name in set(g.stages())]
            label = "fused " + ", ".join(members)
            if self.collectives == "nccl-device":
                dev = self.device_fused(members, None)
                if dev is not None:
                    return dev
                self._device_fallback(members)
            return self.lower_units(members, None, label, fused=True)
        assert g.chunks is not None
        self._chunk_loops += 1
        items: list[pl.ChunkItem] = []
        all_stages: list[str] = []
        for it in g.items:
            if isinstance(it, Group):
                members = [s.name for s in self.p.stages if s.name in set(it.stages())]
                has_comm = any(self.p.stage(m).expr.op in COLLECTIVES for m in members)
                stream: pl.StreamName = "comm" if has_comm else "compute"
                steps: list[pl.Step] | None = None
                if self.collectives == "nccl-device":
                    steps = self.device_fused(members, g.chunks)
                    if steps is None:
                        self._device_fallback(members)
                if steps is None:
                    steps = self.lower_units(
                        members, g.chunks, "fused " + ", ".join(members), fused=True
                    )
                label = "fused(" + ", ".join(members) + ")"
            else:
                members = [it]
                op = self.p.stage(it).expr.op
                stream = "comm" if op in COLLECTIVES else "compute"
                steps = self.lower_units(members, g.chunks, it)
                label = it
            steps = [_on_stream(st, stream) for st in steps]
            for m in members:
                self.stage_streams.setdefault(m, set()).add(stream)
            all_stages.extend(members)
            items.append(pl.ChunkItem(label, stream, tuple(steps)))
        cname = self.names.fresh(f"{self.ns}_overlap_{all_stages[0]}", "ol_")
        pst = self.type_of(all_stages[0]).pstage
        return [
            pl.ChunkLoop(
                cname,
                tuple(all_stages),
                g.chunks,
                tuple(items),
                pst if not self._spans_stages(all_stages) else None,
            )
        ]

    def _spans_stages(self, stages: Iterable[str]) -> bool:
        return len({self.type_of(s).pstage for s in stages}) > 1 or any(
            self.p.stage(s).expr.op is Op.SEND for s in stages
        )

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
                if compute_dtype(dt) != compute_dtype(acc_dt):
                    v = bb.operand_conv(v, dt, acc_dt)
                pname = self.names.fresh(f"{self.ns}_{u.value}", "p_")
                self.buffers[pname] = pl.Buffer(
                    pname, u.value, compute_dtype(acc_dt), REDUCE_BLOCKS, u.ty.pstage, "partial"
                )
                self.buffer_order.append(pname)
                red = pl.Reduction(_RED_KIND[u.expr.op], v, pname, compute_dtype(acc_dt))
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
        cdt = compute_dtype(e.type.dtype)
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
        acc = compute_dtype(dt)
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
            recv_off = pl.Offset(per_rank=c.count, per_chunk=send_off.per_chunk) if rs else send_off
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
        if src_buf != c.recv and rs:
            # this rank's reduced block sits at staging + k·(send per chunk) + tp·count
            idx = db.emit(
                None, kind="index_affine", a="i", n1=c.count, n2=per_send if chunks else 0
            )
        v = db.emit(None, kind="load", buffer=src_buf, a=idx, dtype=acc)
        g = db.emit(None, kind="const", literal=c_double(self.G), dtype=acc)
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
                and sbuf.addressing == "global"
            )
            if sv.kind == "block":
                staging = self.names.fresh(f"{self.ns}_{u.value}_gather", "s_")
                self.buffers[staging] = pl.Buffer(
                    staging, u.value, dt, dv.count, u.ty.pstage, "staging"
                )
                self.buffer_order.append(staging)
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
        elif op in (Op.BROADCAST, Op.REDUCE):
            if sv.count != dv.count:
                raise EmitError(
                    f"{op.value} '{u.stage}' of a sliced value is not supported by the emitter"
                )
            n = dv.count // K
            off = pl.Offset(per_chunk=n) if chunks else pl.ZERO
            c = pl.Collective(
                op=op.value,
                rop=rop if op is Op.REDUCE else None,
                send=sbuf.cname,
                recv=dbuf.cname,
                count=n,
                send_offset=off,
                recv_offset=off,
                root=int(e.value or 0),
                **common,
            )
        else:  # SEND
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
        self.stage_colls.setdefault(u.stage, []).append(f"{cname} ({desc})")
        return c

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
        rs = members[0]
        compute = [m for m, o in zip(members, ops, strict=True) if o not in COLLECTIVES]
        gathers = [m for m, o in zip(members, ops, strict=True) if o is Op.ALLGATHER]
        if any(o in COLLECTIVES and o not in (Op.REDUCESCATTER, Op.ALLGATHER) for o in ops):
            return None
        if any(u.kind != "ew" for m in compute for u in self.units[m]):
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


def _on_stream(step: pl.Step, stream: pl.StreamName) -> pl.Step:
    return dataclasses.replace(step, stream=stream)  # type: ignore[return-value]


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


def strip_schedule(program: Program) -> Program:
    """The program without fused/overlapped groups."""
    return dataclasses.replace(program, groups=())


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
    g = scheduled.grid
    return pl.EmitPlan(
        program=scheduled.name,
        file_stem=file_stem(scheduled.name),
        tp=g.tp,
        pp=g.pp,
        is_grid=g.is_grid,
        dims=tuple((d.name, d.value) for d in scheduled.dims),
        params=params,
        scheduled=sched,
        reference=ref,
        collectives=collectives,
        schedule_name=schedule_name,
        schedule_steps=tuple(schedule_steps),
        seed=seed,
    )
