"""The printer: Program → `.coco` text that parses back to an equal Program."""

from __future__ import annotations

from cocoviz.ir.collectives import collective
from cocoviz.ir.graph import ordered_items
from cocoviz.ir.nodes import (
    AXIS_NAMES,
    AXIS_REDUCTIONS,
    BINARY_INFIX,
    COLLECTIVES,
    COMPARISONS,
    CONSTANTS,
    PERMUTES,
    Expr,
    Group,
    GroupKind,
    Op,
    Program,
    ScheduleBlock,
    Stage,
    StepCall,
)
from cocoviz.ir.types import axis_layout_text, format_shape

_PREC = {Op.ADD: 1, Op.SUB: 1, Op.MUL: 2, Op.DIV: 2}
_DEFAULT_EPS = {Op.LAYERNORM: 1e-5, Op.RMSNORM: 1e-6}


def format_number(v: float | int) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v)}.0"
    return repr(v)


class _ExprPrinter:
    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.dropouts = 0

    def expr(self, e: Expr, prec: int = 0) -> str:
        op = e.op
        if op is Op.REF:
            return str(e.name)
        if op is Op.CONST:
            assert e.value is not None
            s = format_number(e.value)
            return f"({s})" if s.startswith("-") and prec >= 2 else s
        if op in BINARY_INFIX:
            p = _PREC[op]
            lhs = self.expr(e.args[0], p)
            rhs = self.expr(e.args[1], p + 1)
            s = f"{lhs} {op.value} {rhs}"
            return f"({s})" if p < prec else s
        if op is Op.NEG:
            s = "-" + self.expr(e.args[0], 3)
            return f"({s})" if prec >= 2 else s
        if op in COMPARISONS:
            return f"{self.expr(e.args[0])} {op.value} {self.expr(e.args[1])}"
        if op is Op.DROPOUT:  # ids count dropout calls in source order: number it first
            default = f"{self.stage}#{self.dropouts}"
            self.dropouts += 1
        args = [self.expr(a) for a in e.args]
        row = collective(op) if op in COLLECTIVES else None
        if row is not None and row.reduces:
            assert e.rop is not None
            args.insert(0, e.rop.value)
        if row is not None and row.rooted and e.value:
            args.append(f"root={e.value}")
        if row is not None and row.reslices:
            if e.tag is not None:
                args.append(f"from={e.tag}")
            args.append(f"to={e.value}")
        if op is Op.CAST:
            assert e.dtype_arg is not None
            args.insert(0, e.dtype_arg.value)
        if op is Op.RESHAPE:
            assert e.shape_arg is not None
            args += [size.text for size in e.shape_arg]
        if op in PERMUTES:
            assert e.tag is not None
            args += e.tag.split(",")
        if op is Op.SCATTER_ADD:
            assert e.dtype_arg is not None and e.shape_arg is not None
            sizes = ", ".join(size.text for size in e.shape_arg)
            args.insert(0, f"{e.dtype_arg.value}[{sizes}]")
        if op in (Op.TOPK, Op.TOPK_INDICES, Op.CAPACITY_SLOTS):
            assert e.shape_arg is not None
            args += [size.text for size in e.shape_arg]
        if op in (Op.GATHER, Op.SCATTER_ADD, Op.TOPK, Op.TOPK_INDICES):
            args.append(f"dim={e.value}")
        if op in CONSTANTS:
            assert e.dtype_arg is not None and e.shape_arg is not None
            sizes = ", ".join(size.text for size in e.shape_arg)
            parts = [f"{e.dtype_arg.value}[{sizes}]"]
            if op is Op.FULL:
                assert e.value is not None
                parts.append(format_number(e.value))
            if op is Op.IOTA:
                parts.append(f"dim={e.value}")
            return f"{op.value}({', '.join(parts)})"
        if op in AXIS_REDUCTIONS:
            args.append(f"dim={e.value}")
            if e.tag == "keepdim":
                args.append("keepdim=true")
            return f"{AXIS_NAMES[op]}({', '.join(args)})"
        if op is Op.SLICE and e.value is not None:
            args.append(str(e.value))
        if e.tag == "dp" and (op is Op.SLICE or (row is not None and not row.reslices)):
            args.append("over=dp")  # the axis of a collective or a slice (rank grids)
        if op is Op.DROPOUT:
            assert e.value is not None
            args.append(format_number(e.value))
            if e.tag != default and e.tag is not None:
                src, _, k = e.tag.rpartition("#")
                args.append(f"id={src}")
                if k != "0":
                    args.append(f"k={k}")
        if op in _DEFAULT_EPS and e.value is not None and e.value != _DEFAULT_EPS[op]:
            args.append(f"eps={format_number(e.value)}")
        return f"{op.value}({', '.join(args)})"


