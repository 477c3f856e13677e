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
import os
import select
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from cocoviz.errors import CocovizError, ExitCode, InternalError, UsageError

# Command modules, in the order their commands appear in --help.
COMMAND_MODULES = (
    "cocoviz.cli.inspect",
    "cocoviz.cli.schedule",
    "cocoviz.cli.sim",
    "cocoviz.cli.calibrate",
    "cocoviz.cli.emit",
    "cocoviz.cli.check_tree",
    "cocoviz.cli.run",
    "cocoviz.cli.tui",
)

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as exit 2 with a one-line message and hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, hint=f"see '{self.prog} --help'")


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
