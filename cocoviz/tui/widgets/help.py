"""The help screen (`?`): every key of the app and of each pane, and the mouse, as one
scrollable list that opens at the top; `/` searches it; escape, q or ? close it
(README, the TUI's key table; docs/architecture.md, layer 9)."""

from __future__ import annotations

from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

PANES = """
**source** — the program. Keys type into it only in edit mode: `i` (or `enter` here)
starts it, `escape` or leaving the pane stops it, and the footer says `EDIT source` while
it lasts; elsewhere every letter is a command, here too. The text is parsed again when
you pause typing, and errors are marked where they are. Tab never types: it moves to the
next pane.

**graph** — arrows move between stages, the mouse selects; the selected stage is shaded
in the source, highlighted in the timeline, and the palette offers its steps.

**timeline** — one row per rank and stream; arrows move the cursor; the event under
the cursor, or under the mouse, is described under the axis.

**steps** — the steps legal for the selected stage, keys `1`–`9`; illegal ones are
dimmed with the reason. The legal overlap groups through the stage that overlap
communication are offered, the most collectives first, and `decompose` for an all-gather
feeding a matmul or a matmul feeding a reduce-scatter. An `overlap` is applied without
`chunks=`: the cost model picks the chunk count K for the hardware (`model: K=2`), and
the history shows it.

**cost** — the predicted makespan of the current step and its speedup over the
unscheduled program; `w` shows instead the crossover sweep of the program's main
dimension (its token or element count): per size the fastest schedule block, its time
and the tuner's best speedup (`tuned`), and the size from which the winner changes.

**code** — the files `cocoviz emit` writes for the current step, for the target, the
collectives mode and the CUDA architecture in the pane's title; `e` writes them to a
directory of your choice.

Each step is also a command: `c` copies the equivalent `cocoviz apply FILE 'step' …`.
The session is autosaved and offered back the next time you open the same file.
"""

CLOSE_HINT = "escape, q or ? close · / search · ↑ ↓ PgUp PgDn Home End scroll"

KeyRow = tuple[str, str, str]
"""(where the key works, the key, what it does)."""


class HelpScreen(ModalScreen[None]):
    """Keys and panes; any of escape, q or ? closes it."""

    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss", "Close help"),
        Binding("slash", "search", "Search the keys", key_display="/"),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > #help {
        width: 100; max-width: 100%; height: 100%; max-height: 100%;
        border: thick $primary; background: $panel; padding: 0 1;
    }
    HelpScreen #help-hint { height: 1; color: $text-muted; }
    HelpScreen #help-search { height: 1; border: none; padding: 0; margin: 0 0 1 0; }
    HelpScreen #help-search:focus { border: none; background: $boost; }
    HelpScreen #help-body { height: 1fr; }
    """

    def __init__(self, keys: list[KeyRow]) -> None:
        super().__init__()
        self.keys = keys
        self.shown: list[KeyRow] = list(keys)
        """The rows the current search leaves."""

    def compose(self) -> ComposeResult:
        with Vertical(id="help") as box:
            box.border_title = "cocoviz — keys"
            box.border_subtitle = "escape, q or ? close"
            yield Static(Text(CLOSE_HINT), id="help-hint")
            yield Input(placeholder="/ search the keys", id="help-search")
            with VerticalScroll(id="help-body"):
                yield Static(id="help-keys")
                yield Static(Markdown(PANES), id="help-panes")

    def on_mount(self) -> None:
        self._render_keys("")
        body = self.query_one("#help-body", VerticalScroll)
        body.scroll_home(animate=False)
        body.focus()

    def _render_keys(self, query: str) -> None:
        q = query.strip().lower()
        self.shown = [r for r in self.keys if not q or any(q in x.lower() for x in r)]
        t = Table(box=None, show_header=False, padding=(0, 1), expand=True)
        t.add_column(style="bold", no_wrap=True)
        t.add_column(ratio=1)
        section = None
        for where, key, what in self.shown:
            if where != section:
                if section is not None:
                    t.add_row("", "")
                t.add_row(Text(where, style="bold underline"), "")
                section = where
            t.add_row(key, what)
        if not self.shown:
            t.add_row("", Text(f"no key matches {query!r}", style="italic"))
        self.query_one("#help-keys", Static).update(t)
        self.query_one("#help-panes", Static).display = not q

    @on(Input.Changed, "#help-search")
    def _search(self, event: Input.Changed) -> None:
        self._render_keys(event.value)
        self.query_one("#help-body", VerticalScroll).scroll_home(animate=False)

    @on(Input.Submitted, "#help-search")
    def _searched(self) -> None:
        self.query_one("#help-body", VerticalScroll).focus()

    def action_search(self) -> None:
        self.query_one("#help-search", Input).focus()

    async def action_dismiss(self, result: None = None) -> None:
        search = self.query_one("#help-search", Input)
        if search.has_focus:  # escape leaves the search (q and ? type there)
            self.query_one("#help-body", VerticalScroll).focus()
            return
        self.dismiss(result)
