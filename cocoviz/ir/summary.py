"""Per-program figures for `check` and the TUI: stage counts, collectives, and the
bytes each rank sends (ring-algorithm volumes, as NCCL moves them)."""

from __future__ import annotations

from dataclasses import dataclass

from cocoviz.ir.collectives import collective
from cocoviz.ir.graph import implicit_reductions, reduce_name
from cocoviz.ir.nodes import COLLECTIVES, Op, Program
from cocoviz.ir.types import TensorType, dp_view


def per_rank_numel(ty: TensorType, group: int, dp: int = 1) -> int:
    """Elements one rank stores for a value of this type (`dp`: the grid's dp size, for
    a value sliced over dp; docs/language.md, rank grids)."""
    n = ty.numel // group if ty.layout.is_sliced else ty.numel
    return n // dp if ty.dp.is_sliced else n


@dataclass(frozen=True)
class CommOp:
    """One collective of a program as the summary lists it."""

    name: str
    op: str
    dtype: str
    nbytes: int  # bytes of the full (unsliced) buffer the collective works on
    sent_per_rank: int  # bytes each participating rank sends


@dataclass(frozen=True)
class Summary:
    """What a program holds and moves: counts of its stages and its communication."""

    program: str
    ranks: str
    world: int
    stages: int
    matmuls: int
    collectives: int
    compute: int
    groups: int
    comm: tuple[CommOp, ...]

    @property
    def sent_per_rank(self) -> int:
        return sum(c.sent_per_rank for c in self.comm)


def comm_ops(program: Program) -> list[CommOp]:
    """Every communication of the program with the bytes each rank sends."""
    G = program.grid.group
    out: list[CommOp] = []
    for s in program.stages:
        e = s.expr
        if e.op not in COLLECTIVES:
            continue
        x = e.args[0].type
        itemsize = x.dtype.itemsize
        if e.tag == "dp":  # over dp: a tp rank's part, over D ranks (rank grids)
            view, D = dp_view(x, G), program.grid.dp
            full = view.numel * itemsize
            sent = collective(e.op).sent(full, per_rank_numel(view, D) * itemsize, D)
            out.append(CommOp(s.name, e.op.value, x.dtype.value, full, sent))
            continue
        full = x.numel * itemsize
        sent = collective(e.op).sent(full, per_rank_numel(x, G) * itemsize, G)
        out.append(CommOp(s.name, e.op.value, x.dtype.value, full, sent))
    counts: dict[str, int] = {}
    for stage, e in implicit_reductions(program):
        k = counts.get(stage, 0)
        counts[stage] = k + 1
        size = e.type.dtype.itemsize
        out.append(
            CommOp(
                reduce_name(stage, k),
                Op.ALLREDUCE.value,
                e.type.dtype.value,
                size,
                collective(Op.ALLREDUCE).sent(size, size, G),
            )
        )
    return out


def summarize(program: Program) -> Summary:
    st = program.stages
    mm = sum(1 for s in st if s.expr.op is Op.MATMUL)
    coll = sum(1 for s in st if s.expr.op in COLLECTIVES)
    return Summary(
        program=program.name,
        ranks=str(program.grid),
        world=program.grid.world,
        stages=len(st),
        matmuls=mm,
        collectives=coll,
        compute=len(st) - mm - coll,
        groups=len(program.groups),
        comm=tuple(comm_ops(program)),
    )


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover
