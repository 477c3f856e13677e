"""The headless workbench the terminal UI displays (docs/architecture.md, layers).

A `Workbench` holds a program being edited and scheduled: the source and its parse
generation, the step history (a `cocoviz.schedule.Session`, docs/schedules.md), the
timeline and the emitted code of each step, the timeline comparison, teach mode
(`teach`), the crossover sweep and the autosave (`state`). It sits above the schedule
layer, the simulator and the emitter, and below `cocoviz.tui`, which lays it out and
draws it; nothing here imports Textual or rich, so it is driven and tested without a
terminal.
"""

from cocoviz.workbench.source import Source, open_source
from cocoviz.workbench.workbench import (
    COMPARE_MODES,
    NO_PROGRAM,
    Accepted,
    CodeJob,
    CodeOptions,
    CodePair,
    CompareMode,
    Comparison,
    NoBest,
    Parsed,
    Refused,
    Simulated,
    SweepJob,
    TeachNote,
    Workbench,
    Written,
    emitted_files,
)

__all__ = [
    "COMPARE_MODES",
    "NO_PROGRAM",
    "Accepted",
    "CodeJob",
    "CodeOptions",
    "CodePair",
    "CompareMode",
    "Comparison",
    "NoBest",
    "Parsed",
    "Refused",
    "Simulated",
    "Source",
    "SweepJob",
    "TeachNote",
    "Workbench",
    "Written",
    "emitted_files",
    "open_source",
]
