"""Durations as a person reads them, one formatter for every view.

`cocoviz sim`'s summary and per-stage table (`cocoviz.sim.textview`), `cocoviz tune`'s
ranking, the TUI's cost panel, timeline and teach notes all print seconds with
`format_time`: about three significant digits in the largest unit that keeps the
value at least 1 (``850 ns``, ``2.50 µs``, ``426 µs``, ``3.25 ms``, ``1.20 s``); the
timeline axes label their ticks in `time_unit` (docs/cost-model.md, the timeline
simulator).

This module sits at the bottom of the layers (docs/architecture.md): it imports nothing
from cocoviz.
"""

from __future__ import annotations

from typing import Final

__all__ = ["format_time", "time_unit"]

_UNITS: Final = (("ns", 1e-9, 1e-6), ("µs", 1e-6, 1e-3), ("ms", 1e-3, 1.0))
"""(unit, its size in seconds, the magnitude from which the next unit is used)."""


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit `format_time` shows a duration of this magnitude in, and its size in
    seconds: ns below 1 µs, µs below 1 ms, ms below 1 s, else s."""
    a = abs(seconds)
    for unit, scale, below in _UNITS:
        if a < below:
            return unit, scale
    return "s", 1.0


def format_time(seconds: float) -> str:
    """A duration with its unit: 12.3 µs, 4.56 ms, 1.20 s (negative values keep a sign)."""
    a = abs(seconds)
    for unit, _, below in _UNITS:
        if a < below:
            return f"{_three(seconds * 1e3 / below)} {unit}"
    return f"{_three(seconds)} s"


def _three(v: float) -> str:
    """About three significant digits, without a trailing `.0`."""
    a = abs(v)
    if a >= 100 or a == 0:
        return f"{v:.0f}"
    return f"{v:.1f}" if a >= 10 else f"{v:.2f}"
