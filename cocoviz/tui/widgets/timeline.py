"""The timeline pane: one row per rank × stream on a shared time axis, with a cursor
whose event is described below the axis, and an optional comparison timeline."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from cocoviz.style import kind_colour
from cocoviz.timefmt import format_time
from cocoviz.tui.timeline_rows import Bar, Row, TimelineRows, nice_step, render_bars

GUTTER = 14
HEADER = 2  # the axis and the details line


class TimelineView(ScrollView, can_focus=True):
    """Bars per rank and stream; left/right move the time cursor, up/down the row."""

    BINDINGS = [
        Binding("left", "cursor(0, -1)", "Earlier", show=False),
        Binding("right", "cursor(0, 1)", "Later", show=False),
        Binding("up", "cursor(-1, 0)", "Row up", show=False),
        Binding("down", "cursor(1, 0)", "Row down", show=False),
        Binding("plus,equals_sign", "zoom(2)", "Zoom in", show=False),
        Binding("minus", "zoom(0.5)", "Zoom out", show=False),
        Binding("enter", "pick", "Select the stage under the cursor", show=False),
        Binding("a", "all_ranks", "Every rank / identical ranks once", show=False),
    ]

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
        return max(10, self.size.width - GUTTER - 1)

    def _per_cell(self) -> float:
        return self._span() / (self._bar_width() * self.zoom)

    def _resize_virtual(self) -> None:
        width = GUTTER + int(self._bar_width() * self.zoom) + 1
        self.virtual_size = Size(width, HEADER + len(self._rows()))

    def on_resize(self, event: events.Resize) -> None:
        self._resize_virtual()

    # --- rendering --------------------------------------------------------------------
    def cursor_time(self) -> float:
        return (self.cursor_col + 0.5) * self._per_cell()

    def cursor_bar(self) -> Bar | None:
        rows = self._rows()
        if not 0 <= self.cursor_row < len(rows):
            return None
        row = rows[self.cursor_row][1]
        if isinstance(row, str):
            return None
        assert isinstance(row, Row)
        t = self.cursor_time()
        for b in row.bars:
            if b.start <= t < b.end:
                return b
        return None

    def details(self) -> str:
        b = self.cursor_bar()
        t = format_time(self.cursor_time())
        rows = self._rows()
        where = rows[self.cursor_row][0] if 0 <= self.cursor_row < len(rows) else ""
        if b is None:
            return f"{where} at {t}: idle"
        return (
            f"{where} at {t}: {b.label or b.stage} ({b.kind}"
            + (f", {b.detail}" if b.detail else "")
            + f") {format_time(b.start)} → {format_time(b.end)}, {format_time(b.duration)}"
        )

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if self.data is None:
            text = self.message_text if y == 0 else ""
            return Strip([Segment(text[:width].ljust(width), base + Style(italic=True))])
        scroll_x, scroll_y = self.scroll_offset
        per_cell = self._per_cell()
        bar_cells = int(self._bar_width() * self.zoom)
        if y == 0:
            return self._axis(width, scroll_x, per_cell, bar_cells, base)
        if y == 1:
            text = self.details()
            return Strip([Segment(text[:width].ljust(width), base + Style(italic=True))])
        idx = y - HEADER + scroll_y
        rows = self._rows()
        if idx >= len(rows):
            return Strip.blank(width, base)
        label, row = rows[idx]
        is_cursor = idx == self.cursor_row and self.has_focus
        gutter_style = base + Style(bold=True, reverse=is_cursor)
        if isinstance(row, str):
            return Strip([Segment(row[:width].ljust(width), base + Style(dim=True))])
        segs = [Segment(label[: GUTTER - 1].ljust(GUTTER), gutter_style)]
        t0 = scroll_x * per_cell
        cells = render_bars(row, t0, per_cell, max(0, width - GUTTER))  # type: ignore[arg-type]
        cursor_x = self.cursor_col - scroll_x if idx == self.cursor_row else -1
        highlight = self._highlighted_stages()
        for i, (ch, kind, stage) in enumerate(cells):
            if kind:
                color = kind_colour(kind)
                st = base + Style(bgcolor=color, color="black")
                if stage in highlight:
                    st += Style(bold=True, underline=True, bgcolor="bright_white")
            else:
                st = base + Style(dim=True)
            if i == cursor_x and self.has_focus:
                st += Style(reverse=True)
            segs.append(Segment(ch, st))
        return Strip(segs).simplify().crop(0, width)

    def _axis(
        self, width: int, scroll_x: int, per_cell: float, bar_cells: int, base: Style
    ) -> Strip:
        n = max(0, width - GUTTER)
        chars = [" "] * n
        span = per_cell * n
        step = nice_step(span, max(1, n // 10))
        t0 = scroll_x * per_cell
        k = int(t0 // step)
        while True:
            t = k * step
            col = int(round((t - t0) / per_cell))
            if col >= n:
                break
            if col >= 0:
                label = "┆" + format_time(t) if t > 0 else "0"
                for i, ch in enumerate(label):
                    if 0 <= col + i < n:
                        chars[col + i] = ch
            k += 1
        return Strip(
            [
                Segment("rank stream".ljust(GUTTER), base + Style(dim=True)),
                Segment("".join(chars), base + Style(dim=True)),
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
        if self.cursor_row - self.scroll_offset.y >= self.size.height - HEADER:
            self.scroll_to(y=self.cursor_row - (self.size.height - HEADER) + 1, animate=False)
        elif self.cursor_row < self.scroll_offset.y:
            self.scroll_to(y=self.cursor_row, animate=False)
        bar_w = self.size.width - GUTTER
        if self.cursor_col - self.scroll_offset.x >= bar_w:
            self.scroll_to(x=self.cursor_col - bar_w + 1, animate=False)
        elif self.cursor_col < self.scroll_offset.x:
            self.scroll_to(x=self.cursor_col, animate=False)
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

    def on_click(self, event: events.Click) -> None:
        if event.x < GUTTER or event.y < HEADER:
            return
        self.cursor_row = event.y - HEADER + self.scroll_offset.y
        self.cursor_col = event.x - GUTTER + self.scroll_offset.x
        self.refresh()
        self.action_pick()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
