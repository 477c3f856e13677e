"""A layered drawing of a program's dataflow graph with box-drawing characters.

Stages go into layers by longest path (`cocoviz.ir.draw.layers`); an edge that skips
layers passes through one-column dummy slots so that it never crosses a box; inside a
layer, nodes are ordered by the mean position of their predecessors (two sweeps), with
the members of one group kept side by side. The result is a `GraphDrawing`: node boxes,
edge cells (a bitmask of up/down/left/right strokes per cell) and group frames, from
which any row is rendered on demand, so a 500-stage graph costs nothing until it is
scrolled into view.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from rich.segment import Segment
from rich.style import Style

from cocoviz.ir.draw import layers
from cocoviz.ir.graph import deps, implicit_reductions, op_kind, stage_reads
from cocoviz.ir.nodes import Group, GroupKind, Op, Program, Stage
from cocoviz.ir.types import format_shape
from cocoviz.style import kind_colour

NODE_H = 5  # border, op, type, layout/reads, border
COL_GAP = 4
MAX_NODE_W = 30
DUMMY_W = 1

UP, DOWN, LEFT, RIGHT = 1, 2, 4, 8
ARROW = 16
_STROKE = {
    0: " ",
    UP: "│",
    DOWN: "│",
    UP | DOWN: "│",
    LEFT: "─",
    RIGHT: "─",
    LEFT | RIGHT: "─",
    DOWN | RIGHT: "┌",
    DOWN | LEFT: "┐",
    UP | RIGHT: "└",
    UP | LEFT: "┘",
    UP | DOWN | RIGHT: "├",
    UP | DOWN | LEFT: "┤",
    DOWN | LEFT | RIGHT: "┬",
    UP | LEFT | RIGHT: "┴",
    UP | DOWN | LEFT | RIGHT: "┼",
}


@dataclass(frozen=True)
class NodeBox:
    """One stage's box: where it is and what it says."""

    name: str
    kind: str
    x: int
    y: int
    w: int
    lines: tuple[str, ...]  # op, type, detail
    layer: int

    @property
    def cx(self) -> int:
        return self.x + self.w // 2

    def contains(self, x: int, y: int) -> bool:
        return self.x <= x < self.x + self.w and self.y <= y < self.y + NODE_H


@dataclass(frozen=True)
class Frame:
    """A fused or overlapped group drawn as a frame around its members."""

    label: str
    kind: str
    x0: int
    y0: int
    x1: int
    y1: int


class Strokes:
    """The edges as vertical and horizontal strokes, turned into per-cell masks only for
    the rows that are drawn (a large graph has far more rows than a screen)."""

    def __init__(self, band_starts: list[int]) -> None:
        self.band_starts = band_starts  # first row of each layer's band, ascending
        self.vertical: dict[int, list[tuple[int, int, int]]] = {}  # band → (x, y0, y1)
        self.horizontal: dict[int, list[tuple[int, int]]] = {}  # row → (x0, x1)
        self.arrows: dict[int, list[int]] = {}  # row → columns

    def _band(self, y: int) -> int:
        return bisect.bisect_right(self.band_starts, y) - 1

    def vline(self, x: int, y0: int, y1: int) -> None:
        self.vertical.setdefault(self._band(y0), []).append((x, y0, y1))

    def hline(self, y: int, x0: int, x1: int) -> None:
        self.horizontal.setdefault(y, []).append((min(x0, x1), max(x0, x1)))

    def arrow(self, x: int, y: int) -> None:
        self.arrows.setdefault(y, []).append(x)

    def row(self, y: int) -> dict[int, int]:
        """Column → stroke mask for row y."""
        out: dict[int, int] = {}
        band = self._band(y)
        for b in (band - 1, band):
            for x, y0, y1 in self.vertical.get(b, ()):
                if y0 <= y <= y1:
                    out[x] = out.get(x, 0) | (UP if y > y0 else 0) | (DOWN if y < y1 else 0)
        for a, b in self.horizontal.get(y, ()):
            for x in range(a, b + 1):
                out[x] = out.get(x, 0) | (LEFT if x > a else 0) | (RIGHT if x < b else 0)
        for x in self.arrows.get(y, ()):
            out[x] = out.get(x, 0) | ARROW
        return out


