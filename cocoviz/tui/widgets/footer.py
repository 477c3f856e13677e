"""The footer: the focused pane's name (and mode) and its keys first, then the keys that
work everywhere, so that the keys a user needs now are the ones a narrow terminal still
shows (at 80 columns the keys that work everywhere are cut, the pane's are not)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey, FooterLabel, KeyGroup

Shown = tuple[Binding, bool, str]
"""(binding, enabled, tooltip) of a key the footer shows."""


def pane_name(widget: Widget | None) -> str:
    """What the footer calls the pane of `widget`: the `FOOTER_NAME` (a class attribute or
    a property) of it or of its nearest ancestor that has one; "" when none has."""
    node = widget
    while isinstance(node, Widget):
        name = getattr(node, "FOOTER_NAME", None)
        if isinstance(name, str):
            return name
        node = node.parent  # type: ignore[assignment]
    return ""


class KeyFooter(Footer):
    """A `Footer` that names the focused pane and lists its keys before the app's."""

    DEFAULT_CSS = """
    KeyFooter FooterLabel.-pane {
        color: $footer-key-foreground;
        background: $footer-key-background;
        text-style: bold reverse;
        padding: 0 1;
        margin: 0 1 0 0;
    }
    """

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        # The keys composed last are removed after this: their drawn lines go now.
        # Textual keeps each widget's styles cache in a class-wide LRU of 1,024 entries
        # (`StylesCache.get_inner_outer`) long after the widget is gone, and with its
        # lines that was a few MB of a long session (bench/bench_tui_rss.py).
        for old in self.query(Widget):
            old._styles_cache.clear()
        screen = self.screen
        local: list[Shown] = []
        general: list[Shown] = []
        for node, binding, enabled, tooltip in screen.active_bindings.values():
            if not binding.show:
                continue
            # The app's keys and the screen's (tab) work everywhere; the rest belong to
            # the focused widget and the panes around it.
            everywhere = node is self.app or (node is screen and screen is self.app.screen_stack[0])
            (general if everywhere else local).append((binding, enabled, tooltip))
        name = pane_name(screen.focused)
        if name:
            yield FooterLabel(name, classes="-pane")
        yield from self._keys(local)
        yield from self._keys(general)
        if self.show_command_palette and self.app.ENABLE_COMMAND_PALETTE:
            found = screen.active_bindings.get(self.app.COMMAND_PALETTE_BINDING)
            if found is not None:
                _node, binding, enabled, _tooltip = found
                yield FooterKey(
                    binding.key,
                    self.app.get_key_display(binding),
                    binding.description,
                    binding.action,
                    classes="-command-palette",
                    disabled=not enabled,
                    tooltip=binding.tooltip or binding.description,
                )

    def _keys(self, shown: list[Shown]) -> Iterator[Widget]:
        """One key per action (its first binding); a group's keys together, one label."""
        by_action: defaultdict[str, list[Shown]] = defaultdict(list)
        for item in shown:
            by_action[item[0].action].append(item)
        pending: list[Shown] = []
        group: Binding.Group | None = None

        def flush() -> Iterator[Widget]:
            if group is None or not pending:
                return
            keys = [
                FooterKey(
                    binding.key,
                    self.app.get_key_display(binding),
                    "",
                    binding.action,
                    disabled=not enabled,
                    tooltip=tooltip or binding.description,
                    classes="-grouped",
                )
                for binding, enabled, tooltip in pending
            ]
            yield KeyGroup(*map(self._sized, keys), classes="-compact" if group.compact else "")
            yield FooterLabel(group.description)

        for items in by_action.values():
            binding, enabled, tooltip = items[0]
            if binding.group is not None:
                if binding.group is not group:
                    yield from flush()
                    pending, group = [], binding.group
                pending.append(items[0])
                continue
            yield from flush()
            pending, group = [], None
            yield self._sized(
                FooterKey(
                    binding.key,
                    self.app.get_key_display(binding),
                    binding.description,
                    binding.action,
                    disabled=not enabled,
                    tooltip=tooltip,
                )
            )
        yield from flush()

    def _sized(self, key: FooterKey) -> FooterKey:
        """`key` in the footer's compact style or not. Textual's Footer binds each key's
        `compact` to its own (`data_bind`), which adds a watcher to the footer that only
        a change of `compact` would drop: the footer is composed again at every change of
        focus or bindings, and each time it kept every key it had removed (the TUI's
        memory grew without bound over a session, bench/bench_tui_rss.py)."""
        key.set_reactive(FooterKey.compact, self.compact)
        key.set_class(self.compact, "-compact", update=False)  # what its watcher sets
        return key

    def watch_compact(self, compact: bool) -> None:
        for key in self.query(FooterKey):
            key.compact = compact

    def text(self) -> str:
        """The footer as a line of text: the pane's name, then each key and its
        description (what the tests read)."""
        parts: list[str] = []
        for child in self.query("FooterLabel, FooterKey, KeyGroup"):
            if isinstance(child, FooterKey):
                if "-grouped" in child.classes:
                    continue
                parts.append(f"{child.key_display} {child.description}".strip())
            elif isinstance(child, KeyGroup):
                parts.append("".join(k.key_display for k in child.query(FooterKey)))
            elif isinstance(child, FooterLabel):
                parts.append(str(child.render()))
        return "  ".join(parts)
