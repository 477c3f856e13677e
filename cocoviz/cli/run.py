"""`cocoviz run`: execute a program and its schedule — in-process simulated ranks (the
reference) by default, or one real MPI process per rank with `--mpi`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocoviz.cli.inspect import apply_named_schedule
from cocoviz.cli.options import (
    add_json_option,
    add_program_options,
    add_reference_limits,
    int_in,
    load_args_program,
    seconds_in,
)
from cocoviz.errors import ExitCode, MismatchError, UsageError
from cocoviz.exec.dumps import dumped_values
from cocoviz.ir.nodes import Program

if TYPE_CHECKING:
    import numpy as np

DUMP_MARKER = ".cocoviz-dump"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="execute a program (simulated ranks, or real MPI processes with --mpi)",
        description="Execute FILE with its schedule. By default the ranks are simulated in "
        "one process (the numpy reference); with --mpi every rank is a real process under "
        "mpiexec holding only its own storage, and the schedule's communication structure "
        "(fused groups on shards, overlapped groups as chunked non-blocking collectives) "
        "is what executes. Outputs are compared with the reference of the unscheduled "
        "program unless --no-check.",
    )
    add_program_options(p)
    p.add_argument("--mpi", action="store_true", help="run one MPI process per rank")
    p.add_argument("--inputs", metavar="DIR", help="read inputs from DIR/NAME.npy (global shapes)")
    p.add_argument(
        "--dump",
        metavar="DIR",
        help="write every output (DIR/<output>.npy) and the new value of every updated "
        "input, named by the input (DIR/<input>.npy)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="let --dump write into a directory cocoviz did not create, and --trace "
        "overwrite a file that is not a cocoviz trace",
    )
    p.add_argument("--no-check", action="store_true", help="do not compare with the reference")
    p.add_argument(
        "--trace", metavar="OUT.json", help="write the measured timeline (Perfetto / Chrome trace)"
    )
    p.add_argument(
        "--iters",
        type=int_in(1, 1_000_000),
        default=1,
        metavar="N",
        help="with --mpi: time N iterations after a warm-up; the summary (makespan, "
        "communication, exposed, overlap, per-stage table) is all of one iteration, the "
        "one whose makespan is the median",
    )
    p.add_argument(
        "--timeout",
        type=seconds_in(),
        default=600.0,
        metavar="S",
        help="stop an MPI run after S seconds",
    )
    p.add_argument(
        "--hostfile",
        metavar="FILE",
        help="with --mpi: place the ranks on the hosts FILE lists (mpiexec -hostfile; "
        "every host needs this Python and the job's directory)",
    )
    p.add_argument(
        "--mpi-args",
        metavar="ARGS",
        default="",
        help="with --mpi: more arguments for mpiexec, as one shell-quoted string "
        "(e.g. --mpi-args '-genv UCX_TLS tcp')",
    )
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help="with --mpi: allow more ranks than 4 per CPU (at most 1024)",
    )
    add_reference_limits(p)
    add_json_option(p)
    p.set_defaults(handler=cmd_run)


def _mpi_args(text: str) -> list[str]:
    """`--mpi-args`, split as a shell would."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError as err:
        raise UsageError(f"--mpi-args: expected shell words, got {text!r} ({err})") from None


def _check_run_args(args: argparse.Namespace, program: Program) -> None:
    """Usage errors found without reading an input or starting a process."""
    if args.mpi:
        from cocoviz.exec.mpi_run import check_world

        if args.iters < 1:
            raise UsageError("--iters must be at least 1")
        check_world(program, args.oversubscribe)
    else:
        for given, flag in (
            (args.oversubscribe, "--oversubscribe"),
            (args.hostfile, "--hostfile"),
            (args.mpi_args, "--mpi-args"),
        ):
            if given:
                raise UsageError(f"{flag} is for real processes: add --mpi")


def collected_names(program: Program) -> list[str]:
    """The stages a run collects: outputs, then the update stages of updated inputs
    (their new global values)."""
    names: list[str] = []
    for d in dumped_values(program):
        if d.stage not in names:
            names.append(d.stage)
    return names


def _prepare_dump(path: str, force: bool) -> Path:
    """Check and create the --dump directory before the run, so a refusal costs nothing."""
    from cocoviz import fsio

    return fsio.claim_directory(
        Path(path), DUMP_MARKER, "--dump", "written by cocoviz run --dump\n", force=force
    )


def _write_dump(d: Path, program: Program, values: dict[str, Any]) -> None:
    """Write every dumped value (`cocoviz.exec.dumps`: outputs by name, updated inputs by
    the input's name) as DIR/NAME.npy: all staged beside their destinations, then
    renamed into place (no truncated file, no write through a link), under the
    directory's lock."""
    import numpy as np

    from cocoviz import fsio
    from cocoviz import numerics as nx

    def npy(x: Any, dtype: str) -> fsio.Content:
        return lambda sink: np.save(sink, nx.to_dtype(x, nx.dtype_info(dtype)), allow_pickle=False)

    arrays = {
        f"{v.name}.npy": npy(values[v.stage], program.type_of(v.stage).dtype.value)
        for v in dumped_values(program)
    }
    with fsio.locked_directory(d):
        fsio.remove_stale_temporaries(d)
        fsio.replace_files(d, arrays)


