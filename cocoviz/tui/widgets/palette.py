"""The transformation palette: the steps for the selected stage, legal ones with a key."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from cocoviz.schedule import PaletteEntry
from cocoviz.tui.pane_layout import SIDE_W
from cocoviz.tui.widgets.steady import SteadyOptionList


def _label(e: PaletteEntry, room: int) -> tuple[tuple[str, str], ...]:
    """The step in bold; a note after it (how `overlap` picks K) in the dim style, on a
    line of its own under the step when the two do not fit in `room` cells together (a
    long overlap group), so that the note is not broken in two."""
    if e.label.startswith(e.step) and e.label != e.step:
        note = e.label[len(e.step) :]
        if len(e.label) > room:
            note = "\n    " + note.strip()
        return ((e.step, "bold"), (note, "dim"))
    return ((e.shown, "bold"),)


class StepPalette(SteadyOptionList):
    """Legal steps first, keyed 1–9; illegal ones dimmed with the reason."""

    BINDINGS = [Binding("enter", "select", "Apply step")]
    FOOTER_NAME = "steps"

    DEFAULT_CSS = """
    StepPalette { height: 1fr; }
    """

    class StepChosen(Message):
        """The user chose a legal step."""

        def __init__(self, step: str) -> None:
            self.step = step
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.entries: list[PaletteEntry] = []
        self.keyed: list[str] = []
        self._message = ""
        self._room = -1
        """The cells a step's line had when shown (a new width lays the notes out again)."""

    def show(self, entries: list[PaletteEntry], message: str = "") -> None:
        """Display `entries` (or `message` when there is nothing to offer)."""
        self.entries = entries
        self._message = message
        legal = [e for e in entries if e.ok]
        illegal = [e for e in entries if not e.ok]
        self.keyed = [e.step for e in legal[:9]]
        # cells for a step after its key: the list's width once laid out, else the side
        # column's less its border
        room = self._room = (self.scrollable_content_region.width or SIDE_W - 2) - 3
        options: list[Option] = []
        for i, e in enumerate(legal):
            key = f"{i + 1} " if i < 9 else "  "
            label = Text.assemble((key, "bold reverse"), " ", *_label(e, room))
            options.append(Option(label, id=f"ok:{i}"))
        for i, e in enumerate(illegal):
            t = Text(f"  {e.shown}", style="dim")
            if e.reason:
                t.append(f"\n    {e.reason}", style="dim italic")
            options.append(Option(t, id=f"no:{i}", disabled=True))
        if not options:
            options.append(Option(Text(message or "no steps", style="italic dim"), disabled=True))
        elif message:
            options.insert(0, Option(Text(message, style="italic dim"), disabled=True))
        self.set_options(options)

    def on_resize(self) -> None:
        # The list was filled before the layout settled: its notes are placed for the
        # width it has now (a step and its note on one line, or the note under it).
        room = (self.scrollable_content_region.width or SIDE_W - 2) - 3
        if self.entries and room != self._room:
            self.show(self.entries, self._message)

    def step_for_key(self, n: int) -> str | None:
        return self.keyed[n - 1] if 0 < n <= len(self.keyed) else None

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        oid = event.option.id or ""
        if oid.startswith("ok:"):
            legal = [e for e in self.entries if e.ok]
            self.post_message(self.StepChosen(legal[int(oid[3:])].step))
