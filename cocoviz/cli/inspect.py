"""`cocoviz check`, `cocoviz show` and `cocoviz samples`."""

from __future__ import annotations

import argparse
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

from cocoviz.cli.options import (
    add_json_option,
    add_program_options,
    args_hardware,
    console,
    load_args_program,
)
from cocoviz.errors import ExitCode, UsageError
from cocoviz.ir.nodes import Program
from cocoviz.ir.summary import Summary, format_bytes, summarize
from cocoviz.sim.hardware import Hardware


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="parse, infer and apply every schedule block; exit 0 or a diagnostic",
        description="Parse and type-check a program, apply each of its schedule blocks, and "
        "print a one-line summary.",
    )
    add_program_options(p, schedule=False)
    add_json_option(p)
    p.set_defaults(handler=cmd_check, bounded=True)

    p = sub.add_parser(
        "show",
        help="print a program (text, json or dot), or draw its graph",
        description="Print the program with every stage's inferred dtype, shape and layout "
        "(after --schedule, when given), as text, as JSON or as a Graphviz graph; or draw "
        "the dataflow graph in the terminal.",
    )
    add_program_options(p)
    p.add_argument(
        "--format",
        choices=("text", "json", "dot"),
        default="text",
        help="text: the program with types as comments (default); json: the dataflow graph "
        "as data; dot: a Graphviz graph",
    )
    p.add_argument("--graph", action="store_true", help="draw the dataflow graph in the terminal")
    add_json_option(p)
    p.set_defaults(handler=cmd_show, bounded=True)

    p = sub.add_parser(
        "samples",
        help="list the bundled sample programs, or copy them",
        description="List the sample programs that ship with cocoviz (any command takes a "
        "sample's name in place of a FILE), copy them into a directory to edit, or print a "
        "GPT stack of any depth.",
    )
    p.add_argument("--copy", metavar="DIR", help="copy the samples into DIR")
    p.add_argument(
        "--gpt",
        metavar="LAYERS",
        type=_layers,
        help=f"print an N-layer GPT stack program (1 .. {MAX_GPT_LAYERS})",
    )
    add_json_option(p)
    p.set_defaults(handler=cmd_samples)


MAX_GPT_LAYERS = 2400
"""The largest --gpt stack: every stack up to it loads (2,438 layers is the most whose
statements, its schedule block's steps included, stay within `syntax_tree.MAX_STATEMENTS`)."""


def _layers(text: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 9):
        raise argparse.ArgumentTypeError(f"not a layer count: '{text}'")
    n = int(digits)
    if not 1 <= n <= MAX_GPT_LAYERS:
        raise argparse.ArgumentTypeError(f"must be in 1 .. {MAX_GPT_LAYERS}, got {n}")
    return n


def apply_named_schedule(args: argparse.Namespace, program: Program) -> Program:
    """`--schedule S` (a block name or a .sched file) applied on `--hw`'s model."""
    from cocoviz.schedule import apply_schedule_arg

    if not args.schedule:
        return program
    return apply_schedule_arg(program, args.schedule, args_hardware(args))


def _check_schedules(program: Program, hw: Hardware) -> list[str]:
    """Apply every schedule block; returns the names applied (raises on the first failure)."""
    from cocoviz.schedule import apply_blocks

    return [name for name, _ in apply_blocks(program, hw)]


SUMMARY_COLLECTIVES = 8
"""Collectives a summary line names; more are counted by kind (`--json` lists all)."""


def summary_line(s: Summary) -> str:
    named = [f"{c.op} {c.name}" for c in s.comm[:SUMMARY_COLLECTIVES]]
    if len(s.comm) > SUMMARY_COLLECTIVES:
        rest: dict[str, int] = {}
        for c in s.comm[SUMMARY_COLLECTIVES:]:
            rest[c.op] = rest.get(c.op, 0) + 1
        named.append("and " + ", ".join(f"{n} more {op}" for op, n in rest.items()))
    colls = ", ".join(named) or "no communication"
    return (
        f"{s.program}: ranks {s.ranks}, {s.stages} stages "
        f"({s.matmuls} matmul, {s.collectives} collective, {s.compute} compute); "
        f"{colls}; each rank sends {format_bytes(s.sent_per_rank)}"
    )


def summary_json(s: Summary) -> dict[str, Any]:
    return {
        "program": s.program,
        "ranks": s.ranks,
        "world": s.world,
        "stages": s.stages,
        "matmuls": s.matmuls,
        "collectives": s.collectives,
        "compute": s.compute,
        "communication": [
            {
                "name": c.name,
                "op": c.op,
                "dtype": c.dtype,
                "bytes": c.nbytes,
                "sent_per_rank": c.sent_per_rank,
            }
            for c in s.comm
        ],
        "sent_per_rank": s.sent_per_rank,
    }


def cmd_check(args: argparse.Namespace) -> int:
    program = load_args_program(args)
    applied = _check_schedules(program, args_hardware(args))
    s = summarize(program)
    if args.json:
        print(json.dumps({**summary_json(s), "schedules": applied}, indent=2))
    else:
        line = summary_line(s)
        if applied:
            line += f"; schedules ok: {', '.join(applied)}"
        print(line)
    return ExitCode.OK


def cmd_show(args: argparse.Namespace) -> int:
    from cocoviz.ir.describe import to_json
    from cocoviz.ir.graph import to_dot
    from cocoviz.ir.printer import format_program

    program = apply_named_schedule(args, load_args_program(args))
    fmt = "json" if args.json else args.format
    if args.graph:
        from cocoviz.ir.draw import print_graph

        print_graph(program, console())
        return ExitCode.OK
    if fmt == "json":
        print(json.dumps(to_json(program), indent=2))
    elif fmt == "dot":
        print(to_dot(program), end="")
    else:
        print(format_program(program, schedules=not args.schedule, annotate=True), end="")
    return ExitCode.OK


def cmd_samples(args: argparse.Namespace) -> int:
    from cocoviz import samples

    if args.gpt is not None:
        from cocoviz.samples.gpt import gpt_stack

        print(gpt_stack(args.gpt), end="")
        return ExitCode.OK
    names = samples.names()
    if args.copy:
        _copy_samples(Path(args.copy), names)
        return ExitCode.OK
    if args.json:
        print(json.dumps(names))
        return ExitCode.OK
    width = max(shutil.get_terminal_size((100, 24)).columns, 60)
    pad = max(len(n) for n in names) + 2
    for n in names:
        lines = textwrap.wrap(samples.description(n), width - pad, break_on_hyphens=False) or [""]
        print(f"{n:<{pad}}{lines[0]}")
        for more in lines[1:]:
            print(" " * pad + more)
    return ExitCode.OK


def _copy_samples(dest: Path, names: list[str]) -> None:
    """`samples --copy DIR`: never overwrites a file; each copy written atomically."""
    from cocoviz import fsio, samples

    if fsio.lstat(dest, "write") is not None and not dest.is_dir():
        raise UsageError(f"--copy {dest}: exists and is not a directory")
    with fsio.locked_directory(dest):
        clashes = [n for n in names if fsio.lstat(dest / f"{n}.coco") is not None]
        if clashes:
            raise UsageError(
                f"{dest}: would overwrite {', '.join(c + '.coco' for c in clashes)}",
                hint="choose an empty directory",
            )
        fsio.replace_files(dest, {f"{n}.coco": samples.path(n).read_bytes() for n in names})
    print(f"copied {len(names)} samples to {dest}")
