"""A layered drawing of a program's dataflow graph with box-drawing characters.

Stages go into layers by longest path (`cocoviz.ir.draw.layers`); an edge that skips
layers passes through one-column dummy slots so that it never crosses a box; inside a
layer, nodes are ordered by the mean position of their predecessors (two sweeps), with
the members of one group kept side by side. The result is a `GraphDrawing`: node boxes,
edge cells (a bitmask of up/down/left/right strokes per cell) and group frames, from
which any row is rendered on demand, so a 500-stage graph costs nothing until it is
scrolled into view. The layers from one *cut* (a layer of one stage that no edge passes)
to the next are laid out as a block, kept by what its layout reads (`_Block`): a step
lays out again only the blocks it changed.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import Any

from rich.segment import Segment
from rich.style import Style

from cocoviz.ir import routing
from cocoviz.ir.draw import layers
from cocoviz.ir.graph import deps, op_kind, stage_reads, stage_reductions
from cocoviz.ir.nodes import COLLECTIVES, ROUTING, Group, GroupKind, Op, Program, Stage
from cocoviz.ir.types import format_shape, layouts_text
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
    strokes: list[Strokes]
    """The edges of each block of layers, each in its own rows (`block_tops`)."""
    block_tops: list[int]
    """The drawing's row of each block's first row, ascending."""
    header: str
    layers: list[list[str]] = field(default_factory=list)
    layer_ys: list[int] = field(default_factory=list)
    """The top row of each layer's boxes, ascending."""
    layer_nodes: list[list[NodeBox]] = field(default_factory=list)
    """The boxes of each layer (so that a row is drawn from the boxes it crosses)."""

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
        width = self.width
        if width <= 0:
            return []
        chars = [" "] * width
        styles: list[Style] = [base] * width
        for f in self.frames:
            if not f.y0 <= y <= f.y1:
                continue
            st, label_style = _frame_styles(base, f.kind)
            if y in (f.y0, f.y1):
                left, right = ("╭", "╮") if y == f.y0 else ("╰", "╯")
                chars[f.x0 : f.x1 + 1] = "┄" * (f.x1 + 1 - f.x0)
                styles[f.x0 : f.x1 + 1] = [st] * (f.x1 + 1 - f.x0)
                chars[f.x0], chars[f.x1] = left, right
                if y == f.y0:
                    label = f" {f.label} "[: max(0, f.x1 - f.x0 - 2)]
                    chars[f.x0 + 2 : f.x0 + 2 + len(label)] = label
                    styles[f.x0 + 2 : f.x0 + 2 + len(label)] = [label_style] * len(label)
            else:
                chars[f.x0], styles[f.x0] = "┆", st
                chars[f.x1], styles[f.x1] = "┆", st
        edge_style = _edge_style(base)
        bi = bisect.bisect_right(self.block_tops, y) - 1
        masks = self.strokes[bi].row(y - self.block_tops[bi]) if bi >= 0 else {}
        for x, mask in masks.items():
            chars[x] = "▼" if mask & ARROW else _STROKE.get(mask, "┼")
            styles[x] = edge_style
        li = bisect.bisect_right(self.layer_ys, y) - 1
        crossed = self.layer_nodes[li] if li >= 0 and y < self.layer_ys[li] + NODE_H else ()
        for n in crossed:
            sel = n.name == selected
            border, title_style, body_styles = _box_styles(base, n.kind, sel)
            r = y - n.y
            inner = n.w - 2
            x0, x1 = n.x, n.x + n.w
            if r == 0:
                title = f" {n.name} "[:inner]
                edge = "━" if sel else "─"
                chars[x0:x1] = (
                    ("┏" if sel else "┌")
                    + title
                    + edge * (inner - len(title))
                    + ("┓" if sel else "┐")
                )
                styles[x0:x1] = [border] * n.w
                styles[x0 + 1 : x0 + 1 + len(title)] = [title_style] * len(title)
            elif r == NODE_H - 1:
                chars[x0:x1] = "┗" + "━" * inner + "┛" if sel else "└" + "─" * inner + "┘"
                styles[x0:x1] = [border] * n.w
            else:
                side = "┃" if sel else "│"
                chars[x0:x1] = side + n.lines[r - 1][:inner].ljust(inner) + side
                styles[x0:x1] = [border, *[body_styles[r - 1]] * inner, border]
        segments: list[Segment] = []
        run_start = 0
        run_style = styles[0]
        for x in range(1, width):
            st = styles[x]
            if st is not run_style and st != run_style:
                segments.append(Segment("".join(chars[run_start:x]), run_style))
                run_start, run_style = x, st
        segments.append(Segment("".join(chars[run_start:]), run_style))
        return segments


