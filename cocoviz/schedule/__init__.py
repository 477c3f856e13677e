"""The schedule layer: steps and their defaults, sessions with undo, `.sched` files,
schedule blocks, the step palette and the tuner (docs/architecture.md, layers).

It sits above the IR (whose transformations are pure values) and the simulator (whose
cost model picks `overlap`'s chunk count and ranks the tuner's candidates); the emitter,
the TUI and the CLI call it. The hardware profile is a `Hardware` value passed down from
the caller's boundary, never a global.
"""

from typing import TYPE_CHECKING, Any

from cocoviz.schedule.files import (
    SCHED_HEADER,
    check_sched_output,
    format_sched,
    load_sched,
    save_sched,
)
from cocoviz.schedule.palette import PaletteEntry, palette
from cocoviz.schedule.steps import (
    apply_block,
    apply_blocks,
    apply_schedule_arg,
    apply_step,
    apply_steps,
    block_steps,
    chunk_chooser,
    find_block,
    resolve_schedule,
    schedule_arg_steps,
)

if TYPE_CHECKING:
    from cocoviz.schedule.session import HistoryEntry, Session, StepFailure

_SESSION_NAMES = frozenset({"HistoryEntry", "Session", "StepFailure"})


def __getattr__(name: str) -> Any:
    """Sessions are imported when first asked for: a command that only applies a
    schedule (`--schedule`) does not pay for creating their classes."""
    if name in _SESSION_NAMES:
        from cocoviz.schedule import session

        value = getattr(session, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHED_HEADER",
    "HistoryEntry",
    "PaletteEntry",
    "Session",
    "StepFailure",
    "apply_block",
    "apply_blocks",
    "apply_schedule_arg",
    "apply_step",
    "apply_steps",
    "block_steps",
    "check_sched_output",
    "chunk_chooser",
    "find_block",
    "format_sched",
    "load_sched",
    "palette",
    "resolve_schedule",
    "save_sched",
    "schedule_arg_steps",
]
