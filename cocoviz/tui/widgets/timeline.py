"""The timeline pane: one row per rank × stream on a shared time axis, with a cursor
whose event (or the event under the mouse) is described below the axis, and an optional
comparison timeline (docs/cost-model.md)."""

from __future__ import annotations

import functools

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip

from cocoviz.style import kind_colour
from cocoviz.timefmt import format_time
from cocoviz.tui.timeline_rows import Bar, Row, TimelineRows, axis_labels, render_bars
from cocoviz.tui.widgets.steady import SteadyScrollbars

GUTTER = 14
HEADER = 2  # the axis and the details line (more when the details wrap)
MAX_DETAIL_LINES = 3
AXIS_TAIL = 8


@functools.lru_cache(maxsize=256)
def _bar_style(base: Style, kind: str, highlighted: bool, cursor: bool) -> Style:
    """The style of a bar's cells (idle cells: `kind` empty), highlighted when they run
    (part of) the selected stage, reversed under the cursor."""
    if kind:
        st = base + Style(bgcolor=kind_colour(kind), color="black")
        if highlighted:
            st += Style(bold=True, underline=True, bgcolor="bright_white")
    else:
        st = base + Style(dim=True)
    return st + Style(reverse=True) if cursor else st


CURSOR = Binding.Group("Cursor", compact=True)
ZOOM = Binding.Group("Zoom", compact=True)
"""The arrows and the zoom keys, shown in the footer as key groups."""


