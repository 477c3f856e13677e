"""The collectives, dtype and target tables, and what reads them: every row is known to
each layer that must handle it (docs/architecture.md)."""

from __future__ import annotations

import pytest

from cocoviz.emit import plan as pl
from cocoviz.emit.render import (
    CpuRenderer,
    CudaRenderer,
    EmitOptions,
    renderer_class,
    renderer_for,
    unknown,
)
from cocoviz.emit.targets import DEFAULT_TARGET, TARGET_NAMES, TARGETS
from cocoviz.errors import CocovizError
from cocoviz.exec.ops import COLLECTIVE_SEMANTICS
from cocoviz.ir.collectives import COLLECTIVE_TABLE, Operand, collective, collective_named
from cocoviz.ir.nodes import COLLECTIVES, Op, Program, unscheduled
from cocoviz.ir.types import DTYPE_NAMES, FLAT, REPLICATED, DType
from cocoviz.numerics import DTYPES
from cocoviz.sim.collectives import Coll
from cocoviz.sim.hardware import load_profile


def test_every_row_has_its_op_and_every_collective_op_a_row() -> None:
    assert {Op(c.name) for c in COLLECTIVE_TABLE} == COLLECTIVES
    assert [collective(op).name for op in (Op.ALLREDUCE, Op.SEND)] == ["allreduce", "send"]
    assert len({c.label for c in COLLECTIVE_TABLE}) == len(COLLECTIVE_TABLE)


def test_the_cost_model_prices_every_row() -> None:
    assert {c.cost_name for c in COLLECTIVE_TABLE} == {c.value for c in Coll}
    for op in COLLECTIVES:
        assert Coll.of(op).row is collective(op)
    assert Coll.parse("send") is Coll.SENDRECV and Coll.parse("p2p") is Coll.SENDRECV
    assert Coll.parse("all-reduce") is Coll.ALLREDUCE


def test_the_reference_has_semantics_for_every_row() -> None:
    assert set(COLLECTIVE_SEMANTICS) == COLLECTIVES


def test_rows_read_as_the_language_documents_them() -> None:
    ar, rs, ag = (collective(o) for o in (Op.ALLREDUCE, Op.REDUCESCATTER, Op.ALLGATHER))
    assert ar.reduces and not ar.rooted and ar.result == REPLICATED
    assert rs.result == FLAT and rs.count_per_rank and ag.operand is Operand.SLICED
    assert collective(Op.SEND).result is None and collective(Op.SEND).operand is Operand.ANY
    assert collective(Op.REDUCE).rooted and collective(Op.BROADCAST).rooted
    assert collective_named("sendrecv") is collective(Op.SEND)
    assert collective_named("alltoall") is collective(Op.ALLTOALL)
    assert collective_named("scatter") is None
    a2a = collective(Op.ALLTOALL)
    assert a2a.reslices and a2a.operand is Operand.SLICED and a2a.chunkable
    # ring volumes: what one rank sends of a full buffer of 8 bytes over 4 ranks (an
    # alltoall keeps a quarter of its 2 and sends 1.5, counted in whole bytes)
    assert [c.sent(8, 2, 4) for c in COLLECTIVE_TABLE] == [12, 6, 6, 8, 8, 2, 1]


def test_a_plan_collective_names_a_row() -> None:
    with pytest.raises(pl.EmitError, match="not a collective"):
        pl.Collective("c", "s", "scatter", None, "a", "b", 1, DType.F32)


def test_dtype_facts_are_the_numerics_table() -> None:
    assert DTYPE_NAMES == tuple(DTYPES)
    for d in DType:
        f, row = d.facts, DTYPES[d.value]
        assert (f.itemsize, f.is_float, f.numpy, d.compute.facts.numpy) == (
            row.itemsize,
            row.is_float,
            row.storage.name,
            row.compute.name,
        )
        assert (f.cpu_ctype, f.cuda_ctype, f.nccl, f.mpi) == (
            row.cpu_ctype,
            row.cuda_ctype,
            row.nccl,
            row.mpi,
        )


def test_target_table() -> None:
    assert TARGET_NAMES == ("cuda", "cpu") and DEFAULT_TARGET == "cuda"
    assert [t.gpu for t in TARGETS] == [True, False]
    assert renderer_class("cpu") is CpuRenderer
    assert renderer_class("cuda") is CudaRenderer


def test_an_unknown_target_is_an_emit_error_not_the_cpu() -> None:
    with pytest.raises(CocovizError, match="unknown target 'hip'") as err:
        renderer_for(None, EmitOptions(target="hip"))  # type: ignore[arg-type]
    assert isinstance(err.value, pl.EmitError)
    assert "cuda, cpu" in str(err.value.hint)


def test_an_unknown_tag_is_a_render_error() -> None:
    with pytest.raises(pl.EmitError, match="cannot render the collective 'scatter'"):
        unknown("the collective", "scatter")
    stmt = pl.Stmt(kind="unary", dst="v1", a="v0", op="cbrt", dtype=DType.F32)
    renderer = CpuRenderer(None, EmitOptions(target="cpu"))  # type: ignore[arg-type]
    with pytest.raises(pl.EmitError, match="unary operator 'cbrt'"):
        renderer.stmt(stmt)
    good = renderer.stmt(pl.Stmt(kind="binary", dst="v2", a="x", b="y", op="div", dtype=DType.I32))
    assert good["c_expr"] == "(y == 0 ? int64_t(0) : x / y)"


def test_unscheduled_drops_the_groups_only() -> None:
    from cocoviz import samples
    from cocoviz.ir.lower import load_file
    from cocoviz.schedule import apply_block, find_block

    p0 = load_file(samples.path("megatron_mlp"))
    p = apply_block(p0, find_block(p0, "fused"))
    assert p.groups and isinstance(unscheduled(p), Program) and not unscheduled(p).groups
    assert unscheduled(p).stages == p.stages


def test_model_table_reads_the_rows() -> None:
    from cocoviz.sim.model_table import format_table, model_table

    hw = load_profile("h100-dgx")
    ag = model_table(hw, "allgather", 8, dtype="bf16", min_bytes=1 << 20, max_bytes=1 << 20)
    assert ag[0].count == (1 << 20) // (2 * 8) and ag[0].redop == "none" and ag[0].root == -1
    red = model_table(hw, "reduce", 8, min_bytes=1 << 20, max_bytes=1 << 20)
    assert red[0].redop == "sum" and red[0].root == 0
    assert " bfloat16 " in format_table(ag)
