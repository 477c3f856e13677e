"""The `cocoviz` command.

Each command group lives in its own module with a `register(subparsers)` function that
adds its subcommands; a subcommand's handler takes the parsed arguments and returns an
exit code. Data goes to stdout, diagnostics to stderr; every user mistake is a
`CocovizError` rendered once, with its exit code (docs/language.md, diagnostics); anything else is reported
as an internal error (exit 70), never as a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import gc
import importlib
import io
import math
import os
import re
import select
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocoviz.errors import CocovizError, ExitCode, InputError, InternalError, UsageError

if TYPE_CHECKING:
    from cocoviz.sim.hardware import Hardware

# Command modules, in the order their commands appear in --help.
COMMAND_MODULES = (
    "cocoviz.cli.inspect",
    "cocoviz.cli.schedule",
    "cocoviz.cli.sim",
    "cocoviz.cli.calibrate",
    "cocoviz.cli.emit",
    "cocoviz.cli.run",
    "cocoviz.cli.tui",
)

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as exit 2 with a one-line message and hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, hint=f"see '{self.prog} --help'")


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


def bytes_in(lo: int = 1, hi: int = MAX_BYTES_OPTION) -> Callable[[str], int]:
    """An argparse type: a size such as 4G, 512M, 1.5G or 4096 (binary units), in
    [lo, hi] bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}

    def parse(text: str) -> int:
        t = text.strip().upper().removesuffix("B").removesuffix("I")
        mult = 1
        if t and t[-1] in units:
            mult, t = units[t[-1]], t[:-1]
        if not re.fullmatch(r"[0-9]{1,20}(\.[0-9]{1,9})?", t):
            raise argparse.ArgumentTypeError(f"not a size: '{text}' (e.g. 4G, 512M)")
        value = int(float(t) * mult) if "." in t else int(t) * mult
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"must be a size from {lo:,} bytes to {hi >> 50} PiB, got '{text}'"
            )
        return value

    return parse


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
    p.add_argument("--ranks", metavar="N|tp=T,pp=P", help="override the rank count or grid")
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cocoviz",
        description="Write a distributed computation once, reschedule it step by step, see "
        "the graph and the timeline, and emit CUDA/NCCL or C++/MPI code.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse the command line. A command whose trailing positionals may come anywhere
    (`apply FILE --ranks 4 'split(sum)'`: its steps) sets `intermixed` to their name."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        name = getattr(args, "intermixed", None)
        if name is None or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, name, [*getattr(args, name), *extra])
    return args


def _emit_error(err: CocovizError, as_json: bool = False) -> None:
    """The diagnostic on stderr; with `--json` also as JSON on stdout (the same fields:
    severity, message, where, hint, notes), so that a script reading stdout sees why."""
    color = sys.stderr.isatty() and os.environ.get("NO_COLOR") is None
    print(err.render(color), file=sys.stderr)
    if as_json:
        import json

        def where(span: Any) -> dict[str, Any]:
            if span is None:
                return {"file": None, "line": None, "col": None}
            return {
                "file": span.path,
                "line": span.line,
                "col": span.col,
                "end_line": span.end_line,
                "end_col": span.end_col,
            }

        errors = [
            {
                "severity": d.severity,
                "message": d.message,
                **where(d.span),
                "hint": d.hint,
                "notes": [{"message": n, **where(ns)} for n, ns in d.notes],
            }
            for d in err.diagnostics
        ]
        with contextlib.suppress(OSError, ValueError):
            print(json.dumps({"ok": False, "exit_code": int(err.exit_code), "errors": errors}))


GC_THRESHOLD = (20_000, 10, 10)
"""The cyclic collector's thresholds while a command runs (Python's are 700, 10, 10).
A command on a large program allocates hundreds of thousands of small objects that
live to its end (stages, steps, timeline events); at the default threshold the
collector scanned them again and again, a tenth to a sixth of a command's time."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns (and, as a script, exits with) the exit code."""
    threshold = gc.get_threshold()
    frozen = gc.get_freeze_count()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        code = int(ExitCode.INTERNAL)
        with contextlib.suppress(OSError), _patient("stderr"):  # a diagnostic that cannot
            code = _main(argv)  # be written changes no exit code
        return code
    finally:
        gc.set_threshold(*threshold)
        if not frozen:  # what `load_args_program` froze (a caller's freeze is kept)
            gc.unfreeze()


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        if not argv:
            return _default(parser)
        args = _parse(parser, argv)
        if args.version:
            from importlib.metadata import version

            print(f"cocoviz {version('cocoviz')}")
            return ExitCode.OK
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return ExitCode.USAGE
        with _patient("stdout"), _inputs_remembered(args):
            if getattr(args, "bounded", False):
                return _without_collector(handler, args)
            return int(handler(args))
    except CocovizError as err:
        _emit_error(err, "--json" in argv)
        return int(err.exit_code)
    except InternalError as err:
        print(f"internal error (a cocoviz bug): {err}", file=sys.stderr)
        if os.environ.get("COCOVIZ_DEBUG"):
            traceback.print_exc()
        return int(ExitCode.INTERNAL)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader stopped early (`| head`): not an error
        _discard_stdout()
        return int(ExitCode.OK)
    except MemoryError:
        print(
            "error: out of memory\nhint: the program or its sizes are too large for this "
            "machine: smaller -D sizes or fewer ranks",
            file=sys.stderr,
        )
        return int(ExitCode.INPUT)
    except OSError as err:
        if err.filename is None:
            if err.errno in _OUTPUT_ERRNOS:
                return _output_failed(err)
            return _internal(err)
        # a file the user named (or its directory) could not be read or written: the same
        # diagnostic the writers give, never an internal error
        from cocoviz.fsio import os_error

        diag = os_error(err, err.filename, "read or write")
        _emit_error(diag, "--json" in argv)
        return int(diag.exit_code)
    except Exception as err:  # noqa: BLE001 - the one boundary that turns bugs into exit 70
        return _internal(err)


