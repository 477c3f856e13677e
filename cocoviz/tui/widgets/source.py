"""The source pane: an editable `.coco` text with highlighting, error marks and the
diagnostic of the current parse."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive, var
from textual.timer import Timer
from textual.widgets import Static, TextArea
from textual.widgets.text_area import TextAreaTheme, WrappedDocument

from cocoviz.errors import Diagnostic
from cocoviz.tui.highlight import lex_line
from cocoviz.tui.widgets.steady import SteadyScrollbars

REPARSE_DELAY = 0.4  # seconds of quiet typing before the text is parsed again
LINES_CACHED = 200
"""Drawn rows the editor keeps (TextArea's own default: 1,024)."""

COCO_THEME = TextAreaTheme(
    name="cocoviz",
    syntax_styles={
        "comment": Style(color="#7f8c8d", italic=True),
        "keyword": Style(color="#c678dd", bold=True),
        "type": Style(color="#e5c07b"),
        "layout": Style(color="#56b6c2"),
        "number": Style(color="#d19a66"),
        "operator": Style(color="#abb2bf"),
        "function": Style(color="#61afef"),
        "collective": Style(color="#e06c75", bold=True),
        "step": Style(color="#98c379", bold=True),
        "error": Style(bgcolor="#5c1a1a", underline=True, color="#ff8080"),
        "selected": Style(bgcolor="#2c3e50"),
    },
)


Highlight = tuple[int, int | None, str]
"""(start byte, end byte or None for the line's end, name in the theme)."""


class CountedRows(WrappedDocument):
    """A `WrappedDocument` whose height is the length of its row table (one entry per
    row, kept by `wrap` and `wrap_range`) instead of a sum over every line: TextArea
    reads the height for each line it renders, so on a 10,000-line source a repaint
    summed 10,000 lines for each of its rows. A `wrap` at the width and tab width of the
    last one, over the same lines, is skipped: TextArea wraps the whole text again at
    every resize, even unwrapped (width 0), which on such a source took a second."""

    _last: tuple[int, int, list[str]] | None = None
    """(width, tab width, a copy of the lines) of the last `wrap`."""

    @property
    def height(self) -> int:
        return len(self._offset_to_line_info)

    def wrap(self, width: int, tab_width: int | None = None) -> None:
        lines = self.document.lines
        last = self._last
        tabs = tab_width or self._tab_width
        # The list compares its strings by identity first: an unchanged text costs a
        # pass over pointers. An edit since (`wrap_range`) changed a line, so it wraps.
        if last is not None and last[:2] == (width, tabs) and last[2] == lines:
            return
        super().wrap(width, tab_width)
        self._last = (width, self._tab_width, list(lines))


class LazyHighlights(dict[int, list[Highlight]]):
    """The editor's highlights of each line, lexed when the line is first drawn (a
    10,000-line source was lexed whole at each edit and each new error mark): the marks
    of the selected line first, then the tokens, then the error marks."""

    def __init__(
        self,
        lines: list[str],
        before: dict[int, list[Highlight]],
        after: dict[int, list[Highlight]],
    ) -> None:
        super().__init__()
        self._lines = lines
        self._before = before
        self._after = after

    def __missing__(self, index: int) -> list[Highlight]:
        line = self._lines[index] if 0 <= index < len(self._lines) else ""
        found: list[Highlight] = [
            *self._before.get(index, ()),
            *lex_line(line),
            *self._after.get(index, ()),
        ]
        self[index] = found
        return found

    def __bool__(self) -> bool:
        return True  # TextArea draws no highlight at all when its map is empty


class CocoTextArea(TextArea, SteadyScrollbars):
    """A TextArea that highlights `.coco` by regular expressions and marks error spans.

    It has two modes. In command mode (at start, and whenever it has not the focus) it is
    read-only: the cursor moves, and every other key reaches the app's bindings, so a
    command key pressed here runs the command. `enter` or `i` enter edit mode, where keys
    type into the text; `escape` (or moving the focus away) leaves it. Tab never types:
    it moves the focus in either mode."""

    BINDINGS = [
        Binding("enter,i", "edit", "Edit", key_display="enter"),
        Binding("escape", "leave", "Stop editing", key_display="esc"),
        # TextArea has no document start/end keys; without these, ctrl+end reached the app.
        Binding("ctrl+home", "document_start", "Start of the text", show=False),
        Binding("ctrl+end", "document_end", "End of the text", show=False),
        Binding("ctrl+shift+home", "document_start(True)", "Select to the start", show=False),
        Binding("ctrl+shift+end", "document_end(True)", "Select to the end", show=False),
    ]

    error_spans: reactive[tuple[tuple[int, int, int, int], ...]] = reactive((), init=False)
    """(line, col, end line, end col), 1-based, of every diagnostic to mark."""

    selected_line: var[int | None] = var(None, init=False)
    """1-based line of the selected stage, shaded (a `var`: its watcher redraws the rows
    of the two lines, not the whole editor)."""

    editing: reactive[bool] = reactive(False, init=False)
    """Edit mode: keys type into the text. Off (command mode) the text is read-only and
    letter keys are the app's commands."""

    class ModeChanged(Message):
        """Edit mode was entered or left."""

        def __init__(self, editing: bool) -> None:
            self.editing = editing
            super().__init__()

    def __init__(self, text: str = "", **kwargs: object) -> None:
        super().__init__(text, read_only=True, tab_behavior="focus", **kwargs)  # type: ignore[arg-type]
        self.register_theme(COCO_THEME)
        self.theme = "cocoviz"
        # TextArea keeps 1,024 drawn rows, each keyed by its scroll offset and selection
        # too: over a session of scrolling and selecting it fills them all (a drawn row
        # holds a dozen caches), a few MB the app never gives back. The rows shown, a
        # few times over, are what a repaint reuses.
        self._line_cache = LRUCache(LINES_CACHED)

    @property  # type: ignore[override]
    def wrapped_document(self) -> WrappedDocument:
        return self._counted_rows

    @wrapped_document.setter
    def wrapped_document(self, document: WrappedDocument) -> None:
        # TextArea makes a WrappedDocument at start and for each new document.
        if type(document) is WrappedDocument:
            document.__class__ = CountedRows
        self._counted_rows = document

    @property
    def FOOTER_NAME(self) -> str:  # noqa: N802 - read as the class attribute of the other panes
        """The footer's name of the pane: it says which mode the editor is in."""
        return "EDIT source" if self.editing else "source"

    def watch_editing(self, editing: bool) -> None:
        self.read_only = not editing
        self.refresh_bindings()
        self.post_message(self.ModeChanged(editing))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Hidden, not dimmed: the footer shows the key that changes the mode now.
        if action == "edit":
            return not self.editing
        if action == "leave":
            return self.editing
        return True

    def on_blur(self) -> None:
        self.editing = False

    def watch_error_spans(self) -> None:
        self._build_highlight_map()
        self.refresh()

    def watch_selected_line(self, old: int | None, new: int | None) -> None:
        # Only the two lines change: the highlight map is not rebuilt (a long source
        # re-lexes nothing, but walks every line) and only their rows are redrawn.
        highlights = self._highlights
        lines = self.document.line_count
        if old is not None and 0 < old <= lines:
            highlights[old - 1] = [h for h in highlights[old - 1] if h[2] != "selected"]
        if new is not None and 0 < new <= lines:
            highlights[new - 1].insert(0, (0, None, "selected"))
        rows: set[int] = set()
        for line in (old, new):
            if line is not None and 0 < line <= lines:
                rows.update(self._rows_of(line - 1))
        # Only those rows' drawn lines are forgotten: the others are drawn again from
        # the cache when the editor scrolls to the new selection (a step's next paint).
        cache = self._line_cache
        for key in [k for k in cache.keys() if k[2] in rows]:  # (size, scroll x, row, …)
            cache.discard(key)
        for row in rows:
            self.refresh_line(row)

    def _rows_of(self, index: int) -> range:
        """The rows (of the whole text, wrapped or not) that show line `index` (0-based)."""
        if not self.soft_wrap:
            return range(index, index + 1)
        wrapped = self.wrapped_document
        top = wrapped.location_to_offset((index, 0)).y
        return range(top, top + len(wrapped.get_offsets(index)) + 1)

    def _build_highlight_map(self) -> None:
        self._line_cache.clear()
        lines = self.document.lines
        before: dict[int, list[Highlight]] = {}
        after: dict[int, list[Highlight]] = {}
        if self.selected_line is not None and 0 < self.selected_line <= len(lines):
            before[self.selected_line - 1] = [(0, None, "selected")]
        for line, col, end_line, end_col in self.error_spans:
            if not 0 < line <= len(lines):
                continue
            text = lines[line - 1]
            start = len(text[: max(col - 1, 0)].encode("utf-8"))
            if end_line == line and end_col > col:
                end: int | None = len(text[: end_col - 1].encode("utf-8"))
            else:
                end = None if end_line != line else start + 1
            if not text:  # an error at an empty line (end of file): mark nothing, the panel says it
                continue
            after.setdefault(line - 1, []).append((start, end, "error"))
        self._highlights = LazyHighlights(lines, before, after)

    def action_edit(self) -> None:
        self.editing = True

    def action_leave(self) -> None:
        self.editing = False
        self.screen.focus_next()

    def action_document_start(self, select: bool = False) -> None:
        self.move_cursor((0, 0), select=select)

    def action_document_end(self, select: bool = False) -> None:
        self.move_cursor(self.document.end, select=select)


class SourceEditor(Vertical):
    """Editable source with live re-parse; shows the diagnostics it is given."""

    DEFAULT_CSS = """
    SourceEditor { height: 1fr; }
    SourceEditor > CocoTextArea { height: 1fr; border: none; padding: 0; }
    /* TextArea:focus draws a tall border; the pane's top border already shows focus. */
    SourceEditor > CocoTextArea:focus { border: none; }
    SourceEditor > #diagnostic { height: auto; max-height: 8; padding: 0 1; }
    SourceEditor > #diagnostic.-error { background: $error 20%; color: $text; }
    SourceEditor > #diagnostic.-ok { color: $text-muted; }
    """

    # `var`: a change redraws the panel under the editor (and the editor's marks), not
    # the whole pane.
    diagnostics: var[tuple[Diagnostic, ...]] = var((), init=False)
    """The diagnostics of the latest parse; empty when it succeeded."""

    status: var[str] = var("", init=False)
    """One line shown when there is no diagnostic (what was parsed)."""

    selected_line: var[int | None] = var(None, init=False)

    class Edited(Message):
        """The text changed and the user paused typing."""

        def __init__(self, text: str) -> None:
            self.text = text
            super().__init__()

    class CursorOnLine(Message):
        """The cursor moved to another line (to select the stage defined there)."""

        def __init__(self, line: int) -> None:
            self.line = line
            super().__init__()

    def __init__(self, text: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._initial = text
        self._timer: Timer | None = None
        self._cursor_line = 0
        self._status_width = -1
        """The cells of the status line shown (-1: the panel shows diagnostics)."""
        self._reveal: int | None = None
        """The line `reveal_line` keeps in view while the layout settles."""

    def compose(self) -> ComposeResult:
        yield CocoTextArea(self._initial, show_line_numbers=True, soft_wrap=False, id="editor")
        yield Static("", id="diagnostic")

    @property
    def text_area(self) -> CocoTextArea:
        return self.query_one(CocoTextArea)

    @property
    def text(self) -> str:
        return self.text_area.text

    def set_text(self, text: str) -> None:
        """Replace the text (a restored autosave); posts Edited after the usual pause."""
        self.text_area.load_text(text)

    def watch_diagnostics(self) -> None:
        self._show()

    def watch_status(self) -> None:
        self._show()

    def watch_selected_line(self, line: int | None) -> None:
        self.text_area.selected_line = line

    def _show(self) -> None:
        panel = self.query_one("#diagnostic", Static)
        area = self.text_area
        spans = []
        for d in self.diagnostics:
            if d.span is not None:
                s = d.span
                spans.append((s.line, s.col, s.end_line, s.end_col))
        area.error_spans = tuple(spans)
        if self.diagnostics:
            out = Text()
            for i, d in enumerate(self.diagnostics[:3]):
                if i:
                    out.append("\n")
                where = f"{d.span.line}:{d.span.col} " if d.span else ""
                out.append(f"{where}", style="bold")
                out.append(f"{d.severity}: ", style="bold red")
                out.append(d.message)
                if d.hint:
                    out.append(f"\nhint: {d.hint}", style="italic")
            if len(self.diagnostics) > 3:
                out.append(f"\n… and {len(self.diagnostics) - 3} more")
            panel.update(out)
            panel.set_class(True, "-error")
            panel.set_class(False, "-ok")
            self._status_width = -1
        else:
            status = Text(self.status)
            # One status line for another, both fitting the panel: its height stays, so
            # the screen needs no new layout (the step → screen path).
            room = panel.content_size.width
            same = 0 <= self._status_width <= room and status.cell_len <= room
            panel.update(status, layout=not same)
            panel.set_class(False, "-error")
            panel.set_class(True, "-ok")
            self._status_width = status.cell_len

    @on(TextArea.Changed)
    def _changed(self, event: TextArea.Changed) -> None:
        event.stop()
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(REPARSE_DELAY, self._flush)

    def _flush(self) -> None:
        self._timer = None
        self.post_message(self.Edited(self.text))

    @on(TextArea.SelectionChanged)
    def _moved(self, event: TextArea.SelectionChanged) -> None:
        event.stop()
        line = event.selection.end[0] + 1
        if line != self._cursor_line:
            self._cursor_line = line
            if self.text_area.has_focus:
                self.post_message(self.CursorOnLine(line))

    def reveal_line(self, line: int) -> None:
        """Once laid out, scroll so that `line` (1-based) shows, a third down the pane,
        when it does not show from the top (a long header comment above the program);
        again after each resize, until the user moves in the text."""
        self._reveal = line
        self.call_after_refresh(self._reveal_line, line)

    def on_resize(self) -> None:
        if self._reveal is not None:
            self.call_after_refresh(self._reveal_line, self._reveal)

    def _reveal_line(self, line: int) -> None:
        area = self.text_area
        if area.has_focus:
            self._reveal = None
            return
        height = area.scrollable_content_region.height
        if height <= 0 or line > area.document.line_count:
            return
        if area.soft_wrap:
            row = area.wrapped_document.location_to_offset((line - 1, 0)).y
        else:
            row = line - 1
        if not area.scroll_offset.y <= row < area.scroll_offset.y + height - 1:
            area.scroll_to(y=max(0, row - height // 3), animate=False)

    def go_to_line(self, line: int) -> None:
        """Scroll so that `line` (1-based) is visible, once the editor has its size."""
        self._reveal = None
        self.call_after_refresh(self._scroll_to_line, line)

    def _scroll_to_line(self, line: int) -> None:
        area = self.text_area
        top, height = area.scroll_offset.y, area.scrollable_content_region.height
        if height > 0 and not top <= line - 1 < top + height:
            area.scroll_to(y=max(0, line - 3), animate=False)
