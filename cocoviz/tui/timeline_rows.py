"""The timeline as the TUI draws it: rows of bars, one row per rank × stream.

`TimelineRows.from_timeline` reads a `cocoviz.sim.timeline.Timeline` (lanes of ranks
with identical events: stream, stage, kind, start and end in seconds; a summary;
warnings) into plain rows, shown merged (`r0-15 comm`) or one per rank;
`render_bars` turns one row into cells for a given time window. No Textual here.
Times are in seconds.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

from cocoviz.timefmt import format_time

_STREAM_ORDER = {"compute": 0, "comm": 1}


@dataclass(frozen=True)
class Bar:
    stage: str
    kind: str
    start: float
    end: float
    label: str = ""
    members: tuple[str, ...] = ()
    detail: str = ""

    def shows(self, stage: str | None) -> bool:
        """Whether this bar runs (part of) `stage`."""
        return stage is not None and (stage == self.stage or stage in self.members)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Row:
    rank: int
    stream: str
    bars: tuple[Bar, ...]
    """In order of start (then end), as `TimelineRows.from_timeline` sorts them."""
    ranks: tuple[int, ...] = ()  # when identical rows of several ranks are shown as one

    @functools.cached_property
    def ends(self) -> list[float]:
        """The latest end of the bars up to each one (ascending): the bars before the
        first whose value passes a time all end before it (`render_bars` skips them)."""
        return list(itertools.accumulate((b.end for b in self.bars), max))

    @property
    def label(self) -> str:
        rs = self.ranks or (self.rank,)
        if len(rs) == 1:
            who = f"r{rs[0]}"
        elif rs == tuple(range(rs[0], rs[-1] + 1)):
            who = f"r{rs[0]}-{rs[-1]}"
        else:
            who = f"r{rs[0]},{rs[1]}…"
        return f"{who} {self.stream}"


@dataclass(frozen=True)
class CostFigures:
    """The summary figures the cost pane shows."""

    makespan: float
    exposed_comm: float | None = None
    overlap_fraction: float | None = None
    speedup: float | None = None
    warnings: tuple[str, ...] = ()


@dataclass
class TimelineRows:
    rows: list[Row]
    figures: CostFigures
    by_stage: dict[str, list[tuple[int, Bar]]] = field(default_factory=dict)
    _views: dict[str, TimelineRows] = field(default_factory=dict, repr=False, compare=False)
    """`merged()` and `expanded()`, once made (the rows do not change)."""

    def merged(self) -> TimelineRows:
        """Rows of ranks whose events are identical shown once (`r0-15 comm`); made once
        (indexing a 10,000-stage program's bars by stage took a noticeable time at every
        redraw of the timeline)."""
        hit = self._views.get("merged")
        if hit is None:
            hit = self._views["merged"] = self._merge()
        return hit

    def _merge(self) -> TimelineRows:
        groups: dict[tuple[str, tuple[Bar, ...]], list[Row]] = {}
        for r in self.rows:
            key = (r.stream, r.bars)
            groups.setdefault(key, []).append(r)
        rows = [
            Row(
                rs[0].rank,
                rs[0].stream,
                rs[0].bars,
                tuple(k for x in rs for k in (x.ranks or (x.rank,))),
            )
            for rs in groups.values()
        ]
        rows.sort(key=lambda r: (r.rank, _STREAM_ORDER.get(r.stream, 2), r.stream))
        return TimelineRows._indexed(rows, self.figures)

    @staticmethod
    def _indexed(rows: list[Row], figures: CostFigures) -> TimelineRows:
        out = TimelineRows(rows, figures)
        for i, r in enumerate(rows):
            for b in r.bars:
                for n in (b.stage, *b.members):
                    out.by_stage.setdefault(n, []).append((i, b))
        return out

    @property
    def makespan(self) -> float:
        return self.figures.makespan

    def expanded(self) -> TimelineRows:
        """One row per rank and stream (made once)."""
        hit = self._views.get("expanded")
        if hit is None:
            hit = self._views["expanded"] = self._expand()
        return hit

    def _expand(self) -> TimelineRows:
        rows = [Row(k, r.stream, r.bars) for r in self.rows for k in (r.ranks or (r.rank,))]
        rows.sort(key=lambda r: (r.rank, _STREAM_ORDER.get(r.stream, 2), r.stream))
        return TimelineRows._indexed(rows, self.figures)

    @staticmethod
    def from_timeline(tl: Any) -> TimelineRows:
        """Rows per simulated lane (a class of ranks with identical events) and stream."""
        rows: list[Row] = []
        for lane in tl.lanes:
            by_stream: dict[str, list[Bar]] = {}
            for ev in lane.events:
                by_stream.setdefault(str(ev.stream), []).append(
                    Bar(
                        str(ev.stage),
                        str(getattr(ev.kind, "value", ev.kind)),
                        float(ev.start),
                        float(ev.end),
                        str(ev.label),
                        tuple(ev.members),
                        str(ev.detail),
                    )
                )
            ranks = tuple(lane.ranks)
            for stream in sorted(by_stream, key=lambda st: (_STREAM_ORDER.get(st, 2), st)):
                bars = tuple(sorted(by_stream[stream], key=lambda b: (b.start, b.end)))
                rows.append(Row(ranks[0], stream, bars, ranks))
        rows.sort(key=lambda r: (r.rank, _STREAM_ORDER.get(r.stream, 2), r.stream))
        s = tl.summary
        figures = CostFigures(
            makespan=float(s.makespan_s),
            exposed_comm=float(s.exposed_comm_s),
            overlap_fraction=float(s.overlap_fraction),
            speedup=None if s.speedup is None else float(s.speedup),
            warnings=tuple(str(w.message) for w in tl.warnings),
        )
        out = TimelineRows._indexed(rows, figures)
        out.merged()  # in the simulation's worker, not at the first redraw
        return out

    def bar_at(self, row: int, t: float) -> Bar | None:
        if not 0 <= row < len(self.rows):
            return None
        for b in self.rows[row].bars:
            if b.start <= t < b.end:
                return b
        return None


def nice_step(span: float, target_ticks: int) -> float:
    """A round tick spacing (1, 2 or 5 × 10^k) nearest to span / target_ticks."""
    import math

    if span <= 0 or target_ticks <= 0:
        return 1.0
    raw = span / target_ticks
    mag = 10 ** math.floor(math.log10(raw))
    return min((m * mag for m in (1, 2, 5, 10)), key=lambda c: abs(math.log(c / raw)))


def axis_labels(n: int, t0: float, per_cell: float) -> str:
    """The time axis of a window `n` cells wide starting at `t0`: a tick label (`┆200 µs`)
    every round step, spaced so that labels never touch, and only labels that fit whole
    (a label is never cut at the window's edge)."""
    chars = [" "] * n
    if n <= 0 or per_cell <= 0:
        return ""
    span = per_cell * n
    widest = max(len(format_time(span)), len(format_time(t0 + span))) + 2
    step = nice_step(span, max(1, n // (widest + 2)))
    while step / per_cell < widest + 1:
        step = nice_step(step * 2.5, 1)
    k = int(t0 // step)
    free = 0  # the first cell a label may use
    while True:
        t = k * step
        col = int(round((t - t0) / per_cell))
        if col >= n:
            break
        label = "┆" + format_time(t) if t > 0 else "0"
        if col >= free and col + len(label) <= n:
            chars[col : col + len(label)] = label
            free = col + len(label) + 1
        k += 1
    return "".join(chars)


def render_bars(row: Row, t0: float, per_cell: float, width: int) -> list[tuple[str, str, str]]:
    """Cells (char, kind, stage) of one row for the window starting at t0; kind "" is idle.

    A cell shows the event covering most of it; bars start with the stage name when
    it fits; the timeline pane colours a bar's cells by its kind (`cocoviz.style`).
    """
    cells: list[tuple[str, str, str]] = [(" ", "", "")] * width
    if width <= 0:
        return cells
    # Only the bars that can reach the window: a row of a huge program has thousands,
    # and a window shows a few. Those skipped end a cell before it or start a cell after
    # it (the test below would skip them as well).
    bars = row.bars
    first = bisect.bisect_right(row.ends, t0 - per_cell)
    last = t0 + (width + 1) * per_cell
    for i in range(first, len(bars)):
        b = bars[i]
        if b.start > last:
            break
        c0 = int((b.start - t0) / per_cell)
        c1 = max(c0 + 1, int(round((b.end - t0) / per_cell)))
        if c1 <= 0 or c0 >= width:
            continue
        c0, c1 = max(c0, 0), min(c1, width)
        n = c1 - c0
        if n == 1:  # most bars of a large program: no room for a name or an edge
            cells[c0] = (" ", b.kind, b.stage)
            continue
        name = b.label or b.stage
        chars = name if n > len(name) + 1 else "▏"
        chars += " " * (n - len(chars))
        kind, stage = b.kind, b.stage
        cells[c0:c1] = [(ch, kind, stage) for ch in chars]
    return cells
