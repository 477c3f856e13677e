"""The history pane: the steps applied so far, the current one marked, and the last
failed step (a failure is a value shown here, not a crash)."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option


class HistoryList(OptionList):
    """Step 0 is the unscheduled program; enter jumps to a step."""

    DEFAULT_CSS = """
    HistoryList { height: 1fr; }
    """

    class JumpTo(Message):
        """The user asked to go to step `index` (0 = unscheduled)."""

        def __init__(self, index: int) -> None:
            self.index = index
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.count = 0

    def show(self, steps: list[str], current: int, failed: tuple[str, str] | None = None) -> None:
        """`steps` are every recorded step (also undone ones); `current` how many apply."""
        options = [
            Option(self._line(0, "unscheduled", current == 0, False), id="h:0"),
        ]
        for i, s in enumerate(steps, start=1):
            options.append(Option(self._line(i, s, current == i, i > current), id=f"h:{i}"))
        if failed is not None:
            step, reason = failed
            t = Text.assemble(("✗ ", "bold red"), (step, "red"), ("\n  " + reason, "italic"))
            options.append(Option(t, id="failed", disabled=True))
        self.count = len(steps) + 1
        self.set_options(options)
        self.highlighted = current

    @staticmethod
    def _line(i: int, step: str, current: bool, undone: bool) -> Text:
        mark = "▶" if current else " "
        style = "bold" if current else "dim strike" if undone else ""
        return Text.assemble((f"{mark}{i:>2} ", "bold cyan" if current else "dim"), (step, style))

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        oid = event.option.id or ""
        if oid.startswith("h:"):
            self.post_message(self.JumpTo(int(oid[2:])))