@functools.lru_cache(maxsize=1024)
def _frame_styles(base: Style, kind: str) -> tuple[Style, Style]:
    """A group frame's style and its label's."""
    st = base + Style(color=kind_colour(kind), dim=False)
    return st, st + Style(bold=True)


@functools.lru_cache(maxsize=64)
def _edge_style(base: Style) -> Style:
    return base + Style(color="bright_black")


@functools.lru_cache(maxsize=1024)
def _box_styles(base: Style, kind: str, sel: bool) -> tuple[Style, Style, tuple[Style, ...]]:
    """A box's border, its title and its three lines of text (op, type, detail)."""
    color = kind_colour(kind)
    border = base + Style(color=color, bold=sel)
    text = base + (Style(reverse=True, bold=True) if sel else Style())
    lines = (text + Style(color=color, bold=True), text + Style(dim=False))
    return border, border + Style(bold=True, reverse=sel), (*lines, text + Style(dim=not sel))


# Node text and width by stage object: most stages are the same objects before and after
# a step, so a step on a large program re-describes only the stages it touched.
_LINES: dict[int, tuple[Stage, int, tuple[str, ...], int]] = {}
LINES_KEPT = 2000
"""The stages whose boxes are kept: at least this many, and twice the stages of the
program laid out last (a step on it keeps most of its stages). An entry holds its stage
alive, so the bound is in stages, whatever the number of steps taken; the least
recently used go first."""
BLOCKS_KEPT = 1000
"""The same for the blocks of layers (`_BLOCKS`): this many, or twice the last layout's."""
_limits = [LINES_KEPT, BLOCKS_KEPT]


def _kept(cache: dict[Any, Any], key: object, value: object, limit: int) -> None:
    """Keep `value` in `cache` as its most recent entry, within `limit` entries."""
    while len(cache) >= limit:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _node_lines(
    s: Stage, group: int, stage_names: set[str] | frozenset[str], dp_size: int = 1
) -> tuple[tuple[str, ...], int]:
    """A stage's box: its three lines of text and its width."""
    hit = _LINES.pop(id(s), None)
    if hit is not None and hit[0] is s and hit[1] == group:
        _LINES[id(s)] = hit  # the most recently used, last
        return hit[2], hit[3]
    t = s.ty
    e = s.expr
    if e.rop is not None:
        op = f"{e.op.value}({e.rop.value})"
    elif e.op is Op.MATMUL or e.op in (Op.UPDATE,):
        op = e.op.value
    elif e.op in ROUTING:
        op = routing.label(e)
    else:
        ops = sorted({x.op.value for x in e.walk() if x.op not in (Op.REF, Op.CONST)})
        op = " ".join(ops) if ops else "copy"
    if e.tag == "dp" and e.op in COLLECTIVES:
        op += " over dp"  # the axis of a collective (docs/language.md, rank grids)
    # a rank's share: 1/G over tp, times 1/D over dp
    share = (group if t.layout.is_sliced else 1) * (dp_size if t.dp.is_sliced else 1)
    per_rank = f" 1/{share}" if share > 1 else ""
    ty = f"{t.dtype.value}{format_shape(t.shape)}"
    inputs = sorted(r for r in stage_reads(s) if r not in stage_names)
    detail = f"{layouts_text(t)}{per_rank}"
    if inputs:
        detail += " ← " + ",".join(inputs)
    lines = (op, ty, detail)
    width = min(MAX_NODE_W, max(len(s.name) + 4, *(len(x) + 2 for x in lines)))
    _kept(_LINES, id(s), (s, group, lines, width), _limits[0])
    return lines, width


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


def _frame_label(g: Group, room: int) -> str:
    """A group's frame title: `fused`, `overlapped ×K` (K row chunks) or `overlapped by
    shard ×G` (decomposed around the ring of G ranks; `by shard ×G` where that does not
    fit in the `room` cells of the frame's top edge — its style says it is overlapped)."""
    if g.kind is GroupKind.FUSED:
        return g.kind.value
    if g.by_shard:
        full = f"overlapped by shard ×{g.chunks}"
        return full if len(full) + 2 <= room else f"by shard ×{g.chunks}"
    return f"overlapped ×{g.chunks}"


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


@dataclass(frozen=True)
class _Block:
    """The layout of a block of layers, in rows counted from its first layer's boxes.

    A *cut* layer holds one stage and no edge passes it, so nothing above it decides the
    order, the places or the edges below it: the layers from one cut to the next are laid
    out on their own, and a block a step did not touch is reused as it was (a step
    changes a few stages of a program of hundreds)."""

    rows: tuple[tuple[str, ...], ...]
    """The stages of each layer, in drawing order."""
    boxes: tuple[tuple[str, int, int, int, int], ...]
    """(stage, x, y, width, layer) of each box."""
    ys: tuple[int, ...]
    """The top of each layer's boxes."""
    height: int
    width: int
    strokes: Strokes


