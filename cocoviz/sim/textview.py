"""A Timeline drawn as text with rich: a time axis with units and one row per rank ×
stream, coloured by kind, plus the summary and the per-stage table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.console import Group as RichGroup
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from cocoviz.sim.timeline import Event, Lane, Summary, Timeline
from cocoviz.sim.workload import COMM, COMPUTE, P2P, Kind
from cocoviz.style import kind_colour
from cocoviz.timefmt import format_time, time_unit

if TYPE_CHECKING:
    from rich.table import Table

_STREAM_SHORT = {COMPUTE: "compute", COMM: "comm", P2P: "p2p"}


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(1, ticks)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def pick_lanes(timeline: Timeline, limit: int = 8) -> list[Lane]:
    """Representative lanes: every pipeline stage first, then more classes if room."""
    chosen: list[Lane] = []
    seen: set[int] = set()
    for lane in timeline.lanes:
        if lane.pstage not in seen:
            chosen.append(lane)
            seen.add(lane.pstage)
    for lane in timeline.lanes:
        if lane not in chosen:
            chosen.append(lane)
    chosen = chosen[:limit]
    return sorted(chosen, key=lambda lane: lane.index)


def _rank_span(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"r{ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"r{ranks[0]}-{ranks[-1]}"
    return f"r{ranks[0]} +{len(ranks) - 1}"


def _row(events: Sequence[Event], width: int, t0: float, span: float) -> Text:
    cells: list[tuple[Kind | None, float]] = [(None, 0.0)] * width
    cover: list[dict[Kind, float]] = [{} for _ in range(width)]
    dt = span / width
    for e in events:
        start, end, kind = e.start, e.end, e.kind
        if end <= start:
            continue
        a = max(0, int((start - t0) / dt))
        b = min(width - 1, int((end - t0) / dt))
        for c in range(a, b + 1):
            left, right = t0 + c * dt, t0 + (c + 1) * dt
            lo = left if left > start else start  # max(start, left), min(end, right)
            hi = right if right < end else end
            if hi > lo:
                here = cover[c]
                here[kind] = here.get(kind, 0.0) + (hi - lo) / dt
    for c in range(width):
        if cover[c]:
            kind = max(cover[c], key=lambda k: cover[c][k])
            cells[c] = (kind, sum(cover[c].values()))
    text = Text()
    chars: list[tuple[str, str]] = []
    for cell_kind, amount in cells:
        if cell_kind is None:
            chars.append(("·", "grey35"))
        else:
            chars.append(("█" if amount >= 0.5 else "▌", kind_colour(cell_kind)))
    # Names inside the slices wide enough to hold them.
    for e in events:
        a = max(0, int(math.ceil((e.start - t0) / dt)))
        b = min(width, int((e.end - t0) / dt))
        if b - a < 3:
            continue  # too narrow for any label (a character and the spaces around it)
        label = e.label if e.chunk is None else f"{e.name}{e.chunk + 1}"
        if b - a >= len(label) + 2:
            style = f"bold black on {kind_colour(e.kind)}"
            for i, ch in enumerate(f" {label}"):
                chars[a + i] = (ch, style)
    # runs of one style appended together (one span each instead of one per cell)
    i = 0
    while i < len(chars):
        style = chars[i][1]
        j = i + 1
        while j < len(chars) and chars[j][1] == style:
            j += 1
        text.append("".join(ch for ch, _ in chars[i:j]), style=style)
        i = j
    return text


def render_timeline(timeline: Timeline, width: int = 100, max_lanes: int = 8) -> RenderableType:
    """The timeline of representative ranks (ranks in one lane behave identically)."""
    lanes = pick_lanes(timeline, max_lanes)
    span = timeline.makespan or 1e-9
    label_w = 16
    bar_w = max(20, width - label_w - 1)
    unit, scale = time_unit(span)
    step = _nice_step(span / scale, max(2, bar_w // 12))
    lines: list[Text] = []
    # Axis: ticks with labels.
    axis = [" "] * (bar_w + 12)
    marks = ["─"] * bar_w
    t = 0.0
    while t <= span / scale + 1e-12:
        c = min(bar_w - 1, int(round(t * scale / span * bar_w)))
        marks[c] = "┼" if 0 < c < bar_w - 1 else ("├" if c == 0 else "┤")
        tick = f"{t:g}"
        for i, ch in enumerate(tick):
            if c + i < len(axis):
                axis[c + i] = ch
        t += step
    lines.append(Text(f"{unit:>{label_w}} " + "".join(axis).rstrip(), style="dim"))
    lines.append(Text(" " * label_w + " " + "".join(marks), style="dim"))
    for lane in lanes:
        for stream in (COMPUTE, COMM, P2P):
            events = [e for e in lane.events if e.stream == stream]
            if stream == P2P and not events:
                continue  # a row of its own only inside an overlapped pipeline
            name = f"{_rank_span(lane.ranks)} {_STREAM_SHORT[stream]}"
            row = Text(f"{name[:label_w]:>{label_w}} ")
            row.append_text(_row(events, bar_w, 0.0, span))
            lines.append(row)
    legend = Text(" " * label_w + " ")
    kinds = {e.kind for lane in lanes for e in lane.events}
    for k in Kind:
        if k in kinds:
            legend.append("█ ", style=kind_colour(k))
            legend.append(f"{k.value}  ")
    lines.append(legend)
    shown = sum(len(lane.ranks) for lane in lanes)
    note = (
        f"{timeline.world} ranks in {len(timeline.lanes)} group"
        f"{'s' if len(timeline.lanes) != 1 else ''} of identical ranks"
    )
    if len(lanes) < len(timeline.lanes):
        note += f"; showing {len(lanes)} groups ({shown} ranks)"
    note += "; a row stands for every rank it names"
    lines.append(Text(" " * label_w + " " + note, style="dim"))
    return RichGroup(*lines)


def render_summary(timeline: Timeline) -> RenderableType:
    s: Summary = timeline.summary
    t = Text()
    t.append(f"{timeline.program}", style="bold")
    t.append(
        f" on {timeline.hardware}, {timeline.world} ranks"
        + (f" (tp={timeline.tp}, pp={timeline.pp})" if timeline.pp > 1 else "")
        + (
            f" of dp replica 0 (dp={timeline.dp}: {timeline.world * timeline.dp} in all)"
            if timeline.dp > 1
            else ""
        )
        + f", collectives {timeline.collectives}\n"
    )
    t.append("  predicted time      ")
    t.append(format_time(s.makespan_s), style="bold")
    if s.speedup is not None and s.baseline_s is not None:
        style = "green" if s.speedup >= 1.0 else "red"
        t.append(f"   baseline {format_time(s.baseline_s)}, speedup ")
        t.append(f"{s.speedup:.2f}x", style=f"bold {style}")
    t.append("\n")
    t.append(
        f"  communication       {format_time(s.comm_s)}, exposed {format_time(s.exposed_comm_s)}"
        f", overlap {s.overlap_fraction:.0%} (rank {s.critical_rank})\n"
    )
    t.append(f"  computation         {format_time(s.compute_s)}")
    return t


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def render_stage_table(timeline: Timeline, limit: int = 40) -> RenderableType:
    """The per-stage table; beyond ``limit`` rows, the longest ``limit`` in time order."""
    rows = timeline.summary.stages
    title = "per stage (one rank per pipeline stage)"
    if len(rows) > limit:
        keep = set(sorted(rows, key=lambda r: -r.busy_s)[:limit])
        rows = tuple(r for r in rows if r in keep)
        title += f": the {limit} longest of {len(timeline.summary.stages)} (--json has all)"
    multi = timeline.pp > 1
    columns = [("stage", False)]
    if multi:
        columns.append(("pp", True))
    columns += [("kind", False), ("stream", False), ("calls", True), ("time", True)]
    columns += [("start", True), ("end", True), ("bytes", True), ("detail", False)]
    cells: list[list[tuple[str, str]]] = []  # per row: (text, style) per column
    for r in rows:
        row = [(r.name, "")]
        if multi:
            row.append((str(r.pstage), ""))
        row += [
            (r.kind, kind_colour(r.kind)),
            (r.stream, ""),
            (str(r.calls), ""),
            (format_time(r.busy_s), ""),
            (format_time(r.start_s), ""),
            (format_time(r.end_s), ""),
            (_bytes(r.bytes), ""),
            (r.detail, ""),
        ]
        cells.append(row)
    return _StageTable(title, columns, cells)


class _StageTable:
    """A rich table of plain cells, laid out directly when it fits the console (the
    common case: rich's general layout measures and wraps every cell, which cost more than
    the simulation it shows); otherwise rich's `Table`, which shrinks and folds columns.
    Both draw the same characters and styles (tests/test_cli_sim.py compares them)."""

    def __init__(
        self, title: str, columns: list[tuple[str, bool]], cells: list[list[tuple[str, str]]]
    ) -> None:
        self.title = title
        self.columns = columns  # (header, right-justified)
        self.cells = cells

    def rich_table(self) -> Table:
        from rich.table import Table  # only a table too wide for the console comes here

        table = Table(title=self.title, title_justify="left")
        for header, right in self.columns:
            if right:
                table.add_column(header, justify="right")
            elif header == "detail":
                table.add_column(header, overflow="fold")
            else:
                table.add_column(header)
        for row in self.cells:
            # Text cells: plain text, not console markup (a str cell would be parsed for
            # `[style]` tags, and a detail like `[2048, 2048] x …` is not one)
            table.add_row(*(Text(text, style=style) for text, style in row))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [cell_len(h) for h, _ in self.columns]
        for row in self.cells:
            for i, (text, _) in enumerate(row):
                widths[i] = max(widths[i], cell_len(text))
        total = sum(widths) + 3 * len(widths) + 1  # one space each side, the rules
        if (
            total > options.max_width
            or cell_len(self.title) > total
            or "\n" in "".join(t for row in self.cells for t, _ in row)
        ):
            yield self.rich_table()
            return
        head = console.get_style("table.header")
        new_line = Segment.line()
        yield Segment(
            self.title + " " * (total - cell_len(self.title)), console.get_style("table.title")
        )
        yield new_line
        rights = [right for _, right in self.columns]

        def rule(left: str, mid: str, right: str, fill: str) -> Segment:
            return Segment(left + mid.join(fill * (w + 2) for w in widths) + right)

        yield rule("┏", "┳", "┓", "━")
        yield new_line
        yield Segment("┃")
        for (header, right), w in zip(self.columns, widths, strict=True):
            yield Segment(" ", head)
            yield Segment(_pad(header, w, right), head)
            yield Segment(" ", head)
            yield Segment("┃")
        yield new_line
        yield rule("┡", "╇", "┩", "━")
        yield new_line
        styles: dict[str, Style] = {}
        for row in self.cells:
            yield Segment("│")
            for (text, style), w, right in zip(row, widths, rights, strict=True):
                yield Segment(" ")
                if style:
                    st = styles.get(style)
                    if st is None:
                        st = styles[style] = console.get_style(style)
                    yield Segment(_pad(text, w, right), st)
                else:
                    yield Segment(_pad(text, w, right))
                yield Segment(" │")
            yield new_line
        yield rule("└", "┴", "┘", "─")
        yield new_line


def _pad(text: str, width: int, right: bool) -> str:
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad
