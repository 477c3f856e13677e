"""Rendering an `EmitPlan` through jinja2 templates: one renderer class per backend
over the same lowered form (tinygrad's pattern), each named by a row of the target table
(`cocoviz.emit.targets`). Context builders prepare every value a template prints — C
types, trait names, API enums, operator expressions, literals — from the dtype table
(`cocoviz.ir.types.DType`), the collectives table (`cocoviz.ir.collectives`) and small
tag tables; templates only loop and branch, and a tag they do not know is an `EmitError`
when rendering (docs/codegen.md)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import jinja2

from cocoviz.emit import plan as pl
from cocoviz.emit import routing as emit_routing
from cocoviz.emit.kernels import REDUCE_BLOCKS
from cocoviz.emit.names import c_double, c_string
from cocoviz.emit.plan import EmitError
from cocoviz.emit.stamp import built_from
from cocoviz.emit.targets import target_spec
from cocoviz.ir.collectives import collective_named
from cocoviz.ir.types import DType

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# `avg` never reaches a collective: lowering turns it into a `sum` and a division kernel
_MPI_OP = {"sum": "sum", "prod": "prod", "max": "max", "min": "min"}
_NCCL_OP = {
    "sum": "ncclSum",
    "prod": "ncclProd",
    "max": "ncclMax",
    "min": "ncclMin",
}
# The C expression of each unary and binary operator of a kernel body: `a`/`b` are the
# operands, `ctype` the compute type, the math functions are the target's (`_CPU_MATH`,
# `_CUDA_MATH`). Integer division and power have their own forms.
_UNARY_C = {
    "neg": "-{a}",
    "sqrt": "{sqrt}({a})",
    "rsqrt": "{ctype}(1) / {sqrt}({a})",
    "exp": "{exp}({a})",
    "log": "{log}({a})",
    "tanh": "{tanh}({a})",
    "sigmoid": "{ctype}(1) / ({ctype}(1) + {exp}(-{a}))",
    "relu": "(({a} > {ctype}(0) || {a} != {a}) ? {a} : {ctype}(0))",
    "gelu": "{ctype}(0.5) * {a} * ({ctype}(1) + {tanh}({ctype}(0.7978845608028654) * ({a} + "
    "{ctype}(0.044715) * {a} * {a} * {a})))",
    "abs": "{abs}({a})",
}
_BINARY_C = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "max": "(({a} > {b} || {a} != {a}) ? {a} : {b})",
    "min": "(({a} < {b} || {a} != {a}) ? {a} : {b})",
    "pow": "{pow}({a}, {b})",
}
_BINARY_INT_C = {
    **_BINARY_C,
    "div": "({b} == 0 ? {ctype}(0) : {a} / {b})",
    "pow": "static_cast<int64_t>({pow}(static_cast<double>({a}), static_cast<double>({b})))",
}
_CPU_MATH = {f: f"std::{f}" for f in ("sqrt", "exp", "log", "tanh", "abs", "pow")}
_CUDA_MATH = {
    "float": {
        "sqrt": "sqrtf",
        "exp": "expf",
        "log": "logf",
        "tanh": "tanhf",
        "abs": "fabsf",
        "pow": "powf",
    },
    "double": {
        "sqrt": "sqrt",
        "exp": "exp",
        "log": "log",
        "tanh": "tanh",
        "abs": "fabs",
        "pow": "pow",
    },
    "int64_t": {
        "sqrt": "sqrt",
        "exp": "exp",
        "log": "log",
        "tanh": "tanh",
        "abs": "llabs",
        "pow": "pow",
    },
}


_AXIS_COMBINE = {
    "sum": "{acc} += {t};",
    "mean": "{acc} += {t};",
    "max": "{acc} = ({t} > {acc} || {t} != {t}) ? {t} : {acc};",
    "min": "{acc} = ({t} < {acc} || {t} != {t}) ? {t} : {acc};",
}
"""How a `reduce_axis` statement folds the next element t into its accumulator (max and
min propagate a NaN, as numpy's do)."""


def unknown(what: str, tag: object) -> NoReturn:
    """A tag no template branch spells (the `unknown` of the templates' if/elif chains)."""
    raise EmitError(f"the templates cannot render {what} {tag!r}; this is a cocoviz bug")


def spelled(table: dict[str, str], tag: str, what: str) -> str:
    """`table[tag]`, or an `EmitError` naming the tag."""
    try:
        return table[tag]
    except KeyError:
        unknown(what, tag)


@functools.cache
def environment() -> jinja2.Environment:
    """The one jinja2 environment of the emitter (StrictUndefined, no autoescape)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.globals["unknown"] = unknown
    return env


_UNSAFE_TEXT = re.compile(r"[^A-Za-z0-9_ ,.#()=>+-]")


def safe_text(text: str) -> str:
    """Text for a C comment: characters outside a small safe set become '?'."""
    return _UNSAFE_TEXT.sub("?", text)


def dt_enum(dt: DType) -> str:
    return dt.runtime_enum


@dataclass(frozen=True)
class EmitOptions:
    target: str = "cpu"
    arch: str = "sm_90"
    make_vars: tuple[tuple[str, str], ...] = ()
    mpiexec: str = "mpiexec"
    """Shell-quoted launcher baked into run.sh (overridable with $MPIEXEC)."""


class Renderer:
    """Shared context building; subclasses name their templates and spellings (their
    target's row in `cocoviz.emit.targets` names them)."""

    templates: ClassVar[tuple[tuple[str, str], ...]] = ()
    """(output file, template) pairs; ``{stem}`` in a file name is the program's stem."""
    runtime_files: ClassVar[tuple[str, ...]] = ()
    """Files of cocoviz/templates copied into the output tree as they are."""
    storage_traits: ClassVar[str] = "::cocoviz::Dt"

    def __init__(self, plan: pl.EmitPlan, options: EmitOptions) -> None:
        self.plan = plan
        self.options = options
        self.spec = target_spec(options.target)

    # ---- spellings
    def storage_ctype(self, dt: DType) -> str:
        return dt.facts.cpu_ctype

    def compute_ctype(self, dt: DType) -> str:
        return dt.compute.facts.cpu_ctype

    def st(self, dt: DType) -> str:
        return f"{self.storage_traits}<{dt_enum(dt)}>"

    def dtt(self, dt: DType) -> str:
        return f"::cocoviz::Dt<{dt_enum(dt)}>"

    def math(self, ctype: str) -> dict[str, str]:
        return _CPU_MATH

    # ---- statements
    def stmt(self, s: pl.Stmt) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": s.kind, "dst": s.dst, "a": s.a, "b": s.b, "c": s.c, "op": s.op,
            "buffer": s.buffer, "literal": s.literal, "n1": s.n1, "n2": s.n2, "n3": s.n3,
        }  # fmt: skip
        if s.kind == "index_affine":
            terms = [(n, v) for n, v in ((s.n1, "tp"), (s.n2, "k"), (s.n3, "1")) if n]
            d["terms"] = terms
        elif s.kind == "index_bcast":
            d["terms"] = list(s.terms)
        elif s.kind == "index_block_g":
            d["blk"] = s.terms[0][0]
        elif s.kind == "route":
            d["code"] = emit_routing.route_code(self, s)
        elif s.kind == "reduce_axis":
            assert s.src_dtype is not None
            d["src_st"] = self.st(s.src_dtype)
            d["combine"] = spelled(_AXIS_COMBINE, s.op, "the reduction along a dimension")
        if s.dtype is not None:
            dt = s.dtype
            ctype = self.compute_ctype(dt)
            d.update(
                ctype=ctype, st=self.st(dt), dt=self.dtt(dt), half=dt.is_half,
                integer=not dt.is_float, m=self.math(ctype),
            )  # fmt: skip
            if s.kind == "convert":
                assert s.src_dtype is not None
                if dt.is_half:
                    d["conv"] = "half"
                elif not dt.is_float:
                    d["conv"] = "int_from_float" if s.src_dtype.is_float else "int_from_int"
                else:
                    d["conv"] = "cast"
            if s.kind == "compare":
                d["cmp"] = spelled(_CMP, s.op, "the comparison")
            elif s.kind == "unary":
                form = spelled(_UNARY_C, s.op, "the unary operator")
                d["c_expr"] = form.format(a=s.a, ctype=ctype, **d["m"])
            elif s.kind == "binary":
                forms = _BINARY_C if dt.is_float else _BINARY_INT_C
                form = spelled(forms, s.op, "the binary operator")
                d["c_expr"] = form.format(a=s.a, b=s.b, ctype=ctype, **d["m"])
        return d

    def stmts(self, body: tuple[pl.Stmt, ...]) -> list[dict[str, Any]]:
        return [self.stmt(s) for s in body]

    # ---- steps
    def offset(self, o: pl.Offset) -> str:
        parts = []
        if o.per_rank:
            parts.append(f"{o.per_rank} * tp")
        if o.per_chunk:
            parts.append(f"{o.per_chunk} * k")
        if o.per_dp:
            parts.append(f"{o.per_dp} * dp")
        if o.const:
            parts.append(str(o.const))
        return " + ".join(parts) if parts else "0"

    def step(self, st: pl.Step) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": st.kind,
            "cname": st.cname,
            "pstage": st.pstage,
            "stream": st.stream,
        }
        names = getattr(st, "stages", None) or (getattr(st, "stage", ""),)
        d["stage_lit"] = c_string(", ".join(names))
        d["reduce_lit"] = c_string(", ".join(names) + ".reduce")
        if isinstance(st, pl.Kernel):
            d.update(
                stages=safe_text(", ".join(st.stages)),
                count=st.space.launch_count,
                threads=st.space.launch_count,
                red_blocks=max(1, min(REDUCE_BLOCKS, -(-st.space.launch_count // 256))),
                finishes=[],
                pre=self.stmts(st.pre),
                body=self.stmts(st.body),
                reductions=[self.reduction(r) for r in st.reductions],
            )
        elif isinstance(st, pl.RowKernel):
            d.update(
                stages=safe_text(", ".join(st.stages)), op=st.op, count=st.space.launch_count,
                rows=st.space.launch_count // st.row_len, row_len=st.row_len,
                x_body=self.stmts(st.x_body), x=st.x_var, gb_body=self.stmts(st.gb_body),
                store_body=self.stmts(st.store_body),
                y=st.y_var, gamma=st.gamma_var, beta=st.beta_var, eps=c_double(st.eps),
                ctype=self.compute_ctype(st.compute), m=self.math(self.compute_ctype(st.compute)),
            )  # fmt: skip
        elif isinstance(st, pl.ReduceFinish):
            r = st.reduction
            d.update(
                stage=safe_text(st.stage), red=self.reduction(r), cross=st.cross_rank, result=st.result,
                result_st=self.st(st.result_dtype), result_ctype=self.compute_ctype(st.result_dtype),
                acc_enum=dt_enum(r.acc_dtype), mpi_op="max" if r.kind == "absmax" else "sum",
                nccl_op="ncclMax" if r.kind == "absmax" else "ncclSum",
                nccl_type=r.acc_dtype.facts.nccl, batched=False,
            )  # fmt: skip
        elif isinstance(st, pl.FinishBatch):
            f0 = st.finishes[0]
            d.update(
                stage=safe_text(", ".join(f.stage for f in st.finishes)),
                finishes=[self.step(f) for f in st.finishes], pack=st.pack,
                n=len(st.finishes), acc_ctype=self.compute_ctype(st.acc_dtype),
                acc_enum=dt_enum(st.acc_dtype), is_max=f0.reduction.kind == "absmax",
                nccl_op="ncclMax" if f0.reduction.kind == "absmax" else "ncclSum",
                nccl_type=st.acc_dtype.facts.nccl,
            )  # fmt: skip
            d["stage_lit"] = c_string(", ".join(f.stage for f in st.finishes))
            d["reduce_lit"] = c_string(", ".join(f"{f.stage}.reduce" for f in st.finishes))
            for f in d["finishes"]:
                f["batched"] = True
        elif isinstance(st, pl.Matmul):
            d.update(
                stage=safe_text(st.stage), a=st.a, b=st.b, c=st.c, m=st.m, n=st.n, k=st.k,
                a_off=self.offset(st.a_offset), c_off=self.offset(st.c_offset),
                b_off=self.offset(st.b_offset),
                batch=[dataclasses.asdict(bd) for bd in st.batch],
                gemms=math.prod(bd.extent for bd in st.batch),
                outer=math.prod(bd.extent for bd in st.batch[:-1]),
                st=self.st(st.dtype), ctype=self.compute_ctype(st.dtype),
                enum=dt_enum(st.dtype), cuda_type=st.dtype.facts.cuda_datatype,
                gemm=st.dtype.is_float,
                compute_type="CUBLAS_COMPUTE_64F" if st.dtype is DType.F64 else "CUBLAS_COMPUTE_32F",
                scale_ctype="double" if st.dtype is DType.F64 else "float",
                lda=st.lda or st.k, ldb=st.ldb or st.n, ldc=st.ldc or st.n,
                accumulate=st.accumulate, beta=1 if st.accumulate else 0,
                c_st=self.st(st.c_dtype or st.dtype),
                c_cuda_type=(st.c_dtype or st.dtype).facts.cuda_datatype,
            )  # fmt: skip
        elif isinstance(st, pl.Collective):
            row = collective_named(st.op)
            assert row is not None  # pl.Collective checks its op
            d.update(
                nccl_call=row.nccl, rooted=row.rooted,
                stage=safe_text(st.stage), op=st.op, rop=st.rop, send=st.send, recv=st.recv, count=st.count,
                send_off=self.offset(st.send_offset), recv_off=self.offset(st.recv_offset),
                inplace=st.inplace, root=st.root, peer_pstage=st.peer_pstage, comm=st.comm,
                enum=dt_enum(st.dtype), ctype=self.storage_ctype(st.dtype),
                mpi_op=spelled(_MPI_OP, st.rop, "the reduction") if st.rop else "",
                nccl_op=spelled(_NCCL_OP, st.rop, "the reduction") if st.rop else "",
                nccl_type=st.dtype.facts.nccl,
                permute=_view(st.permute) if st.permute else None, staging=st.staging,
                pack=_view(st.pack) if st.pack else None, pack_staging=st.pack_staging,
            )  # fmt: skip
        elif isinstance(st, pl.RingExchange):
            d.update(
                stage=safe_text(st.stage), send=st.send, recv=st.recv, count=st.count,
                send_slot=st.send_slot, recv_slot=st.recv_slot, steps=st.steps,
                to_add=st.to % st.steps, from_add=-st.to % st.steps,
                enum=dt_enum(st.dtype), nccl_type=st.dtype.facts.nccl,
            )  # fmt: skip
        elif isinstance(st, pl.RingCombine):
            d.update(
                stage=safe_text(st.stage), partial=st.partial, received=st.received,
                acc=st.acc, out=st.out, count=st.count, steps=st.steps, rop=st.rop,
                mpi_op=spelled(_MPI_OP, "sum" if st.rop == "avg" else st.rop, "the reduction"),
                avg=st.rop == "avg", partial_st=self.st(st.partial_dtype),
                acc_st=self.st(st.acc_dtype), acc_ctype=self.compute_ctype(st.acc_dtype),
                acc_storage=self.storage_ctype(st.acc_dtype), out_st=self.st(st.out_dtype),
            )  # fmt: skip
        elif isinstance(st, pl.DeviceCollective):
            d.update(
                stages=safe_text(", ".join(st.stages)), rop=st.rop, src=st.src, shard=st.shard,
                src_st=self.st(st.src_dtype), src_ctype=self.compute_ctype(st.src_dtype),
                src_storage=self.storage_ctype(st.src_dtype),
                count=st.space.launch_count, body=self.stmts(st.body), pre=self.stmts(st.pre),
                prologue=self.stmts(st.prologue), l_var=st.l_var, e_var=st.e_var,
                numel=st.space.view.numel, chunks=st.space.view.chunks,
                chunked=st.space.in_chunk_loop,
                shard_count=st.space.view.count,
                gathers=[
                    {"var": v, "dst": dst, "st": self.st(dt), "ctype": self.storage_ctype(dt)}
                    for v, dst, dt in st.gathers
                ],
            )  # fmt: skip
        elif isinstance(st, pl.ChunkLoop):
            d.update(
                stages=safe_text(", ".join(st.stages)), chunks=st.chunks, skewed=st.skewed,
                chunk_items=self.chunk_items(st), streams=list(st.streams), n_edges=len(st.edges),
                edges=[{"guard": self.pp_guard(e.stages)} for e in st.edges],
                shards=dataclasses.asdict(st.shards) if st.shards else None,
                exchanges=[x.cname for it in st.items for x in it.steps if isinstance(x, pl.RingExchange)],
            )  # fmt: skip
        return d

    def pp_guard(self, stages: tuple[int, ...] | None) -> str:
        """The condition under which an edge's event is used: "" on every rank."""
        if stages is None or self.plan.pp == 1:
            return ""
        return " || ".join(f"ctx.pp == {q}" for q in stages)

    def chunk_items(self, st: pl.ChunkLoop) -> list[dict[str, Any]]:
        """Each item with, per step, the events it waits for before it and records after it
        (`ChunkEdge` e of chunk k is `ev_<loop>[e][k]`)."""
        streams = [s.stream for it in st.items for s in it.steps]
        flat = [s for it in st.items for s in it.steps]
        exchanges = [s.cname for s in flat if isinstance(s, pl.RingExchange)]
        # CPU target, decomposed group: the previous step's exchange is waited for (its
        # MPI requests) before the first step that needs it — an exchange, or a step an
        # edge from the previous step releases
        cpu_waits: list[list[str]] = []
        waited = False
        for j, s in enumerate(flat):
            need = isinstance(s, pl.RingExchange) or any(
                e.carried and e.before == j for e in st.edges
            )
            cpu_waits.append(exchanges if need and not waited else [])
            waited = waited or need
        out: list[dict[str, Any]] = []
        at = 0
        for it in st.items:
            waits: list[list[dict[str, Any]]] = []
            records: list[list[dict[str, Any]]] = []
            for j in range(at, at + len(it.steps)):
                waits.append([
                    {"e": e, "stream": streams[j], "guard": self.pp_guard(x.stages),
                     "carried": x.carried}
                    for e, x in enumerate(st.edges) if x.before == j
                ])  # fmt: skip
                records.append([
                    {"e": e, "stream": streams[j], "guard": self.pp_guard(x.stages)}
                    for e, x in enumerate(st.edges) if x.after == j
                ])  # fmt: skip
            on = list(dict.fromkeys(s.stream for s in it.steps))
            out.append({
                "label": safe_text(it.label), "label_lit": c_string(it.label), "stream": " and ".join(on),
                "streams_text": " and ".join(on) + (" streams" if len(on) > 1 else " stream"),
                "steps": [self.step(s) for s in it.steps], "waits": waits, "records": records,
                "cpu_waits": cpu_waits[at : at + len(it.steps)],
            })  # fmt: skip
            at += len(it.steps)
        return out

    def reduction(self, r: pl.Reduction) -> dict[str, Any]:
        return {
            "kind": r.kind, "var": r.var, "partial": r.partial,
            "ctype": self.compute_ctype(r.acc_dtype),
            "acc_ctype": "int64_t" if not r.acc_dtype.is_float else "double",
            "is_float": r.acc_dtype.is_float,
        }  # fmt: skip

    def flat_kernels(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for s in steps:
            if s["kind"] == "chunks":
                for it in s["chunk_items"]:
                    out.extend(self.flat_kernels(it["steps"]))
            else:
                out.append(s)
        return out

    def output_spec(self, o: pl.OutputSpec) -> dict[str, Any]:
        """A value the launcher gathers (--check) or writes (--dump)."""
        v = o.view
        return {
            "name": o.source, "literal": c_string(o.source), "buffer": o.buffer,
            "enum": dt_enum(o.dtype), "ctype": self.storage_ctype(o.dtype),
            "pstage": o.pstage if o.pstage is not None else 0,
            "view": _view(v), "shape": list(o.global_shape),
            "shape_text": "{" + ", ".join(str(x) for x in o.global_shape) + "}",
            # a sliced update of a replicated input, stored at its global positions: rank
            # r's part of chunk k starts at k·numel/K + r·count/K (docs/schedules.md)
            "global_addressing": o.global_addressing,
            "normwise": o.normwise,
            "chunks": v.chunks if v.kind == "chunked" else 1,
        }  # fmt: skip

    def program(self, p: pl.ProgramPlan) -> dict[str, Any]:
        steps = [self.step(s) for s in p.steps]
        flat = self.flat_kernels(steps)
        finish = {f["red"]["partial"]: f for f in flat if f["kind"] == "finish"}
        for fb in flat:
            if fb["kind"] == "finishes":
                finish.update({f["red"]["partial"]: f for f in fb["finishes"]})
        for k in flat:
            if k["kind"] == "kernel":
                k["finishes"] = [finish[r["partial"]] for r in k["reductions"]]
                for f in k["finishes"]:
                    f["red_blocks"] = k["red_blocks"]
        buffers = []
        for b in p.buffers:
            buffers.append(
                {
                    "cname": b.cname, "source": safe_text(b.source), "count": b.count, "role": b.role,
                    "ctype": self.storage_ctype(b.dtype), "alias": b.alias,
                    "offset": self.offset(b.offset), "pstage": b.pstage, "symmetric": b.symmetric, "registered": b.registered,
                    "enum": dt_enum(b.dtype),
                }
            )  # fmt: skip
        inputs = []
        for i in p.inputs:
            v = i.view
            part = v.tp_count or v.count  # the tp part (of which a value sliced over dp holds 1/D)
            start = {"replicated": "0", "local": f"tp * {v.numel}", "flat": f"tp * {part}"}.get(
                v.kind, "0"
            )
            # the global value: [G, *shape] for a local input (G: the tp group's size),
            # [D, …] of that for an input local over dp (docs/language.md, rank grids)
            gshape = (self.plan.tp, *v.shape) if i.local else v.shape
            # generator indices of replica d start at d·N (N: the tp-global numel)
            dp_base = f"dp * {math.prod(gshape)}" if v.dp == "local" else "0"
            if v.dp == "local":
                gshape = (self.plan.dp, *gshape)
            inputs.append(
                {
                    "buffer": i.buffer, "id": c_string(i.source), "enum": dt_enum(i.dtype),
                    "kind": v.kind, "count": v.count, "start": start, "pstage": i.pstage,
                    "outer": v.outer, "run": v.blk * v.inner, "row": v.extent * v.inner,
                    "name": i.source, "literal": c_string(i.source), "updated": i.updated,
                    "nonnegative": i.nonnegative, "ctype": self.storage_ctype(i.dtype),
                    "shape_text": "{" + ", ".join(str(x) for x in gshape) + "}",
                    "numel": math.prod(gshape), "local": i.local,
                    "dp": v.dp, "dp_base": dp_base, "part": part,
                }
            )  # fmt: skip
        outputs = [self.output_spec(o) for o in p.outputs]
        updated = [self.output_spec(o) for o in p.updated]
        return {
            "ns": p.cname,
            "title": p.title,
            "buffers": buffers,
            "inputs": inputs,
            "outputs": outputs,
            # what --dump writes: every output, then every updated input by its name
            # (cocoviz.exec.dumps)
            "dumps": outputs + updated,
            "poison": [b for b in buffers if not b["alias"] and b["role"] != "input"],
            "steps": steps,
            "kernels": flat,
            "rngkeys": [{"cname": k.cname, "tag": c_string(k.tag)} for k in p.keys],
            "dropouts": [
                {
                    "cname": q.cname,
                    "p": c_double(q.p),
                    "enum": dt_enum(q.dtype),
                    "scale_ctype": "float" if q.dtype.compute is DType.F32 else "double",
                }
                for q in p.dropouts
            ],  # fmt: skip
            "uses_matmul": p.uses_matmul,
            "uses_device": p.uses_device_api,
            # streams whose GEMMs run on cuBLAS (each gets its own workspace)
            "gemm_streams": sorted(
                {k["stream"] for k in flat if k["kind"] == "matmul" and (k["gemm"] or k["batch"])}
            ),
            "fallback_ns": None,
            "uses_p2p": any(isinstance(st, pl.ChunkLoop) and "p2p" in st.streams for st in p.steps),
        }

    def context(self) -> dict[str, Any]:
        p = self.plan
        params = [
            {
                "cname": q.cname, "source": q.source, "ctype": self.compute_ctype(q.dtype),
                "init": c_double(q.default), "dt": self.dtt(q.dtype), "half": q.dtype.is_half,
                "literal": c_string(q.source),
            }
            for q in p.params
        ]  # fmt: skip
        header = {
            "program": p.program,
            "schedule": p.schedule_name or "",
            "target": self.spec.name,
            "collectives": p.collectives if self.spec.gpu else "mpi",
            "world": p.world,
            "tp": p.tp,
            "pp": p.pp,
        }
        if p.has_dp:
            header["dp"] = p.dp
        json_prefix = json.dumps(header)[:-1]
        sched = self.program(p.scheduled)
        fallback = self.program(p.fallback) if p.fallback else None
        if fallback is not None:
            sched["fallback_ns"] = fallback["ns"]
        return {
            "program": safe_text(p.program),
            "program_literal": c_string(p.program),
            "stem": p.file_stem,
            "tp": p.tp,
            "pp": p.pp,
            "world": p.world,
            "dp": p.dp,
            "has_dp": p.has_dp,
            "grid": p.pp > 1,
            "params": params,
            "sched": sched,
            "ref": self.program(p.reference) if p.reference else None,
            "fallback": fallback,
            "json_prefix": c_string(json_prefix),
            "reduce_blocks": REDUCE_BLOCKS,
            "schedule": safe_text(p.schedule_name or "(none)"),
            "schedule_literal": c_string(p.schedule_name or ""),
            "arch": self.options.arch,
            "make_vars": list(self.options.make_vars),
            "collectives": p.collectives,
            "seed": p.seed,
            "target": self.spec.name,
            "mpiexec": self.options.mpiexec,
        }

    def render(self, template: str, ctx: dict[str, Any]) -> str:
        return environment().get_template(template).render(**ctx)

    def files(self) -> dict[str, str]:
        """The rendered output files by name."""
        ctx = self.context()
        stem = self.plan.file_stem
        names = [name.format(stem=stem) for name, _ in self.templates]
        # the files the Makefile stamps a binary with and run.sh checks (cocoviz/emit/stamp.py)
        ctx["built_from"] = built_from([*names, *self.runtime_files])
        out = {name.format(stem=stem): self.render(t, ctx) for name, t in self.templates}
        for f in self.runtime_files:
            out[f] = (TEMPLATES / f).read_text(encoding="utf-8")
        return out


def _view(v: pl.View) -> dict[str, Any]:
    return {
        "kind": v.kind, "count": v.count, "numel": v.numel, "outer": v.outer,
        "extent": v.extent, "inner": v.inner, "blk": v.blk, "dp": v.dp, "tp_count": v.tp_count,
    }  # fmt: skip


class CpuRenderer(Renderer):
    """C++17 with MPI collectives and OpenMP loops."""

    templates = (
        ("{stem}.h", "cpu_program.h.jinja"),
        ("{stem}.cpp", "cpu_program.cpp.jinja"),
        ("main.cpp", "cpu_main.cpp.jinja"),
        ("Makefile", "cpu_Makefile.jinja"),
        ("run.sh", "run.sh.jinja"),
    )
    runtime_files = ("cocoviz_runtime.h",)

    def step(self, st: pl.Step) -> dict[str, Any]:
        d = super().step(st)
        if isinstance(st, pl.Kernel) and not d["reductions"]:
            rows = split_rows(d["body"], d["count"])
            d["row_len"], d["body"] = rows if rows else (0, d["body"])
        elif isinstance(st, pl.RowKernel):
            d["x_body"], d["gb_body"], d["store_body"] = row_indices(
                [d["x_body"], d["gb_body"], d["store_body"]],
                d["row_len"],
                {d["x"], d["gamma"], d["beta"]},
            )
        return d


MIN_ROW = 8
"""The shortest row ``split_rows`` runs as an inner loop."""


def split_rows(body: list[dict[str, Any]], count: int) -> tuple[int, list[dict[str, Any]]] | None:
    """An elementwise CPU kernel that reads a broadcast operand (a bias along the last
    dimension: ``(i % n)``) as two loops, rows ``i0`` outside and the n elements of a row
    ``i1`` inside (``i = i0·n + i1``), with every broadcast index of ``i`` in those terms:
    ``((i / rs) % rd)·os`` is ``i1·os`` for the last dimension (rs = 1, rd = n) and
    ``((i0 / (rs/n)) % rd)·os`` for the others (rs a multiple of n). A broadcast of an
    index ``a = i + off`` (``off = n1·tp + n2·k + n3``, a chunk's or a rank's offset) splits
    the same way when n divides each of n1, n2, n3: ``(a % n)`` is ``i1`` and ``a / rs`` is
    ``(i0 + off/n) / (rs/n)``. A gather of 16-bit values, which ``(a % n)`` is to the
    compiler, does not vectorize; a row's contiguous run does (docs/codegen.md, "Fast loops
    (CPU)"). The same elements in the same per-element order: the same bits. None when no
    broadcast reads ``i`` or a term does not fit the split (the one loop as before).
    (row length, new body)"""
    affine = _affine_indices(body)
    reads = [s for s in body if s["kind"] == "index_bcast" and s["a"] in affine]
    inner = {rd for s in reads for rs, rd, _ in s["terms"] if rs == 1}
    if len(inner) != 1:
        return None
    (n,) = inner
    if n < MIN_ROW or count % n:
        return None
    out = []
    for s in body:
        if s["kind"] == "index_bcast" and s["a"] in affine:
            split = row_index(s, affine[s["a"]], n)
            if split is None:
                return None
            s = split
        out.append(s)
    return n, _live(out, set())[0]  # without the offset indices only the reads used


def row_index(
    s: dict[str, Any], off: tuple[int, int, int], n: int, row: str = "i0", col: str = "i1"
) -> dict[str, Any] | None:
    """The broadcast index statement `s` of ``a = i + off`` (``off = n1·tp + n2·k + n3``)
    in terms of the row and column of ``i = row·n + col`` (``0 ≤ col < n``) when n divides
    each of n1, n2, n3 and every term ``((a / rs) % rd)·os`` is the last dimension
    (rs = 1, rd = n: ``col·os``) or one above it (rs a multiple of n:
    ``(((row + off/n) / (rs/n)) % rd)·os``); None otherwise."""
    if any(c % n for c in off):
        return None
    if any(rd != n if rs == 1 else rs % n for rs, rd, _ in s["terms"]):
        return None
    terms = zip(off, ("tp", "k", "1"), strict=True)
    at = " + ".join([row] + [f"{c // n} * {v}" for c, v in terms if c])
    parts = [
        f"{col} * {os}" if rs == 1 else f"((({at}) / {rs // n}) % {rd}) * {os}"
        for rs, rd, os in s["terms"]
    ]
    return {**s, "kind": "index_rows", "a": "", "expr": " + ".join(parts) or "0"}


def row_indices(
    bodies: list[list[dict[str, Any]]], n: int, roots: set[str]
) -> list[list[dict[str, Any]]]:
    """A row kernel's bodies (one scope, ``i = row·n + j``) with each broadcast index that
    `row_index` can write in ``row`` and ``j`` so written (a gather less), the others as
    they were, and without the offset indices only the rewritten reads used (`_live`,
    ``roots``: the variables the kernel's template reads)."""
    affine = _affine_indices([s for body in bodies for s in body])
    rewritten = [
        [
            (row_index(s, affine[s["a"]], n, "row", "j") or s)
            if s["kind"] == "index_bcast" and s["a"] in affine
            else s
            for s in body
        ]
        for body in bodies
    ]
    kept = {id(s) for s in _live([s for body in rewritten for s in body], roots)[0]}
    return [[s for s in body if id(s) in kept] for body in rewritten]


VEC_BYTES = 16
"""Widest access of a vectorized kernel (one 128-bit load or store per pack)."""
MAX_VEC = 8


def _affine_indices(body: list[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Index variables of the form ``i + n1·tp + n2·k + n3`` (unit stride in the launch
    index `i`), with their (n1, n2, n3)."""
    affine = {"i": (0, 0, 0)}
    for s in body:
        if s["kind"] == "index_affine" and s["a"] in affine:
            b = affine[s["a"]]
            affine[s["dst"]] = (b[0] + s["n1"], b[1] + s["n2"], b[2] + s["n3"])
    return affine


def _uses(s: dict[str, Any]) -> set[str]:
    if s["kind"] == "vload":
        return set()
    if s["kind"] == "vstore":
        return {s["b"]}
    return {s["a"], s["b"], s["c"]} - {""}


def _live(body: list[dict[str, Any]], roots: set[str]) -> tuple[list[dict[str, Any]], set[str]]:
    """The statements a store or a root variable needs, and every name they read."""
    live = set(roots)
    kept: list[dict[str, Any]] = []
    for s in reversed(body):
        if s["kind"] in ("store", "vstore") or s["dst"] in live:
            kept.append(s)
            live |= _uses(s)
    return kept[::-1], live


def _offset_expr(n1: int, n2: int, n3: int) -> str:
    parts = [f"({n}) * {v}" for n, v in ((n1, "tp"), (n2, "k")) if n]
    if n3:
        parts.append(f"({n3})")
    return " + ".join(parts)


def vectorize(
    body: list[dict[str, Any]],
    reductions: list[dict[str, Any]],
    count: int,
    width: int | None = None,
) -> dict[str, Any] | None:
    """How an elementwise kernel runs `width` consecutive elements per thread: every load
    and store at a unit-stride index (``i + n1·tp + n2·k + n3``: the element's own storage
    or a flat/replicated operand read at its global index) becomes one packed access of
    `width` elements (at most 16 bytes of the narrowest dtype); other reads (broadcast
    operands, block-sliced operands, dropout's generator index) stay per element, with
    ``i = i0 + j``. None when no access is unit-stride or fewer than two elements fit.
    `width` overrides the pack width (the nccl-device kernel's, which counts its peer
    accesses too)."""
    affine = _affine_indices(body)
    access = [s for s in body if s["kind"] in ("load", "store") and s["a"] in affine]
    if not access:
        return None
    if width is None:
        width = min(MAX_VEC, VEC_BYTES // min(s["size"] for s in access))
    if width < 2 or count < width:
        return None
    packs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in access:
        key = (s["kind"], s["buffer"], s["a"])
        if key in packs:
            continue
        off = _offset_expr(*affine[s["a"]])
        packs[key] = {
            "name": f"{'ld' if s['kind'] == 'load' else 'st'}{len(packs)}",
            "load": s["kind"] == "load",
            "buffer": s["buffer"],
            "storage": s["storage"],
            "at": "i0" + (f" + {off}" if off else ""),
            "first": f"B.{s['buffer']}" + (f" + ({off})" if off else ""),
            "terms": affine[s["a"]],
        }
    vbody = []
    for s in body:
        key = (s["kind"], s["buffer"], s["a"])
        if s["kind"] in ("load", "store") and key in packs:
            s = {**s, "kind": "v" + s["kind"], "pack": packs[key]["name"]}
        vbody.append(s)
    vbody, live = _live(vbody, {r["var"] for r in reductions})
    return {
        "width": width,
        "packs": list(packs.values()),
        "body": vbody,
        "uses_i": "i" in live,
        "groups": count // width,
        "end": count // width * width,
    }


DEVICE_THREADS = 256
"""Threads per CTA of the nccl-device kernel (the template's kThreads)."""
DEVICE_LOADS_IN_FLIGHT = 16
"""Peer packs a thread of the nccl-device kernel loads before it reduces them (packs ×
peers): 16 loads of 16 bytes in flight per thread, 64 registers."""
DEVICE_MAX_CTAS = 1024
"""Cap of the CTA count the emitter computes; the launch caps it again at the SM count."""


class CudaRenderer(Renderer):
    """CUDA kernels, NCCL collectives, cuBLAS GEMMs, an MPI launcher."""

    templates = (
        ("{stem}.h", "cuda_program.h.jinja"),
        ("{stem}.cu", "cuda_program.cu.jinja"),
        ("main.cu", "cuda_main.cu.jinja"),
        ("Makefile", "cuda_Makefile.jinja"),
        ("run.sh", "run.sh.jinja"),
    )
    runtime_files = ("cocoviz_runtime.h", "cocoviz_runtime.cuh")
    storage_traits = "::cocoviz::CudaDt"

    def storage_ctype(self, dt: DType) -> str:
        return dt.facts.cuda_ctype

    def stmt(self, s: pl.Stmt) -> dict[str, Any]:
        d = super().stmt(s)
        if s.kind in ("load", "store") and s.dtype is not None:
            d["storage"] = self.storage_ctype(s.dtype)
            d["size"] = s.dtype.itemsize
        return d

    def step(self, st: pl.Step) -> dict[str, Any]:
        d = super().step(st)
        if isinstance(st, pl.Kernel):
            vec = vectorize(d["body"], d["reductions"], d["count"])
            d["vec"] = vec
            if vec is not None:
                d["threads"] = -(-d["count"] // vec["width"])
                # a reduction kernel launches the threads its packed path needs
                d["red_blocks"] = max(1, min(REDUCE_BLOCKS, -(-d["threads"] // 256)))
        elif isinstance(st, pl.DeviceCollective):
            d["dev"] = self.device_kernel(d, st)
        return d

    def math(self, ctype: str) -> dict[str, str]:
        return _CUDA_MATH[ctype]

    def device_kernel(self, d: dict[str, Any], st: pl.DeviceCollective) -> dict[str, Any]:
        """How the nccl-device kernel runs (docs/codegen.md, the nccl-device kernel): NCCL's
        symmetric-kernel pattern. `width` elements per pack (16 bytes of the narrowest
        dtype it touches, peers included), `unroll` packs per thread whose loads from all
        `peers` are issued before any is reduced, CTAs sized to the message (`ctas`, capped
        at the SM count at run time). `vec` is None when the shard's global index is not
        unit-stride in the launch index (then every element takes the element-wise loop);
        `multimem` says whether the NVLS variant (switch-side reduction and broadcast
        stores) exists: sums of f32/f16/bf16, and `avg` of f32 (an f16 average would round
        twice)."""
        peers = self.plan.tp
        sizes = [st.src_dtype.itemsize] + [dt.itemsize for _, _, dt in st.gathers]
        sizes += [s["size"] for s in d["prologue"] + d["body"] if s["kind"] in ("load", "store")]
        width = min(MAX_VEC, VEC_BYTES // min(sizes))
        unroll = max(1, min(4, DEVICE_LOADS_IN_FLIGHT // peers))
        count = d["count"]
        extra = []
        if st.shard:
            extra.append(
                self.stmt(
                    pl.Stmt(
                        kind="store", buffer=st.shard, a=st.l_var, b="shard", dtype=st.src_dtype
                    )
                )
            )
        for n, (var, _, dt) in enumerate(st.gathers):
            extra.append(
                self.stmt(pl.Stmt(kind="store", buffer=f"@{n}", a=st.e_var, b=var, dtype=dt))
            )
        body = [*d["prologue"], *d["body"], *extra]
        affine = _affine_indices(body)
        vec = vectorize(body, [], count, width) if st.e_var in affine else None
        out: dict[str, Any] = {"peers": peers, "width": width, "unroll": unroll, "vec": None}
        if vec is None or count < width:
            out["ctas"] = max(1, min(DEVICE_MAX_CTAS, -(-count // DEVICE_THREADS)))
            out["multimem"] = False
            return out
        e_off = _offset_expr(*affine[st.e_var])
        peer_out = {}
        local = []
        for p in vec["packs"]:
            if p["buffer"].startswith("@"):
                peer_out[int(p["buffer"][1:])] = p["name"]
            else:
                local.append(p)
        vec["packs"] = local
        vec["peer_out"] = [peer_out[n] for n in range(len(st.gathers))]
        vec["e_at"] = "i0" + (f" + {e_off}" if e_off else "")
        vec["e_first"] = e_off or "0"
        out["vec"] = vec
        out["ctas"] = max(1, min(DEVICE_MAX_CTAS, -(-vec["groups"] // (DEVICE_THREADS * unroll))))
        out["multimem"] = (
            st.rop == "sum" and st.src_dtype in (DType.F32, DType.F16, DType.BF16)
        ) or (st.rop == "avg" and st.src_dtype is DType.F32)
        out["mc_unroll"] = 4
        return out


RENDERERS: dict[str, type[Renderer]] = {cls.__name__: cls for cls in (CudaRenderer, CpuRenderer)}
"""The renderer classes by the name a row of `cocoviz.emit.targets` gives them."""


def renderer_class(target: str) -> type[Renderer]:
    """The renderer class of `target` (an `EmitError` naming the known targets otherwise)."""
    spec = target_spec(target)
    cls = RENDERERS.get(spec.renderer)
    if cls is None:
        raise EmitError(f"target {target!r} names no renderer class {spec.renderer!r}")
    return cls


def renderer_for(plan: pl.EmitPlan, options: EmitOptions) -> Renderer:
    """The renderer of `options.target` for `plan`."""
    return renderer_class(options.target)(plan, options)