def _inputs_remembered(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """While a command runs, the files it reads are remembered so that none of them is
    overwritten by its outputs (`simulate x.coco --trace x.coco`). The TUI is a session,
    not one command: it saves the schedule file it opened, so it is not covered."""
    from cocoviz import fsio

    if getattr(args, "command", None) == "tui":
        return contextlib.nullcontext()
    return fsio.command_inputs()


class _PatientWriter(io.RawIOBase):
    """Standard output that waits when the descriptor is non-blocking and full, where
    Python's writer would raise (or, at exit, drop what is buffered): every byte is
    written or the command fails."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data: Any) -> int:
        while True:
            try:
                return os.write(self.fd, data)
            except BlockingIOError:
                select.select([], [self.fd], [])


@contextlib.contextmanager
def _patient(name: str) -> Iterator[None]:
    """`sys.<name>` (stdout or stderr) through `_PatientWriter` while the block runs when
    its descriptor is non-blocking (a parent such as node or an editor may leave it so);
    otherwise as it is. What the block wrote is flushed at its end (an error doing so
    is raised there, so that `_main` reports it as it reports any write error)."""
    old = getattr(sys, name)
    try:
        fd = old.fileno()
        blocking = not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        blocking = True  # not a file (a test's StringIO): nothing to do
    if blocking:
        yield
        return
    old.flush()
    new = io.TextIOWrapper(
        io.BufferedWriter(_PatientWriter(fd)),
        encoding=old.encoding,
        errors=old.errors,
        line_buffering=bool(getattr(old, "line_buffering", False)),
    )
    setattr(sys, name, new)
    try:
        yield
        new.flush()
    finally:
        setattr(sys, name, old)
        with contextlib.suppress(OSError, ValueError):
            new.flush()
        new.detach()


_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
"""Errors of a write without a file name: the command's output (stdout) could not be
written, as to a full disk."""


def _output_failed(err: OSError) -> int:
    """Report that the output could not be written (a user's disk, not a bug)."""
    from cocoviz.fsio import os_error

    diag = os_error(err, "<stdout>", "write the output to")
    _discard_stdout()
    with contextlib.suppress(OSError):
        _emit_error(diag)
    return int(diag.exit_code)


def _discard_stdout() -> None:
    """Send the rest of the output nowhere (after the reader stopped or the disk filled),
    so that flushing what is still buffered at exit does not fail again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


class _Ending:
    """How the process ends after `main` (`entry`)."""

    without_teardown = False
    """Set by a bounded command: its objects (the program, the timeline) need no
    finalization, and freeing them one by one at interpreter exit cost a simulation of
    the 96-layer stack 40M instructions and more (mypy's fast exit, for the same reason)."""


def _without_collector(handler: Handler, args: argparse.Namespace) -> int:
    """Run a command whose work is bounded by its input (check, show, apply, simulate)
    with the cyclic collector off. Their objects form no reference cycles (programs,
    indexes, operations and timelines are trees; an index holds its program weakly): on
    the 96-layer GPT stack a whole `simulate` leaves about 2,000 objects for the collector,
    while its passes over the young objects cost 5-8% of the command. Commands that run
    long or repeat work (tui, tune, run, emit's builds) keep it."""
    enabled = gc.isenabled()
    gc.disable()
    _Ending.without_teardown = True
    try:
        return int(handler(args))
    finally:
        if enabled:
            gc.enable()


def _internal(err: BaseException) -> int:
    print(
        f"internal error (a cocoviz bug): {type(err).__name__}: {err}\n"
        "Please report it with the command you ran; set COCOVIZ_DEBUG=1 for details.",
        file=sys.stderr,
    )
    if os.environ.get("COCOVIZ_DEBUG"):
        traceback.print_exc()
    return int(ExitCode.INTERNAL)


def _default(parser: argparse.ArgumentParser) -> int:
    """Bare `cocoviz`: the TUI on the default sample."""
    from cocoviz.cli.tui import open_default

    return int(open_default())


def entry() -> None:
    code = main()
    if _Ending.without_teardown:
        _exit_now(code)
    sys.exit(code)


def _exit_now(code: int) -> None:
    """End the process at once: the output flushed (a failure to write it reported as
    `main` reports it), no atexit work (a bounded command registers none, opens no
    temporary files and starts no processes), no freeing of every object."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass  # the reader stopped early (`| head`): not an error, as in `main`
    except OSError as err:
        code = _output_failed(err) if err.errno in _OUTPUT_ERRNOS else _internal(err)
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    os._exit(code)