@dataclass
class GraphDrawing:
    width: int
    height: int
    nodes: dict[str, NodeBox]
    frames: list[Frame]
    strokes: Strokes
    header: str
    layers: list[list[str]] = field(default_factory=list)

    def node_at(self, x: int, y: int) -> str | None:
        for n in self.nodes.values():
            if n.contains(x, y):
                return n.name
        return None

    def neighbour(self, name: str | None, direction: str) -> str | None:
        """The node next to `name` in a direction (up/down/left/right)."""
        if not self.nodes:
            return None
        if name not in self.nodes:
            return self.layers[0][0] if self.layers and self.layers[0] else None
        here = self.nodes[name]
        if direction in ("left", "right"):
            row = self.layers[here.layer]
            i = row.index(name) + (1 if direction == "right" else -1)
            return row[i] if 0 <= i < len(row) else None
        li = here.layer + (1 if direction == "down" else -1)
        if not 0 <= li < len(self.layers) or not self.layers[li]:
            return None
        return min(self.layers[li], key=lambda n: abs(self.nodes[n].cx - here.cx))

    def render_row(self, y: int, selected: str | None, base: Style) -> list[Segment]:
        """Segments for one row of the drawing, `width` cells wide."""
        chars = [" "] * self.width
        styles: list[Style] = [base] * self.width
        for f in self.frames:
            if not f.y0 <= y <= f.y1:
                continue
            st = base + Style(color=kind_colour(f.kind), dim=False)
            if y in (f.y0, f.y1):
                left, right = ("╭", "╮") if y == f.y0 else ("╰", "╯")
                for x in range(f.x0, f.x1 + 1):
                    chars[x], styles[x] = "┄", st
                chars[f.x0], chars[f.x1] = left, right
                if y == f.y0:
                    label = f" {f.label} "
                    for i, ch in enumerate(label[: max(0, f.x1 - f.x0 - 2)]):
                        chars[f.x0 + 2 + i] = ch
                        styles[f.x0 + 2 + i] = st + Style(bold=True)
            else:
                chars[f.x0], styles[f.x0] = "┆", st
                chars[f.x1], styles[f.x1] = "┆", st
        edge_style = base + Style(color="bright_black")
        for x, mask in self.strokes.row(y).items():
            chars[x] = "▼" if mask & ARROW else _STROKE.get(mask, "┼")
            styles[x] = edge_style
        for n in self.nodes.values():
            if not n.y <= y < n.y + NODE_H:
                continue
            sel = n.name == selected
            color = kind_colour(n.kind)
            border = base + Style(color=color, bold=sel)
            text = base + (Style(reverse=True, bold=True) if sel else Style())
            r = y - n.y
            inner = n.w - 2
            if r == 0:
                line = "┏" + "━" * inner + "┓" if sel else "┌" + "─" * inner + "┐"
                title = f" {n.name} "[:inner]
                cells = list(line)
                for i, ch in enumerate(title):
                    cells[1 + i] = ch
                for i, ch in enumerate(cells):
                    chars[n.x + i] = ch
                    styles[n.x + i] = border
                for i in range(len(title)):
                    styles[n.x + 1 + i] = border + Style(bold=True, reverse=sel)
            elif r == NODE_H - 1:
                line = "┗" + "━" * inner + "┛" if sel else "└" + "─" * inner + "┘"
                for i, ch in enumerate(line):
                    chars[n.x + i] = ch
                    styles[n.x + i] = border
            else:
                body = n.lines[r - 1][:inner].ljust(inner)
                side = "┃" if sel else "│"
                chars[n.x], styles[n.x] = side, border
                chars[n.x + n.w - 1], styles[n.x + n.w - 1] = side, border
                for i, ch in enumerate(body):
                    chars[n.x + 1 + i] = ch
                    styles[n.x + 1 + i] = text + (
                        Style(color=color, bold=True) if r == 1 else Style(dim=r == 3 and not sel)
                    )
        segments: list[Segment] = []
        run_start = 0
        for x in range(1, self.width + 1):
            if x == self.width or styles[x] != styles[run_start]:
                segments.append(Segment("".join(chars[run_start:x]), styles[run_start]))
                run_start = x
        return segments


