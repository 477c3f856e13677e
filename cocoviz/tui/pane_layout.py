"""Where the panes go: the sizes of source, graph, side column and timeline, from the
terminal's size and what each pane has to show. No Textual here (docs/architecture.md,
layer 9: the terminal UI).

Rules, in order:

* The side column (cost, steps, history) is `SIDE_W` columns, or nothing when the
  user collapsed it (`s`).
* Wide layout — the source column on the left over the full height; to its right the
  graph and the side column on top and the timeline/code tabs below them, across both,
  so the timeline is as wide as graph and side together (at least `TIMELINE_MIN`).
  The graph column wants its drawing's width; the source column wants its longest line
  plus the line numbers. When both fit, the source gets what it needs and the graph
  the rest. When not, the source gets what the graph leaves, but at least half of the
  room; it then wraps its long lines (`wrap`) so that no line is cut.
* Narrow layout — when the source column would be narrower than `SOURCE_MIN` in the
  wide layout (e.g. 80×24), a 2×2 grid: source | graph over side | timeline, the
  source wrapping its lines when they are longer than its half. A collapsed side
  column gives its cell to the timeline, and so does the shown side column while the
  code tab shows (the app hides it then).
* The timeline/code row is as tall as the timeline's rows (at least `BOTTOM_MIN`,
  at most half the height); the code tab takes half the height.
"""

from __future__ import annotations

from dataclasses import dataclass

SIDE_W = 36
"""Width of the side column: the cost table and the palette's longest step lines."""
SOURCE_MIN = 40
"""Below this the source column is too narrow to read: the 2×2 grid instead."""
GRAPH_MIN = 24
TIMELINE_MIN = 64
"""The timeline's gutter and about fifty cells of time axis."""
BOTTOM_MIN = 9
"""Rows of the timeline/code row: border, tabs, axis, event line and a few rows."""
NARROW_BOTTOM = 11
"""Rows of the lower half of the 2×2 grid: compact cost, steps and history."""
PANE_CHROME = 2
"""Rows a timeline pane spends beside its own lines: the border and the tabs."""


@dataclass(frozen=True)
class Needs:
    """What the panes have to show, in cells."""

    source_width: int
    """Longest source line plus line numbers, scrollbar and cursor."""
    graph_width: int
    """Width of the graph drawing plus the scrollbar."""
    timeline_lines: int
    """Lines of the timeline view: its header and rows."""
    code: bool = False
    """The code tab is showing (it wants height)."""


@dataclass(frozen=True)
class PaneLayout:
    """Grid tracks in cells and how the panes sit in them."""

    narrow: bool
    side: bool
    """The side column is shown."""
    columns: tuple[int, ...]
    rows: tuple[int, int]
    wrap: bool
    """The source column is narrower than its longest line: wrap lines."""

    @property
    def source_width(self) -> int:
        return self.columns[0]


def source_need(lines: list[str]) -> int:
    """Cells the editor needs to show every line whole: the gutter (line numbers and two
    cells), the text, one cell for the cursor after the end and one for the scrollbar."""
    longest = max((len(line.expandtabs(4)) for line in lines), default=0)
    return len(str(max(1, len(lines)))) + 2 + longest + 2


def plan(width: int, height: int, needs: Needs, *, side: bool = True) -> PaneLayout:
    """The layout for a `width` × `height` area (the screen less footer and panels)."""
    d = SIDE_W if side else 0
    avail = width - d
    graph_want = max(needs.graph_width, GRAPH_MIN, TIMELINE_MIN - d)
    if needs.source_width + graph_want <= avail:
        src = needs.source_width
    else:
        src = max(avail - graph_want, min(needs.source_width, avail // 2))
    if src >= SOURCE_MIN:
        bottom = _bottom(height, needs, BOTTOM_MIN, height // 2)
        cols = (src, avail - src, d) if side else (src, avail - src)
        return PaneLayout(False, side, cols, (height - bottom, bottom), src < needs.source_width)
    half = width // 2
    bottom = max(_bottom(height, needs, NARROW_BOTTOM, height - 8), min(NARROW_BOTTOM, height // 2))
    if not side:
        bottom = _bottom(height, needs, BOTTOM_MIN, height // 2)
    return PaneLayout(
        True, side, (half, width - half), (height - bottom, bottom), half < needs.source_width
    )


def _bottom(height: int, needs: Needs, low: int, high: int) -> int:
    want = height // 2 if needs.code else needs.timeline_lines + PANE_CHROME
    return max(min(low, high), min(max(want, low), high))
