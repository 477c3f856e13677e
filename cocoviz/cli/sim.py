"""`cocoviz simulate`, `cocoviz tune` and `cocoviz model-table`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cocoviz.cli.options import (
    add_hw_option,
    add_json_option,
    add_program_options,
    args_hardware,
    console,
    int_in,
    load_args_program,
    seconds_in,
)
from cocoviz.errors import Diagnostic, ExitCode, UsageError

MIN_WIDTH, MAX_WIDTH = 20, 1000
"""--width: the drawn timeline's columns."""
MAX_RANKS = 1 << 16
"""model-table --ranks and --ranks-per-node: the largest job the table describes."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="predict the per-rank timeline of a (scheduled) program",
        description="Simulate one run of a program on a hardware profile: a timeline per "
        "rank and stream, the predicted time, exposed communication, overlap, speedup over "
        "the unscheduled program, and a per-stage table. Warnings about steps the model "
        "predicts to be slower go to stderr.",
    )
    add_program_options(p)
    _add_collectives(p)
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace")
    p.add_argument(
        "--force",
        action="store_true",
        help="let --trace overwrite a file that is not a cocoviz trace",
    )
    p.add_argument(
        "--width",
        type=int_in(MIN_WIDTH, MAX_WIDTH),
        default=None,
        help=f"width of the drawn timeline, {MIN_WIDTH}-{MAX_WIDTH} columns (default: terminal)",
    )
    add_json_option(p)
    p.set_defaults(handler=cmd_simulate, bounded=True)

    p = sub.add_parser(
        "tune",
        help="rank the legal schedules of a program by predicted time",
        description="Enumerate legal schedules (split, reorder, asslice, dce, fuse, overlap "
        "with chunk counts 2-16, decompose over the program's collectives), predict each "
        "with the model and print the best. A program of several regions whose choices do "
        "not interact (the layers of a stack) is tuned region by region, each kind of region "
        "once. On a terminal a progress bar shows on stderr once a tune takes more than a "
        "second; Ctrl-C prints the best schedules found so far (exit 130).",
    )
    add_program_options(p, schedule=False)
    _add_collectives(p)
    p.add_argument(
        "--top", type=int_in(1, 100_000), default=10, metavar="K", help="schedules to list"
    )
    p.add_argument(
        "--budget",
        type=seconds_in(),
        default=None,
        metavar="SECONDS",
        help="stop searching after SECONDS and list the best schedules found so far "
        "(marked as such)",
    )
    p.add_argument(
        "--sweep",
        metavar="NAME=LO..HI",
        help="tune at every power of two of dimension NAME from LO to HI (e.g. N=2^16..2^30): "
        "the best schedule and each canonical schedule's time per size, and where the "
        "winner changes",
    )
    p.add_argument("-o", "--output", metavar="BEST.sched", help="write the best schedule")
    p.add_argument(
        "--force",
        action="store_true",
        help="let -o overwrite a file that cocoviz did not write",
    )
    add_json_option(p)
    p.set_defaults(handler=cmd_tune)

    p = sub.add_parser(
        "model-table",
        help="the collective model as an nccl-tests table (size, time, algbw, busbw)",
        description="Print the model's prediction for each size of an nccl-tests sweep, to "
        "compare line by line with measured all_reduce_perf / reduce_scatter_perf / "
        "all_gather_perf output.",
    )
    add_hw_option(p)
    from cocoviz.ir.types import DType
    from cocoviz.sim.collectives import Coll
    from cocoviz.sim.hardware import Algo, Proto

    p.add_argument(
        "--coll",
        default="allreduce",
        choices=tuple(c.value for c in Coll),
        help="collective (default allreduce)",
    )
    p.add_argument(
        "--ranks", type=int_in(1, MAX_RANKS), default=None, help="ranks (default: one full node)"
    )
    p.add_argument(
        "--algo",
        choices=tuple(a.value for a in Algo if a is not Algo.P2P),
        default=None,
        help="NCCL algorithm (default: the one NCCL's tuning model picks per size)",
    )
    p.add_argument(
        "--proto",
        choices=tuple(q.value for q in Proto),
        default=None,
        help="NCCL protocol (default: the one NCCL's tuning model picks per size)",
    )
    p.add_argument(
        "--ranks-per-node",
        type=int_in(1, MAX_RANKS),
        default=None,
        metavar="N",
        help="ranks on each node (default: the profile's GPUs per node)",
    )
    p.add_argument(
        "--dtype",
        default="f32",
        choices=tuple(d.value for d in DType),
        help="element type of the sweep (default f32)",
    )
    p.add_argument("-b", "--min-bytes", default="8", metavar="SIZE", help="smallest size (8)")
    p.add_argument("-e", "--max-bytes", default="16G", metavar="SIZE", help="largest size (16G)")
    add_json_option(p)
    p.set_defaults(handler=cmd_model_table)


def _add_collectives(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--collectives",
        choices=("nccl", "nccl-device"),
        default="nccl",
        help="lowering of fused collectives (default nccl)",
    )


def _warn(message: str, hint: str | None = None) -> None:
    color = sys.stderr.isatty()
    print(Diagnostic(message, hint=hint, severity="warning").render(color), file=sys.stderr)


# ---------------------------------------------------------------------------------------
# simulate


def timeline_json(timeline: Any) -> dict[str, Any]:
    s = timeline.summary
    return {
        "program": timeline.program,
        "hardware": timeline.hardware,
        "collectives": timeline.collectives,
        "ranks": {"tp": timeline.tp, "pp": timeline.pp, "world": timeline.world},
        "summary": {
            "makespan_s": s.makespan_s,
            "compute_s": s.compute_s,
            "comm_s": s.comm_s,
            "exposed_comm_s": s.exposed_comm_s,
            "overlap_fraction": s.overlap_fraction,
            "critical_rank": s.critical_rank,
            "baseline_s": s.baseline_s,
            "speedup": s.speedup,
        },
        "stages": [
            {
                "name": r.name,
                "pipeline_stage": r.pstage,
                "kind": r.kind,
                "stream": r.stream,
                "calls": r.calls,
                "time_s": r.busy_s,
                "start_s": r.start_s,
                "end_s": r.end_s,
                "bytes": r.bytes,
                "flops": r.flops,
                "detail": r.detail,
            }
            for r in s.stages
        ],
        "warnings": [w.to_json() for w in timeline.warnings],
        "lanes": [
            {
                "ranks": list(lane.ranks),
                "pipeline_stage": lane.pstage,
                "events": [
                    {
                        "name": e.name,
                        "stage": e.stage,
                        "stages": list(e.members),
                        "stream": e.stream,
                        "kind": e.kind.value,
                        "start_s": e.start,
                        "end_s": e.end,
                        "bytes": e.bytes,
                        "flops": e.flops,
                        "chunk": e.chunk,
                        "chunks": e.chunks,
                        "detail": e.detail,
                        "slowdown": e.slowdown,
                    }
                    for e in lane.events
                ],
            }
            for lane in timeline.lanes
        ],
    }


def cmd_simulate(args: argparse.Namespace) -> int:
    from cocoviz.cli.inspect import apply_named_schedule
    from cocoviz.sim.predict import simulate
    from cocoviz.sim.textview import render_stage_table, render_summary, render_timeline

    hw = args_hardware(args)
    original = load_args_program(args)
    program = apply_named_schedule(args, original)
    baseline = original if args.schedule and not original.groups else None
    if args.trace:
        from cocoviz.sim.trace import check_trace_path

        check_trace_path(args.trace, force=args.force)
    timeline = simulate(program, hw, collectives=args.collectives, baseline=baseline)
    if args.trace:
        from cocoviz.sim.trace import traced_ranks_text, write_trace

        n = write_trace(timeline, args.trace, force=args.force)
        print(
            f"wrote {args.trace}: {n} trace events for {traced_ranks_text(timeline)} "
            "(open in ui.perfetto.dev or chrome://tracing)",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(timeline_json(timeline), indent=2))
    else:
        out = console(args.width)
        width = args.width or min(out.width, 160)
        out.print(render_summary(timeline))
        out.print()
        out.print(render_timeline(timeline, width=width))
        out.print()
        out.print(render_stage_table(timeline))
    for w in timeline.warnings:
        _warn(w.message, w.suggestion)
    return ExitCode.OK


# ---------------------------------------------------------------------------------------
# tune


_PROGRESS_AFTER_S = 1.0
"""A tune shows its progress bar once it has run this long (a quick one never draws)."""


def cmd_tune(args: argparse.Namespace) -> int:
    from cocoviz.schedule.files import check_sched_output
    from cocoviz.schedule.tune import tune, write_schedule

    if args.top < 1:
        raise UsageError("--top needs a positive count")
    budget = args.budget
    if budget is not None and not budget > 0:  # (also NaN)
        raise UsageError("--budget needs a positive number of seconds")
    if args.sweep is not None:
        if budget is not None:
            raise UsageError("--budget bounds one tune; it does not combine with --sweep")
        return _cmd_sweep(args)
    if args.output:
        check_sched_output(Path(args.output), args.force)
    hw = args_hardware(args)
    program = load_args_program(args)
    bar = _TuneBar(program.name) if sys.stderr.isatty() and not args.json else None
    with _StopOnInterrupt() as interrupt:
        try:
            result = tune(
                program,
                hw,
                collectives=args.collectives,
                progress=bar.update if bar is not None else None,
                budget_s=budget,
                stop=interrupt.requested,
            )
        finally:
            if bar is not None:
                bar.close()
    code = ExitCode.OK if result.stopped != "stopped" else _INTERRUPTED
    if result.stopped == "stopped":
        print("interrupted: the best schedules found so far", file=sys.stderr)
    best = result.candidates[: args.top]
    if args.output:
        header = None if result.complete else f"{result.best.name} (best found so far)"
        write_schedule(result.best, Path(args.output), header)
        print(f"wrote {args.output}: {len(result.best.steps)} steps", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    "program": program.name,
                    "hardware": hw.name,
                    "collectives": args.collectives,
                    "evaluated": result.evaluated,
                    "regions": result.regions,
                    "kinds": result.kinds,
                    "complete": result.complete,
                    "stopped": result.stopped,
                    "baseline_s": result.baseline_s,
                    "schedules": [
                        {
                            "rank": i + 1,
                            "time_s": c.time_s,
                            "speedup": result.baseline_s / c.time_s if c.time_s else None,
                            "name": c.name,
                            "block": c.block,
                            "steps": [str(s) for s in c.steps],
                        }
                        for i, c in enumerate(best)
                    ],
                },
                indent=2,
            )
        )
        return code
    from rich.table import Table
    from rich.text import Text

    from cocoviz.timefmt import format_time

    title = (
        f"{program.name} on {hw.name}, {program.grid.world} ranks: "
        f"{result.evaluated} schedules evaluated"
    )
    if result.regions > 1:
        title += f" in {result.regions} regions ({result.kinds} kinds tuned)"
    if result.stopped == "budget":
        title += f"; the best found in {budget:g} s (the search did not finish)"
    elif result.stopped is not None:
        title += "; the best found before the search was interrupted"
    table = Table(title=title, title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("predicted", justify="right")
    table.add_column("speedup", justify="right")
    table.add_column("schedule")
    table.add_column("steps", overflow="fold")
    for i, c in enumerate(best):
        speed = result.baseline_s / c.time_s if c.time_s else float("nan")
        table.add_row(
            str(i + 1),
            format_time(c.time_s),
            f"{speed:.2f}x",
            Text(c.title),
            Text("; ".join(str(s) for s in c.steps) or "(as written)"),
        )
    console().print(table)
    return code


_INTERRUPTED = 130
"""The exit code of a command Ctrl-C ended (as `cocoviz.cli.main` returns it)."""


class _StopOnInterrupt:
    """While a tune runs, the first Ctrl-C asks it to stop (it then returns the best
    schedules found so far); a second one interrupts as usual. Only the main thread
    receives signals: elsewhere nothing is installed."""

    def __init__(self) -> None:
        self.stop = False
        self._previous: Any = None

    def requested(self) -> bool:
        return self.stop

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        self.stop = True
        signal.signal(signal.SIGINT, self._previous)

    def __enter__(self) -> _StopOnInterrupt:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class _TuneBar:
    """The progress of a tune on stderr (a terminal's only): candidates evaluated,
    regions done and an estimate of the time left, drawn once the tune has run for
    `_PROGRESS_AFTER_S` and cleared when it ends."""

    _STEPS = 1000

    def __init__(self, name: str) -> None:
        self.name = name
        self.live: Any = None
        self.task: Any = None

    def update(self, p: Any) -> None:
        if self.live is None:
            if p.elapsed_s < _PROGRESS_AFTER_S:
                return
            from rich.progress import BarColumn, Progress, TextColumn

            self.live = Progress(
                TextColumn("tuning {task.description}"),
                BarColumn(bar_width=20),
                TextColumn("{task.fields[evaluated]} candidates"),
                TextColumn("{task.fields[regions]}"),
                TextColumn("{task.fields[elapsed]}"),
                TextColumn("{task.fields[left]}"),
                console=console(stderr=True),
                transient=True,
            )
            self.task = self.live.add_task(
                self.name, total=self._STEPS, evaluated=0, regions="", elapsed="", left=""
            )
            self.live.start()
        left = p.remaining_s
        done = p.elapsed_s / (p.elapsed_s + left) if left is not None else 0.0
        if p.regions_done >= p.regions:
            done = 1.0
        if p.phase == "check":
            note = "checking the best"
        else:
            note = "" if left is None else f"about {_duration(left)} left"
        self.live.update(
            self.task,
            completed=int(done * self._STEPS),
            evaluated=p.evaluated,
            regions=f"regions {p.regions_done}/{p.regions}",
            elapsed=_duration(p.elapsed_s),
            left=note,
        )

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


_SWEEP_MAX_LOG2 = 40
"""The largest size a sweep reaches (2^40): past it every tensor is beyond any GPU."""


def _sweep_size(text: str, spec: str) -> int:
    """``2^k`` or a decimal power of two."""
    t = text.strip()
    base, caret, exp = t.partition("^")
    if caret:
        if base.strip() != "2" or not (exp.strip().isascii() and exp.strip().isdigit()):
            raise UsageError(
                f"--sweep: '{text}' is not a size (write 2^k or a power of two such as 65536)"
            )
        k = int(exp.strip()[:4])
        if len(exp.strip()) > 3 or k > _SWEEP_MAX_LOG2:
            raise UsageError(
                f"--sweep {spec}: 2^{exp.strip()} is too large",
                hint=f"sweeps go up to 2^{_SWEEP_MAX_LOG2}",
            )
        return 1 << k
    if not (t.isascii() and t.isdigit()) or int(t[:20]) < 1:
        raise UsageError(
            f"--sweep: '{text}' is not a size (write 2^k or a power of two such as 65536)"
        )
    if len(t) > 13 or int(t) > 1 << _SWEEP_MAX_LOG2:
        raise UsageError(
            f"--sweep {spec}: {t} is too large", hint=f"sweeps go up to 2^{_SWEEP_MAX_LOG2}"
        )
    value = int(t)
    if value & (value - 1):
        low = 1 << (value.bit_length() - 1)
        raise UsageError(
            f"--sweep {spec}: {value} is not a power of two",
            hint=f"use 2^{low.bit_length() - 1} ({low}) or 2^{low.bit_length()} ({low * 2})",
        )
    return value


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``NAME=LO..HI`` with powers of two: the name and every power of two from LO to HI."""
    name, eq, span = text.partition("=")
    lo_text, dots, hi_text = span.partition("..")
    name = name.strip()
    if not eq or not dots or not name.isidentifier():
        raise UsageError(
            f"--sweep expects NAME=LO..HI, got '{text[:80]}'",
            hint="for example --sweep N=2^16..2^30 (powers of two)",
        )
    lo, hi = _sweep_size(lo_text, text), _sweep_size(hi_text, text)
    if lo > hi:
        raise UsageError(
            f"--sweep {text}: LO is larger than HI", hint=f"write {name}={hi_text}..{lo_text}"
        )
    return name, [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]


def _pow2(value: int) -> str:
    return f"2^{value.bit_length() - 1}" if value & (value - 1) == 0 else str(value)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from cocoviz.cli.options import resolve_program_path
    from cocoviz.errors import InputError, did_you_mean
    from cocoviz.ir.lower import RanksOverride, load_file, parse_defines
    from cocoviz.ir.nodes import Program
    from cocoviz.schedule.tune import sweep
    from cocoviz.timefmt import format_time

    if args.output:
        raise UsageError("-o writes one schedule; it does not combine with --sweep")
    dim, values = parse_sweep(args.sweep)
    defines = parse_defines(getattr(args, "defines", None))
    if dim in defines:
        raise UsageError(f"--sweep {dim} and -D {dim} both set {dim}; drop one")
    program = load_args_program(args)  # the file's own errors first, and its dimensions
    dims = program.shape_env
    if dim not in dims:
        known = ", ".join(dims) or "none"
        raise InputError(
            f"--sweep: {program.name} has no dimension '{dim}' (its dimensions: {known})",
            hint=did_you_mean(dim, dims),
        )
    hw = args_hardware(args)
    ranks = RanksOverride.parse(args.ranks) if args.ranks else None
    path = resolve_program_path(args.file)

    def load(value: int) -> Program:
        return load_file(path, {**defines, dim: value}, ranks)

    result = sweep(load, dim, values, hw, collectives=args.collectives)
    if args.json:
        print(
            json.dumps(
                {
                    "program": result.program,
                    "hardware": hw.name,
                    "collectives": args.collectives,
                    "dimension": dim,
                    "points": [
                        {
                            "value": pt.value,
                            "baseline_s": pt.baseline_s,
                            "best": {
                                "name": pt.best.name,
                                "block": pt.best.block,
                                "time_s": pt.best.time_s,
                                "steps": list(pt.best.steps),
                            },
                            "canonical": [{"name": n, "time_s": t} for n, t in pt.canonical],
                            "winner": pt.winner,
                            "decomposed": _candidate_json(pt.decomposed),
                            "undecomposed": _candidate_json(pt.undecomposed),
                        }
                        for pt in result.points
                    ],
                    "decompose_pays_at": result.decompose_pays_at,
                    "decompose_pays_from": result.decompose_pays_from,
                    "crossovers": [
                        {"value": c.value, "winner": c.winner, "loser": c.loser}
                        for c in result.crossovers
                    ],
                },
                indent=2,
            )
        )
        return ExitCode.OK
    from rich.table import Table
    from rich.text import Text

    titles = list(dict.fromkeys(n for pt in result.points for n, _ in pt.canonical))
    table = Table(
        title=f"{result.program} on {hw.name}, {program.grid.world} ranks: sweep of {dim}",
        title_justify="left",
    )
    table.add_column(dim, justify="right")
    table.add_column("best (tuned)")
    for t in titles:
        table.add_column(Text(t), justify="right")
    for pt in result.points:
        times = dict(pt.canonical)
        cells = []
        for t in titles:
            cell = format_time(times[t]) if t in times else "-"
            cells.append(Text(cell, style="bold") if t == pt.winner else Text(cell))
        speed = pt.baseline_s / pt.best.time_s if pt.best.time_s else float("nan")
        table.add_row(
            _pow2(pt.value),
            Text(f"{pt.best.title} {format_time(pt.best.time_s)} ({speed:.2f}x)"),
            *cells,
        )
    console().print(table)
    crossings = result.crossovers
    if not crossings and result.points:
        print(
            f"{result.points[0].winner} is the fastest canonical schedule at every size "
            f"from {dim} = {_pow2(values[0])} to {_pow2(values[-1])} on {hw.name}"
        )
    for c in crossings:
        print(f"{c.winner} beats {c.loser} from {dim} = {_pow2(c.value)} on {hw.name}")
    line = _decompose_line(result, dim, hw.name)
    if line:
        print(line)
    return ExitCode.OK


def _candidate_json(c: Any) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"name": c.name, "block": c.block, "time_s": c.time_s, "steps": list(c.steps)}