_BLOCKS: dict[tuple[object, ...], _Block] = {}
"""Blocks by what their layout reads (`_block_key`)."""


def layout_graph(program: Program) -> GraphDrawing:
    """Place every stage and route every stage-to-stage edge."""
    _limits[0] = max(LINES_KEPT, 2 * len(program.stages))
    d = deps(program)
    by_layer = layers(program, d)
    layer_of = {n: i for i, row in enumerate(by_layer) for n in row}
    group_rank: dict[str, int] = {}
    for gi, g in enumerate(program.groups):
        for n in g.stages():
            group_rank[n] = gi
    by_name = {s.name: s for s in program.stages}
    stage_names = set(by_name)
    kinds = _kinds(program)
    G = program.grid.group
    contents: dict[str, tuple[str, ...]] = {}
    widths: dict[str, int] = {}
    for row in by_layer:
        for n in row:
            contents[n], widths[n] = _node_lines(by_name[n], G, stage_names, program.grid.dp)

    # The edges in the order they are routed; the cut layers; each edge's block (its
    # source's).
    edges = [(src, dst) for dst, srcs in d.items() for src in sorted(srcs)]
    passed = [False] * len(by_layer)
    for src, dst in edges:
        for li in range(layer_of[src] + 1, layer_of[dst]):
            passed[li] = True
    starts = [0] + [
        li for li in range(1, len(by_layer)) if len(by_layer[li]) == 1 and not passed[li]
    ]
    _limits[1] = max(BLOCKS_KEPT, 2 * len(starts))
    block_of_layer: list[int] = []
    for bi, first in enumerate(starts):
        end = starts[bi + 1] if bi + 1 < len(starts) else len(by_layer)
        block_of_layer += [bi] * (end - first)
    block_edges: list[list[tuple[str, str]]] = [[] for _ in starts]
    for src, dst in edges:
        block_edges[block_of_layer[layer_of[src]]].append((src, dst))

    blocks: list[_Block] = []
    for bi, first in enumerate(starts):
        end = starts[bi + 1] if bi + 1 < len(starts) else len(by_layer)
        rows = tuple(tuple(by_layer[li]) for li in range(first, end))
        cut = by_layer[end][0] if end < len(by_layer) else None
        key = _block_key(rows, block_edges[bi], cut, widths, group_rank)
        block = _BLOCKS.pop(key, None)
        if block is None:
            block = _layout_block(rows, block_edges[bi], cut, widths, group_rank)
        _kept(_BLOCKS, key, block, _limits[1])
        blocks.append(block)

    # The header line and a blank row; a group's frame takes the row above its members'
    # boxes for its top edge and title, so with groups one more row keeps the title of a
    # frame around the first layer off the header line (it was drawn over).
    top = 3 if program.groups else 2
    nodes: dict[str, NodeBox] = {}
    layer_ys: list[int] = []
    layer_nodes: list[list[NodeBox]] = []
    tops: list[int] = []
    width = 0
    y0 = top
    for bi, block in enumerate(blocks):
        first = starts[bi]
        tops.append(y0)
        layer_ys += [y0 + y for y in block.ys]
        row_nodes: list[list[NodeBox]] = [[] for _ in block.rows]
        for n, x, y, w, li in block.boxes:
            box = NodeBox(n, kinds[n], x, y0 + y, w, contents[n], first + li)
            nodes[n] = box
            row_nodes[li].append(box)
        layer_nodes += row_nodes
        width = max(width, block.width)
        y0 += block.height
    height = y0

    frames: list[Frame] = []
    for g, depth in _group_frames(program):
        members = [nodes[n] for n in g.stages() if n in nodes]
        if not members:
            continue
        pad = 2 - min(depth, 1)
        x0 = min(m.x for m in members) - pad
        x1 = max(m.x + m.w for m in members) + pad - 1
        fy0 = min(m.y for m in members) - 2 + depth
        fy1 = max(m.y for m in members) + NODE_H + 1 - depth
        label = _frame_label(g, x1 - max(0, x0) - 2)  # the title's cells (`render_row`)
        frames.append(Frame(label, g.kind.value, max(0, x0), max(0, fy0), x1, fy1))
        width = max(width, x1 + 2)

    red = {s.name for s in program.stages if stage_reductions(s)}
    header = f"{program.name}: {len(program.stages)} stages on {program.grid.world} ranks" + (
        f"; implicit reductions in {', '.join(sorted(red))}" if red else ""
    )
    width = max(width, len(header) + 2)
    return GraphDrawing(
        width=width,
        height=height,
        nodes=nodes,
        frames=frames,
        strokes=[b.strokes for b in blocks],
        block_tops=tops,
        header=header,
        layers=[list(row) for b in blocks for row in b.rows],
        layer_ys=layer_ys,
        layer_nodes=layer_nodes,
    )


