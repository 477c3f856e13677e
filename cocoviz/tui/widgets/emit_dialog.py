"""The emit dialog: choose an output directory and a target, then emit."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, RadioButton, RadioSet

from cocoviz.emit.targets import DEFAULT_TARGET, TARGETS
from cocoviz.tui.widgets.dialogs import DIALOG_CSS


@dataclass(frozen=True)
class EmitRequest:
    directory: str
    target: str  # a name of cocoviz.emit.targets.TARGET_NAMES
    force: bool = False


class EmitDialog(ModalScreen[EmitRequest | None]):
    """Returns an EmitRequest, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = (
        DIALOG_CSS.format(name="EmitDialog")
        + """
    EmitDialog RadioSet { width: auto; height: auto; }
    """
    )

    def __init__(self, default_dir: str, target: str = DEFAULT_TARGET) -> None:
        super().__init__()
        self.default_dir = default_dir
        self.target = target

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Emit the current step's program", classes="title")
            yield Label("Output directory")
            yield Input(self.default_dir, id="dir")
            with RadioSet(id="target"):
                for t in TARGETS:
                    yield RadioButton(t.title, value=self.target == t.name, id=t.name)
            yield Checkbox("overwrite a directory cocoviz did not write (--force)", id="force")
            with Horizontal():
                yield Button("Emit", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        directory = self.query_one("#dir", Input).value.strip()
        if not directory:
            self.notify("choose a directory", severity="warning")
            return
        pressed = self.query_one("#target", RadioSet).pressed_button
        target = pressed.id if pressed is not None and pressed.id else DEFAULT_TARGET
        force = self.query_one("#force", Checkbox).value
        self.dismiss(EmitRequest(directory, target, force))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
