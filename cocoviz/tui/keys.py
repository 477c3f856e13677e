"""The app's keys and focus: which key does what where, and which pane has the keys.

The model is the one of lazygit, k9s or Posting. The focused pane owns the keys its
footer lists first (`cocoviz.tui.widgets.footer`); the app's keys work in every pane;
letter keys are commands everywhere except in the source editor's edit mode, which only
`enter`/`i` on the source (or `i` anywhere) enters and `escape` or moving the focus
leaves (`CocoTextArea`). Tab and Shift-Tab move between panes and never type. The help
screen and the command palette list the same bindings, from here.

`KeyModel` is the App's part that handles focus and the keys that are not about the
program (the pane to show, the help, the command palette's commands); the App mixes it
in and keeps what changes the program.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import TabbedContent

from cocoviz.tui.widgets.code import CodeView
from cocoviz.tui.widgets.graph import GraphView
from cocoviz.tui.widgets.help import HelpScreen
from cocoviz.tui.widgets.source import CocoTextArea, SourceEditor
from cocoviz.tui.widgets.timeline import TimelineView

APP_BINDINGS: list[Binding] = [
    Binding("q", "quit", "Quit", key_display="q"),
    Binding("question_mark", "help", "Help", key_display="?"),
    Binding("u", "undo", "Undo"),
    Binding("U", "redo", "Redo", key_display="U"),
    Binding("ctrl+r", "redo", "Redo", show=False),
    Binding("b", "compare", "Before/after"),
    Binding("e", "emit", "Emit"),
    Binding("t", "teach", "Teach"),
    Binding("n", "teach_next", "Next lesson", show=False),
    Binding("escape", "cancel_tune", "Stop the tuner (teach mode waits for it)", key_display="esc"),
    Binding("p", "teach_prev", "Previous lesson", show=False),
    Binding("c", "copy_command", "Copy as command", show=False),
    Binding("ctrl+s", "save_sched", "Save .sched", show=False),
    Binding("x", "dismiss_error", "Dismiss error", show=False),
    Binding("i", "edit", "Edit source", show=False),
    Binding("g", "focus_graph", "Focus graph", show=False),
    Binding("z", "zoom_pane", "Zoom pane", show=False),
    Binding("s", "toggle_side", "Side column (cost, steps, history)", show=False),
    Binding("w", "crossover", "Crossover sweep in the cost pane (when does it pay)", show=False),
    Binding("ctrl+o", "view('code')", "Code view", show=False),
    Binding("ctrl+l", "view('timeline')", "Timeline view", show=False),
    Binding("f12", "screenshot", "Save screenshot", show=False),
    *[
        Binding(str(k), f"palette_key({k})", f"Apply step {k} of the palette", show=False)
        for k in range(1, 10)
    ],
]
"""The keys that work in every pane (a pane's own come first where it has the focus)."""

EDITING = " · EDIT (esc stops)"
"""The end of the source pane's title in edit mode."""

_KEY_NAMES = {
    "question_mark": "?",
    "equals_sign": "=",
    "plus": "+",
    "minus": "-",
    "up": "↑",
    "down": "↓",
    "left": "←",
    "right": "→",
    "slash": "/",
}


def key_names(b: Binding) -> str:
    """A binding's keys as the help shows them: `U / ctrl+r`, `+ / =`."""
    keys = [_KEY_NAMES.get(k.strip(), k.strip()) for k in b.key.split(",")]
    if b.key_display and b.key_display not in keys:
        keys[0] = b.key_display
    return " / ".join(keys)


def key_descriptions() -> list[tuple[str, str, str]]:
    """Every key as the help lists it: (where it works, the key, what it does); the keys
    that work everywhere first, quitting at the top."""
    out: list[tuple[str, str, str]] = [
        ("everywhere", "q / ctrl+q", "Quit (the session is autosaved)"),
    ]
    by_action: dict[str, tuple[list[str], str]] = {}
    for b in APP_BINDINGS:
        if b.action.startswith("palette_key") or b.action == "quit":
            continue
        by_action.setdefault(b.action, ([], b.description))[0].append(key_names(b))
    for names, description in by_action.values():
        out.append(("everywhere", " / ".join(names), description))
    out.append(("everywhere", "1 … 9", "apply that step of the palette"))
    out.append(("everywhere", "tab / shift+tab", "move between panes (never types)"))
    out.append(("everywhere", "ctrl+p", "command palette: steps, samples, schedules, actions"))
    panes: list[tuple[str, list[Binding]]] = [
        ("graph", GraphView.BINDINGS),  # type: ignore[list-item]
        ("timeline", TimelineView.BINDINGS),  # type: ignore[list-item]
        ("code", CodeView.BINDINGS),  # type: ignore[list-item]
        ("source editor", CocoTextArea.BINDINGS),  # type: ignore[list-item]
    ]
    for where, bindings in panes:
        for b in bindings:
            out.append((where, key_names(b), b.description))
        if where == "graph":
            out.append((where, "click", "select the stage"))
        if where == "timeline":
            out.append((where, "mouse over", "describe the event under the mouse"))
            out.append((where, "click", "move the cursor there, select its stage"))
    out.append(("steps, history", "enter", "apply the step / jump to the step"))
    out.append(("help", "escape / q / ?", "close the help"))
    out.append(("help", "/", "search the keys (escape or enter leaves the search)"))
    return out


class KeyModel(App[None]):
    """Focus, edit mode, the views and the help: the App's keys that do not change the
    program. The App mixes it in; its bindings are `APP_BINDINGS`."""

    AUTO_FOCUS = "GraphView"
    """The graph, not the editor, has the focus at start, so letter keys are commands."""

    def action_edit(self) -> None:
        """Focus the source in edit mode (from any pane: `i`)."""
        area = self.query_one(CocoTextArea)
        area.focus()
        area.editing = True

    def action_focus_graph(self) -> None:
        self.query_one(GraphView).focus()

    def action_view(self, which: str) -> None:
        self.query_one(TabbedContent).active = f"tab-{which}"

    def action_zoom_pane(self) -> None:
        screen = self.screen
        if screen.maximized is not None:
            screen.minimize()
        elif screen.focused is not None:
            screen.maximize(screen.focused)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.key_descriptions()))

    def action_screenshot(self) -> None:
        path = self.save_screenshot(path=".")
        self.notify(f"saved {path}")

    def key_descriptions(self) -> list[tuple[str, str, str]]:
        return key_descriptions()

    def on_coco_text_area_mode_changed(self, event: CocoTextArea.ModeChanged) -> None:
        """The source pane's title says when keys type into the text."""
        pane = self.query_one(SourceEditor).parent
        if isinstance(pane, Widget):
            title = str(pane.border_title or "").removesuffix(EDITING)
            pane.border_title = title + EDITING if event.editing else title

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in APP_BINDINGS:
            if b.action.startswith("palette_key") or b.action == "quit":
                continue  # Textual's own Quit is listed
            action = b.action

            async def run(action: str = action) -> None:
                await self.run_action(action)

            yield SystemCommand(b.description, f"key: {b.key_display or b.key}", run)
