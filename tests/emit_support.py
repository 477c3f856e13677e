"""Shared helpers of the emitter tests: sample programs at small sizes, their canonical
schedules, building emitted trees (each distinct source tree once), tool requirements."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
from compile_cache import cached_compiler
from conftest import need_tool

from cocoviz import samples
from cocoviz.emit.emitter import emit
from cocoviz.emit.toolchain import find_toolchain
from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.ir.nodes import Program, unscheduled
from cocoviz.schedule import apply_block, find_block

SMALL: dict[str, dict[str, int]] = {
    "adam": {"N": 1024},
    "lamb": {"N": 1024},
    "sgd": {"N": 1024},
    "megatron_mlp": {"B": 2, "S": 8, "H": 16},
    "megatron_attention_out": {"B": 2, "S": 8, "H": 16},
    "pipeline_stage": {"B": 2, "S": 8, "H": 16},
    "transformer_block": {"B": 2, "S": 8, "H": 16},
    "ulysses_attention": {"S": 64, "NH": 8, "D": 8},
    "moe_layer": {"R": 8, "T": 16, "E": 8, "C": 4, "H": 16, "F": 32},
    "moe_routed": {"R": 8, "T": 16, "E": 8, "C": 4, "H": 16, "F": 32},
    "megatron_sp_block": {"S": 16, "B": 2, "H": 16},
    "zero3_layer": {"T": 16, "H": 16, "F": 16},
    "zero1_tp_mlp": {"B": 8, "H": 16, "F": 32},
}
"""-D sizes small enough to run on 4 CPU ranks in a second, large enough for every
schedule's divisibility rules (chunks=4 of 4 ranks, whole rows per chunk)."""


def small_ranks(name: str) -> RanksOverride:
    if name == "zero1_tp_mlp":
        return RanksOverride.parse("dp=2,tp=2")  # a dp x tp grid (docs/language.md, rank grids)
    return RanksOverride.parse("tp=2,pp=2" if name == "pipeline_stage" else "4")


def cases() -> list[tuple[str, str]]:
    """Every (sample, canonical schedule)."""
    out = []
    for name in samples.names():
        p = load_file(samples.path(name))
        out.extend((name, b.name) for b in p.schedules)
    return out


def scheduled(
    name: str, schedule: str, small: bool = True, ranks: str | None = None
) -> tuple[Program, Program]:
    """(scheduled program, unscheduled program) of a sample (`ranks`: a --ranks override)."""
    if small:
        r = RanksOverride.parse(ranks) if ranks else small_ranks(name)
        p0 = load_file(samples.path(name), SMALL[name], r)
    else:
        p0 = load_file(samples.path(name))
    return apply_block(p0, find_block(p0, schedule)), unscheduled(p0)


def emit_files(
    name: str,
    schedule: str,
    target: str,
    collectives: str = "nccl",
    small: bool = True,
    ranks: str | None = None,
) -> dict[str, str]:
    p, ref = scheduled(name, schedule, small, ranks)
    steps = [str(s) for s in find_block(load_file(samples.path(name)), schedule).steps]
    out = emit(
        p,
        ref,
        target=target,  # type: ignore[arg-type]
        collectives=collectives,  # type: ignore[arg-type]
        schedule_name=schedule,
        schedule_steps=steps,
    )
    return out.files