def format_expr(e: Expr, stage: str = "") -> str:
    return _ExprPrinter(stage).expr(e)


def format_stage(s: Stage) -> str:
    return f"{s.name} = {format_expr(s.expr, s.name)}"


def format_step(step: StepCall) -> str:
    return str(step)


def format_schedule(block: ScheduleBlock) -> str:
    lines = [f"schedule {block.name} {{"]
    lines += [f"  {format_step(s)}" for s in block.steps]
    lines.append("}")
    return "\n".join(lines)


def _group_lines(g: Group, stages: dict[str, Stage], indent: str) -> list[str]:
    if g.kind is GroupKind.FUSED:
        head = f"{indent}fused {{"
    else:
        kw = "shards" if g.by_shard else "chunks"
        head = f"{indent}overlapped {kw}={g.chunks} {{"
    lines = [head]
    for it in g.items:
        if isinstance(it, Group):
            lines += _group_lines(it, stages, indent + "  ")
        else:
            lines.append(f"{indent}  {format_stage(stages[it])}")
    lines.append(f"{indent}}}")
    return lines


def _annotate(lines: list[str], comments: list[str]) -> list[str]:
    width = max((len(x) for x, c in zip(lines, comments, strict=True) if c), default=0)
    return [f"{x.ljust(width)}  # {c}" if c else x for x, c in zip(lines, comments, strict=True)]


def format_program(program: Program, schedules: bool = True, annotate: bool = False) -> str:
    """The program as `.coco` text (normal-form layouts, groups as blocks).

    With `annotate`, every stage line ends with a comment giving its inferred dtype,
    shape and layout (and pipeline stage); comments keep the text parseable.
    """
    p = program
    lines = [f"program {p.name}", f"ranks {p.grid}"]
    if p.dims:
        lines.append("dim " + ", ".join(f"{d.name} = {d.value}" for d in p.dims))
    if p.params:
        lines.append(
            "param "
            + ", ".join(f"{q.name}: {q.dtype.value} = {format_number(q.default)}" for q in p.params)
        )
    lines.append("")
    for i in p.inputs:
        t = i.ty
        stage = f" @stage {t.pstage}" if t.pstage else ""
        over = "" if t.dp.is_replicated else " " + axis_layout_text(t.dp, "dp")
        lines.append(
            f"input {i.name} : {t.dtype.value}{format_shape(t.shape)} {t.layout}{over}{stage}"
        )
    lines.append("")
    by_name = {s.name: s for s in p.stages}
    body: list[str] = []
    for item in ordered_items(p):
        if isinstance(item, Group):
            body += _group_lines(item, by_name, "")
        else:
            body.append(format_stage(by_name[item]))
    if annotate:
        comments = []
        for line in body:
            name = line.strip().split(" = ", 1)[0]
            st = by_name.get(name) if " = " in line else None
            if st is None:
                comments.append("")
                continue
            t = st.ty
            where = f" @stage {t.pstage}" if p.grid.is_grid and t.pstage is not None else ""
            over = "" if t.dp.is_replicated else " " + axis_layout_text(t.dp, "dp")
            comments.append(f"{t.dtype.value}{format_shape(t.shape)} {t.layout}{over}{where}")
        body = _annotate(body, comments)
    lines += body
    if p.outputs:
        lines.append("")
        lines.append("output " + ", ".join(p.outputs))
    if schedules and p.schedules:
        for b in p.schedules:
            lines.append("")
            lines.append(format_schedule(b))
    return "\n".join(lines) + "\n"