class TimelineView(SteadyScrollbars, can_focus=True):
    """Bars per rank and stream; left/right move the time cursor, up/down the row."""

    BINDINGS = [
        Binding("left", "cursor(0, -1)", "Earlier", group=CURSOR),
        Binding("right", "cursor(0, 1)", "Later", group=CURSOR),
        Binding("up", "cursor(-1, 0)", "Row up", group=CURSOR),
        Binding("down", "cursor(1, 0)", "Row down", group=CURSOR),
        Binding("plus,equals_sign", "zoom(2)", "Zoom in", key_display="+", group=ZOOM),
        Binding("minus", "zoom(0.5)", "Zoom out", key_display="-", group=ZOOM),
        Binding("enter", "pick", "Select its stage"),
        Binding("a", "all_ranks", "All ranks / identical once"),
    ]
    FOOTER_NAME = "timeline"

    DEFAULT_CSS = """
    TimelineView { height: 1fr; background: $surface; }
    """

    selected: reactive[str | None] = reactive(None, init=False)
    """The selected stage; its bars are drawn highlighted."""

    class StagePicked(Message):
        """The user picked the stage of the event under the cursor."""

        def __init__(self, name: str) -> None:
            self.name = name
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.data: TimelineRows | None = None
        self.compare: TimelineRows | None = None
        self.compare_label = ""
        self.label = "this step"
        self.message_text = "no timeline yet"
        self.zoom = 1.0
        self.all_ranks = False
        self._given: tuple[TimelineRows | None, TimelineRows | None] = (None, None)
        self.cursor_row = 0
        self.cursor_col = 0
        self.hover: tuple[int, int] | None = None
        """(row, column) of the cell under the mouse, described instead of the cursor's."""
        self._header = HEADER
        self._base: Style | None = None
        """The widget's `rich_style` (until its styles change)."""
        self._cells: dict[int, tuple[Row, list[tuple[str, str, str]]]] = {}
        """`render_bars` of the rows drawn, by row identity, for the window `_window`: a
        cursor move or a new selection redraws a row's styles, not its bars (on a huge
        program thousands of bars fall in the window at zoom 1)."""
        self._window: tuple[float, float, int] = (0.0, 0.0, 0)

    # --- attributes down --------------------------------------------------------------
    def show(
        self,
        data: TimelineRows | None,
        message: str = "",
        compare: TimelineRows | None = None,
        compare_label: str = "",
    ) -> None:
        self._given = (data, compare)
        if self.all_ranks:
            data = data.expanded() if data is not None else None
            compare = compare.expanded() if compare is not None else None
        else:
            data = data.merged() if data is not None else None
            compare = compare.merged() if compare is not None else None
        self.data = data
        self.compare = compare
        self.compare_label = compare_label
        self._cells.clear()
        self.message_text = message
        self.cursor_row = min(self.cursor_row, max(0, len(self._rows()) - 1))
        self._resize_virtual()
        self.refresh()

    def watch_selected(self) -> None:
        self.refresh()

    # --- geometry ---------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, object]]:
        """(label, row-or-caption) for every line below the header."""
        out: list[tuple[str, object]] = []
        if self.data is None:
            return out
        if self.compare is not None:
            out.append(("", f"── {self.label} ({format_time(self.data.makespan)})"))
        out += [(r.label, r) for r in self.data.rows]
        if self.compare is not None:
            out.append(("", f"── {self.compare_label} ({format_time(self.compare.makespan)})"))
            out += [(r.label, r) for r in self.compare.rows]
        return out

    def _span(self) -> float:
        spans = [d.makespan for d in (self.data, self.compare) if d is not None]
        return max(spans + [1e-9])

    def _bar_width(self) -> int:
        """Cells of the whole span at zoom 1; the axis keeps room after the end for the
        label of a tick at the makespan (`┆400 µs`)."""
        return max(10, self.size.width - GUTTER - AXIS_TAIL)

    def _per_cell(self) -> float:
        return self._span() / (self._bar_width() * self.zoom)

    def _resize_virtual(self) -> None:
        width = GUTTER + int(self._bar_width() * self.zoom) + 1
        self._header = 1 + len(self._detail_lines())
        self.virtual_size = Size(width, self._header + len(self._rows()))

    def content_lines(self) -> int:
        """Lines the view needs to show every row: the axis, the details and the rows."""
        return self._header + len(self._rows()) if self.data is not None else HEADER

    def on_resize(self, event: events.Resize) -> None:
        self._resize_virtual()

    # --- rendering --------------------------------------------------------------------
    def cursor_time(self) -> float:
        return (self.cursor_col + 0.5) * self._per_cell()

    def _point(self) -> tuple[int, int]:
        """The described cell: under the mouse when it hovers a row, else the cursor."""
        return self.hover if self.hover is not None else (self.cursor_row, self.cursor_col)

    def bar_at(self, row_index: int, col: int) -> Bar | None:
        rows = self._rows()
        if not 0 <= row_index < len(rows):
            return None
        row = rows[row_index][1]
        if isinstance(row, str):
            return None
        assert isinstance(row, Row)
        t = (col + 0.5) * self._per_cell()
        for b in row.bars:
            if b.start <= t < b.end:
                return b
        return None

    def cursor_bar(self) -> Bar | None:
        return self.bar_at(self.cursor_row, self.cursor_col)

    def details(self) -> str:
        """What the described cell shows: its row, time and event (or idle)."""
        row_index, col = self._point()
        b = self.bar_at(row_index, col)
        t = format_time((col + 0.5) * self._per_cell())
        rows = self._rows()
        where = rows[row_index][0] if 0 <= row_index < len(rows) else ""
        if b is None:
            return f"{where} at {t}: idle"
        return (
            f"{where} at {t}: {b.label or b.stage} ({b.kind}"
            + (f", {b.detail}" if b.detail else "")
            + f") {format_time(b.start)} → {format_time(b.end)}, {format_time(b.duration)}"
        )

    def _detail_lines(self) -> list[str]:
        """The details wrapped at words to the view's width (at most MAX_DETAIL_LINES)."""
        if self.data is None:
            return [""]
        width = max(20, self.size.width)
        lines: list[str] = []
        line = ""
        for word in self.details().split(" "):
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = "  " + word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
        if len(lines) > MAX_DETAIL_LINES:
            lines = lines[:MAX_DETAIL_LINES]
            lines[-1] = lines[-1][: width - 1] + "…"
        return [x[:width] for x in lines]

    def notify_style_update(self) -> None:
        self._base = None
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self._base
        if base is None:  # `rich_style` walks the ancestors' styles: once, not per line
            base = self._base = self.rich_style
        if self.data is None:
            text = self.message_text if y == 0 else ""
            return Strip([Segment(text[:width].ljust(width), base + Style(italic=True))])
        scroll_x, scroll_y = self.scroll_offset
        per_cell = self._per_cell()
        if y == 0:
            return self._axis(width, scroll_x, per_cell, base)
        header = self._header
        if y < header:
            lines = self._detail_lines()
            text = lines[y - 1] if y - 1 < len(lines) else ""
            return Strip([Segment(text[:width].ljust(width), base + Style(italic=True))])
        idx = y - header + scroll_y
        rows = self._rows()
        if idx >= len(rows):
            return Strip.blank(width, base)
        label, row = rows[idx]
        if isinstance(row, str):
            return Strip([Segment(row[:width].ljust(width), base + Style(dim=True))])
        assert isinstance(row, Row)
        focus = self.has_focus
        gutter_style = base + Style(bold=True, reverse=idx == self.cursor_row and focus)
        segs = [Segment(label[: GUTTER - 1].ljust(GUTTER), gutter_style)]
        cells = self._row_cells(row, scroll_x * per_cell, per_cell, max(0, width - GUTTER))
        cursor_x = self.cursor_col - scroll_x if idx == self.cursor_row and focus else -1
        highlight = self._highlighted_stages()
        # One segment per run of cells drawn alike (kind, highlighted, under the cursor).
        run: list[str] = []
        run_key: tuple[str, bool, bool] | None = None
        for i, (ch, kind, stage) in enumerate(cells):
            key = (kind, stage in highlight, i == cursor_x)
            if key != run_key:
                if run_key is not None:
                    segs.append(Segment("".join(run), _bar_style(base, *run_key)))
                run, run_key = [], key
            run.append(ch)
        if run_key is not None:
            segs.append(Segment("".join(run), _bar_style(base, *run_key)))
        return Strip(segs).simplify().crop(0, width)

    def _row_cells(
        self, row: Row, t0: float, per_cell: float, width: int
    ) -> list[tuple[str, str, str]]:
        """`render_bars(row, …)`, kept while the window is the same (one entry per row
        shown: the cache is emptied when the window moves)."""
        window = (t0, per_cell, width)
        if window != self._window:
            self._cells.clear()
            self._window = window
        hit = self._cells.get(id(row))
        if hit is None or hit[0] is not row:
            hit = (row, render_bars(row, t0, per_cell, width))
            if len(self._cells) > 4 * max(1, self.size.height):
                self._cells.clear()
            self._cells[id(row)] = hit
        return hit[1]

    def _axis(self, width: int, scroll_x: int, per_cell: float, base: Style) -> Strip:
        n = max(0, width - GUTTER)
        chars = axis_labels(n, scroll_x * per_cell, per_cell)
        return Strip(
            [
                Segment("rank stream".ljust(GUTTER), base + Style(dim=True)),
                Segment(chars, base + Style(dim=True)),
            ]
        ).crop(0, width)

    def _highlighted_stages(self) -> set[str]:
        """Event stages to draw highlighted: those running (part of) the selection."""
        out: set[str] = set()
        for d in (self.data, self.compare):
            if d is not None and self.selected is not None:
                out.update(b.stage for _, b in d.by_stage.get(self.selected, ()))
        return out

    # --- actions ----------------------------------------------------------------------
    def action_cursor(self, drow: int, dcol: int) -> None:
        rows = self._rows()
        if not rows:
            return
        self.cursor_row = min(max(0, self.cursor_row + drow), len(rows) - 1)
        self.cursor_col = min(
            max(0, self.cursor_col + dcol), int(self._bar_width() * self.zoom) - 1
        )
        shown = self.size.height - self._header
        if self.cursor_row - self.scroll_offset.y >= shown:
            self.scroll_to(y=self.cursor_row - shown + 1, animate=False)
        elif self.cursor_row < self.scroll_offset.y:
            self.scroll_to(y=self.cursor_row, animate=False)
        bar_w = self.size.width - GUTTER
        if self.cursor_col - self.scroll_offset.x >= bar_w:
            self.scroll_to(x=self.cursor_col - bar_w + 1, animate=False)
        elif self.cursor_col < self.scroll_offset.x:
            self.scroll_to(x=self.cursor_col, animate=False)
        self.hover = None
        self._resize_virtual()
        self.refresh()

    def action_zoom(self, factor: float) -> None:
        self.zoom = min(64.0, max(1.0, self.zoom * factor))
        self.cursor_col = min(self.cursor_col, int(self._bar_width() * self.zoom) - 1)
        self._resize_virtual()
        self.refresh()

    def action_pick(self) -> None:
        b = self.cursor_bar()
        if b is not None:
            name = b.members[0] if b.members else b.stage
            self.post_message(self.StagePicked(name.split(".")[0]))

    def action_all_ranks(self) -> None:
        self.all_ranks = not self.all_ranks
        data, compare = self._given
        self.show(data, self.message_text, compare, self.compare_label)

    def _cell(self, x: int, y: int) -> tuple[int, int] | None:
        """(row, column) of the bar cell at widget offset (x, y); None off the bars."""
        if x < GUTTER or y < self._header or self.data is None:
            return None
        row = y - self._header + self.scroll_offset.y
        if row >= len(self._rows()):
            return None
        return row, x - GUTTER + self.scroll_offset.x

    def on_click(self, event: events.Click) -> None:
        cell = self._cell(event.x, event.y)
        if cell is None:
            return
        self.cursor_row, self.cursor_col = cell
        self.hover = None
        self.refresh()
        self.action_pick()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        cell = self._cell(event.x, event.y)
        if cell != self.hover:
            self.hover = cell
            self._resize_virtual()
            self.refresh()

    def on_leave(self, event: events.Leave) -> None:
        if self.hover is not None:
            self.hover = None
            self._resize_virtual()
            self.refresh()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
