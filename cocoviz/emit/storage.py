"""Storage of the emitter's lowering (docs/codegen.md, what each construct becomes): the
state one program's lowering shares, every value's view and buffer, aliases for in-place
updates and collectives, and the keys and constants of dropout."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from cocoviz.emit import plan as pl
from cocoviz.emit.body import Reads, Unit, view_of
from cocoviz.emit.names import NameTable
from cocoviz.emit.plan import Collectives, EmitError
from cocoviz.ir.graph import users
from cocoviz.ir.nodes import Group, GroupKind, Op, Program
from cocoviz.ir.types import DType, TensorType


class Storage:
    """What one program's lowering knows about its values and buffers."""

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
        self.D = program.grid.dp
        """D: the dp group's size on a grid with a dp axis (docs/language.md, rank grids)."""
        self.param_names = {q.name for q in program.params}
        self.param_cname = param_cname
        self.register_only = register_only
        self.users = users(program)
        self.types: dict[str, TensorType] = {i.name: i.ty for i in program.inputs}
        self.types.update({s.name: s.ty for s in program.stages})
        self.chunks_of: dict[str, int] = {}
        self.shards_of: dict[str, int] = {}
        self.unstored: set[str] = set()
        """Matmuls of decomposed reduce-scatters: computed block by block, never whole."""
        for g in program.groups:
            if g.kind is GroupKind.OVERLAPPED:
                assert g.chunks is not None
                if g.by_shard:
                    # every value keeps its layout: nothing is chunked (cocoviz.emit.shards)
                    for n in g.stages():
                        self.shards_of[n] = g.chunks
                    first = g.items[0]
                    if isinstance(first, str) and program.stage(first).expr.op is Op.MATMUL:
                        self.unstored.add(first)
                    continue
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
        self.reads: dict[str, Reads] = {}
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
                if self.type_of(name).layout.is_sliced or self.type_of(name).dp.is_sliced
                else None,
                self.D,
            )
        return self.views[name]

    def _stage_of(self, value: str) -> str:
        return value.split(".", 1)[0] if value not in self.types else value

    def buffer_of(self, name: str) -> pl.Buffer:
        return self.buffers[self.value_buffer[name]]

    def note_read(self, name: str, kernel: str, register: bool) -> None:
        r = self.reads.setdefault(name, Reads())
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

    def dp_alias(self, name: str, count: int) -> str:
        """A buffer aliasing this rank's dp part of `name` (replicated over dp): `count`
        elements at ``dp·count`` of its tp part, for `slice(name, over=dp)`."""
        key = f"{name}@dp"
        if key not in self.value_buffer:
            b = self.buffer_of(name)
            root = b.alias or b.cname
            base = b.offset if b.alias else pl.ZERO
            if b.addressing != "local":
                raise EmitError(
                    f"slice('{name}', over=dp) of a value stored at its global positions "
                    "is not supported yet (code generation)"
                )
            off = dataclasses.replace(base, per_dp=base.per_dp + count)
            cname = self.names.fresh(f"{self.ns}_{name}_dp", "v_")
            self.add_buffer(
                key,
                pl.Buffer(cname, name, b.dtype, count, b.pstage, "stage", alias=root, offset=off),
            )
        return self.value_buffer[key]

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
            base.per_dp + offset.per_dp,
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

    # ---- storage
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
                if (
                    v.dp == "sliced"
                    and tv.dp == "replicated"
                    and dataclasses.replace(v, count=v.tp_count, dp="replicated", tp_count=0) == tv
                ):
                    # this rank's dp part of the target, in place: the allgather over dp
                    # that must follow runs in place (docs/language.md, rank grids)
                    self.alias_buffer(s.name, tgt, pl.Offset(per_dp=v.count))
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
                dp_inplace = (
                    sb is not None
                    and e.tag == "dp"
                    and sb.alias is not None
                    and sb.offset == pl.Offset(per_dp=self.view(src).count)
                    and self.buffers[sb.alias].count == v.count
                )
                if (
                    sb is not None
                    and sb.alias is not None
                    and (sb.addressing == "global" or dp_inplace)
                ):
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
            if (
                e.op in (Op.ALLREDUCE, Op.REDUCESCATTER)
                and s.name not in self.chunks_of
                and s.name not in self.shards_of
            ):
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
                    off = pl.ZERO
                    if e.op is Op.REDUCESCATTER:
                        # this rank's block: tp·count over tp, dp·count over dp
                        off = (
                            pl.Offset(per_dp=v.count)
                            if e.tag == "dp"
                            else pl.Offset(per_rank=v.count)
                        )
                    self.alias_buffer(s.name, src, off)
                    continue
            if s.name in self.register_only or s.name in self.unstored:
                continue
            self.new_buffer(s.name, "stage", s.ty.dtype, v.count, s.ty.pstage)
