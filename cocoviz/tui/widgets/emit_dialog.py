"""The emit dialog: choose an output directory and a target, then emit."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, RadioButton, RadioSet

from cocoviz.tui.widgets.dialogs import DIALOG_CSS


@dataclass(frozen=True)
class EmitRequest:
    directory: str
    target: str  # "cuda" or "cpu"
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

    def __init__(self, default_dir: str, target: str = "cuda") -> None:
        super().__init__()
        self.default_dir = default_dir
        self.target = target

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Emit the current step's program", classes="title")
            yield Label("Output directory")
            yield Input(self.default_dir, id="dir")
            with RadioSet(id="target"):
                yield RadioButton(
                    "CUDA + NCCL + MPI launcher", value=self.target == "cuda", id="cuda"
                )
                yield RadioButton("C++ + MPI (CPU)", value=self.target == "cpu", id="cpu")
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
        target = pressed.id if pressed is not None and pressed.id else "cuda"
        force = self.query_one("#force", Checkbox).value
        self.dismiss(EmitRequest(directory, target, force))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
