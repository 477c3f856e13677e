"""The code pane: the files emitted for the current step, or their diff against the
previous step's files."""

from __future__ import annotations

import difflib

from rich.syntax import Syntax
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

_LEXERS = {
    ".cu": "cuda",
    ".cuh": "cuda",
    ".cpp": "cpp",
    ".h": "cpp",
    ".json": "json",
    ".sh": "bash",
}


def _lexer(name: str) -> str:
    if name == "Makefile":
        return "make"
    for ext, lex in _LEXERS.items():
        if name.endswith(ext):
            return lex
    return "text"


def diff_files(before: dict[str, str], after: dict[str, str], name: str) -> str:
    a = before.get(name, "").splitlines(keepends=True)
    b = after.get(name, "").splitlines(keepends=True)
    out = "".join(difflib.unified_diff(a, b, f"previous/{name}", f"current/{name}", n=2))
    return out or "(no change in this file)\n"


class CodeView(Horizontal):
    """A file list on the left and the selected file (or its diff) on the right."""

    BINDINGS = [Binding("d", "toggle_diff", "Diff against the previous step")]

    DEFAULT_CSS = """
    CodeView { height: 1fr; }
    CodeView > #files { width: 22; height: 1fr; }
    CodeView > #body { width: 1fr; height: 1fr; }
    """

    show_diff: reactive[bool] = reactive(False, init=False)
    """Show the diff against the previous step instead of the file."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.files: dict[str, str] = {}
        self.previous: dict[str, str] | None = None
        self.current = ""
        self.message_text = "no code yet"

    def compose(self) -> ComposeResult:
        yield OptionList(id="files")
        with VerticalScroll(id="body"):
            yield Static(id="content")

    def show(
        self, files: dict[str, str] | None, previous: dict[str, str] | None, message: str = ""
    ) -> None:
        self.files = files or {}
        self.previous = previous
        self.message_text = message
        names = sorted(self.files)
        changed = set()
        if previous is not None:
            changed = {n for n in names if previous.get(n) != self.files.get(n)}
        ol = self.query_one("#files", OptionList)
        ol.set_options(
            [Option(Text(("● " if n in changed else "  ") + n), id=n) for n in names]
            or [Option(Text(message or "no files", style="italic dim"), disabled=True)]
        )
        if self.current not in self.files:
            self.current = next(
                (n for n in names if n.endswith((".cu", ".cpp"))), names[0] if names else ""
            )
        if self.current:
            ol.highlighted = names.index(self.current)
        self._render_body()

    def watch_show_diff(self) -> None:
        self._render_body()

    def _render_body(self) -> None:
        content = self.query_one("#content", Static)
        if not self.files:
            content.update(Text(self.message_text, style="italic"))
            return
        name = self.current
        if self.show_diff:
            if self.previous is None:
                content.update(Text("no previous step to compare with", style="italic"))
            else:
                content.update(
                    Syntax(diff_files(self.previous, self.files, name), "diff", theme="ansi_dark")
                )
        else:
            content.update(
                Syntax(self.files.get(name, ""), _lexer(name), theme="ansi_dark", line_numbers=True)
            )

    @on(OptionList.OptionHighlighted, "#files")
    def _pick(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id and event.option.id in self.files and event.option.id != self.current:
            self.current = event.option.id
            self._render_body()

    def action_toggle_diff(self) -> None:
        self.show_diff = not self.show_diff
