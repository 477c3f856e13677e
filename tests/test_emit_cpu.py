"""The CPU target for real: every sample × canonical schedule is emitted at small sizes,
built with the mpich wheel's mpicxx (warning-free under -Wall), run under
`mpiexec -n 4` (2×2 for the pipeline) with --check, and its --dump outputs are compared
with the numpy reference within the dtype tolerance."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from emit_support import (
    AVG_PROGRAM,
    cases,
    compare_dumps,
    diagnostics,
    emit_files,
    emit_text,
    make,
    need_mpicxx,
    scheduled,
    text_programs,
    write,
)

from cocoviz.ir.nodes import Program


@pytest.mark.parametrize(("name", "schedule"), cases())
def test_cpu_builds_runs_checks_and_matches_reference(
    name: str, schedule: str, tmp_path: Path
) -> None:
    need_mpicxx()
    program, _ = scheduled(name, schedule)
    _build_run_and_compare(emit_files(name, schedule, "cpu"), program, tmp_path)


@pytest.mark.parametrize("schedule", [None, "split", "chunked", "fused"])
def test_cpu_avg_matches_reference(schedule: str | None, tmp_path: Path) -> None:
    """`avg` of i32 truncates toward zero after an exact (int64) sum, also when the i32
    sum would overflow and for negative values; f16 `avg` does not overflow in the sum."""
    need_mpicxx()
    program, _ = text_programs(AVG_PROGRAM, schedule)
    files = emit_text(AVG_PROGRAM, schedule, "cpu")
    assert "_widen" in files["avg_int.cpp"] and "_avg" in files["avg_int.cpp"]
    _build_run_and_compare(files, program, tmp_path)


def _build_run_and_compare(files: dict[str, str], program: Program, tmp_path: Path) -> None:
    """Build warning-free, run under mpiexec with --check and --dump, and compare every
    dumped output with the numpy reference."""
    write(tmp_path, files)
    res = make(tmp_path)
    assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stderr
    assert not diagnostics(res), "\n".join(diagnostics(res))
    dump = tmp_path / "dump"
    run = subprocess.run(
        [str(tmp_path / "run.sh"), "--check", "--iters", "1", "--warmup", "0", "--dump", str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass"
    assert result["program"] == program.name
    compare_dumps(program, dump)
