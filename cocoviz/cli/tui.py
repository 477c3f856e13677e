"""`cocoviz tui FILE [--schedule S] [--teach]`, and the TUI that bare `cocoviz` opens.

Textual is imported only when the TUI starts, so `import cocoviz.cli` stays headless.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from cocoviz.cli.options import add_hw_option
from cocoviz.errors import ExitCode, UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "tui",
        help="the terminal UI: edit, step the schedule, see graph, timeline, cost and code",
        description="Open the terminal UI on a program (a .coco file or a sample name).",
    )
    p.add_argument("file", metavar="FILE", help="a .coco program (or the name of a sample)")
    p.add_argument("--schedule", "-s", metavar="S", help="a schedule block name, or a .sched file")
    p.add_argument(
        "--teach",
        action="store_true",
        help="step through the program's schedule with an explanation per step",
    )
    add_hw_option(p)
    p.set_defaults(handler=cmd_tui)


def _run(
    file: str | None, schedule: str | None = None, teach: bool = False, hw: str | None = None
) -> int:
    from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile

    hardware = load_profile(hw or DEFAULT_PROFILE)  # a bad --hw: an input error, before the tty
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        raise UsageError(
            "the terminal UI needs a terminal",
            hint="run it in a terminal, or use 'cocoviz show' / 'cocoviz apply' in scripts",
        )
    # Imported by name so that mypy (configured to skip the Textual app) does not follow.
    create_app = importlib.import_module("cocoviz.tui.app").create_app
    app = create_app(file, schedule=schedule, teach_mode=teach, hw=hardware)
    app.run()
    return int(app.return_code or ExitCode.OK)


def cmd_tui(args: argparse.Namespace) -> int:
    return _run(args.file, args.schedule, args.teach, args.hw)


def open_default() -> int:
    """Bare `cocoviz`: the TUI on the embedded default sample."""
    return _run(None)
