"""Small modal dialogs: ask for a path, confirm restoring an autosave."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 70; max-width: 95%; height: auto; padding: 1 2;
    border: thick $primary; background: $panel;
}}
{name} Horizontal {{ height: auto; margin-top: 1; }}
{name} Button {{ margin-right: 2; }}
{name} .title {{ text-style: bold; margin-bottom: 1; }}
"""


class PathDialog(ModalScreen[str | None]):
    """Ask for a file or directory path; returns it, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = DIALOG_CSS.format(name="PathDialog")
    AUTO_FOCUS = "#path"
    """The name is typed at once (enter saves)."""

    def __init__(self, title: str, default: str, ok_label: str = "Save") -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self.ok_label = ok_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="title")
            yield Input(self.default, id="path")
            with Horizontal():
                yield Button(self.ok_label, variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        value = self.query_one("#path", Input).value.strip()
        self.dismiss(value or None)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class RestoreDialog(ModalScreen[bool]):
    """Offer back an autosaved session, saying what restoring it would replace; True
    restores it. Keeping what was opened is the default (escape, d, the focused
    button), so steps given with `--schedule` win unless the user chooses otherwise."""

    BINDINGS = [
        Binding("r", "restore", "Restore"),
        Binding("escape,d,k", "discard", "Keep"),
    ]
    DEFAULT_CSS = DIALOG_CSS.format(name="RestoreDialog")
    AUTO_FOCUS = "#discard"

    def __init__(self, what: str, detail: str, replaces: str = "", keep: str = "") -> None:
        super().__init__()
        self.what = what
        self.detail = detail
        self.replaces = replaces
        """What restoring replaces (the steps given with --schedule, …)."""
        self.keep = keep or "Keep what was opened (d)"

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"An autosaved session of {self.what} was found", classes="title")
            yield Label(self.detail)
            if self.replaces:
                yield Label(f"Restoring it replaces {self.replaces}.", id="replaces")
            with Horizontal():
                yield Button("Restore (r)", id="restore")
                yield Button(self.keep, variant="primary", id="discard")

    @on(Button.Pressed, "#restore")
    def action_restore(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#discard")
    def action_discard(self) -> None:
        self.dismiss(False)