def cmd_run(args: argparse.Namespace) -> int:
    from cocoviz import numerics as nx
    from cocoviz.exec.reference import check_limits, run_reference

    original = load_args_program(args)
    _check_run_args(args, original)
    scheduled = apply_named_schedule(args, original)
    names = collected_names(original)
    dump_dir = _prepare_dump(args.dump, args.force) if args.dump else None
    given: dict[str, np.ndarray] | None = None
    if args.inputs:
        import numpy as np

        from cocoviz.exec.mpi_run import load_inputs_dir

        given = {k: np.asarray(v) for k, v in load_inputs_dir(original, args.inputs).items()}

    measured: dict[str, Any] = {}
    if args.mpi:
        from cocoviz.exec.mpi_run import Terminated, run_mpi

        if args.trace:
            from cocoviz.sim.trace import check_trace_path

            check_trace_path(args.trace, force=args.force)

        check_limits(original, args.max_mem, max_work=args.max_work)
        try:
            mrun = run_mpi(
                scheduled,
                names,
                seed=args.seed,
                inputs_dir=args.inputs,
                timeout_s=args.timeout,
                iters=args.iters,
                oversubscribe=args.oversubscribe,
                hostfile=args.hostfile,
                mpi_args=_mpi_args(args.mpi_args),
            )
        except Terminated as stop:  # the run was cleaned up; end as the signal would
            print(f"terminated ({stop})", file=sys.stderr)
            return stop.exit_code
        values = mrun.outputs
        timeline = mrun.timeline(scheduled)
        summ = timeline.summary
        measured = {
            "mode": "mpi",
            "ranks": mrun.world,
            "iters": args.iters,
            "iteration": mrun.iteration,
            "wall_s": mrun.wall_s,
            "makespan_s": mrun.makespan_s,
            "communication_s": summ.comm_s,
            "exposed_communication_s": summ.exposed_comm_s,
            "overlap_fraction": summ.overlap_fraction,
            "critical_rank": summ.critical_rank,
            "stages": [
                {"stage": row.name, "kind": row.kind, "calls": row.calls, "busy_s": row.busy_s}
                for row in summ.stages
            ],
        }
        if args.trace:
            from cocoviz.sim.trace import write_trace

            write_trace(timeline, args.trace, force=args.force)
    else:
        if args.trace:
            raise UsageError("--trace records real processes: add --mpi")
        t0 = time.perf_counter()
        res = run_reference(
            scheduled, args.seed, given, max_mem=args.max_mem, max_work=args.max_work
        )
        values = {n: res.global_value(n) for n in names}
        measured = {
            "mode": "reference",
            "ranks": scheduled.grid.world,
            "wall_s": time.perf_counter() - t0,
        }

    rows: list[dict[str, Any]] = []
    ok = True
    if not args.no_check:
        ref = run_reference(
            original, args.seed, given, max_mem=args.max_mem, max_work=args.max_work
        )
        for v in dumped_values(original):
            ty = original.type_of(v.stage)
            c = nx.compare(values[v.stage], ref.global_value(v.stage), ty.dtype.value)
            ok &= c.ok
            rows.append(
                {
                    "name": v.name,
                    "dtype": ty.dtype.value,
                    "max_abs": c.max_abs,
                    "max_rel": c.max_rel,
                    "ok": c.ok,
                }
            )
    if dump_dir is not None:
        _write_dump(dump_dir, original, values)

    if args.json:
        print(
            json.dumps(
                {
                    "program": original.name,
                    "schedule": args.schedule,
                    **measured,
                    "check": rows,
                    "ok": ok,
                },
                indent=2,
            )
        )
    else:
        _print_text(original, args, measured, rows, dump_dir)
    if not ok:
        bad = [r["name"] for r in rows if not r["ok"]]
        raise MismatchError(
            f"the run's results differ from the reference: {', '.join(bad)}",
            hint="run 'cocoviz verify' on the same schedule to see whether the schedule or the executor is at fault",
        )
    return ExitCode.OK


def _print_text(
    program: Program,
    args: argparse.Namespace,
    m: dict[str, Any],
    rows: list[dict[str, Any]],
    dump: Path | None,
) -> None:
    sched = f" with schedule {args.schedule}" if args.schedule else ""
    print(
        f"{program.name}{sched}: {m['mode']} run on {m['ranks']} ranks, wall {m['wall_s'] * 1e3:.1f} ms"
    )
    if m["mode"] == "mpi":
        if m["iters"] > 1:
            print(f"  iteration {m['iteration'] + 1} of {m['iters']} (the median makespan):")
        print(
            f"  makespan {m['makespan_s'] * 1e3:.3f} ms, communication {m['communication_s'] * 1e3:.3f} ms, "
            f"exposed {m['exposed_communication_s'] * 1e3:.3f} ms, overlap {m['overlap_fraction'] * 100:.0f}%"
        )
        print(f"  {'stage':<20} {'kind':<12} {'calls':>5} {'busy ms':>9}")
        for row in m["stages"]:
            print(
                f"  {row['stage']:<20} {row['kind']:<12} {row['calls']:>5} {row['busy_s'] * 1e3:>9.3f}"
            )
    for r in rows:
        verdict = "ok" if r["ok"] else "MISMATCH"
        print(
            f"  check {r['name']:<16} {r['dtype']:<5} max abs {r['max_abs']:.3g}  max rel {r['max_rel']:.3g}  {verdict}"
        )
    if dump is not None:
        print(f"  wrote {len(dumped_values(program))} arrays to {dump}")
