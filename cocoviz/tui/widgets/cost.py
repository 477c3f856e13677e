"""The cost summary: predicted makespan, speedup over the unscheduled program, exposed
communication, overlap and the model's warnings; plus what each rank sends. Or (`w`) the
crossover sweep of the program's main dimension: per size the fastest schedule block and
its time, and where the winner changes (`cocoviz tune FILE --sweep`)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from cocoviz.ir.summary import Summary, format_bytes
from cocoviz.schedule.tune import SweepResult, block_of
from cocoviz.timefmt import format_time
from cocoviz.tui.timeline_rows import CostFigures


class CostSummary(Static):
    """Shows the figures it is given; says what is missing instead of inventing it."""

    DEFAULT_CSS = """
    CostSummary { height: auto; padding: 0 1; }
    """

    compact = False
    """Three lines at most (set by the app on small terminals)."""

    _height = -1
    """The lines of what is shown (-1: not measured)."""

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
            self._set(self._compact(summary, figures, base, note, pending))
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
        # pending: no shorter than what it replaces (the figures' warning rows come back
        # with the figures), so the pane is not laid out twice per step
        self._set(t, keep_height=pending)

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

    def _set(self, content: Table | Group | Text, *, keep_height: bool = False) -> None:
        """Show `content`; the screen is laid out again only when its height changed
        (a new layout also redraws every scrollbar on the screen). `keep_height`: blank
        lines below it keep the pane at least as tall as it is."""
        width = self.content_size.width
        height = -1
        if width > 0:  # counted as Textual counts it for a layout
            console = self.app.console
            options = console.options.update_width(width).update(highlight=False)
            height = sum(text.count("\n") for text, _, _ in console.render(content, options))
            if keep_height and 0 <= height < self._height:
                content = Group(content, Text("\n" * (self._height - height - 1)))
                height = self._height
        self.update(content, layout=height < 0 or height != self._height)
        self._height = height

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
