"""What the command palette's providers need of the app: its workbench and the three
ways it changes the program (a step, a schedule from the start, another file).

`cocoviz.tui.commands` reads the app through this protocol and `cocoviz.tui.app`
imports the providers, so imports inside the package go one way: app → commands → host
(docs/architecture.md, layers; tests/test_layering.py checks that no two modules of
`cocoviz.tui` import each other, `TYPE_CHECKING` imports included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from cocoviz.workbench import Workbench


@runtime_checkable
class ProgramHost(Protocol):
    """The app as the providers see it (`CocovizApp` is one)."""

    wb: Workbench[Any]
    """The program being edited and scheduled."""

    def apply_step(self, step: str) -> bool:
        """Apply a step after the current one; False when it was refused."""
        ...

    def apply_schedule(self, steps: Sequence[str]) -> bool:
        """Apply `steps` from the unscheduled program; False when one was refused."""
        ...

    def open_program(self, file: str) -> None:
        """Open a file or a sample in place of the program."""
        ...


def host_of(app: object) -> ProgramHost:
    """`app` as a `ProgramHost`; raises TypeError for an app that is not one (a
    provider mounted in another app)."""
    if not isinstance(app, ProgramHost):
        raise TypeError(f"{type(app).__name__} has no workbench and steps to search")
    return app