def write(directory: Path, files: Mapping[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for n, text in files.items():
        (directory / n).write_text(text)
    (directory / "run.sh").chmod(0o755)


def need_mpicxx() -> None:
    tc = find_toolchain()
    need_tool(tc.mpi is not None and shutil.which("make"), "mpicxx and make", mpi=True)


def need_nvcc() -> None:
    tc = find_toolchain()
    missing = [*tc.missing("cuda"), *([] if shutil.which("make") else ["make"])]
    need_tool(not missing, "nvcc, NCCL, cuBLAS, MPI and make (missing: " + "; ".join(missing) + ")")


def source_key(files: Mapping[str, str], exts: tuple[str, ...]) -> str:
    """Hash of the files that determine the binary (not the manifest or comments elsewhere)."""
    h = hashlib.sha256()
    for n in sorted(files):
        if n.endswith(exts):
            code = [ln for ln in files[n].splitlines() if not ln.lstrip().startswith("//")]
            h.update(n.encode() + b"\0" + "\n".join(code).encode() + b"\0")
    return h.hexdigest()[:16]


def make(directory: Path, *extra: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(directory), "-j2", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def diagnostics(res: subprocess.CompletedProcess[str]) -> list[str]:
    """Warning and error lines of a build."""
    return [
        ln
        for ln in (res.stdout + res.stderr).splitlines()
        if "warning" in ln.lower() or "error" in ln.lower()
    ]


AVG_PROGRAM = (Path(__file__).parent / "programs" / "avg_int.coco").read_text()
"""`avg` collectives on i32 (negative values, sums that overflow i32), f16 (sums that
overflow f16) and f32, plain, chunked and fused: integer `avg` truncates toward zero
after an exact sum (docs/semantics-notes.md)."""


def text_programs(
    text: str, schedule: str | None, ranks: str | None = None
) -> tuple[Program, Program]:
    """(scheduled, unscheduled) of a program given as text (`ranks`: a --ranks override)."""
    p0 = load_program(text, "<test>", None, RanksOverride.parse(ranks) if ranks else None)
    p = apply_block(p0, find_block(p0, schedule)) if schedule else p0
    return p, unscheduled(p0)


def emit_text(
    text: str,
    schedule: str | None,
    target: str,
    collectives: str = "nccl",
    ranks: str | None = None,
) -> dict[str, str]:
    p, ref = text_programs(text, schedule, ranks)
    out = emit(
        p,
        ref,
        target=target,  # type: ignore[arg-type]
        collectives=collectives,  # type: ignore[arg-type]
        schedule_name=schedule,
    )
    return out.files


def compare_dumps(program: Program, dump: Path) -> None:
    """Every value dumped by `--dump` (every output, and every updated input by the
    input's name: cocoviz.exec.dumps) equals the numpy reference within its dtype's
    tolerance, and the tree dumped nothing else."""
    from cocoviz import numerics as nm
    from cocoviz.exec.dumps import dumped_values
    from cocoviz.exec.reference import run_reference

    ref = run_reference(program, 0)
    values = dumped_values(program)
    assert sorted(f.name for f in dump.glob("*.npy")) == sorted(f"{d.name}.npy" for d in values)
    for d in values:
        dtype = program.type_of(d.stage).dtype.value
        got = nm.load_npy(dump / f"{d.name}.npy", dtype)
        want = ref.global_value(d.stage)
        assert got.shape == want.shape
        cmp = nm.compare(got, want, dtype)
        assert cmp.ok, f"{d.name}: {cmp.describe()}"


def check_tree_report(directory: Path, seed: int = 0) -> dict[str, object]:
    """`cocoviz check-tree DIR --no-build --json` on a built tree: it must pass (exit 0:
    its --check, and every dumped value against the reference, bit for bit where exact);
    returns the report."""
    import contextlib
    import io
    import json

    from cocoviz.cli.check_tree import check_tree
    from cocoviz.errors import CocovizError

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = check_tree(directory, seed=seed, no_build=True, as_json=True)
    except CocovizError as err:
        pytest.fail(f"check-tree {directory}: {err}\n{out.getvalue()[-6000:]}")
    assert rc == 0
    report: dict[str, object] = json.loads(out.getvalue())
    assert report["ok"] is True
    return report


EMU_SOURCES = Path(__file__).resolve().parent.parent / "cocoviz" / "emulation"


def emulation_lib(cache: Path) -> Path:
    """The emulation library (cocoviz/emulation/src), built once per source hash and shared
    by every test and xdist worker through a lock file in `cache`."""
    import fcntl

    need_mpicxx()
    h = hashlib.sha256()
    for f in sorted(EMU_SOURCES.rglob("*")):
        if f.is_file() and f.suffix in (".h", ".cpp"):
            h.update(str(f.relative_to(EMU_SOURCES)).encode() + b"\0" + f.read_bytes())
    key = h.hexdigest()[:16]
    cache.mkdir(parents=True, exist_ok=True)
    lib_dir = cache / f"lib-{key}"
    lib = lib_dir / "emu" / "libcocoviz_emu.a"
    with open(cache / f"lib-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
            # the library rule of an emitted tree's own Makefile builds it
            write(lib_dir, emit_files("sgd", "fused", "cuda", ranks="2"))
            res = make(lib_dir, "emu/libcocoviz_emu.a", f"EMU_HOME={EMU_SOURCES}")
            assert res.returncode == 0, res.stdout + res.stderr
    return lib


def build_emulated_program(program: Path, out: Path, cache: Path) -> Path:
    """A hand-written CUDA test program (tests/programs/*.cu) built against the emulation
    as `out`, warning-free."""
    from cocoviz.emit.toolchain import find_toolchain

    lib = emulation_lib(cache)
    tc = find_toolchain()
    assert tc.mpi is not None
    cmd = [str(tc.mpi.mpicxx), "-std=c++17", "-O0", "-Wall", "-Wno-unknown-pragmas"]
    cmd += ["-DCOCOVIZ_EMULATION", f"-I{EMU_SOURCES / 'include'}", "-x", "c++", str(program)]
    cmd += ["-x", "none", str(lib), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    return out


EMU_TEST_FLAGS = "EMU_CXXFLAGS=-std=c++17 -O0 -Wall -Wno-unknown-pragmas"
"""Emulation builds in the tests: -O0 compiles twice as fast, and the sizes are small."""


def emulated_tree_key(files: Mapping[str, str], lib: Path) -> str:
    """A tree's emulation build: its sources and the library (whose directory name is the
    hash of the emulation's sources), so a changed emulation builds and runs trees anew."""
    return source_key(files, (".cu", ".h", ".cuh", "run.sh")) + "-" + lib.parent.parent.name


def build_emulated(files: Mapping[str, str], cache: Path) -> Path:
    """The emulation build (make emulate) of an emitted CUDA tree, once per distinct source
    tree, and each of its objects once per distinct source file (tests/compile_cache.py:
    most programs' source is the same in both --collectives modes, main.cu is not): returns
    the directory holding <stem>-emu and run.sh."""
    import fcntl

    lib = emulation_lib(cache)
    key = emulated_tree_key(files, lib)
    d = cache / f"tree-{key}"
    with open(cache / f"tree-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / ".built").exists():
            write(d, files)
            emu_cxx = cached_compiler("$(MPICXX)", cache / "objects")
            res = make(d, "emulate", f"EMU_LIB={lib}", EMU_TEST_FLAGS, f"EMU_CXX={emu_cxx}")
            assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stdout + res.stderr
            assert not diagnostics(res), "\n".join(diagnostics(res))
            (d / ".built").write_text("")
    return d
