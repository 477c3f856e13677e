"""The emitted CUDA/NCCL program runs, without a GPU, in the emulation build (`make
emulate`, `run.sh --emulate`): every sample × canonical schedule × --collectives mode (where
the modes emit different code) × 2 and 4 ranks (1×2 and 2×2 for the pipeline), plus the
`avg` programs, is built with the host compiler against cocoviz's CUDA/cuBLAS/NCCL
emulation, run with --check (reference vs scheduled, several iterations, every rank's copy)
and --dump, and the dumped outputs equal the numpy reference within the dtype tolerance.
NCCL's rules, bounds and stream/event ordering are checked as it runs (docs/codegen.md,
"Emulation"). Distinct source trees are built and run once."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from emit_support import (
    AVG_PROGRAM,
    build_emulated,
    cases,
    check_tree_report,
    compare_dumps,
    emit_files,
    emit_text,
    emulated_tree_key,
    emulation_lib,
    scheduled,
    text_programs,
)

from cocoviz.ir.nodes import Program

RANKS = {"pipeline_stage": ("tp=1,pp=2", "tp=2,pp=2"), "zero1_tp_mlp": ("dp=2,tp=2",)}
MODES = ("nccl", "nccl-device")

EMU_CASES = [(n, s, m, r) for n, s in cases() for r in RANKS.get(n, ("2", "4")) for m in MODES]


def run_emulated(
    tree: Path, *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.setdefault("COCOVIZ_EMU_TIMEOUT", "60")
    e.update(env or {})
    return subprocess.run(
        [str(tree / "run.sh"), "--emulate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=e,
    )


def check_and_compare(tree: Path, program: Program, dump: Path) -> None:
    """run.sh --emulate --check --dump: exit 0, check passed, dumps equal the reference."""
    res = run_emulated(tree, "--check", "--iters", "1", "--warmup", "0", "--dump", str(dump))
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass", res.stderr
    assert "cocoviz emulation" not in res.stderr, res.stderr
    compare_dumps(program, dump)
    # and from outside: cocoviz check-tree (signed inputs, bit for bit where exact)
    check_tree_report(tree)


def _run_once(files: dict[str, str], program: Program, cache: Path) -> None:
    import fcntl

    tree = build_emulated(files, cache)
    key = emulated_tree_key(files, emulation_lib(cache))
    with open(cache / f"ran-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (tree / ".passed").exists():
            return  # the same source tree already ran and passed (e.g. both modes identical)
        check_and_compare(tree, program, tree / "dump")
        (tree / ".passed").write_text("")


@pytest.mark.parametrize(("name", "schedule", "mode", "ranks"), EMU_CASES)
def test_emulated_run_checks_and_matches_reference(
    name: str, schedule: str, mode: str, ranks: str, emu_cache: Path
) -> None:
    program, _ = scheduled(name, schedule, ranks=ranks)
    files = emit_files(name, schedule, "cuda", mode, ranks=ranks)
    _run_once(files, program, emu_cache)


@pytest.mark.parametrize(
    ("schedule", "mode"),
    [
        (None, "nccl"),
        ("split", "nccl"),
        ("chunked", "nccl"),
        ("fused", "nccl"),
        ("fused", "nccl-device"),
    ],
)
def test_emulated_avg_programs(schedule: str | None, mode: str, emu_cache: Path) -> None:
    program, _ = text_programs(AVG_PROGRAM, schedule)
    files = emit_text(AVG_PROGRAM, schedule, "cuda", mode)
    _run_once(files, program, emu_cache)


def test_emit_build_emulate_adam_fused_runs_check(tmp_path: Path) -> None:
    """The issue's command: `cocoviz emit adam --schedule fused -o out --ranks 4
    -D N=4096 --build --emulate && (cd out && ./run.sh --emulate --check)`."""
    from emit_support import need_mpicxx

    from cocoviz.cli import main

    need_mpicxx()
    out = tmp_path / "out"
    argv = ["emit", "adam", "--schedule", "fused", "-o", str(out), "--ranks", "4"]
    assert main([*argv, "-D", "N=4096", "--build", "--emulate"]) == 0
    assert (out / "adam-emu").exists() and not (out / "adam").exists()
    res = run_emulated(out, "--check", "--iters", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["check"] == "pass"
    # every rank's copy of the replicated output, after the first and the last iteration
    for r in range(4):
        assert f"check w1 after iteration 3 (copy on group rank {r}): ok" in res.stderr


def test_emulate_needs_build_and_the_cuda_target(tmp_path: Path, capsys) -> None:
    from cocoviz.cli import main

    argv = ["emit", "sgd", "-o", str(tmp_path / "o"), "-D", "N=64"]
    assert main([*argv, "--emulate"]) == 2
    assert "--emulate needs --build" in capsys.readouterr().err
    assert main([*argv, "--target", "cpu", "--build", "--emulate"]) == 2
    assert "CPU emulation of the CUDA target" in capsys.readouterr().err


def test_run_sh_emulate_without_build_says_make_emulate(tmp_path: Path) -> None:
    from emit_support import write

    files = emit_files("sgd", "fused", "cuda", ranks="2")
    write(tmp_path, files)
    res = run_emulated(tmp_path, "--check")
    assert res.returncode == 2
    assert "run 'make emulate' first" in res.stderr
