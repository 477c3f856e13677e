"""`cocoviz check-tree DIR`: run an emitted tree on inputs this command draws, run the numpy
reference on the same inputs, and compare every dumped value (docs/codegen.md, "Inputs,
dumps and check-tree").

The tree stays standalone: it reads `--inputs DIR` and writes `--dump DIR` like any user
would; the program it was emitted from travels with it as `program.coco`, and the
comparison is this command's. A value whose computation is exact everywhere (no sum whose
order depends on where it runs, no call into a math library: `cocoviz.exec.dumps`) must
be bit-identical; any other is compared with its dtype's tolerance (docs/semantics-notes.md,
"Tolerances and memory").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cocoviz import fsio
from cocoviz.cli.options import _seed, add_json_option, add_reference_limits, seconds_in
from cocoviz.errors import ExitCode, InputError, MismatchError, UsageError

if TYPE_CHECKING:
    import numpy as np

    from cocoviz.ir.nodes import Program

MAX_MANIFEST_BYTES = 1 << 20
"""A manifest.json check-tree reads holds at most this (an emitted one is a few KB)."""

PROGRAM_FILE = "program.coco"

KEEP_MARKER = ".cocoviz-check-tree"
"""Written into a --keep directory: its inputs/, tree/ and reference/ are check-tree's."""
"""The unscheduled program an emitted tree was lowered from, with its sizes, ranks and the
schedule's steps as the block `emitted` (written by `cocoviz emit`)."""

