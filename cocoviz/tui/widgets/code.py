"""The code pane: the files `cocoviz emit` writes for the current step, or their diff
against the previous step's files (docs/codegen.md). Its options are the target (a row
of `cocoviz.emit.targets.TARGETS`, `T`) and, for a GPU target, the collectives mode
(`nccl` or `nccl-device`, `N`) and the CUDA architecture (`A`)."""

from __future__ import annotations

import difflib

from rich.syntax import Syntax
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from cocoviz.emit.emitter import Emitted
from cocoviz.workbench import CodeOptions

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


def file_order(files: Emitted) -> list[str]:
    """The program file first, then its header, the launcher, the build and run files,
    the manifest, and the shared runtime headers."""
    stem = files.binary

    def rank(name: str) -> tuple[int, str]:
        if name.startswith(stem + ".") and not name.endswith(".h"):
            return 0, name
        if name == f"{stem}.h":
            return 1, name
        if name.startswith("main."):
            return 2, name
        if name in ("Makefile", "run.sh"):
            return 3, name
        if name == "manifest.json":
            return 4, name
        return 5, name

    return sorted(files.files, key=rank)


def diff_files(before: dict[str, str], after: dict[str, str], name: str) -> str:
    a = before.get(name, "").splitlines(keepends=True)
    b = after.get(name, "").splitlines(keepends=True)
    out = "".join(difflib.unified_diff(a, b, f"previous/{name}", f"current/{name}", n=2))
    return out or "(no change in this file)\n"


class CodeView(Horizontal):
    """A file list on the left and the selected file (or its diff) on the right."""

    BINDINGS = [
        Binding("d", "toggle_diff", "Diff vs previous step"),
        Binding("T", "cycle('target')", "Next target", key_display="T"),
        Binding("N", "cycle('collectives')", "Collectives nccl / nccl-device", key_display="N"),
        Binding("A", "cycle('arch')", "Next CUDA architecture", key_display="A"),
    ]
    FOOTER_NAME = "code"

    DEFAULT_CSS = """
    CodeView { height: 1fr; }
    CodeView > #code-side { width: 26; height: 1fr; }
    CodeView #code-target { height: 3; padding: 0 1; background: $boost; }
    CodeView #files { height: 1fr; }
    CodeView > #body { width: 1fr; height: 1fr; }
    """

    show_diff: reactive[bool] = reactive(False, init=False)
    """Show the diff against the previous step instead of the file."""

    class OptionsChanged(Message):
        """The user asked for the code of other options (target, collectives, arch)."""

        def __init__(self, options: CodeOptions) -> None:
            self.options = options
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.files: dict[str, str] = {}
        self.previous: dict[str, str] | None = None
        self.options = CodeOptions()
        self.current = ""
        self.message_text = "no code yet"
        self.shown_text = ""
        """The text in the body: the file, its diff, or the message."""

    def compose(self) -> ComposeResult:
        with Vertical(id="code-side"):
            yield Static(id="code-target")
            yield OptionList(id="files")
        with VerticalScroll(id="body"):
            yield Static(id="content")

    def show(
        self,
        files: Emitted | None,
        previous: Emitted | None,
        options: CodeOptions,
        message: str = "",
    ) -> None:
        """Display `files` (emitted for `options`) against `previous`, or `message`."""
        self.files = dict(files.files) if files is not None else {}
        self.previous = dict(previous.files) if previous is not None else None
        self.options = options
        self.message_text = message
        self._show_target()
        names = file_order(files) if files is not None else []
        changed = set()
        if self.previous is not None:
            changed = {n for n in names if self.previous.get(n) != self.files.get(n)}
        ol = self.query_one("#files", OptionList)
        ol.set_options(
            [Option(Text(("● " if n in changed else "  ") + n), id=n) for n in names]
            or [Option(Text(message or "no files", style="italic dim"), disabled=True)]
        )
        if self.current not in self.files:
            self.current = names[0] if names else ""
        if self.current:
            ol.highlighted = names.index(self.current)
        self._render_body()

    @property
    def target(self) -> str:
        return self.options.target

    def _show_target(self) -> None:
        o = self.options
        t = Text()
        rows = (
            ("T", "target", o.target, True),
            ("N", "coll.", o.collectives if o.gpu else "-", o.gpu),
            ("A", "arch", o.arch if o.gpu else "-", o.gpu),
        )
        for i, (key, name, value, live) in enumerate(rows):
            if i:
                t.append("\n")
            t.append(f"{key} ", "bold reverse" if live else "dim")
            t.append(f" {name:<7}", "dim")
            t.append(value, "bold" if live else "dim")
        self.query_one("#code-target", Static).update(t)

    def watch_show_diff(self) -> None:
        self._render_body()

    def _render_body(self) -> None:
        content = self.query_one("#content", Static)
        if not self.files:
            self.shown_text = self.message_text
            content.update(Text(self.message_text, style="italic"))
            return
        name = self.current
        if self.show_diff and self.previous is None:
            self.shown_text = "no previous step to compare with"
            content.update(Text(self.shown_text, style="italic"))
        elif self.show_diff:
            assert self.previous is not None
            self.shown_text = diff_files(self.previous, self.files, name)
            content.update(Syntax(self.shown_text, "diff", theme="ansi_dark", word_wrap=True))
        else:
            self.shown_text = self.files.get(name, "")
            content.update(
                Syntax(
                    self.shown_text,
                    _lexer(name),
                    theme="ansi_dark",
                    line_numbers=True,
                    word_wrap=True,  # a long line wraps under its number, never cut
                )
            )

    @on(OptionList.OptionHighlighted, "#files")
    def _pick(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id and event.option.id in self.files and event.option.id != self.current:
            self.current = event.option.id
            self._render_body()

    def on_click(self, event: object) -> None:
        widget = getattr(event, "widget", None)
        if widget is not None and widget.id == "code-target":
            y = getattr(event, "y", 0)
            self.action_cycle(("target", "collectives", "arch")[min(max(y, 0), 2)])

    def action_toggle_diff(self) -> None:
        self.show_diff = not self.show_diff

    def action_cycle(self, which: str) -> None:
        """Ask for the next target, collectives mode or architecture."""
        o = self.options
        nxt = {"target": o.next_target, "collectives": o.next_collectives, "arch": o.next_arch}
        new = nxt[which]()
        if new == o:
            self.app.notify(f"the {o.target} target has no {which} option", severity="warning")
            return
        self.post_message(self.OptionsChanged(new))
