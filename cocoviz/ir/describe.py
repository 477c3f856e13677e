"""A program as JSON (`cocoviz show --json`, `apply --json`): its declarations, stages
with their types and printed expressions, implicit reductions, groups and outputs. Above
both the dataflow graph (`cocoviz.ir.graph`) and the printer (`cocoviz.ir.printer`),
which it uses."""

from __future__ import annotations

from typing import Any

from cocoviz.ir.graph import (
    data_deps,
    deps,
    implicit_reductions,
    node_kind,
    reduce_name,
    stage_reads,
)
from cocoviz.ir.nodes import (
    COLLECTIVES,
    Group,
    Program,
)
from cocoviz.ir.printer import format_expr
from cocoviz.ir.types import axis_layout_text


def to_json(program: Program) -> dict[str, Any]:
    """A JSON-serializable description of the program and its dataflow graph."""
    def ty(t: Any) -> dict[str, Any]:
        return {
            "dtype": t.dtype.value,
            "shape": [s.text for s in t.shape],
            "sizes": [s.value for s in t.shape],
            "layout": str(t.layout),
            "pipeline_stage": t.pstage,
            # on a grid with dp: the layout over dp (docs/language.md, rank grids)
            **({"dp_layout": axis_layout_text(t.dp, "dp")} if program.grid.has_dp else {}),
        }

    def group(g: Group) -> dict[str, Any]:
        return {
            "kind": g.kind.value,
            "chunks": g.chunks,
            "by_shard": g.by_shard,
            "items": [group(i) if isinstance(i, Group) else i for i in g.items],
        }

    red = implicit_reductions(program)
    d = deps(program)
    dd = data_deps(program)
    return {
        "program": program.name,
        "ranks": {
            "tp": program.grid.tp,
            "pp": program.grid.pp,
            "grid": program.grid.is_grid,
            **({"dp": program.grid.dp, "world": program.grid.world} if program.grid.has_dp else {}),
        },
        "dims": {x.name: x.value for x in program.dims},
        "params": [
            {"name": q.name, "dtype": q.dtype.value, "default": q.default} for q in program.params
        ],
        "inputs": [{"name": i.name, **ty(i.ty)} for i in program.inputs],
        "stages": [
            {
                "name": s.name,
                "op": s.expr.op.value,
                **({"over": "dp"} if s.expr.tag == "dp" and s.expr.op in COLLECTIVES else {}),
                "expr": format_expr(s.expr, s.name),
                "kind": node_kind(program, s.name),
                "reads": sorted(stage_reads(s)),
                "after": sorted(d[s.name] - dd[s.name]),
                **ty(s.ty),
            }
            for s in program.stages
        ],
        "implicit_reductions": [
            {
                "name": reduce_name(n, sum(1 for m, _ in red[:k] if m == n)),
                "stage": n,
                "op": e.op.value,
            }
            for k, (n, e) in enumerate(red)
        ],
        "groups": [group(g) for g in program.groups],
        "outputs": list(program.outputs),
    }