TREE_EXIT = {
    2: "refused its arguments or an --inputs file",
    3: "the emulation reported a rule violation, a hazard or a hang",
    4: "its own --check (the scheduled against the unscheduled program) failed",
    5: "run.sh refused a binary built from other sources (run make, or drop --no-build)",
}
"""What an emitted program's exit codes mean (docs/codegen.md, "Building and running")."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check-tree",
        help="run an emitted tree against the numpy reference on inputs drawn here",
        description="Run the emitted tree in DIR (the CPU target, or the CUDA target under "
        "its CPU emulation: run.sh --emulate) with --inputs drawn here (signed, of varied "
        "magnitude) and --dump, run the numpy reference of the program it was emitted from "
        "on the same inputs, and compare every output and every updated input: bit for bit "
        "where every operation it depends on rounds the same everywhere, within its "
        "dtype's tolerance where a sum's order or a math library differs. The tree's own "
        "--check runs too. Exit 0 when everything agrees; 4 on any mismatch, emulation "
        "rule, hazard or failed --check, naming the value, the first differing element and "
        "both numbers.",
    )
    p.add_argument("directory", metavar="DIR", help="a tree written by cocoviz emit")
    p.add_argument(
        "--seed", type=_seed, default=0, metavar="S", help="seed of the drawn inputs and dropout"
    )
    p.add_argument(
        "--keep",
        metavar="WORK",
        help="write the inputs, the tree's dump and the reference's dump under WORK "
        "(WORK/inputs, WORK/tree, WORK/reference) and keep them (a new or empty directory, "
        "or one an earlier --keep wrote)",
    )
    p.add_argument(
        "--timeout",
        type=seconds_in(),
        default=600.0,
        metavar="S",
        help="stop the tree after S seconds (default 600)",
    )
    p.add_argument(
        "--no-build",
        action="store_true",
        help="do not run make first (by default make, or make emulate for CUDA, brings the "
        "binary up to date; a missing binary is then an error)",
    )
    add_reference_limits(p)
    add_json_option(p)
    p.set_defaults(handler=cmd_check_tree)


@dataclass(frozen=True)
class Row:
    """One compared value."""

    name: str
    kind: str
    dtype: str
    rule: str
    """"exact" or "tolerance"."""
    why: str
    """For a tolerance: the operation that makes the value's last bits depend on where it
    runs (`cocoviz.exec.dumps.inexact_reason`)."""
    ok: bool
    max_abs: float = 0.0
    n_bad: int = 0
    note: str = ""
    """Where it differs: the first differing element and both numbers."""


@dataclass(frozen=True)
class Tree:
    directory: Path
    target: str
    binary: Path
    program: Program


def _read_tree(directory: str) -> Tree:
    from cocoviz.ir.lower import load_file

    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: no such directory")
    d = d.resolve()
    man = d / "manifest.json"
    if not man.exists():
        raise InputError(
            f"{d}: not a tree cocoviz emitted (no manifest.json)",
            hint="write one with 'cocoviz emit FILE -o DIR'",
        )
    try:
        # bounded, regular files only: a crafted tree cannot hand it a FIFO or a huge file
        data = json.loads(fsio.read_text(man, "manifest", MAX_MANIFEST_BYTES))
    except RecursionError:
        raise InputError(f"{man}: not a manifest cocoviz wrote (nested too deep)") from None
    except ValueError as err:
        raise InputError(f"{man}: not readable as cocoviz's manifest ({err})") from None
    if not isinstance(data, dict) or data.get("tool") != "cocoviz":
        raise InputError(f"{man}: not a manifest cocoviz wrote")
    target = data.get("target")
    if target not in ("cpu", "cuda"):
        raise InputError(f"{man}: unknown target {target!r}")
    src = d / PROGRAM_FILE
    if not src.is_file():
        raise InputError(
            f"{d}: has no {PROGRAM_FILE} (emitted by an older cocoviz)",
            hint="emit the tree again",
        )
    program = load_file(src)
    stem = _stem(d, target)
    binary = d / (f"{stem}-emu" if target == "cuda" else stem)
    return Tree(d, target, binary, program)


def _stem(d: Path, target: str) -> str:
    """The program's file stem: the tree's `<stem>.cu` / `<stem>.cpp` beside main."""
    ext = ".cu" if target == "cuda" else ".cpp"
    stems = sorted(p.stem for p in d.glob(f"*{ext}") if p.name != f"main{ext}")
    if len(stems) != 1:
        raise InputError(f"{d}: expected one program source *{ext} beside main{ext}")
    return stems[0]


def draw_inputs(program: Program, seed: int) -> dict[str, np.ndarray]:
    """The inputs check-tree runs on: the values an emitted program's --check draws in its
    first round (docs/codegen.md): ±k/1024·2^e, k in 1..1024, e in −3..3 (magnitudes
    2^-13..16), unsigned where an input reaches sqrt, rsqrt, log or pow; integers
    ((u & 15) − 8)·2^s, s in 0..7. Global values (``[G, *shape]`` for local inputs,
    ``[D, …]`` of that for inputs local over dp: docs/language.md, rank grids)."""
    import numpy as np

    from cocoviz import numerics as nx
    from cocoviz.emit.lower import unsigned_inputs
    from cocoviz.exec.layout import grid_global_shape

    unsigned = unsigned_inputs(program)
    out: dict[str, np.ndarray] = {}
    for i in program.inputs:
        shape = grid_global_shape(i.ty, program.grid.group, program.grid.dp)
        n = int(np.prod(shape, dtype=np.int64))
        key = nx.mix_scalar(nx.key_for(i.name, seed) ^ nx.mix_scalar(1))
        u = nx.mix(np.arange(n, dtype=np.uint64) ^ np.uint64(key))
        info = nx.dtype_info(i.ty.dtype.value)
        neg = (i.name not in unsigned) & (((u >> np.uint64(50)) & np.uint64(1)) == 1)
        if info.is_float:
            k = ((u >> np.uint64(54)) + np.uint64(1)).astype(np.float64) / 1024.0
            e = ((u >> np.uint64(51)) & np.uint64(7)).astype(np.int64) - 3
            vals = np.ldexp(k, e)
            vals = np.where(neg, -vals, vals)
        else:
            base = (u & np.uint64(15)).astype(np.int64) - (0 if i.name in unsigned else 8)
            vals = base << ((u >> np.uint64(56)) & np.uint64(7)).astype(np.int64)
        out[i.name] = nx.to_dtype(vals, info).reshape(shape)
    return out


def _run_tree(tree: Tree, inputs: Path, dump: Path, seed: int, timeout: float) -> tuple[int, str]:
    """Run the tree's run.sh (with --emulate for CUDA) on `inputs`, dumping into `dump`."""
    argv = [str(tree.directory / "run.sh")]
    if tree.target == "cuda":
        argv.append("--emulate")
    argv += ["--check", "--iters", "0", "--warmup", "0", "--seed", str(seed)]
    argv += ["--inputs", str(inputs), "--dump", str(dump)]
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as err:
        raise InputError(f"{argv[0]}: cannot run it ({err.strerror})") from None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, out + f"\n(stopped after {timeout:g} s: --timeout)"
    return proc.returncode, out


