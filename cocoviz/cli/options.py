"""What the command modules share: option types with their ranges, the program and
hardware options, and loading the program a command names. Every `cocoviz.cli` module
imports this one and none imports the package, so the package (which imports the
command modules) and its modules form no cycle."""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocoviz.errors import InputError, shown_value

if TYPE_CHECKING:
    from cocoviz.sim.hardware import Hardware



def _seed(text: str) -> int:
    """A --seed value: an ASCII integer in [0, 2^64)."""
    digits = text.strip().lstrip("+-")
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(f"not an integer: '{text}'")
    if len(digits) > 40:
        raise argparse.ArgumentTypeError("must be in [0, 2^64)")
    n = int(text)
    if not 0 <= n < 1 << 64:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^64), got {n}")
    return n


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an ASCII integer in [lo, hi] (one range check for every count
    option, so a 400-digit number is a usage error, not an overflow deep inside)."""

    def parse(text: str) -> int:
        digits = text.strip()
        body = digits.removeprefix("-").removeprefix("+")
        if not (body.isascii() and body.isdigit()):
            raise argparse.ArgumentTypeError(f"not an integer: '{text}'")
        if len(body) > len(str(hi)) + 1 or not lo <= int(digits) <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo} .. {hi:,}, got '{text}'")
        return int(digits)

    return parse


def seconds_in(hi: float = 1e9) -> Callable[[str], float]:
    """An argparse type: a number of seconds in (0, hi] (not NaN or infinite)."""

    def parse(text: str) -> float:
        try:
            s = float(text) if len(text) <= 64 and text.isascii() else math.nan
        except ValueError:
            s = math.nan
        if not 0 < s <= hi:
            raise argparse.ArgumentTypeError(
                f"not a number of seconds: '{text}' (a positive number up to {hi:g}, e.g. 60)"
            )
        return s

    return parse


MAX_BYTES_OPTION = 1 << 50
"""The largest size a size option (--max-mem) takes: 1 PiB."""


def _scaled(
    units: dict[str, int], what: str, example: str, lo: int, hi: int, span: str
) -> Callable[[str], int]:
    """An argparse type: a number with an optional unit suffix, in [lo, hi] (`span` says
    so: "from 1 to 1 PiB")."""

    def parse(text: str) -> int:
        t = text.strip().upper().removesuffix("B").removesuffix("I")
        mult = 1
        if t and t[-1] in units:
            mult, t = units[t[-1]], t[:-1]
        if re.fullmatch(r"[0-9]{21,}(\.[0-9]*)?", t):  # a number, past every bound
            raise argparse.ArgumentTypeError(f"must be {what} {span}, got '{shown_value(text)}'")
        if not re.fullmatch(r"[0-9]{1,20}(\.[0-9]{1,9})?", t):
            raise argparse.ArgumentTypeError(f"not {what}: '{shown_value(text)}' (e.g. {example})")
        value = int(float(t) * mult) if "." in t else int(t) * mult
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"must be {what} {span}, got '{shown_value(text)}'"
            )
        return value

    return parse


def bytes_in(lo: int = 1, hi: int = MAX_BYTES_OPTION) -> Callable[[str], int]:
    """An argparse type: a size such as 4G, 512M, 1.5G or 4096 (binary units), in
    [lo, hi] bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
    return _scaled(units, "a size", "4G, 512M", lo, hi, f"from {lo:,} bytes to {hi >> 50} PiB")


MAX_COUNT_OPTION = 10**18
"""The largest count a count option (--max-work) takes: 10^18 (1,000 P)."""


