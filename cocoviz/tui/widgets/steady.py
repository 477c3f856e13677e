"""Scrolling widgets that draw again only what a new layout changed.

Each layout of the screen (and a step brings one: the history grows, the steps change)
tells every scrolling widget its size again. Textual's `ScrollView` then redraws its
scrollbars even when nothing changed (it compares the size it is told with one computed
differently), and its `OptionList` forgets every drawn option on each `Resize`, which a
list that scrolls gets whenever its options are replaced. On the step → screen path that
was a hundred scrollbar cells and both lists drawn twice, for nothing.
"""

from __future__ import annotations

from textual import events
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.widgets import OptionList


class SteadyScrollbars(ScrollView):
    """A `ScrollView` whose scrollbars a layout that changes nothing of its geometry
    leaves as they are. A widget of Textual's takes it as its second base (`class
    X(TextArea, SteadyScrollbars)`): Textual's styles, bindings and component classes
    follow the first base only."""

    _told: tuple[Size, Size, Size, Size] | None = None
    """The last geometry laid out: (size, virtual size told, container size, own
    virtual size)."""

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        told = (size, virtual_size, container_size, self.virtual_size)
        if told == self._told:
            return False
        self._told = told
        return super()._size_updated(size, virtual_size, container_size, layout)


class SteadyOptionList(OptionList, SteadyScrollbars):
    """An `OptionList` that draws its options again only when their width changed."""

    _options_width = -1
    """The width the options were last drawn at (-1: not yet)."""

    def _on_resize(self, event: events.Resize) -> None:
        width = self.scrollable_content_region.width
        if width == self._options_width:
            event.prevent_default()  # OptionList's handler would drop the drawn options
        self._options_width = width
