"""The help screen (`?`): every key of the app and of the focused pane, and the mouse."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

PANES = """
## Panes

- **source** — edit the program; it is parsed again when you pause typing, and errors are
  marked where they are. `escape` leaves the editor so the letter keys work again.
- **graph** — arrows move between stages, the mouse selects; the selected stage is shaded
  in the source, highlighted in the timeline, and the palette offers its steps.
- **timeline** — one row per rank and stream; arrows move the cursor (its event is
  described under the axis), `+`/`-` zoom, `enter` selects the stage under the cursor,
  `b` compares with the previous step or the unscheduled program.
- **palette** — the steps legal for the selected stage, keys `1`–`9`; illegal ones are
  dimmed with the reason. An `overlap` is applied without `chunks=`: the cost model
  picks the chunk count K for the hardware (`model: K=2`), and the history shows it.
- **history** — every step; `enter` jumps to one; `u` undo, `U` or `ctrl+r` redo.
- **code** — the files `cocoviz emit` writes for the current step; `d` shows the diff
  against the previous step, `T` switches between the CUDA and the CPU (C++/MPI) target.
  `e` writes them to a directory of your choice.

Each step is also a command: `c` copies the equivalent `cocoviz apply FILE 'step' …`.
The session is autosaved and offered back the next time you open the same file.
"""


class HelpScreen(ModalScreen[None]):
    """Keys and panes; any of escape, q or ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close help")]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90; max-width: 100%; height: 90%;
        border: thick $primary; background: $panel; padding: 0 1;
    }
    """

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        rows = "\n".join(f"| `{k}` | {d} |" for k, d in self.keys)
        text = "# cocoviz — keys\n\n| key | what it does |\n|---|---|\n" + rows + "\n" + PANES
        with VerticalScroll():
            yield Markdown(text)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