def _ensure_built(tree: Tree, no_build: bool) -> None:
    """`make` (`make emulate` for CUDA) in the tree: nothing to do when the binary is up to
    date, a rebuild when its sources changed (run.sh would refuse a stale binary)."""
    rule = "emulate" if tree.target == "cuda" else "all"
    if no_build:
        if not tree.binary.exists():
            raise UsageError(
                f"{tree.binary}: not built",
                hint=f"run 'make {rule}' in {tree.directory}, or drop --no-build",
            )
        return
    from cocoviz.emit.emitter import build

    build(tree.directory, extra=[] if rule == "all" else [rule])


def _first_difference(
    actual: np.ndarray, expected: np.ndarray, flat: int | None, exact: bool
) -> str:
    """The first differing element (flat index `flat`) with both numbers, and their bit
    patterns when the value must be exact."""
    import numpy as np

    a, b = actual.reshape(-1), expected.reshape(-1)
    flat = flat or 0
    idx = list(map(int, np.unravel_index(flat, expected.shape))) if expected.ndim else []
    x, y = a[flat], b[flat]
    text = f"first at {idx}: tree {x}, reference {y}"
    if exact and a.dtype.kind == "f":
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        text += f" (bits {int(a[flat : flat + 1].view(bits)[0]):#x} vs {int(b[flat : flat + 1].view(bits)[0]):#x})"
    return text


