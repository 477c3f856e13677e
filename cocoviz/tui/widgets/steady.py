"""Scrolling widgets that draw again only what a new layout changed.

Each layout of the screen (and a step brings one: the history grows, the steps change)
tells every scrolling widget its size again. Textual's `ScrollView` then redraws its
scrollbars even when nothing changed (it compares the size it is told with one computed
differently), and its `OptionList` forgets every drawn option on each `Resize`, which a
list that scrolls gets whenever its options are replaced. On the step → screen path that
was a hundred scrollbar cells and both lists drawn twice, for nothing.
"""

from __future__ import annotations

from typing import cast

from textual import events
from textual.css.styles import RulesMap
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.visual import VisualType
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
    """An `OptionList` that draws its options again only when their width changed, and
    an option whose prompt is replaced alone (`replace_prompt_at_index`)."""

    _options_width = -1
    """The width the options were last drawn at (-1: not yet)."""

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        changed = super()._size_updated(size, virtual_size, container_size, layout)
        # The options are drawn again when their width changes: with the widget's size,
        # or with a scrollbar that comes or goes (which sends no `Resize`).
        width = self.scrollable_content_region.width
        if width != self._options_width:
            if self._options_width >= 0:
                self._clear_caches()
            self._options_width = width
        return changed

    def _on_resize(self, event: events.Resize) -> None:
        event.prevent_default()  # OptionList's handler drops the drawn options, always

    def replace_prompt_at_index(self, index: int, prompt: VisualType) -> None:
        """`replace_option_prompt_at_index`, which forgets the drawn lines of that option
        only, when it keeps its height: Textual's forgets every option's drawing and
        measures every option again (a history of a hundred steps, at each step)."""
        option = self.get_option_at_index(index)
        height = self._heights.get(index)
        option._set_prompt(prompt)
        width = self.scrollable_content_region.width - self._get_left_gutter_width()
        padding = self.get_component_styles("option-list--option").padding
        visual = self._get_visual(option)
        rules = cast(RulesMap, self.styles)  # as OptionList measures its options
        # A list with no room (its column hidden, another pane zoomed) has nothing drawn
        # to keep; measured at zero width rich's wrapping would divide by zero.
        if width - padding.width <= 0 or height != (
            visual.get_height(rules, width - padding.width) + option._divider
        ):
            self._clear_caches()
            return
        cache = self._option_render_cache
        for key in [k for k in cache.keys() if k[0] is option]:  # (option, style, padding)
            cache.discard(key)
        self.refresh_lines(self._index_to_line[index], height)