# Node text by stage object: most stages are the same objects before and after a step,
# so a step on a large program re-describes only the stages it touched.
_LINES: dict[int, tuple[Stage, int, tuple[str, ...]]] = {}


def _node_lines(s: Stage, group: int, stage_names: set[str] | frozenset[str]) -> tuple[str, ...]:
    hit = _LINES.get(id(s))
    if hit is not None and hit[0] is s and hit[1] == group:
        return hit[2]
    t = s.ty
    e = s.expr
    if e.rop is not None:
        op = f"{e.op.value}({e.rop.value})"
    elif e.op is Op.MATMUL or e.op in (Op.UPDATE,):
        op = e.op.value
    else:
        ops = sorted({x.op.value for x in e.walk() if x.op not in (Op.REF, Op.CONST)})
        op = " ".join(ops) if ops else "copy"
    per_rank = f" 1/{group}" if t.layout.is_sliced else ""
    ty = f"{t.dtype.value}{format_shape(t.shape)}"
    inputs = sorted(r for r in stage_reads(s) if r not in stage_names)
    detail = f"{t.layout}{per_rank}"
    if inputs:
        detail += " ← " + ",".join(inputs)
    lines = (op, ty, detail)
    if len(_LINES) > 20000:
        _LINES.clear()
    _LINES[id(s)] = (s, group, lines)
    return lines


def _kinds(program: Program) -> dict[str, str]:
    """`cocoviz.ir.graph.node_kind` for every stage at once."""
    out: dict[str, str] = {}
    for g in program.groups:
        for n in g.stages():
            out[n] = g.kind.value
    for s in program.stages:
        if s.name not in out:
            out[s.name] = op_kind(s)
    return out


def _group_frames(program: Program) -> list[tuple[Group, int]]:
    out: list[tuple[Group, int]] = []

    def visit(g: Group, depth: int) -> None:
        out.append((g, depth))
        for it in g.items:
            if isinstance(it, Group):
                visit(it, depth + 1)

    for g in program.groups:
        visit(g, 0)
    return out


