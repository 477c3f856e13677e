"""`cocoviz calibrate`: a hardware profile fitted to nccl-tests logs, or to this machine.

    cocoviz calibrate LOG... -o PROFILE.toml [--base h100-dgx] [--in-place]
    cocoviz calibrate --local -o PROFILE.toml [--ranks 2]

The first reads nccl-tests output (``cocoviz.sim.nccl_tests_log``) and fits the base
profile's link, latency and efficiency fields to it (``cocoviz.sim.calibrate``); the
second emits, builds and times small programs of the CPU target on this machine and fits
a cpu-mpi profile (``cocoviz.sim.local_profile``). Both write a profile that ``--hw``
loads and print, per size (per micro-run), what was measured next to what the fitted
profile predicts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cocoviz.cli.options import add_json_option
from cocoviz.errors import ExitCode, InternalError, UsageError, did_you_mean, shown_value

WRITTEN_BY = "# Written by `cocoviz calibrate"
"""How a profile this command wrote begins (what -o may replace without --force)."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit a hardware profile to nccl-tests logs (or to this machine: --local)",
        description="Fit a hardware profile to the output of nccl-tests (all_reduce_perf, "
        "reduce_scatter_perf, all_gather_perf, alltoall_perf, sendrecv_perf; several logs, "
        "several node counts), starting from a shipped profile and moving only the link, "
        "latency and efficiency fields the logs inform; or, with --local, to micro-runs of "
        "the CPU target on this machine. Writes a profile for --hw and prints the measured "
        "and the fitted bus bandwidth (step time) side by side.",
    )
    p.add_argument("logs", nargs="*", metavar="LOG", help="nccl-tests output files")
    p.add_argument(
        "-o", "--output", metavar="PROFILE.toml", required=True, help="the profile to write"
    )
    p.add_argument(
        "--base",
        metavar="NAME",
        default=None,
        help="the shipped profile to start from (default: the one of the GPU the logs name)",
    )
    p.add_argument("--name", default=None, help="the profile's name (default: BASE-calibrated)")
    p.add_argument(
        "--in-place",
        action="store_true",
        help="fit the in-place columns (default: out-of-place)",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="no logs: emit, build and time micro-runs of the CPU target on this machine "
        "and fit a cpu-mpi profile",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=2,
        metavar="N",
        help="with --local: MPI ranks of the micro-runs (default 2)",
    )
    p.add_argument(
        "--build-dir",
        metavar="DIR",
        default=None,
        help="with --local: where the micro-runs are built and kept for the next time "
        "(default $XDG_CACHE_HOME/cocoviz/calibrate-local)",
    )
    p.add_argument(
        "--force", action="store_true", help="let -o overwrite a file that cocoviz did not write"
    )
    add_json_option(p)
    p.set_defaults(handler=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.suffix != ".toml":
        raise UsageError(f"-o {out}: a profile file must end in .toml", hint="name it PROFILE.toml")
    if args.name is not None:
        _check_name(args.name)
    if args.local:
        if args.logs:
            raise UsageError("--local measures this machine: give no logs with it")
        if args.base is not None or args.in_place:
            raise UsageError("--base and --in-place apply to nccl-tests logs, not to --local")
        return _local(args, out)
    if not args.logs:
        raise UsageError(
            "give nccl-tests logs to fit, or --local to measure this machine",
            hint="e.g. cocoviz calibrate all_reduce_perf.log all_gather_perf.log -o mine.toml",
        )
    return _from_logs(args, out)


def _check_name(name: str) -> None:
    """``--name`` goes into the profile as its name: one line of printable text."""
    bad = [c for c in name if not c.isprintable()]
    if not name.strip() or bad:
        raise UsageError(
            f"--name {shown_value(repr(name), 60)}: "
            + (f"a profile's name may not hold {bad[0]!r}" if bad else "empty"),
            hint="name it with letters, digits and dashes: --name h100-lab",
        )


def _check_output(out: Path, force: bool) -> None:
    """Before any fitting or micro-run: -o must be writable as `_write` will write it."""
    from cocoviz import fsio

    fsio.check_output(out, force=force, ours=_ours, writer="cocoviz calibrate")


def _ours(path: Path) -> bool:
    from cocoviz import fsio

    head = fsio.read_head(path, len(WRITTEN_BY))
    return head is not None and head.decode("utf-8", "replace") == WRITTEN_BY


def _write(out: Path, text: str, force: bool) -> None:
    """Write the profile, once it is known to load as ``--hw`` will load it: a profile
    that does not is a bug of calibrate's, and leaves no file (nor a changed one)."""
    from cocoviz import fsio
    from cocoviz.sim.hardware import ProfileError, parse_profile

    try:
        parse_profile(text, str(out))
    except ProfileError as err:
        raise InternalError(
            f"calibrate wrote a profile that does not load: {err.message}"
        ) from None
    fsio.write_file(out, text, force=force, ours=_ours, writer="cocoviz calibrate")


def _from_logs(args: argparse.Namespace, out: Path) -> int:
    from cocoviz.sim.calibrate import base_for_gpu, calibrate, printable, residual_table
    from cocoviz.sim.hardware import list_profiles, load_profile
    from cocoviz.sim.nccl_tests_log import read_log

    _check_output(out, args.force)
    _check_distinct(args.logs)
    if args.base is not None and args.base not in list_profiles():
        _unknown_base(args.base)
    logs = [read_log(path) for path in args.logs]
    _check_output(out, args.force)  # again, now that the logs are known inputs (-o LOG)
    base_name = args.base
    if base_name is None:
        named = {base_for_gpu(log.gpu) for log in logs} - {None}
        if len(named) != 1:
            gpus = ", ".join(sorted({log.gpu or "?" for log in logs}))
            raise UsageError(
                f"cannot tell which shipped profile to start from (the logs name: {gpus})",
                hint=f"pass --base with one of {', '.join(list_profiles())}",
            )
        base_name = named.pop()
    if base_name not in list_profiles():
        _unknown_base(base_name)
    base = load_profile(base_name)
    for log in logs:
        guess = base_for_gpu(log.gpu)
        if guess is not None and guess != base_name:
            print(
                f"warning: {printable(log.path)} ran on {printable(log.gpu or '')}; fitting "
                f"{base_name} to it anyway",
                file=sys.stderr,
            )
    cal = calibrate(logs, base, in_place=args.in_place)
    for note in cal.notes:
        print(f"warning: {printable(note)}", file=sys.stderr)
    name = args.name or f"{base_name}-calibrated"
    files = printable(", ".join(Path(log.path).name for log in logs))
    text = cal.profile_toml(
        name=name,
        description=f"{base.description}; fitted by cocoviz calibrate to {files}",
        base_name=base_name,
    )
    _write(out, text, args.force)
    if args.json:
        _print_json(cal, out)
    else:
        sys.stdout.write(residual_table(cal, in_place=args.in_place))
    print(f"{out}: written (use it with --hw {out})", file=sys.stderr)
    return ExitCode.OK


def _unknown_base(name: str) -> None:
    from cocoviz.sim.hardware import list_profiles

    known = list_profiles()
    close = did_you_mean(name, known)
    raise UsageError(
        f"--base {shown_value(name)}: not a shipped profile" + (f" ({close})" if close else ""),
        hint=f"one of {', '.join(known)}",
    )


def _check_distinct(paths: list[str]) -> None:
    """The same log twice (by any path) would count its sizes twice: refused."""
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            continue  # read_log names what is wrong with it
        key = (st.st_dev, st.st_ino)
        if key in seen:
            same = "" if seen[key] == path else f" (as {seen[key]})"
            raise UsageError(
                f"{path}: the same log is given twice{same}",
                hint="give each nccl-tests log once",
            )
        seen[key] = path


def _json_head(cal: Any, out: Path) -> dict[str, Any]:
    med, worst = cal.summary()
    med0, worst0 = cal.summary(after=False)
    return {
        "profile": str(out),
        "base": cal.base.name,
        "set": {field: value for field, value in cal.set_fields},
        "fitted": [{"field": k.field, "base": old, "fitted": new} for k, old, new in cal.fitted],
        "kept": [k.field for k in cal.kept],
        "error": {"median": med, "max": worst, "base_median": med0, "base_max": worst0},
    }


def _json_points(cal: Any) -> Iterator[dict[str, Any]]:
    for r, b in zip(cal.residuals, cal.before, strict=True):
        yield {
            "log": r.sample.label.rsplit(":", 1)[0],
            "line": int(r.sample.label.rsplit(":", 1)[1]),
            "size": r.sample.nbytes,
            "measured_busbw": r.sample.busbw,
            "model_busbw": r.model_busbw,
            "error": r.error,
            "base_error": b.error,
            "algo_proto": r.label,
        }


def _print_json(cal: Any, out: Path) -> None:
    """The fit as one JSON object, its points one a line as they are encoded: a log of a
    few hundred thousand sizes is printed without holding them all as objects."""
    head = json.dumps(_json_head(cal, out), indent=2)
    sys.stdout.write(head[: head.rindex("}")].rstrip() + ',\n  "points": [')
    for i, point in enumerate(_json_points(cal)):
        sys.stdout.write(("," if i else "") + "\n    " + json.dumps(point))
    sys.stdout.write("\n  ]\n}\n")


# ---------------------------------------------------------------------------------------
# --local


def default_build_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "cocoviz" / "calibrate-local"


def build_cpu_program(program: Any, directory: Path, hw: Any = None) -> Path:
    """Emit ``program`` for the CPU target into ``directory`` and build it (make skips
    what is up to date); the directory, for ``cpu_timing.time_step``."""
    from cocoviz.emit.emitter import build, emit
    from cocoviz.emit.writer import write_tree
    from cocoviz.ir.nodes import unscheduled

    out = emit(program, unscheduled(program), target="cpu", hw=hw)
    directory.mkdir(parents=True, exist_ok=True)
    write_tree(directory, out.files, force=True)
    build(directory)
    return directory


def _local(args: argparse.Namespace, out: Path) -> int:
    from cocoviz.exec.cpu_timing import time_step
    from cocoviz.exec.mpi_run import usable_cpus
    from cocoviz.sim.local_profile import (
        MICRO,
        fit_local,
        local_profile_toml,
        micro_program,
    )

    if args.ranks < 2:
        raise UsageError("--ranks: the micro-runs need at least 2 ranks")
    cpus = usable_cpus()
    if args.ranks > cpus:
        raise UsageError(
            f"--ranks {args.ranks}: this machine runs this process on {cpus} CPU"
            f"{'s' if cpus != 1 else ''}, and a rank of the micro-runs is a core (ranks "
            "sharing a core would time each other)",
            hint=(f"--ranks 2 to {cpus}" if cpus > 2 else "--ranks 2")
            if cpus >= 2
            else "run it on a machine of 2 or more CPUs",
        )
    _check_output(out, args.force)
    root = Path(args.build_dir) if args.build_dir else default_build_dir()
    measured: list[tuple[str, float]] = []
    for micro in MICRO:
        program = micro_program(micro.name, args.ranks)
        directory = build_cpu_program(program, root / f"{micro.name}-{args.ranks}")
        t = time_step(directory).best_s
        measured.append((micro.name, t))
        print(f"{micro.name:<22} {t * 1e6:>10.1f} us  {micro.measures}", file=sys.stderr)
    cal = fit_local(dict(measured), args.ranks, name=args.name)
    _write(out, local_profile_toml(cal, args.ranks, measured), args.force)
    fitted = {r.sample.label: r.model_time_s for r in cal.residuals}
    if args.json:
        print(
            json.dumps(
                {
                    "profile": str(out),
                    "ranks": args.ranks,
                    "fitted": [
                        {"field": k.field, "start": a, "fitted": b} for k, a, b in cal.fitted
                    ],
                    "runs": [
                        {"name": n, "measured_s": t, "model_s": fitted[n]} for n, t in measured
                    ],
                },
                indent=2,
            )
        )
    else:
        med, worst = cal.summary()
        print(
            f"# cpu-mpi profile of this machine, {args.ranks} ranks: step-time error "
            f"median {med:.1%}, max {worst:.1%}"
        )
        print(f"#{'micro-run':<21} {'measured':>10} {'fitted':>10} {'error':>7}")
        for n, t in measured:
            print(f"{n:<22} {t * 1e6:>8.1f}us {fitted[n] * 1e6:>8.1f}us {t / fitted[n] - 1:>+7.1%}")
    print(f"{out}: written (use it with --hw {out})", file=sys.stderr)
    return ExitCode.OK
