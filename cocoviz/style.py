"""The colour of each kind of stage and event, one table for every view.

`cocoviz show --graph` (`cocoviz.ir.draw`), `cocoviz show --dot` (`cocoviz.ir.graph`),
`cocoviz sim`'s text timeline (`cocoviz.sim.textview`) and the TUI's timeline and graph
all colour by kind from `KIND_COLOURS`, so a matmul is the same colour wherever it is
drawn (docs/cost-model.md describes the timeline and its events).

Kinds are the simulator's event kinds (``matmul compute fused collective reduce p2p
fused-collective``, `cocoviz.sim.workload.Kind`) and the graph's node and group kinds
(``compute matmul collective``, ``fused overlapped``, `cocoviz.ir.graph.node_kind`).
Communication is drawn in reds and blues, computation in cyan, yellow and greens.

This module sits at the bottom of the layers (docs/architecture.md): it imports nothing
from cocoviz, nor rich or Textual; colours are names both of them accept.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "DEFAULT_COLOUR",
    "DEFAULT_FILL",
    "KIND_COLOURS",
    "KindColour",
    "kind_colour",
    "kind_fill",
]


@dataclass(frozen=True)
class KindColour:
    """How one kind is drawn."""

    term: str
    """Terminal colour: a colour name rich and Textual both accept."""
    fill: str
    """Light fill for Graphviz boxes and clusters (dark text stays readable on it)."""


KIND_COLOURS: Final = MappingProxyType(
    {
        "compute": KindColour("cyan", "#cfe8ff"),
        "matmul": KindColour("yellow", "#fff2b3"),
        "fused": KindColour("green", "#d9f2d9"),
        "overlapped": KindColour("magenta", "#eadcff"),
        "collective": KindColour("red", "#ffd0d0"),
        "reduce": KindColour("bright_red", "#ffb8b8"),
        "p2p": KindColour("blue", "#d0dcff"),
        "fused-collective": KindColour("bright_green", "#c4f5c4"),
    }
)
"""Colours by kind name (a `StrEnum` kind looks up as its value)."""

DEFAULT_COLOUR: Final = "white"
"""Terminal colour of a kind not in the table."""
DEFAULT_FILL: Final = "#ffffff"
"""Graphviz fill of a kind not in the table."""


def kind_colour(kind: str) -> str:
    """The terminal colour of `kind` (`DEFAULT_COLOUR` when the table has no such kind)."""
    row = KIND_COLOURS.get(kind)
    return row.term if row is not None else DEFAULT_COLOUR


def kind_fill(kind: str) -> str:
    """The Graphviz fill colour of `kind` (`DEFAULT_FILL` when the table has no such kind)."""
    row = KIND_COLOURS.get(kind)
    return row.fill if row is not None else DEFAULT_FILL
