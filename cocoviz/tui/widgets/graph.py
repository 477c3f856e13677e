"""The dataflow graph pane: a layered drawing that scrolls, with a selected stage.

A program of more than `cocoviz.tui.offload.INLINE_STAGES` stages is laid out in a worker
thread: the pane keeps the drawing it shows (a previous step's, its header starting with
the news that a new one is being laid out) or says what it waits for, and the new drawing replaces it
once it is handed back (`LaidOut` tells the app, whose layout reads the drawing's
width)."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip

from cocoviz.ir.nodes import Program
from cocoviz.tui import offload
from cocoviz.tui.graph_layout import NODE_H, GraphDrawing, layout_graph
from cocoviz.tui.widgets.steady import SteadyScrollbars

DRAWINGS_KEPT = 16
"""The drawings kept for undo and redo: at most this many programs' ..."""
STAGES_KEPT = 40_000
"""... and at most this many stages in all (the last drawing is always kept): a
drawing holds a box per stage, and a huge program's history would hold hundreds of MB."""

MOVE = Binding.Group("Select stage", compact=True)
"""The arrows, shown in the footer as one key group."""


class GraphView(SteadyScrollbars, can_focus=True):
    """Draws a program's dataflow graph; arrows move the selection, enter confirms it."""

    BINDINGS = [
        Binding("up", "move('up')", "Stage above", group=MOVE),
        Binding("down", "move('down')", "Stage below", group=MOVE),
        Binding("left", "move('left')", "Stage left", group=MOVE),
        Binding("right", "move('right')", "Stage right", group=MOVE),
    ]
    FOOTER_NAME = "graph"

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

    class LaidOut(Message):
        """A drawing laid out in a worker is shown now (its width may differ)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.drawing: GraphDrawing | None = None
        self.message_text = "no program yet"
        self._cache: dict[int, list[Segment]] = {}
        self._program: Program | None = None
        self._base: Style | None = None
        """The widget's `rich_style` (until its styles change)."""
        self._drawings: dict[int, tuple[Program, GraphDrawing]] = {}
        """The drawings of the programs shown last, by identity (undo and redo)."""
        self._layouts: offload.LatestJob[Program, GraphDrawing] = offload.LatestJob(
            self, "layout", layout_graph, self._laid_out
        )
        self.pending = False
        """The program shown is being laid out in a worker (the drawing is an older one,
        or None)."""

    def show(self, program: Program | None, message: str = "") -> None:
        """Draw `program` (None: show `message` instead)."""
        if program is not None and program is self._program:
            return
        self._program = program
        self.message_text = message
        drawing = self._kept(program) if program is not None else None
        if program is not None and drawing is None and offload.inline(len(program.stages)):
            drawing = self._keep(program, layout_graph(program))
        self.pending = program is not None and drawing is None
        if self.pending:
            assert program is not None
            self._layouts.request(program)
            if self.drawing is None:
                self.message_text = f"laying out the graph of {len(program.stages):,} stages…"
            self._set_virtual_size()
            self.refresh()
            return
        self._layouts.forget()
        self._set_drawing(drawing)

    def _set_drawing(self, drawing: GraphDrawing | None) -> None:
        self.drawing = drawing
        self._cache.clear()
        self._set_virtual_size()
        self.refresh()

    def _set_virtual_size(self) -> None:
        if self.drawing is not None:
            self.virtual_size = Size(self.drawing.width, self.drawing.height)
        else:
            self.virtual_size = Size(len(self.message_text) + 2, 2)

    def _laid_out(self, program: Program, drawing: GraphDrawing) -> None:
        self._keep(program, drawing)
        if program is not self._program:
            return
        self.pending = False
        self._set_drawing(drawing)
        if self.selected is not None:
            self.scroll_to_stage(self.selected)
        self.post_message(self.LaidOut())

    def _kept(self, program: Program) -> GraphDrawing | None:
        hit = self._drawings.get(id(program))
        return hit[1] if hit is not None and hit[0] is program else None

    def _keep(self, program: Program, drawing: GraphDrawing) -> GraphDrawing:
        """Keep `drawing` for undo and redo, within `DRAWINGS_KEPT` and `STAGES_KEPT`."""
        kept = self._drawings
        kept.pop(id(program), None)
        stages = len(program.stages) + sum(len(p.stages) for p, _ in kept.values())
        while kept and (len(kept) >= DRAWINGS_KEPT or stages > STAGES_KEPT):
            old, _ = kept.pop(next(iter(kept)))
            stages -= len(old.stages)
        kept[id(program)] = (program, drawing)
        return drawing

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

    def notify_style_update(self) -> None:
        self._base = None
        self._cache.clear()
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self._base
        if base is None:  # `rich_style` walks the ancestors' styles: once, not per line
            base = self._base = self.rich_style
        if self.drawing is None:
            text = self.message_text if y == 0 else ""
            return Strip([Segment(text.ljust(width), base + Style(italic=True))]).crop(0, width)
        row = y + scroll_y
        if row == 0:
            header = self.drawing.header
            if self.pending:  # first: a narrow pane crops the header's end
                header = f"laying out this step's graph… · {header}"
            segs = [Segment(header, base + Style(bold=True))]
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
