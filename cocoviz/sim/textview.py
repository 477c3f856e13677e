"""A Timeline drawn as text with rich: a time axis with units and one row per rank ×
stream, coloured by kind, plus the summary and the per-stage table."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from cocoviz.sim.timeline import Event, Lane, Summary, Timeline
from cocoviz.sim.workload import COMM, COMPUTE, P2P, Kind
from cocoviz.style import kind_colour
from cocoviz.timefmt import format_time, time_unit

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
        if e.end <= e.start:
            continue
        a = max(0, int((e.start - t0) / dt))
        b = min(width - 1, int((e.end - t0) / dt))
        for c in range(a, b + 1):
            lo = max(e.start, t0 + c * dt)
            hi = min(e.end, t0 + (c + 1) * dt)
            if hi > lo:
                cover[c][e.kind] = cover[c].get(e.kind, 0.0) + (hi - lo) / dt
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


def render_stage_table(timeline: Timeline, limit: int = 40) -> Table:
    """The per-stage table; beyond ``limit`` rows, the longest ``limit`` in time order."""
    rows = timeline.summary.stages
    title = "per stage (one rank per pipeline stage)"
    if len(rows) > limit:
        keep = set(sorted(rows, key=lambda r: -r.busy_s)[:limit])
        rows = tuple(r for r in rows if r in keep)
        title += f": the {limit} longest of {len(timeline.summary.stages)} (--json has all)"
    table = Table(title=title, title_justify="left")
    multi = timeline.pp > 1
    table.add_column("stage")
    if multi:
        table.add_column("pp", justify="right")
    table.add_column("kind")
    table.add_column("stream")
    table.add_column("calls", justify="right")
    table.add_column("time", justify="right")
    table.add_column("start", justify="right")
    table.add_column("end", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("detail", overflow="fold")
    for r in rows:
        # Text cells: plain text, not console markup (a str cell would be parsed for
        # `[style]` tags, and a detail like `[2048, 2048] x …` is not one)
        cells: list[Text] = [Text(r.name)]
        if multi:
            cells.append(Text(str(r.pstage)))
        cells += [
            Text(r.kind, style=kind_colour(r.kind)),
            Text(r.stream),
            Text(str(r.calls)),
            Text(format_time(r.busy_s)),
            Text(format_time(r.start_s)),
            Text(format_time(r.end_s)),
            Text(_bytes(r.bytes)),
            Text(r.detail),
        ]
        table.add_row(*cells)
    return table
