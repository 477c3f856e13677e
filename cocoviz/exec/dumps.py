"""The names of dumped values: one naming for `cocoviz run --dump`, `cocoviz verify`,
an emitted tree's `--dump` and `cocoviz check-tree` (docs/codegen.md, "Inputs, dumps and
check-tree").

A dump holds every output of the program, named by its stage, and every updated input,
named by the **input** (``m.npy`` holds the new value of input ``m``, i.e. the global
value of its update stage ``m1``): the name a user passes with ``--inputs`` is the name
the new state comes back under, so a dump of one step is the ``--inputs`` of the next. An
update stage that is also an output is dumped under both names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cocoviz.ir.nodes import Expr, Op, Program, ReduceOp

__all__ = ["Dumped", "dumped_values", "inexact_reason"]


@dataclass(frozen=True)
class Dumped:
    """One dumped value."""

    name: str
    """The file stem (``DIR/<name>.npy``) and the name a comparison reports."""
    stage: str
    """The stage whose global value it holds (the update stage of an updated input)."""
    kind: Literal["output", "updated input"]


def dumped_values(program: Program) -> tuple[Dumped, ...]:
    """Outputs in their declared order, then updated inputs in input order."""
    out = [Dumped(o, o, "output") for o in program.outputs]
    updates = program.updates()
    for i in program.inputs:
        stage = updates.get(i.name)
        if stage is not None:
            out.append(Dumped(i.name, stage, "updated input"))
    return tuple(out)


# ------------------------------------------------------------------ exactness

_EXACT = frozenset(
    {
        Op.REF, Op.CONST, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG, Op.MAX, Op.MIN,
        Op.SQRT, Op.RSQRT, Op.RELU, Op.ABS, Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE,
        Op.WHERE, Op.CAST, Op.DROPOUT, Op.SLICE, Op.UPDATE, Op.RESHAPE, Op.TRANSPOSE,
        Op.PERMUTE, Op.ALLGATHER, Op.BROADCAST, Op.SEND, Op.ALLTOALL, Op.AMAX,
    }
)  # fmt: skip
"""Operations every executor computes with the same correctly rounded steps in the same
order (IEEE +, −, ×, ÷ and sqrt, comparisons, data movement, a maximum): bit-identical
wherever they run (docs/codegen.md, "Inputs, dumps and check-tree")."""

_LIBM = frozenset({Op.EXP, Op.LOG, Op.TANH, Op.SIGMOID, Op.GELU, Op.POW})
_SUMS = frozenset({Op.SUM, Op.NORM, Op.LAYERNORM, Op.RMSNORM, Op.SOFTMAX})
_RANK_SUMS = frozenset({Op.ALLREDUCE, Op.REDUCESCATTER, Op.REDUCE})


def _op_reason(e: Expr, stage: str, integer: bool) -> str | None:
    """Why `e` (one node of stage `stage`'s expression) may round differently in emitted
    code than in the reference, or None when it cannot."""
    op = e.op
    if op in _EXACT:
        return None
    if op in _RANK_SUMS:
        if integer or e.rop in (ReduceOp.MAX, ReduceOp.MIN):
            return None
        return (
            f"'{stage}' sums across ranks in the order of the collective's algorithm "
            "(MPI's, NCCL's ring or tree), the reference in rank order"
        )
    if op is Op.MATMUL:
        if integer:
            return None
        return (
            f"'{stage}' is a matmul: the emitted loop (or cuBLAS) and numpy's BLAS "
            "accumulate the dot products in different orders"
        )
    if op in _SUMS:
        if integer and op is Op.SUM:
            return None
        return (
            f"'{stage}' sums over elements ({op.value}): the kernel's order, numpy's "
            "pairwise summation"
        )
    if op in _LIBM:
        return (
            f"'{stage}' calls {op.value}: the C math library's and numpy's results may "
            "differ in the last place"
        )
    return f"'{stage}' uses {op.value}, which is not known to round the same everywhere"


def inexact_reason(program: Program, stage: str) -> str | None:
    """Why the global value of `stage` may differ from the reference's in the last bits
    when an emitted tree computes it — the first operation on the way to it (in
    dependency order, nearest first) whose rounding depends on where it runs — or None
    when every operation it depends on is exact, so the value must be bit-identical."""
    stages = {s.name: s for s in program.stages}
    seen: set[str] = set()
    todo = [stage]
    while todo:
        name = todo.pop(0)
        if name in seen or name not in stages:
            continue
        seen.add(name)
        s = stages[name]
        integer = not s.ty.dtype.is_float
        nodes = [s.expr]
        while nodes:
            e = nodes.pop()
            why = _op_reason(e, name, integer)
            if why is not None:
                return why
            if e.op is Op.REF and e.name is not None:
                todo.append(e.name)
            nodes.extend(e.args)
    return None