def _decompose_line(result: Any, dim: str, hw: str) -> str | None:
    """Where the tuner's best decomposed schedule (``decompose``) starts to beat every
    schedule without one; None when decompose was legal at no size."""
    from cocoviz.timefmt import format_time

    if not result.decompose_tried:
        return None
    points = result.points
    first, last = _pow2(points[0].value), _pow2(points[-1].value)
    start = result.decompose_pays_from
    if start is not None:
        pt = next(p for p in points if p.value == start)
        dec, plain = pt.decomposed, pt.undecomposed
        where = f"from {dim} = {_pow2(start)}" if start != points[0].value else "at every size"
        return (
            f"decompose pays {where} on {hw}: {dec.name} {format_time(dec.time_s)} vs "
            f"{plain.name} {format_time(plain.time_s)} at {dim} = {_pow2(start)}"
        )
    some = result.decompose_pays_at
    if some:
        at = ", ".join(_pow2(v) for v in some)
        return f"decompose pays only at {dim} = {at} on {hw} (not up to {dim} = {last})"
    return f"decompose does not pay at any size from {dim} = {first} to {last} on {hw}"


# ---------------------------------------------------------------------------------------
# model-table


_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, option: str) -> int:
    """`8`, `64K`, `16M`, `16G` (binary units, as nccl-tests reads -b/-e)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in _SUFFIX else ""
    number = t[:-1] if unit else t
    if not (number.isascii() and number.isdigit() and len(number) <= 15) or int(number) < 1:
        raise UsageError(f"{option} expects a size such as 8, 64K, 16M or 16G, got '{text}'")
    return int(number) * _SUFFIX[unit]


def cmd_model_table(args: argparse.Namespace) -> int:
    from cocoviz.sim.collectives import CostModelError
    from cocoviz.sim.model_table import format_table, model_table, table_title

    hw = args_hardware(args)
    ranks = args.ranks if args.ranks is not None else hw.gpus_per_node
    if ranks < 1:
        raise UsageError("--ranks needs a positive count")
    lo = parse_size(args.min_bytes, "--min-bytes")
    hi = parse_size(args.max_bytes, "--max-bytes")
    if lo > hi:
        raise UsageError(
            f"--min-bytes ({args.min_bytes}) is larger than --max-bytes ({args.max_bytes})",
            hint="the sweep doubles from -b up to -e",
        )
    try:
        rows = model_table(
            hw,
            args.coll,
            ranks,
            args.algo,
            proto=args.proto,
            ranks_per_node=args.ranks_per_node,
            dtype=args.dtype,
            min_bytes=lo,
            max_bytes=hi,
        )
        title = table_title(
            hw, args.coll, ranks, args.algo, proto=args.proto, ranks_per_node=args.ranks_per_node
        )
    except CostModelError as err:
        raise UsageError(str(err)) from None
    if args.json:
        print(
            json.dumps(
                {
                    "title": title,
                    "hardware": hw.name,
                    "collective": args.coll,
                    "ranks": ranks,
                    "rows": [
                        {
                            "size": r.size,
                            "count": r.count,
                            "type": r.dtype,
                            "redop": r.redop,
                            "root": r.root,
                            "time_us": r.time_us,
                            "algbw": r.alg_bw,
                            "busbw": r.bus_bw,
                            "algo": r.algo,
                            "proto": r.proto,
                        }
                        for r in rows
                    ],
                },
                indent=2,
            )
        )
    else:
        print(format_table(rows, title=title), end="")
    return ExitCode.OK