def layout_graph(program: Program) -> GraphDrawing:
    """Place every stage and route every stage-to-stage edge."""
    by_layer = layers(program)
    d = deps(program)
    layer_of = {n: i for i, row in enumerate(by_layer) for n in row}
    group_rank: dict[str, int] = {}
    for gi, g in enumerate(program.groups):
        for n in g.stages():
            group_rank[n] = gi

    # Dummy slots for edges that skip layers: ("~src>dst", layer).
    slots: list[list[str]] = [list(row) for row in by_layer]
    chain: dict[tuple[str, str], list[str]] = {}
    for dst, srcs in d.items():
        for src in sorted(srcs):
            a, b = layer_of[src], layer_of[dst]
            path = [src]
            for li in range(a + 1, b):
                dummy = f"~{src}>{dst}@{li}"
                slots[li].append(dummy)
                path.append(dummy)
            path.append(dst)
            chain[(src, dst)] = path
    preds: dict[str, list[str]] = {}
    for path in chain.values():
        for u, v in zip(path, path[1:], strict=False):
            preds.setdefault(v, []).append(u)
    succs: dict[str, list[str]] = {}
    for v, us in preds.items():
        for u in us:
            succs.setdefault(u, []).append(v)

    widths: dict[str, int] = {}
    contents: dict[str, tuple[str, ...]] = {}
    by_name = {s.name: s for s in program.stages}
    stage_names = set(by_name)
    kinds = _kinds(program)
    G = program.grid.group
    for row in by_layer:
        for n in row:
            lines = _node_lines(by_name[n], G, stage_names)
            contents[n] = lines
            widths[n] = min(MAX_NODE_W, max(len(n) + 4, *(len(x) + 2 for x in lines)))

    def order_pass(rows: list[list[str]], neighbours: dict[str, list[str]]) -> None:
        pos: dict[str, float] = {}
        for row in rows:
            for i, n in enumerate(row):
                pos[n] = i
        for row in rows:
            keys: dict[str, tuple[float, float]] = {}
            for n in row:
                ns = [pos[m] for m in neighbours.get(n, []) if m in pos]
                keys[n] = (sum(ns) / len(ns) if ns else pos[n], pos[n])
            row.sort(key=keys.__getitem__)
            for i, n in enumerate(row):
                pos[n] = i

    order_pass(slots, preds)
    order_pass(slots[::-1], succs)
    order_pass(slots, preds)
    # Keep group members adjacent inside a layer (stable otherwise).
    for row in slots:
        index = {n: i for i, n in enumerate(row)}
        firsts: dict[int, int] = {}
        for n in row:
            g = group_rank.get(n)
            if g is not None:
                firsts.setdefault(g, index[n])
        row.sort(key=lambda n: (firsts.get(group_rank.get(n, -1), index[n]), index[n]))

    # Each source whose edges into the next layer bend gets its own bus row in the gap,
    # so edges from different stages never share a horizontal stroke.
    def layer_index(n: str) -> int:
        return int(n.rsplit("@", 1)[1]) if n.startswith("~") else layer_of[n]

    xs: dict[str, int] = {}
    for row in slots:
        x = 2
        for n in row:
            w = DUMMY_W if n.startswith("~") else widths[n]
            xs[n] = x + w // 2
            x += w + COL_GAP
    buses: list[dict[str, int]] = [{} for _ in slots]
    for path in chain.values():
        for u, v in zip(path, path[1:], strict=False):
            if xs[u] != xs[v]:
                b = buses[layer_index(u)]
                b.setdefault(u, len(b))
    top = 2  # header line and a blank row
    ys: list[int] = []
    y = top
    for li in range(len(slots)):
        ys.append(y)
        y += NODE_H + 3 + max(1, len(buses[li]))
    height = y

    nodes: dict[str, NodeBox] = {}
    width = 0
    for li, row in enumerate(slots):
        for n in row:
            if not n.startswith("~"):
                w = widths[n]
                nodes[n] = NodeBox(n, kinds[n], xs[n] - w // 2, ys[li], w, contents[n], li)
        width = max(width, max((xs[n] + widths.get(n, 1) for n in row), default=0) + COL_GAP)

    strokes = Strokes([0] + [y - 1 for y in ys[1:]])
    vline, hline = strokes.vline, strokes.hline

    for path in chain.values():
        for u, v in zip(path, path[1:], strict=False):
            lu = layer_index(u)
            if u.startswith("~"):
                # A dummy slot: a straight vertical through the node band.
                vline(xs[u], ys[lu] - 1, ys[lu] + NODE_H)
            y_from = ys[lu] + NODE_H
            y_to = ys[lu + 1] - 1
            if xs[u] == xs[v]:
                vline(xs[u], y_from, y_to)
            else:
                bus = y_from + 1 + buses[lu][u]
                vline(xs[u], y_from, bus)
                hline(bus, xs[u], xs[v])
                vline(xs[v], bus, y_to)
            if not v.startswith("~"):
                strokes.arrow(xs[v], y_to)

    frames: list[Frame] = []
    for g, depth in _group_frames(program):
        members = [nodes[n] for n in g.stages() if n in nodes]
        if not members:
            continue
        pad = 2 - min(depth, 1)
        x0 = min(m.x for m in members) - pad
        x1 = max(m.x + m.w for m in members) + pad - 1
        y0 = min(m.y for m in members) - 2 + depth
        y1 = max(m.y for m in members) + NODE_H + 1 - depth
        label = g.kind.value if g.kind is GroupKind.FUSED else f"overlapped ×{g.chunks}"
        frames.append(Frame(label, g.kind.value, max(0, x0), max(0, y0), x1, y1))
        width = max(width, x1 + 2)

    red = {n for n, _ in implicit_reductions(program)}
    header = f"{program.name}: {len(program.stages)} stages on {program.grid.world} ranks" + (
        f"; implicit reductions in {', '.join(sorted(red))}" if red else ""
    )
    width = max(width, len(header) + 2)
    return GraphDrawing(
        width=width,
        height=height,
        nodes=nodes,
        frames=frames,
        strokes=strokes,
        header=header,
        layers=[[n for n in row if not n.startswith("~")] for row in slots],
    )
