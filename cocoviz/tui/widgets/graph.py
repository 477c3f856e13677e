"""The dataflow graph pane: a layered drawing that scrolls, with a selected stage."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from cocoviz.ir.nodes import Program
from cocoviz.tui.graph_layout import NODE_H, GraphDrawing, layout_graph


class GraphView(ScrollView, can_focus=True):
    """Draws a program's dataflow graph; arrows move the selection, enter confirms it."""

    BINDINGS = [
        Binding("up", "move('up')", "Stage above", show=False),
        Binding("down", "move('down')", "Stage below", show=False),
        Binding("left", "move('left')", "Stage left", show=False),
        Binding("right", "move('right')", "Stage right", show=False),
    ]

    DEFAULT_CSS = """
    GraphView { height: 1fr; background: $surface; }
    """

    selected: reactive[str | None] = reactive(None, init=False)
    """The selected stage (set by the app; moved by the keys and the mouse)."""

    class StageSelected(Message):
        """The user picked a stage in the graph."""

        def __init__(self, name: str) -> None:
            self.name = name
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.drawing: GraphDrawing | None = None
        self.message_text = "no program yet"
        self._cache: dict[int, list[Segment]] = {}

    def show(self, program: Program | None, message: str = "") -> None:
        """Draw `program` (None: show `message` instead)."""
        self.drawing = layout_graph(program) if program is not None else None
        self.message_text = message
        self._cache.clear()
        if self.drawing is not None:
            self.virtual_size = Size(self.drawing.width, self.drawing.height)
        else:
            self.virtual_size = Size(len(message) + 2, 2)
        self.refresh()

    def watch_selected(self, name: str | None) -> None:
        self._cache.clear()
        self.refresh()
        if name is not None:
            self.scroll_to_stage(name)

    def scroll_to_stage(self, name: str) -> None:
        if self.drawing is None or name not in self.drawing.nodes:
            return
        n = self.drawing.nodes[name]
        self.scroll_to_region(Region(n.x, n.y, n.w, NODE_H), animate=False, spacing=None)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self.rich_style
        if self.drawing is None:
            text = self.message_text if y == 0 else ""
            return Strip([Segment(text.ljust(width), base + Style(italic=True))]).crop(0, width)
        row = y + scroll_y
        if row == 0:
            segs = [Segment(self.drawing.header, base + Style(bold=True))]
            return Strip(segs).crop(scroll_x, scroll_x + width).extend_cell_length(width, base)
        if row >= self.drawing.height:
            return Strip.blank(width, base)
        segs = self._cache.get(row)
        if segs is None:
            segs = self.drawing.render_row(row, self.selected, base)
            self._cache[row] = segs
        return Strip(segs).crop(scroll_x, scroll_x + width).extend_cell_length(width, base)

    def on_resize(self) -> None:
        self._cache.clear()

    def on_click(self, event: events.Click) -> None:
        if self.drawing is None:
            return
        x = event.x + self.scroll_offset.x
        y = event.y + self.scroll_offset.y
        name = self.drawing.node_at(x, y)
        if name is not None:
            self.post_message(self.StageSelected(name))

    def action_move(self, direction: str) -> None:
        if self.drawing is None:
            return
        name = self.drawing.neighbour(self.selected, direction)
        if name is not None:
            self.post_message(self.StageSelected(name))
