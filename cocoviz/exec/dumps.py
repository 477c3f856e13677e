"""The names of dumped values: one naming for `cocoviz run --dump`, `cocoviz verify`,
an emitted tree's `--dump` and `cocoviz check-tree` (docs/codegen.md, "Inputs, dumps and
check-tree").

A dump holds every output of the program, named by its stage, and every updated input,
named by the **input** (``m.npy`` holds the new value of input ``m``, i.e. the global
value of its update stage ``m1``): the name a user passes with ``--inputs`` is the name
the new state comes back under, so a dump of one step is the ``--inputs`` of the next. An
update stage that is also an output is dumped under both names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cocoviz.ir.nodes import Program

__all__ = ["Dumped", "dumped_values"]


@dataclass(frozen=True)
class Dumped:
    """One dumped value."""

    name: str
    """The file stem (``DIR/<name>.npy``) and the name a comparison reports."""
    stage: str
    """The stage whose global value it holds (the update stage of an updated input)."""
    kind: Literal["output", "updated input"]


def dumped_values(program: Program) -> tuple[Dumped, ...]:
    """Outputs in their declared order, then updated inputs in input order."""
    out = [Dumped(o, o, "output") for o in program.outputs]
    updates = program.updates()
    for i in program.inputs:
        stage = updates.get(i.name)
        if stage is not None:
            out.append(Dumped(i.name, stage, "updated input"))
    return tuple(out)
