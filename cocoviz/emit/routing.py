"""Routing by index in emitted kernels, CPU and CUDA alike (docs/language.md, routing;
docs/codegen.md): `gather`, `scatter_add`, `topk`, `topk_indices` and `capacity_slots`,
each the top of a unit of its own over named operands stored as the rank's arrays. One
`route` statement computes the element of the result the thread owns, reading its
operands where the index says, in the order the numpy reference (cocoviz/exec/routing.py)
uses: a scatter_add adds its contributions in index order, topk selects the largest
entries one after the other (equal values by ascending position), capacity_slots counts
the earlier assignments choice-major, then in token order.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from cocoviz.emit import plan as pl
from cocoviz.ir.nodes import Expr, Op
from cocoviz.ir.types import DType, rank_shape


class _Reads(Protocol):
    """What routing uses of the lowering (`cocoviz.emit.storage.Storage`)."""

    @property
    def G(self) -> int: ...  # noqa: N802 - the group size's name throughout the emitter

    def note_read(self, name: str, kernel: str, register: bool) -> None: ...


class BodyBuilder(Protocol):
    """What routing uses of a kernel body (`cocoviz.emit.body.BodyBuilder`, which calls
    into this module: named here by its shape, so this module imports nothing of it)."""

    @property
    def lw(self) -> _Reads: ...

    @property
    def kernel(self) -> str: ...

    @property
    def L(self) -> str: ...  # noqa: N802 - the index names of plan.py

    def emit(self, key: tuple[object, ...] | None, **kw: Any) -> str: ...

    def _stored_operand(self, e: Expr, name: str) -> pl.Buffer: ...


def routed(bb: BodyBuilder, e: Expr) -> tuple[str, DType]:
    """The `route` statement of a routing node at the top of its unit."""
    G = bb.lw.G
    bufs = []
    for a in e.args:
        assert a.op is Op.REF and a.name is not None
        bufs.append(bb._stored_operand(e, a.name))
        bb.lw.note_read(a.name, bb.kernel, register=False)
    out = rank_shape(e.type, G)
    d = int(e.value or 0)
    ints: tuple[int, ...]
    if e.op is Op.GATHER:
        x, idx = e.args
        xs = rank_shape(x.type, G)
        M = math.prod(rank_shape(idx.type, G)[d:])
        R = math.prod(xs[d + 1 :])
        ints = (M, R, xs[d])
        data, index = bufs
    elif e.op is Op.SCATTER_ADD:
        idx, src = e.args
        ish = rank_shape(idx.type, G)[d:]
        ss = rank_shape(src.type, G)
        M = math.prod(ish)
        R = math.prod(out[d + 1 :])
        src_index = ss[d : d + len(ish)]
        # the offset of index position m among src's rows: Σ ((m / ist) % I) · sst over
        # the index dimensions (sst 0 where src has extent 1: the same row for each)
        ist = [math.prod(ish[k + 1 :]) for k in range(len(ish))]
        sst = [math.prod(src_index[k + 1 :]) if src_index[k] != 1 else 0 for k in range(len(ish))]
        terms = [v for k in range(len(ish)) for v in (ist[k], ish[k], sst[k])]
        ints = (out[d], R, M, math.prod(src_index) * R, *terms)
        index, data = bufs
    elif e.op in (Op.TOPK, Op.TOPK_INDICES):
        (x,) = e.args
        xs = rank_shape(x.type, G)
        assert e.shape_arg is not None
        ints = (xs[d], math.prod(xs[d + 1 :]), e.shape_arg[0].value)
        (data,) = bufs
        index = data
    else:
        assert e.op is Op.CAPACITY_SLOTS and e.shape_arg is not None
        E, C = (s.value for s in e.shape_arg)
        T, K = out[-2], out[-1]
        ints = (T, K, E, C)
        (index,) = bufs
        data = index
    ty = e.type.dtype.compute
    var = bb.emit(
        None,
        kind="route",
        a=bb.L,
        op=e.op.value,
        buffer=data.cname,
        buffer2=index.cname,
        dtype=ty,
        src_dtype=data.dtype,
        dtype2=index.dtype,
        ints=ints,
    )
    return var, ty


def route_code(r: Any, s: pl.Stmt) -> str:
    """The C++/CUDA of a `route` statement; `r` is the Renderer (storage traits and
    compute types of the target)."""
    assert s.dtype is not None and s.src_dtype is not None and s.dtype2 is not None
    v, L, ct = s.dst, s.a, r.compute_ctype(s.dtype)
    xst, xct = r.st(s.src_dtype), r.compute_ctype(s.src_dtype)
    ist = r.st(s.dtype2)
    x, ix = s.buffer, s.buffer2

    def ld(st: str, buf: str, at: str) -> str:
        return f"{st}::load(COCOVIZ_LD(B.{buf}, {at}))"

    def idx(at: str) -> str:
        return f"static_cast<int64_t>({ld(ist, ix, at)})"

    n = s.ints
    if s.op == "gather":
        M, R, N = n[:3]
        return (
            f"const int64_t {v}_b = {L} / {M * R};\n"
            f"    const int64_t {v}_r = {L} % {R};\n"
            f"    const int64_t {v}_n = {idx(f'{L} / {R}')};\n"
            f"    const {ct} {v} = ({v}_n >= 0 && {v}_n < {N}) ? static_cast<{ct}>("
            f"{ld(xst, x, f'({v}_b * {N} + {v}_n) * {R} + {v}_r')}) : {ct}(0);"
        )
    if s.op == "scatter_add":
        N, R, M, SB = n[:4]
        terms = n[4:]
        off = (
            " + ".join(
                f"(({v}_m / {terms[k]}) % {terms[k + 1]}) * {terms[k + 2]}"
                for k in range(0, len(terms), 3)
                if terms[k + 2]
            )
            or "0"
        )
        return (
            f"const int64_t {v}_b = {L} / {N * R};\n"
            f"    const int64_t {v}_n = ({L} / {R}) % {N};\n"
            f"    const int64_t {v}_r = {L} % {R};\n"
            f"    {ct} {v} = {ct}(0);\n"
            f"    for (int64_t {v}_m = 0; {v}_m < {M}; ++{v}_m) {{\n"
            f"      if ({idx(f'{v}_b * {M} + {v}_m')} != {v}_n) continue;\n"
            f"      {v} += static_cast<{ct}>({ld(xst, x, f'{v}_b * {SB} + ({off}) * {R} + {v}_r')});\n"
            f"    }}"
        )
    if s.op in ("topk", "topk_indices"):
        N, S, k = n[:3]
        pick = f"{v}_pv" if s.op == "topk" else f"{v}_pp"
        return (
            f"const int64_t {v}_j = ({L} / {S}) % {k};\n"
            f"    const int64_t {v}_base = ({L} / {S * k}) * {N * S} + {L} % {S};\n"
            f"    int64_t {v}_pp = -1;\n"
            f"    {xct} {v}_pv = {xct}(0);\n"
            f"    for (int64_t {v}_t = 0; {v}_t <= {v}_j; ++{v}_t) {{\n"
            f"      int64_t {v}_bp = -1;\n"
            f"      {xct} {v}_bv = {xct}(0);\n"
            f"      for (int64_t {v}_q = 0; {v}_q < {N}; ++{v}_q) {{\n"
            f"        const {xct} {v}_x = {ld(xst, x, f'{v}_base + {v}_q * {S}')};\n"
            f"        const bool {v}_below = {v}_pp < 0 || {v}_x < {v}_pv || "
            f"({v}_x == {v}_pv && {v}_q > {v}_pp);\n"
            f"        if ({v}_below && ({v}_bp < 0 || {v}_x > {v}_bv)) {{ {v}_bp = {v}_q; "
            f"{v}_bv = {v}_x; }}\n"
            f"      }}\n"
            f"      {v}_pp = {v}_bp;\n"
            f"      {v}_pv = {v}_bv;\n"
            f"    }}\n"
            f"    const {ct} {v} = static_cast<{ct}>({pick});"
        )
    assert s.op == "capacity_slots"
    T, K, E, C = n[:4]
    return (
        f"const int64_t {v}_g = {L} / {T * K};\n"
        f"    const int64_t {v}_t = ({L} / {K}) % {T};\n"
        f"    const int64_t {v}_j = {L} % {K};\n"
        f"    const int64_t {v}_e = {idx(L)};\n"
        f"    int64_t {v}_c = 0;\n"
        f"    for (int64_t {v}_jj = 0; {v}_jj <= {v}_j; ++{v}_jj) {{\n"
        f"      const int64_t {v}_end = {v}_jj < {v}_j ? {T} : {v}_t;\n"
        f"      for (int64_t {v}_tt = 0; {v}_tt < {v}_end; ++{v}_tt) {{\n"
        f"        if ({idx(f'{v}_g * {T * K} + {v}_tt * {K} + {v}_jj')} == {v}_e) ++{v}_c;\n"
        f"      }}\n"
        f"    }}\n"
        f"    const {ct} {v} = ({v}_e >= 0 && {v}_e < {E} && {v}_c < {C}) ? "
        f"static_cast<{ct}>({v}_e * {C} + {v}_c) : {ct}(-1);"
    )
