"""Kernel bodies of the emitter's lowering (docs/codegen.md): the per-rank storage `View`
of a value, the `Unit`s a stage becomes, and `BodyBuilder`, which turns an expression
into the SSA statements (`cocoviz.emit.plan.Stmt`) of one kernel body."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from cocoviz.emit import plan as pl
from cocoviz.emit import routing as emit_routing
from cocoviz.emit.names import c_double
from cocoviz.emit.plan import EmitError
from cocoviz.ir.nodes import (
    AXIS_REDUCTIONS,
    BINARY_CALLS,
    BINARY_INFIX,
    COMPARISONS,
    CONSTANTS,
    PERMUTES,
    ROUTING,
    UNARY_CALLS,
    Expr,
    Op,
    fill_value,
    permutation,
)
from cocoviz.ir.types import (
    DType,
    Layout,
    TensorType,
    axis_layout_text,
    block_dim,
    rank_shape,
    shape_values,
)


class Storage(Protocol):
    """What a kernel body uses of the lowering (`cocoviz.emit.storage.Storage`, which
    builds on this module's views and reads: named here by its shape, so this module
    imports nothing of it)."""

    @property
    def G(self) -> int: ...  # noqa: N802 - the group size's name throughout the emitter

    @property
    def param_names(self) -> set[str]: ...

    @property
    def param_cname(self) -> dict[str, str]: ...

    def type_of(self, name: str) -> TensorType: ...

    def view(self, name: str) -> pl.View: ...

    def buffer_of(self, name: str) -> pl.Buffer: ...

    def note_read(self, name: str, kernel: str, register: bool) -> None: ...

    def dropout(self, tag: str, p: float, dt: DType) -> tuple[str, str]: ...

    def dp_alias(self, name: str, count: int) -> str: ...

# --------------------------------------------------------------------------- views


def view_of(ty: TensorType, group: int, chunks: int | None = None, dp: int = 1) -> pl.View:
    """The per-rank storage view of a value of type `ty` (chunked when `chunks` is set
    and the value is sliced inside an overlapped group); on a grid with D = `dp` > 1, a
    value's layout over dp is the view's `dp` (docs/language.md, rank grids)."""
    v = _tp_view_of(ty, group, chunks)
    if ty.dp.is_replicated:  # every value of a program without a dp axis
        return v
    if ty.dp.is_local:
        return dataclasses.replace(v, dp="local")
    if ty.dp.dim is not None or chunks:
        raise EmitError(
            f"a value laid out {axis_layout_text(ty.dp, 'dp')}"
            + (" inside an overlapped group" if chunks else "")
            + " is not supported yet (code generation: the emitter stores a value sliced over "
            "dp as the flat 1/D of its tp part, `sliced(over=dp)`)",
            hint="lay it out sliced(over=dp), or check and run it with `cocoviz verify` "
            "and `cocoviz run --mpi`",
        )
    return dataclasses.replace(v, count=v.count // dp, dp="sliced", tp_count=v.count)


def _tp_view_of(ty: TensorType, group: int, chunks: int | None = None) -> pl.View:
    shape = shape_values(ty.shape)
    n = 1
    for s in shape:
        n *= s
    lay: Layout = ty.layout
    if lay.is_replicated:
        return pl.View("replicated", shape, n)
    if lay.is_local:
        return pl.View("local", shape, n)
    d = block_dim(lay, ty.shape, group) if lay.dim is not None else None
    if chunks and not d:
        return pl.View("chunked", shape, n // group, chunks=chunks)
    if d is None:
        return pl.View("flat", shape, n // group)
    outer = 1
    for s in shape[:d]:
        outer *= s
    inner = 1
    for s in shape[d + 1 :]:
        inner *= s
    # Inside a group that chunks dimension 0 a value sliced along another dimension keeps
    # its layout: chunk k is block k of the rank's array (docs/codegen.md).
    return pl.View(
        "block", shape, n // group, outer=outer, extent=shape[d], inner=inner, chunks=chunks or 1
    )


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
class Reads:
    """Who reads a value, for deciding what lives in registers."""

    in_kernel_register: set[str] = field(default_factory=set)
    elsewhere: bool = False


# ---------------------------------------------------------------------- body builder


class BodyBuilder:
    """Builds the SSA statements of one kernel body over `space`."""

    def __init__(self, lw: Storage, space: pl.Space, kernel: str, prefix: str = "") -> None:
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
        if view.dp == "sliced":
            raise EmitError(
                f"kernel {self.kernel} reads a value at another element than its own part "
                "sliced over dp (an index, a broadcast or a generator over the global "
                "element): not supported yet (code generation)",
                hint="compute it before the reducescatter over dp, or after the allgather",
            )
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

    def dp_part(self, e: Expr) -> tuple[str, DType]:
        """`slice(x, over=dp)` of a value replicated over dp, in a kernel over a value
        sliced over dp: x evaluated on this rank's dp part, where `read` takes each
        dp-replicated operand's part (`dp_read`)."""
        if self.space.view.dp != "sliced":
            raise EmitError(
                "slice(…, over=dp) read in a kernel over a value that is not sliced over dp "
                "is not supported yet (code generation)",
                e.span,
                hint="combine it with the value sliced over dp it is sliced for",
            )
        return self.expr(e.args[0])

    def dp_read(self, name: str) -> str | None:
        """In a kernel over a value sliced over dp, the buffer of this rank's dp part of
        `name` when it is replicated over dp with the tp part of the kernel's value: the
        tp part at ``dp·count`` (a buffer alias, `Storage.dp_alias`); None otherwise."""
        want = self.space.view
        view = self.lw.view(name)
        if want.dp != "sliced" or view.dp != "replicated":
            return None
        if dataclasses.replace(want, count=want.tp_count, dp="replicated", tp_count=0) != view:
            return None
        return self.lw.dp_alias(name, want.count)

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
        if op is Op.SLICE and e.tag == "dp":
            return self.dp_part(e)
        if op is Op.SLICE:
            v, dt = self.expr(e.args[0])
            return v, dt
        if op is Op.RESHAPE:
            return self.reshaped(e.args[0]), e.args[0].type.dtype
        if op in PERMUTES:
            return self.permuted(e), e.args[0].type.dtype
        if op in AXIS_REDUCTIONS:
            return self.axis_reduced(e)
        if op in ROUTING:
            return emit_routing.routed(self, e)
        if op is Op.IOTA:
            return self.iota(e), e.type.dtype
        if op in CONSTANTS:  # folded: a literal, never stored
            fill = fill_value(e)
            return self.emit(
                ("const", fill, ty.dtype), kind="const", literal=c_double(fill), dtype=ty.dtype
            ), ty.dtype
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

    def reshaped(self, x: Expr) -> str:
        """The operand of `reshape` at the element's own storage index: each rank's part
        of a reshaped value is the same row-major array (docs/language.md, reshape)."""
        if x.op is not Op.REF or x.name is None or x.name in self.lw.param_names:
            raise EmitError(
                "the emitter needs the operand of reshape to be a named value",
                x.span,
                hint="name it first: t = <the operand>, then reshape(t, …)",
            )
        buf = self.lw.buffer_of(x.name)
        if (
            buf.addressing == "global"
            or self.lw.view(x.name).kind == "chunked"
            or self.space.view.kind == "chunked"
        ):
            raise EmitError(
                f"reshape of '{x.name}': the emitter copies a rank's array as it is stored, "
                "and this one is stored chunk by chunk or at global positions",
                x.span,
                hint="reshape a value outside overlapped groups and in-place updates",
            )
        self.lw.note_read(x.name, self.kernel, register=False)
        return self.emit(
            ("load", x.name, self.L), kind="load", buffer=buf.cname, a=self.L, dtype=buf.dtype
        )

    def permuted(self, e: Expr) -> str:
        """`transpose`/`permute` of a named value, at the top of its unit (the lowering
        lifts it so): element L of the rank's result array is element Σ ((L / os_k) %
        O_k) · is_{perm[k]} of the rank's operand array, O the result's per-rank shape and
        os, is the row-major strides (docs/language.md, transpose and permute)."""
        x = e.args[0]
        assert x.op is Op.REF and x.name is not None
        G = self.lw.G
        buf = self._stored_operand(e, x.name)
        perm = permutation(e)
        src = rank_shape(x.type, G)
        out = [src[p] for p in perm]
        src_strides = _row_major(src)
        out_strides = _row_major(out)
        terms = tuple(
            (out_strides[k], out[k], src_strides[perm[k]])
            for k in range(len(out) - 1, -1, -1)
            if out[k] != 1
        )
        self.lw.note_read(x.name, self.kernel, register=False)
        idx = self.emit(("perm", x.name, perm), kind="index_bcast", a=self.L, terms=terms)
        return self.emit(
            ("load", x.name, idx), kind="load", buffer=buf.cname, a=idx, dtype=buf.dtype
        )

    def iota(self, e: Expr) -> str:
        """`iota(T[DIMS], dim=d)`: the coordinate along d of the element's global index in
        the constant's shape, converted to T (docs/language.md, constants)."""
        shape = shape_values(e.type.shape)
        d = int(e.value or 0)
        g = self.generator_index(e.type)  # local values: the index within the rank's tensor
        stride = 1
        for s in shape[d + 1 :]:
            stride *= s
        coord = self.emit(("iota", g, stride, shape[d]), kind="index_bcast", a=g,
                          terms=((stride, shape[d], 1),))  # fmt: skip
        return self.operand_conv(coord, DType.I64, e.type.dtype)

    def axis_reduced(self, e: Expr) -> tuple[str, DType]:
        """`sum/mean/amax/amin(x, dim=d)` of a named value, at the top of its unit: the
        result element's line along d of the rank's operand array, accumulated in x's
        compute type in one loop (`reduce_axis`); `mean` divides by the whole extent of d
        (docs/language.md, reductions along a dimension)."""
        x = e.args[0]
        assert x.op is Op.REF and x.name is not None and isinstance(e.value, int)
        G = self.lw.G
        buf = self._stored_operand(e, x.name)
        src = rank_shape(x.type, G)
        out = rank_shape(e.type, G)
        d = e.value
        keep = e.tag == "keepdim"
        dims = list(range(len(src))) if keep else [k for k in range(len(src)) if k != d]
        src_strides = _row_major(src)
        out_strides = _row_major(out)
        terms = tuple(
            (out_strides[k], out[k], src_strides[dims[k]])
            for k in range(len(out) - 1, -1, -1)
            if out[k] != 1
        )
        self.lw.note_read(x.name, self.kernel, register=False)
        base = self.emit(("axis", x.name, d, keep), kind="index_bcast", a=self.L, terms=terms)
        acc = x.type.dtype.compute
        var = self.emit(
            None, kind="reduce_axis", a=base, buffer=buf.cname, n1=src[d], n2=src_strides[d],
            n3=x.type.shape[d].value, op=_AXIS_STMT[e.op], dtype=acc, src_dtype=buf.dtype,
        )  # fmt: skip
        return var, acc

    def _stored_operand(self, e: Expr, name: str) -> pl.Buffer:
        """The buffer of the named operand of a node that reads other elements than its
        own, refused where it is not the rank's array as it is stored."""
        buf = self.lw.buffer_of(name)
        if (
            buf.addressing == "global"
            or self.lw.view(name).kind == "chunked"
            or self.space.view.kind == "chunked"
        ):
            raise EmitError(
                f"{e.op.value} of '{name}': the emitter reads a rank's array as it is "
                "stored, and inside this group it is stored chunk by chunk or at global "
                "positions (an overlapped group, an in-place update, a fused collective kernel)",
                e.span,
                hint="make it a stage of its own outside the group, or emit with "
                "--collectives nccl",
            )
        shape = shape_values(e.type.shape)
        if self.space.view.shape != shape:
            raise EmitError(
                f"{e.op.value} of '{name}' would run in a kernel over {list(self.space.view.shape)}"
                f", not over its own shape {list(shape)}: a fused collective kernel computes "
                "its members element by element",
                e.span,
                hint="make it a stage of its own outside the fused group, or emit with "
                "--collectives nccl",
            )
        return buf

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
        part = self.dp_read(name)
        if part is not None:
            return self.emit(
                ("load", part, self.L), kind="load", buffer=part, a=self.L, dtype=buf.dtype
            )
        idx = self.storage_index(name, ty)
        return self.emit(("load", name, idx), kind="load", buffer=buf.cname, a=idx, dtype=buf.dtype)

    def store(self, name: str, var: str, dt: DType) -> None:
        buf = self.lw.buffer_of(name)
        ty = self.lw.type_of(name)
        idx = self.storage_index(name, ty)
        v = self.operand_conv(var, dt, buf.dtype)
        self.stmts.append(pl.Stmt(kind="store", buffer=buf.cname, a=idx, b=v, dtype=buf.dtype))


_AXIS_STMT = {Op.SUM_DIM: "sum", Op.MEAN: "mean", Op.AMAX_DIM: "max", Op.AMIN: "min"}
"""The `reduce_axis` statement's operator for each reduction along a dimension."""


def _row_major(shape: Sequence[int]) -> list[int]:
    out = [1] * len(shape)
    for j in range(len(shape) - 2, -1, -1):
        out[j] = out[j + 1] * shape[j + 1]
    return out


def _common_dtype(args: Sequence[Expr]) -> DType:
    tensors = [a for a in args if not a.type.is_scalar]
    return (tensors[0] if tensors else args[0]).type.dtype