def _block_key(
    rows: tuple[tuple[str, ...], ...],
    edges: list[tuple[str, str]],
    cut: str | None,
    widths: dict[str, int],
    group_rank: dict[str, int],
) -> tuple[object, ...]:
    """What a block's layout reads: its stages, their widths and which of them share a
    group (the group's number within the block), its edges, and the next cut's stage."""
    local: dict[int, int] = {}
    facts = tuple(
        (widths[n], local.setdefault(group_rank[n], len(local)) if n in group_rank else -1)
        for row in rows
        for n in row
    )
    return (rows, tuple(edges), cut, widths[cut] if cut is not None else 0, facts)


def _layout_block(
    rows: tuple[tuple[str, ...], ...],
    edges: list[tuple[str, str]],
    cut: str | None,
    widths: dict[str, int],
    group_rank: dict[str, int],
) -> _Block:
    """Lay out the layers `rows` (the edges from their stages, into the next cut's stage
    `cut` at the most), as if the whole program were laid out: the cut's stage alone in
    its layer is at position 0 and at x 2."""
    layer_of = {n: i for i, row in enumerate(rows) for n in row}
    if cut is not None:
        layer_of[cut] = len(rows)

    # Dummy slots for edges that skip layers: ("~src>dst@layer").
    slots: list[list[str]] = [list(row) for row in rows]
    chain: list[list[str]] = []
    for src, dst in edges:
        a, b = layer_of[src], layer_of[dst]
        path = [src]
        for li in range(a + 1, b):
            dummy = f"~{src}>{dst}@{li}"
            slots[li].append(dummy)
            path.append(dummy)
        path.append(dst)
        chain.append(path)
    preds: dict[str, list[str]] = {}
    for path in chain:
        for u, v in zip(path, path[1:], strict=False):
            preds.setdefault(v, []).append(u)
    succs: dict[str, list[str]] = {}
    for v, us in preds.items():
        for u in us:
            succs.setdefault(u, []).append(v)

    outside = {cut: 0.0} if cut is not None else {}

    def order_pass(order: list[list[str]], neighbours: dict[str, list[str]]) -> None:
        pos: dict[str, float] = dict(outside)
        for row in order:
            for i, n in enumerate(row):
                pos[n] = i
        for row in order:
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
    if cut is not None:
        xs[cut] = 2 + widths[cut] // 2
    buses: list[dict[str, int]] = [{} for _ in slots]
    for path in chain:
        for u, v in zip(path, path[1:], strict=False):
            if xs[u] != xs[v]:
                b = buses[layer_index(u)]
                b.setdefault(u, len(b))
    ys: list[int] = []
    y = 0
    for li in range(len(slots)):
        ys.append(y)
        y += NODE_H + 3 + max(1, len(buses[li]))
    height = y
    ys_next = [*ys[1:], height]  # the top of the next layer's boxes (the cut's, last)

    boxes: list[tuple[str, int, int, int, int]] = []
    width = 0
    for li, row in enumerate(slots):
        for n in row:
            if not n.startswith("~"):
                w = widths[n]
                boxes.append((n, xs[n] - w // 2, ys[li], w, li))
        width = max(width, max((xs[n] + widths.get(n, 1) for n in row), default=0) + COL_GAP)

    strokes = Strokes([-1] + [y - 1 for y in ys[1:]])
    vline, hline = strokes.vline, strokes.hline
    for path in chain:
        for u, v in zip(path, path[1:], strict=False):
            lu = layer_index(u)
            if u.startswith("~"):
                # A dummy slot: a straight vertical through the node band.
                vline(xs[u], ys[lu] - 1, ys[lu] + NODE_H)
            y_from = ys[lu] + NODE_H
            y_to = ys_next[lu] - 1
            if xs[u] == xs[v]:
                vline(xs[u], y_from, y_to)
            else:
                bus = y_from + 1 + buses[lu][u]
                vline(xs[u], y_from, bus)
                hline(bus, xs[u], xs[v])
                vline(xs[v], bus, y_to)
            if not v.startswith("~"):
                strokes.arrow(xs[v], y_to)
    return _Block(
        rows=tuple(tuple(n for n in row if not n.startswith("~")) for row in slots),
        boxes=tuple(boxes),
        ys=tuple(ys),
        height=height,
        width=width,
        strokes=strokes,
    )
