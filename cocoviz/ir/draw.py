"""`cocoviz show --graph`: the dataflow graph drawn in the terminal with rich.

Stages are placed in layers by longest path from the inputs; each layer is a row of
boxes (op, dtype, shape, layout, what it reads), coloured by kind, with fused and
overlapped groups named on their members.
"""

from __future__ import annotations

from rich.columns import Columns
from rich.console import Console, RenderableType
from rich.console import Group as RichGroup
from rich.panel import Panel
from rich.text import Text

from cocoviz.ir.graph import deps, node_kind, stage_reads
from cocoviz.ir.nodes import COLLECTIVES, Program
from cocoviz.ir.types import format_shape, layouts_text
from cocoviz.style import kind_colour


def layers(program: Program, d: dict[str, set[str]] | None = None) -> list[list[str]]:
    """Stage names by layer (longest path from the inputs); `d` is `deps(program)` when
    the caller has it."""
    d = deps(program) if d is None else d
    depth: dict[str, int] = {}
    for s in program.stages:  # program order is topological
        depth[s.name] = 1 + max((depth[x] for x in d[s.name]), default=-1)
    out: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for s in program.stages:
        out[depth[s.name]].append(s.name)
    return out


def render_graph(program: Program) -> RichGroup:
    G, D = program.grid.group, program.grid.dp
    parts: list[RenderableType] = []
    ins = Text("inputs: ", style="bold")
    for i, inp in enumerate(program.inputs):
        if i:
            ins.append("  ")
        ins.append(f"{inp.name} ", style="bold")
        ins.append(
            f"{inp.ty.dtype.value}{format_shape(inp.ty.shape)} {layouts_text(inp.ty)}", style="dim"
        )
    parts.append(ins)
    for li, names in enumerate(layers(program)):
        boxes = []
        for n in names:
            s = program.stage(n)
            t = s.ty
            kind = node_kind(program, n)
            body = Text()
            over = " over dp" if s.expr.tag == "dp" and s.expr.op in COLLECTIVES else ""
            body.append(f"{s.expr.op.value}{over}\n", style="bold")
            body.append(f"{t.dtype.value}{format_shape(t.shape)}\n")
            # a rank's share: 1/G over tp, times 1/D over dp (docs/language.md, rank grids)
            share = (G if t.layout.is_sliced else 1) * (D if t.dp.is_sliced else 1)
            per_rank = f"1/{share}" if share > 1 else "full"
            body.append(f"{layouts_text(t)} ({per_rank} per rank)\n", style=kind_colour(kind))
            reads = sorted(stage_reads(s))
            body.append("← " + ", ".join(reads) if reads else "← (constants)", style="dim")
            group = program.group_of(n)
            title = n if group is None else f"{n} [{group.kind.value}]"
            boxes.append(Panel(body, title=title, border_style=kind_colour(kind), expand=False))
        parts.append(Text(f"layer {li}", style="dim"))
        parts.append(Columns(boxes))
    if program.outputs:
        parts.append(Text("outputs: " + ", ".join(program.outputs), style="bold"))
    return RichGroup(*parts)


def print_graph(program: Program, console: Console | None = None) -> None:
    (console or Console()).print(render_graph(program))