def _outside_normwise(actual: np.ndarray, expected: np.ndarray, dtype: str) -> np.ndarray:
    """Elements outside the tolerance of a value that depends on a sum whose order differs
    (docs/codegen.md): |a − b| ≤ atol + rtol·M, M the largest finite |expected| of the
    array — a sum's rounding error scales with its terms, not with a cancelled result; NaN
    positions must match; integers exactly. The same rule as the trees' --check
    (`compare_normwise` in cocoviz_runtime.h)."""
    import numpy as np

    from cocoviz import numerics as nx

    info = nx.dtype_info(dtype)
    a = actual.reshape(-1)
    b = expected.reshape(-1)
    if not info.is_float:
        return a != b
    af, bf = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(bf)
    m = float(np.max(np.abs(bf[finite]))) if finite.any() else 0.0
    tol = info.tolerance.atol + info.tolerance.rtol * m
    an, bn = np.isnan(af), np.isnan(bf)
    with np.errstate(invalid="ignore", over="ignore"):
        close = (af == bf) | (np.isfinite(af) & finite & (np.abs(af - bf) <= tol))
    return (an != bn) | (~(an & bn) & ~close)


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: identical bits, or both NaN (a NaN's payload is not a result)."""
    import numpy as np

    if a.dtype.kind != "f":
        return a == b
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    same = a.view(bits) == b.view(bits)
    return same | (np.isnan(a) & np.isnan(b))


def compare_dumps(program: Program, tree_dump: Path, reference: dict[str, np.ndarray]) -> list[Row]:
    """Every dumped value of the tree against the reference's (`reference`: dump name →
    global value), exactly or within the dtype tolerance as `inexact_reason` decides."""
    import numpy as np

    from cocoviz import numerics as nx
    from cocoviz.exec.dumps import dumped_values, inexact_reason
    from cocoviz.exec.verify import compare_chunked

    rows: list[Row] = []
    for d in dumped_values(program):
        dtype = program.type_of(d.stage).dtype.value
        why = inexact_reason(program, d.stage)
        rule = "exact" if why is None else "tolerance"
        f = tree_dump / f"{d.name}.npy"
        expected = reference[d.name]
        if not f.is_file():
            rows.append(
                Row(d.name, d.kind, dtype, rule, why or "", False, note="not dumped by the tree")
            )
            continue
        try:
            got = nx.load_npy(f, dtype)
        except (OSError, ValueError) as err:
            rows.append(
                Row(d.name, d.kind, dtype, rule, why or "", False, note=f"unreadable: {err}")
            )
            continue
        if got.shape != expected.shape:
            note = f"shape {list(got.shape)}, the reference's {list(expected.shape)}"
            rows.append(Row(d.name, d.kind, dtype, rule, why or "", False, note=note))
            continue
        res = compare_chunked(got, expected, dtype)
        first: int | None = None
        if why is None:
            bad = ~_same_bits(got.reshape(-1), expected.reshape(-1))
            n_bad = int(np.count_nonzero(bad))
            first = int(np.argmax(bad)) if n_bad else None
        else:
            bad = _outside_normwise(got, expected, dtype)
            n_bad = int(np.count_nonzero(bad))
            first = int(np.argmax(bad)) if n_bad else None
        ok = n_bad == 0
        note = (
            ""
            if ok
            else f"{n_bad} element(s) differ, "
            + _first_difference(got, expected, first, why is None)
        )
        rows.append(Row(d.name, d.kind, dtype, rule, why or "", ok, res.max_abs, n_bad, note))
    return rows


def check_tree(
    directory: str | Path,
    *,
    seed: int = 0,
    timeout: float = 600.0,
    keep: str | None = None,
    no_build: bool = False,
    as_json: bool = False,
    max_mem: int | None = None,
    max_work: int | None = None,
) -> int:
    """`cocoviz check-tree DIR` (exit 0, or MismatchError: exit 4)."""
    return cmd_check_tree(
        argparse.Namespace(
            directory=str(directory),
            seed=seed,
            timeout=timeout,
            keep=keep,
            no_build=no_build,
            json=as_json,
            max_mem=max_mem,
            max_work=max_work,
        )
    )


def cmd_check_tree(args: argparse.Namespace) -> int:
    from cocoviz import numerics as nx
    from cocoviz.exec.dumps import dumped_values
    from cocoviz.exec.reference import check_limits, run_reference

    tree = _read_tree(args.directory)
    program = tree.program
    # before building or running anything: the reference must fit its bounds, and --keep
    # must be a directory check-tree may write into
    check_limits(program, args.max_mem, max_work=args.max_work)
    if args.keep:
        work = fsio.claim_directory(
            Path(args.keep), KEEP_MARKER, "--keep", "written by cocoviz check-tree\n", force=None
        )
    _ensure_built(tree, args.no_build)
    inputs = draw_inputs(program, args.seed)
    if not args.keep:
        work = Path(tempfile.mkdtemp(prefix="cocoviz-check-tree-"))
    try:
        for sub in ("inputs", "tree", "reference"):
            if (work / sub).exists():
                shutil.rmtree(work / sub)  # an earlier check-tree's (the marker says so)
            (work / sub).mkdir(parents=True)
        for name, a in inputs.items():
            nx.save_npy(work / "inputs" / f"{name}.npy", a, program.input(name).ty.dtype.value)
        res = run_reference(
            program, args.seed, inputs, max_mem=args.max_mem, max_work=args.max_work
        )
        reference = {d.name: res.global_value(d.stage) for d in dumped_values(program)}
        for d in dumped_values(program):
            nx.save_npy(
                work / "reference" / f"{d.name}.npy",
                reference[d.name],
                program.type_of(d.stage).dtype.value,
            )
        # the tree's dump directory is its own to create
        (work / "tree").rmdir()
        rc, log = _run_tree(tree, work / "inputs", work / "tree", args.seed, args.timeout)
        rows = compare_dumps(program, work / "tree", reference) if rc in (0, 4) else []
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return _report(args, tree, rc, log, rows)


def _report(args: argparse.Namespace, tree: Tree, rc: int, log: str, rows: list[Row]) -> int:
    tree_ok = rc == 0
    ok = tree_ok and all(r.ok for r in rows)
    what = "CUDA under the emulation" if tree.target == "cuda" else "CPU target"
    if args.json:
        print(
            json.dumps(
                {
                    "tree": str(tree.directory),
                    "program": tree.program.name,
                    "target": tree.target,
                    "seed": args.seed,
                    "tree_exit": rc,
                    "tree_log": log.splitlines()[-40:] if not tree_ok else [],
                    "values": [asdict(r) for r in rows],
                    "ok": ok,
                },
                indent=2,
            )
        )
    else:
        print(f"check-tree {tree.directory} ({tree.program.name}, {what}, seed {args.seed})")
        for r in rows:
            verdict = "ok" if r.ok else f"MISMATCH ({r.note})"
            print(
                f"  {r.name:<12} {r.kind:<13} {r.dtype:<4} {r.rule:<9} max abs {r.max_abs:<9.3g} {verdict}"
            )
        for r in rows:
            if r.rule == "tolerance":
                print(f"  tolerance for {r.name}: {r.why}")
        if not tree_ok:
            meaning = TREE_EXIT.get(rc, "it failed" if rc != -1 else "it ran past --timeout")
            print(f"  the tree exited {rc}: {meaning}; its last lines:")
            for line in log.splitlines()[-20:]:
                print(f"    {line}")
        print("ok: every value agrees" if ok else "mismatch")
    if not ok:
        bad = [r.name for r in rows if not r.ok]
        parts = []
        if bad:
            parts.append("differs from the reference: " + ", ".join(bad))
        if not tree_ok:
            parts.append(f"the tree exited {rc}")
        raise MismatchError(f"{tree.directory}: " + "; ".join(parts))
    return ExitCode.OK
