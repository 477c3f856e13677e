"""The history pane: the steps applied so far, the current one marked, and the last
failed step (a failure is a value shown here, not a crash)."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from cocoviz.tui.widgets.steady import SteadyOptionList


class HistoryList(SteadyOptionList):
    """Step 0 is the unscheduled program; enter jumps to a step."""

    BINDINGS = [Binding("enter", "select", "Go to step")]
    FOOTER_NAME = "history"

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
        self._rows: list[tuple[str, tuple[object, ...]]] = []
        """(option id, what its line shows) of each option shown."""

    def show(self, steps: list[str], current: int, failed: tuple[str, str] | None = None) -> None:
        """`steps` are every recorded step (also undone ones); `current` how many apply.

        Only the lines that changed are replaced (a step changes two or three of them):
        the list stays cheap to update however long the history grows."""
        rows: list[tuple[str, tuple[object, ...]]] = [("h:0", ("unscheduled", current == 0, False))]
        rows += [(f"h:{i}", (s, current == i, i > current)) for i, s in enumerate(steps, start=1)]
        if failed is not None:
            rows.append(("failed", failed))
        old = self._rows
        same = 0
        while same < min(len(old), len(rows)) and old[same][0] == rows[same][0]:
            same += 1
        if same == 0:
            self.set_options([self._option(oid, shown) for oid, shown in rows])
        else:
            for i in range(len(old) - 1, same - 1, -1):
                self.remove_option_at_index(i)
            for i in range(same):
                if old[i][1] != rows[i][1]:
                    self.replace_prompt_at_index(i, self._prompt(*rows[i]))
            if len(rows) > same:
                self.add_options([self._option(oid, shown) for oid, shown in rows[same:]])
        self._rows = rows
        self.count = len(steps) + 1
        self.highlighted = current

    @classmethod
    def _option(cls, oid: str, shown: tuple[object, ...]) -> Option:
        return Option(cls._prompt(oid, shown), id=oid, disabled=oid == "failed")

    @classmethod
    def _prompt(cls, oid: str, shown: tuple[object, ...]) -> Text:
        if oid == "failed":
            step, reason = shown
            return Text.assemble(
                ("✗ ", "bold red"), (str(step), "red"), ("\n  " + str(reason), "italic")
            )
        step, current, undone = shown
        return cls._line(int(oid[2:]), str(step), bool(current), bool(undone))

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
