"""The cost summary: predicted makespan, speedup over the unscheduled program, exposed
communication, overlap and the model's warnings; plus what each rank sends. Or (`w`) the
crossover sweep of the program's main dimension: per size the fastest schedule block and
its time, and where the winner changes (`cocoviz tune FILE --sweep`)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.segment import Segment, SegmentLines
from rich.table import Table
from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from cocoviz.ir.summary import Summary, format_bytes
from cocoviz.schedule.tune import SweepResult, block_of
from cocoviz.timefmt import format_time
from cocoviz.tui.timeline_rows import CostFigures


class CostSummary(Widget):
    """Shows the figures it is given; says what is missing instead of inventing it.

    What it shows is drawn once, at the pane's width, into lines that every paint and
    layout reuse (a rich table measures its columns each time it renders: as a `Static`
    it rendered three times per step). The pane's height changes after the step's
    figures are on the screen, not before: the pending state is as tall as the figures
    before it, and figures that need fewer lines than the pane has are drawn in it first
    (blank lines below them) and the pane shrinks to them after that paint. Only figures
    that need more lines lay the screen out before they are shown (a layout redraws
    every scrollbar on the screen and each pane that moves)."""

    DEFAULT_CSS = """
    CostSummary { height: auto; padding: 0 1; }
    """

    compact = False
    """Three lines at most (set by the app on small terminals)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.content: RenderableType = ""
        """What the pane shows (without the blank lines that keep its height)."""
        self._pad_to = 0
        """The lines `content` takes at least (blank ones below it)."""
        self._figures = False
        """`content` is the figures (not their pending state)."""
        self._figures_height = 0
        """The lines the last figures took, unpadded, at the drawn width."""
        self._width = -1
        """The width `_lines` were drawn at (-1: not drawn)."""
        self._lines: list[list[Segment]] = []

    def show(
        self,
        summary: Summary | None,
        figures: CostFigures | None,
        base: CostFigures | None,
        note: str = "",
        hw: str = "",
        *,
        pending: bool = False,
    ) -> None:
        """`pending`: the figures (and the counts, when `summary` is None) are being
        computed: their rows are kept, each value `…`, so that the pane keeps its height
        and the panes below it stay put."""
        if self.compact:
            compact = self._compact(summary, figures, base, note, pending)
            self._set(compact, pending=pending, figures=not pending)
            return
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim")
        t.add_column()
        if figures is not None:
            t.add_row("makespan", Text(format_time(figures.makespan), style="bold"))
            if base is not None and figures.makespan > 0:
                speed = base.makespan / figures.makespan
                style = "bold green" if speed > 1.0001 else "bold red" if speed < 0.9999 else ""
                t.add_row("speedup", Text(f"{speed:.2f}× vs unscheduled", style=style))
            if figures.exposed_comm is not None:
                t.add_row("exposed comm", format_time(figures.exposed_comm))
            if figures.overlap_fraction is not None:
                t.add_row("overlap", f"{figures.overlap_fraction:.0%}")
            for w in figures.warnings[:3]:
                t.add_row(Text("warning", style="yellow"), Text(w, style="yellow"))
        elif pending:
            t.add_row("makespan", Text("simulating…", style="italic"))
            if base is not None:
                t.add_row("speedup", "…")
            t.add_row("exposed comm", "…")
            t.add_row("overlap", "…")
        elif note:
            t.add_row("model", Text(note, style="italic"))
        if summary is None and pending:
            t.add_row("sends/rank", "…")
            t.add_row("stages", "…")
        if summary is not None:
            t.add_row("sends/rank", format_bytes(summary.sent_per_rank))
            t.add_row(
                "stages",
                f"{summary.stages} ({summary.matmuls} mm, {summary.collectives} coll, "
                f"{summary.compute} compute)",
            )
        if hw:
            t.add_row("hardware", hw)
        self._set(t, pending=pending, figures=not pending)

    def show_crossover(self, result: SweepResult | str | None, current: int | None) -> None:
        """The sweep (`current`: the program's own size, marked), why there is none, or
        that it is running (None)."""
        if result is None or isinstance(result, str):
            self._set(Text(result or "sweeping sizes…", style="italic"))
            return
        lines = [
            f"{_name(c.winner)} beats {_name(c.loser)} from {result.dim} = {_size(c.value)}"
            for c in result.crossovers
        ]
        if not lines and result.points:
            lines = [f"{_name(result.points[0].winner)} is fastest at every size"]
        if self.compact:
            self._set(Text("\n".join(lines[:3])))
            return
        t = Table.grid(padding=(0, 1))
        t.add_column(justify="right", no_wrap=True)
        t.add_column(no_wrap=True, overflow="ellipsis", max_width=14)
        t.add_column(justify="right", no_wrap=True)
        t.add_column(justify="right", no_wrap=True)
        t.add_row(*(Text(h, style="dim") for h in (result.dim, "fastest", "time", "tuned")))
        for pt in result.points:
            mark = "▶" if pt.value == current else ""
            style = "bold" if pt.value == current else ""
            speed = pt.baseline_s / pt.best.time_s if pt.best.time_s > 0 else 0.0
            t.add_row(
                Text(f"{mark}{_size(pt.value)}", style=style),
                Text(_name(pt.winner), style=style),
                Text(format_time(pt.time_of(pt.winner)), style=style),
                Text(f"{speed:.2f}×", style="green" if speed > 1.0001 else "dim"),
            )
        self._set(Group(t, Text("\n".join(lines), style="bold")))

    def _set(
        self, content: Table | Group | Text, *, pending: bool = False, figures: bool = False
    ) -> None:
        """Show `content`: the cost figures (`figures`), their pending state (`pending`),
        or anything else (see the class). The screen is laid out again only when the
        pane's height changes."""
        before, width = len(self._lines), self._width
        self.content, self._figures, self._width = content, figures, -1
        self._pad_to = self._figures_height if pending else before if figures else 0
        if width >= 0:
            self._draw(width)
        self.refresh(layout=self._width < 0 or len(self._lines) != before)
        if figures and self._width >= 0 and len(self._lines) > self._figures_height:
            self.call_after_refresh(self._fit, content)

    def _fit(self, content: RenderableType) -> None:
        """Shrink the pane to the figures `content` (drawn padded), if still shown."""
        if content is self.content and self._pad_to:
            self._pad_to, self._width = 0, -1
            self.refresh(layout=True)

    def _draw(self, width: int) -> list[list[Segment]]:
        """The lines of `content` at `width` cells (kept until the content or the width
        changes)."""
        if width == self._width:
            return self._lines
        if self._width >= 0:  # another width: the heights at the old one say nothing
            self._pad_to = self._figures_height = 0
        app = self.app
        options = app.console_options.update(highlight=False).update_width(max(1, width))
        lines = app.console.render_lines(self.content, options, pad=False)
        if self._figures:
            self._figures_height = len(lines)
        lines += [[] for _ in range(self._pad_to - len(lines))]
        self._lines, self._width = lines, width
        return lines

    def render(self) -> RenderableType:
        return SegmentLines(self._draw(self.content_size.width), new_lines=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._draw(width)) if width > 0 else 0

    @staticmethod
    def _compact(
        summary: Summary | None,
        figures: CostFigures | None,
        base: CostFigures | None,
        note: str,
        pending: bool,
    ) -> Text:
        out = Text()
        if figures is None and pending:
            out.append("makespan ", style="dim")
            out.append("simulating…", style="italic")
            out.append("\nexposed comm ", style="dim")
            out.append("…")
        elif figures is None:
            out.append(note or "no figures", style="italic")
        else:
            out.append("makespan ", style="dim")
            out.append(format_time(figures.makespan), style="bold")
            if base is not None and figures.makespan > 0:
                speed = base.makespan / figures.makespan
                style = "bold green" if speed > 1.0001 else "bold red" if speed < 0.9999 else ""
                out.append(f"  {speed:.2f}×", style=style)
            if figures.exposed_comm is not None:
                out.append("\nexposed comm ", style="dim")
                out.append(format_time(figures.exposed_comm))
            if figures.warnings:
                out.append(f"\n⚠ {figures.warnings[0]}", style="yellow")
        return out


def _size(value: int) -> str:
    return f"2^{value.bit_length() - 1}" if value & (value - 1) == 0 else str(value)


def _name(title: str) -> str:
    """A canonical schedule by its block's name; the program as written by that."""
    return block_of(title) or "as written"
