"""The step palette: which steps apply to a stage, and why the others do not.

`cocoviz apply --explain STAGE` and the TUI's palette read the same list. An `overlap`
is offered without `chunks=`, so it is checked with the K the cost model picks on the
session's hardware — the K that applying it will use (docs/schedules.md, `overlap`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cocoviz.errors import CocovizError
from cocoviz.ir.nodes import Program, StepCall
from cocoviz.ir.transforms import as_transformation, legal_steps
from cocoviz.ir.transforms.overlap import Overlap
from cocoviz.schedule.steps import chunk_chooser
from cocoviz.sim.hardware import Hardware

__all__ = ["PaletteEntry", "palette"]


@dataclass(frozen=True)
class PaletteEntry:
    """One step offered for a stage: the step applied, whether it is legal and why not,
    and the text shown (`label`, when it differs from the step)."""

    step: str
    ok: bool
    reason: str = ""
    label: str = ""

    @property
    def shown(self) -> str:
        return self.label or self.step


def palette(program: Program, stage: str, hw: Hardware) -> list[PaletteEntry]:
    """Every step the palette offers for `stage` of `program`, legal or not."""
    return [_entry(program, o.step, o.ok, o.reason, hw) for o in legal_steps(program, stage)]


def _entry(
    program: Program, step: str, ok: bool, reason: str | None, hw: Hardware
) -> PaletteEntry:
    t = as_transformation(step)
    if not isinstance(t, Overlap):
        return PaletteEntry(step, ok, reason or "")
    auto = Overlap(items=t.items)
    shown = str(StepCall(t.name, t.items, ()))
    resolved = auto.resolve(program, chunk_chooser(hw))
    try:
        resolved.check(program)
    except CocovizError as err:
        why = err.message.removeprefix("overlap: ")
        if err.hint:
            why += f" ({err.hint})"
        return PaletteEntry(shown, False, why)
    return PaletteEntry(shown, True, "", f"{shown}  model: K={resolved.k}")
