"""Every path of an emitted CUDA tree is exercised by the emulated check (docs/codegen.md,
"Every path exercised"):

- every lowering and device-kernel variant: `run.sh --emulate --check` of an nccl-device
  tree checks its host-API fallback first (COCOVIZ_EMU_DEVICE_API=0), then, where it has
  a multimem (NVLS) variant, the LSA variant (COCOVIZ_NO_MULTIMEM=1), then the run as asked;
- the packed and the element-wise tail paths: tests/programs/tail_sizes.coco has sizes
  that are not multiples of the pack width (a tail after the packs, and shards that start
  misaligned, so whole kernels run element-wise on some ranks);
- a scalar-only build (-DCOCOVIZ_SCALAR_ONLY: every kernel takes its element-wise loop)
  passes the check and dumps the same bits as the packed build;
- the words pack_part assembles for the GPU's st.global.v4 (the emulation's store_pack
  stores them too) are the pack's bytes, for every element size.

Each check compares the dumped outputs with the numpy reference as well, which code both
programs of one binary share (the pack helpers among it) cannot fool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from emit_support import (
    EMU_SOURCES,
    EMU_TEST_FLAGS,
    build_emulated,
    compare_dumps,
    emit_files,
    emit_text,
    emulation_lib,
    make,
    need_mpicxx,
    scheduled,
    text_programs,
)
from test_emit_emulate import run_emulated

from cocoviz.emit.toolchain import find_toolchain
from cocoviz.ir.nodes import Program

PROGRAMS = Path(__file__).parent / "programs"
TAIL = (PROGRAMS / "tail_sizes.coco").read_text()
TEMPLATES = Path(__file__).resolve().parent.parent / "cocoviz" / "templates"
LSA_FIRST = "run.sh: --check of the LSA variant (COCOVIZ_NO_MULTIMEM=1)"
FALLBACK_FIRST = "run.sh: --check of the host-API fallback (COCOVIZ_EMU_DEVICE_API=0)"


def check_and_dump(tree: Path, dump: Path, env: dict[str, str] | None = None) -> str:
    """run.sh --emulate --check --dump: passes; returns stderr."""
    res = run_emulated(
        tree, "--check", "--iters", "1", "--warmup", "0", "--dump", str(dump), env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass", res.stderr
    assert "cocoviz emulation: [" not in res.stderr.replace("] note:", ""), res.stderr
    return res.stderr


@pytest.mark.build
@pytest.mark.parametrize(
    ("schedule", "mode"), [("ar_c", "nccl"), ("fused", "nccl"), ("fused", "nccl-device")]
)
def test_tail_sizes_pass_the_check_and_match_the_reference(
    schedule: str, mode: str, emu_cache: Path, tmp_path: Path
) -> None:
    files = emit_text(TAIL, schedule, "cuda", mode, "4")
    program, _ = text_programs(TAIL, schedule, "4")
    # the tree holds a packed loop and an element-wise tail of each kernel
    cu = files["tail_sizes.cu"][files["tail_sizes.cu"].index("namespace sch {") :]
    assert "::cocoviz::load_pack<" in cu and "scalar_from = " in cu
    err = check_and_dump(build_emulated(files, emu_cache), tmp_path / "dump")
    compare_dumps(program, tmp_path / "dump")
    # a tree with a host-API fallback checks it first; with a multimem variant, the LSA
    # variant next, then the multimem one
    assert (FALLBACK_FIRST in err) == ("namespace nccl_host {" in files["tail_sizes.cu"]), err
    assert (LSA_FIRST in err) == ("_device_mc(" in cu), err


@pytest.mark.build
def test_lsa_variant_alone_when_the_environment_asks(emu_cache: Path, tmp_path: Path) -> None:
    """COCOVIZ_NO_MULTIMEM=1 keeps one run, the LSA one (an emulation without multimem:
    no LSA run before the run as asked)."""
    files = emit_text(TAIL, "fused", "cuda", "nccl-device", "4")
    tree = build_emulated(files, emu_cache)
    err = check_and_dump(tree, tmp_path / "dump", env={"COCOVIZ_NO_MULTIMEM": "1"})
    assert LSA_FIRST not in err and FALLBACK_FIRST not in err
    err = check_and_dump(tree, tmp_path / "dump2", env={"COCOVIZ_EMU_MULTIMEM": "0"})
    assert LSA_FIRST not in err


def scalar_only_build(base: Path, tree: Path, lib: Path) -> None:
    """The built tree rebuilt with -DCOCOVIZ_SCALAR_ONLY (objects removed: the sources, and
    so the stamp, are unchanged)."""
    shutil.copytree(base, tree, ignore=shutil.ignore_patterns("dump", ".built", ".passed"))
    for o in (tree / "emu").glob("*.o"):
        o.unlink()
    res = make(tree, "emulate", f"EMU_LIB={lib}", EMU_TEST_FLAGS + " -DCOCOVIZ_SCALAR_ONLY")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "-DCOCOVIZ_SCALAR_ONLY" in res.stdout


def files_and_program(case: str, mode: str) -> tuple[dict[str, str], Program]:
    if case == "tail_sizes":
        return emit_text(TAIL, "ar_c", "cuda", mode, "4"), text_programs(TAIL, "ar_c", "4")[0]
    name, schedule = case.split(".")
    return emit_files(name, schedule, "cuda", mode, ranks="4"), scheduled(
        name, schedule, True, "4"
    )[0]


@pytest.mark.build
@pytest.mark.parametrize(("case", "mode"), [("tail_sizes", "nccl"), ("adam.fused", "nccl")])
def test_scalar_only_build_dumps_the_packed_builds_bits(
    case: str, mode: str, emu_cache: Path, tmp_path: Path
) -> None:
    files, program = files_and_program(case, mode)
    base = build_emulated(files, emu_cache)
    check_and_dump(base, tmp_path / "packed")
    scalar = tmp_path / "scalar"
    scalar_only_build(base, scalar, emulation_lib(emu_cache))
    check_and_dump(scalar, tmp_path / "scalar-dump")
    compare_dumps(program, tmp_path / "scalar-dump")
    packed = sorted(p.name for p in (tmp_path / "packed").iterdir())
    assert packed and packed == sorted(p.name for p in (tmp_path / "scalar-dump").iterdir())
    for n in packed:
        assert (tmp_path / "packed" / n).read_bytes() == (
            tmp_path / "scalar-dump" / n
        ).read_bytes(), n


@pytest.mark.build
def test_pack_words_are_the_packs_bytes(tmp_path: Path) -> None:
    """tests/programs/emu_pack_words.cu: pack_part (the words of the GPU's st.global.v4,
    stored by the emulation's store_pack too) against the pack's bytes."""
    need_mpicxx()
    tc = find_toolchain()
    assert tc.mpi is not None
    exe = tmp_path / "emu_pack_words"
    cmd = [str(tc.mpi.mpicxx), "-std=c++17", "-O0", "-Wall", "-Wno-unknown-pragmas"]
    cmd += ["-DCOCOVIZ_EMULATION", f"-I{EMU_SOURCES / 'include'}", f"-I{TEMPLATES}"]
    cmd += ["-x", "c++", str(PROGRAMS / "emu_pack_words.cu"), "-x", "none", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 0 and "pack words: ok" in run.stdout, run.stdout + run.stderr
