"""`cocoviz apply` and `cocoviz verify`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocoviz.cli.options import (
    add_json_option,
    add_program_options,
    add_reference_limits,
    args_hardware,
    load_args_program,
)
from cocoviz.errors import ExitCode, InputError, UsageError
from cocoviz.ir.nodes import Program, StepCall

if TYPE_CHECKING:
    from cocoviz.sim.hardware import Hardware


def register(sub: Any) -> None:
    p = sub.add_parser(
        "apply",
        help="apply schedule steps and print the resulting program",
        description="Apply schedule steps to a program and print the result (without the "
        "source's schedule blocks). Each STEP is written as in a schedule block, e.g. "
        "'split(sum)'; one argument may hold several steps separated by ';'.",
    )
    add_program_options(p, schedule=False)
    p.add_argument(
        "steps",
        metavar="STEP",
        nargs="*",
        help="a step, e.g. 'split(sum)' (steps may come before or after the options)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT.sched",
        help="also save the steps (as applied, chunk counts resolved) to a .sched file",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="let -o overwrite a file that cocoviz did not write",
    )
    p.add_argument(
        "--explain",
        metavar="STAGE",
        help="instead of the program, list the steps that apply to STAGE (or an input) "
        "after the given steps, and why the others do not",
    )
    add_json_option(p)
    p.set_defaults(handler=cmd_apply, intermixed="steps", bounded=True)

    p = sub.add_parser(
        "verify",
        help="check in the numpy reference that schedules do not change results",
        description="Run the original and the scheduled program on the same inputs in "
        "the numpy reference of simulated ranks and compare every output and updated "
        "input with the dtype's tolerance. Without --schedule, every schedule block of "
        "the file is verified. Exit 4 on a mismatch.",
    )
    add_program_options(p)
    add_reference_limits(p)
    add_json_option(p)
    p.set_defaults(handler=cmd_verify)


# --- apply ------------------------------------------------------------------------------


def parse_cli_steps(args: list[str]) -> list[StepCall]:
    """Steps from command-line arguments (each may hold several, separated by ';')."""
    from cocoviz.ir.syntax import parse_steps

    out: list[StepCall] = []
    for k, text in enumerate(args, start=1):
        steps = parse_steps(text, f"<step {k}>")
        if not steps:
            raise UsageError(f"step {k} is empty", hint="write a step, e.g. 'split(sum)'")
        out.extend(steps)
    return out


def cmd_apply(args: argparse.Namespace) -> int:
    from cocoviz.ir.printer import format_program
    from cocoviz.schedule import Session, check_sched_output

    program = load_args_program(args)
    steps = parse_cli_steps(args.steps)
    if args.output:
        check_sched_output(Path(args.output), args.force)
    session = Session(program, args_hardware(args))
    session.apply_all(steps)
    if args.output:
        # the comment after the two header lines (docs/schedules.md, "Writing steps")
        comment = f"program {program.name}, written by cocoviz apply"
        session.save(args.output, comment)
    if args.explain:
        return _explain(session.program, args.explain, session.hw, args.json)
    if args.json:
        from cocoviz.ir.describe import to_json

        data = to_json(session.program)
        data["steps"] = [str(s) for s in session.steps]
        print(json.dumps(data, indent=2))
    else:
        print(format_program(session.program, schedules=False, annotate=True), end="")
    return ExitCode.OK


def _explain(program: Program, stage: str, hw: Hardware, as_json: bool) -> int:
    """The TUI palette's steps for `stage`, a legal overlap with the chunk count the
    model picks on `hw` (what applying it without `chunks=` gives)."""
    from cocoviz.schedule import palette

    options = [(e.resolved or e.step, e.ok, e.reason) for e in palette(program, stage, hw)]
    if as_json:
        print(
            json.dumps(
                [{"step": s, "ok": ok, "reason": why or None} for s, ok, why in options],
                indent=2,
            )
        )
        return ExitCode.OK
    width = max((len(s) for s, _, _ in options), default=0)
    print(f"steps for '{stage}':")
    for s, ok, why in options:
        mark = "ok " if ok else "no "
        print(f"  {mark}{s.ljust(width)}{'' if ok else '  ' + why}".rstrip())
    return ExitCode.OK


# --- verify -----------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    from cocoviz.exec.verify import verify_programs
    from cocoviz.schedule import apply_blocks, apply_schedule_arg

    program = load_args_program(args)
    hw = args_hardware(args)
    max_mem = args.max_mem
    if args.schedule:
        targets: list[tuple[str, Program]] = [
            (args.schedule, apply_schedule_arg(program, args.schedule, hw))
        ]
    else:
        if not program.schedules:
            raise InputError(
                f"{program.name} has no schedule blocks to verify",
                hint="pass --schedule NAME or --schedule FILE.sched",
            )
        targets = apply_blocks(program, hw)
    ok = True
    results = []
    for name, scheduled in targets:
        report = verify_programs(
            program, scheduled, seed=args.seed, max_mem=max_mem, max_work=args.max_work
        )
        ok &= report.ok
        if args.json:
            results.append(
                {
                    "schedule": name,
                    "ok": report.ok,
                    "rows": [
                        {
                            "name": r.name,
                            "kind": r.kind,
                            "dtype": r.dtype,
                            "max_abs": r.max_abs,
                            "max_rel": r.max_rel,
                            "ok": r.ok,
                            "note": r.note,
                        }
                        for r in report.rows
                    ],
                }
            )
        else:
            print(f"schedule {name}:")
            print(report.format_report(), end="")
    if args.json:
        print(json.dumps({"program": program.name, "ok": ok, "schedules": results}, indent=2))
    return ExitCode.OK if ok else ExitCode.MISMATCH
