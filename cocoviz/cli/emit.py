"""`cocoviz emit`: write standalone CUDA/NCCL (or C++/MPI) source for a scheduled program."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cocoviz.cli.options import (
    add_program_options,
    add_reference_limits,
    args_hardware,
    load_args_program,
)
from cocoviz.emit.targets import DEFAULT_TARGET, TARGET_NAMES, target_spec
from cocoviz.errors import ExitCode, UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "emit",
        help="emit CUDA/NCCL + MPI launcher (or C++/MPI) source for a schedule",
        description="Lower the scheduled program to kernels, collectives, streams and events, "
        "and write <program>.cu, main.cu, Makefile, run.sh and manifest.json "
        "(or the C++/MPI equivalents with --target cpu) into DIR.",
    )
    add_program_options(p)
    p.add_argument("-o", "--output", metavar="DIR", required=True, help="output directory")
    p.add_argument(
        "--target",
        choices=TARGET_NAMES,
        default=DEFAULT_TARGET,
        help=f"what to emit (default {DEFAULT_TARGET}): cuda = CUDA + NCCL + cuBLAS with an "
        "MPI launcher, cpu = C++ + MPI + OpenMP",
    )
    p.add_argument(
        "--collectives",
        choices=("nccl", "nccl-device"),
        default="nccl",
        help="fused collectives on NCCL's host API (default) or as one NCCL device-API kernel",
    )
    p.add_argument("--arch", default="sm_90", help="CUDA architecture (sm_80, sm_90, ...)")
    p.add_argument("--build", action="store_true", help="run make in DIR afterwards")
    p.add_argument(
        "--emulate",
        action="store_true",
        help="with --build: build the CPU emulation of the CUDA program (make emulate; no GPU "
        "needed), to run with DIR/run.sh --emulate --check",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="with --build: run 'cocoviz check-tree DIR' on the built tree (the CPU target, "
        "or the CUDA target with --emulate): its --check, and every dumped value against "
        "the numpy reference on the same drawn inputs",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty directory cocoviz did not write",
    )
    add_reference_limits(p)
    p.set_defaults(handler=cmd_emit)


def cmd_emit(args: argparse.Namespace) -> int:
    from cocoviz.emit.emitter import build, check_arch, emit
    from cocoviz.emit.writer import MARKER, write_tree
    from cocoviz.ir.nodes import unscheduled
    from cocoviz.schedule import resolve_schedule, schedule_arg_steps

    gpu = target_spec(args.target).gpu
    if gpu:
        check_arch(args.arch)
    elif args.collectives != "nccl":
        raise UsageError("--collectives applies to --target cuda only")
    if args.emulate and not gpu:
        raise UsageError(
            "--emulate builds the CPU emulation of the CUDA target",
            hint="the cpu target runs on CPUs as it is: drop --emulate",
        )
    if args.emulate and not args.build:
        raise UsageError("--emulate needs --build", hint="add --build")
    if args.check and not args.build:
        raise UsageError("--check runs the built tree: add --build", hint="add --build")
    if args.check and gpu and not args.emulate:
        raise UsageError(
            "--check of the CUDA target runs its CPU emulation: add --emulate",
            hint="on a GPU machine, run DIR/run.sh --check instead",
        )
    program = load_args_program(args)
    hw = args_hardware(args)
    steps = schedule_arg_steps(program, args.schedule) if args.schedule else ()
    scheduled, resolved = resolve_schedule(program, steps, hw)
    reference = unscheduled(program)
    if args.check:
        from cocoviz.exec.reference import check_limits

        # --check runs the tree and the reference at these sizes: refused before any build
        check_limits(program, args.max_mem, max_work=args.max_work)
    out = emit(
        scheduled,
        reference,
        target=args.target,
        collectives=args.collectives,
        arch=args.arch,
        schedule_name=args.schedule,
        schedule_steps=[str(s) for s in resolved],
        seed=args.seed,
        hw=hw,
    )
    res = write_tree(Path(args.output), out.files, force=args.force)
    for entry in res.ignored:
        print(
            f"warning: {res.directory}/{MARKER} lists '{entry}', which is not a file name in "
            "that directory: left alone",
            file=sys.stderr,
        )
    for name in res.kept:
        print(
            f"warning: {res.directory}/{name}: changed since cocoviz wrote it: kept as it is",
            file=sys.stderr,
        )
    if res.kept:
        print("hint: pass --force to overwrite the files you changed", file=sys.stderr)
    print(
        f"{res.directory}: {len(res.written)} file(s) written, {len(res.unchanged)} unchanged"
        + (f", {len(res.removed)} removed" if res.removed else "")
        + (f", {len(res.kept)} kept" if res.kept else ""),
        file=sys.stderr,
    )
    if args.build and args.emulate:
        build(res.directory, extra=["emulate"])
        print(
            f"{res.directory}/{out.binary}-emu: built (emulation; run it with "
            f"{res.directory}/run.sh --emulate --check)",
            file=sys.stderr,
        )
    elif args.build:
        build(res.directory)
        print(f"{res.directory}/{out.binary}: built", file=sys.stderr)
    if args.check:
        from cocoviz.cli.check_tree import check_tree

        return check_tree(
            res.directory, seed=args.seed, max_mem=args.max_mem, max_work=args.max_work
        )
    return ExitCode.OK