def count_in(lo: int = 1, hi: int = MAX_COUNT_OPTION) -> Callable[[str], int]:
    """An argparse type: a count such as 500G, 2T, 1.5T or 4096 (decimal units), in
    [lo, hi]."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
    return _scaled(units, "a count", "500G, 2T", lo, hi, f"from {lo:,} to {hi // 10**15:,} P")


def add_reference_limits(p: argparse.ArgumentParser) -> None:
    """--max-mem and --max-work: the bounds of a numpy reference run (docs/semantics-notes.md,
    tolerances and memory)."""
    p.add_argument(
        "--max-mem",
        type=bytes_in(),
        default=None,
        metavar="BYTES",
        help="refuse reference runs estimated to need more memory (default 4G; suffixes "
        "K, M, G, T, P)",
    )
    p.add_argument(
        "--max-work",
        type=count_in(),
        default=None,
        metavar="N",
        help="refuse reference runs estimated to take more work (a matmul's 2·M·N·K "
        "plus 32 per element of other operations; default 200G, seconds of CPU; "
        "suffixes K, M, G, T, P)",
    )


def add_program_options(p: argparse.ArgumentParser, schedule: bool = True) -> None:
    """Options shared by every command that evaluates a program."""
    p.add_argument("file", metavar="FILE", help="a .coco program (or the name of a sample)")
    if schedule:
        p.add_argument(
            "--schedule",
            "-s",
            metavar="S",
            help="a schedule block name, or a .sched file (default: none, the program as written)",
        )
    p.add_argument(
        "-D",
        dest="defines",
        action="append",
        metavar="NAME=VALUE",
        help="override a dimension, e.g. -D H=1024",
    )
    p.add_argument(
        "--ranks",
        metavar="N|tp=T,pp=P",
        help="override the rank count or grid (named axes: dp=D,tp=T,pp=P, any two or more)",
    )
    p.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="seed of the input and dropout generator (0 .. 2^64-1)",
    )
    add_hw_option(p)


def add_hw_option(p: argparse.ArgumentParser) -> None:
    """`--hw`: the hardware profile of the cost model (parsed by `args_hardware`)."""
    from cocoviz.sim.hardware import DEFAULT_PROFILE, list_profiles

    p.add_argument(
        "--hw",
        metavar="NAME|FILE",
        default=None,
        help=f"hardware profile of the cost model: {', '.join(list_profiles())} "
        f"(default {DEFAULT_PROFILE}), or a .toml file",
    )


def console(width: int | None = None, stderr: bool = False) -> Any:
    """A rich console on stdout (or stderr) for tables and drawings. Piped into a reader
    that stops early (`| head`), it ends the command like `print` does: exit 0 (rich's
    own handler exits 1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    stream = sys.stderr if stderr else sys.stdout
    if width is None and not stream.isatty() and "COLUMNS" not in os.environ:
        width = 132  # pipes and files: rich's 80 columns would fold the tables
    return _Console(file=stream, width=width, highlight=False, soft_wrap=False)


def add_json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def resolve_program_path(file: str) -> Path:
    """A path, or the name of an embedded sample when no such file exists."""
    from cocoviz import samples

    stem = samples.named_by(file)
    return Path(file) if stem is None else samples.path(stem)


def load_args_program(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Load FILE with -D and --ranks applied."""
    from cocoviz.ir.lower import RanksOverride, load_file, parse_defines

    defines = parse_defines(getattr(args, "defines", None))
    ranks = RanksOverride.parse(args.ranks) if getattr(args, "ranks", None) else None
    path = resolve_program_path(args.file)
    if not path.exists():
        raise InputError(f"{args.file}: no such file", hint=_file_hint(args.file))
    if getattr(args, "hw", None):
        args_hardware(args)  # a bad profile is reported before the program is read
    collecting = gc.isenabled()
    gc.disable()
    try:
        return load_file(path, defines, ranks)
    finally:
        # The program (and every module) is read: move it out of the collector's sight
        # for the rest of the command, which only allocates new objects around it
        # (`main` hands it back at the end).
        gc.freeze()
        if collecting:
            gc.enable()


def args_hardware(args: argparse.Namespace) -> Hardware:
    """`--hw` parsed once into the `Hardware` value every layer below is handed (the
    default profile when the option is absent); a bad name or file is an input error."""
    hw: Hardware | None = getattr(args, "_hardware", None)
    if hw is None:
        from cocoviz.sim.hardware import DEFAULT_PROFILE, load_profile

        hw = load_profile(getattr(args, "hw", None) or DEFAULT_PROFILE)
        args._hardware = hw
    return hw


def _file_hint(file: str) -> str | None:
    from cocoviz import samples
    from cocoviz.errors import did_you_mean

    stem = Path(file).stem
    hint = did_you_mean(stem, samples.names())
    return hint or "run 'cocoviz samples' for the bundled programs"
