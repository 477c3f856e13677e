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
    cases,
    diagnostics,
    emit_files,
    make,
    need_mpicxx,
    scheduled,
    write,
)

from cocoviz.exec import numerics as nm
from cocoviz.exec.reference import run_reference


@pytest.mark.parametrize(("name", "schedule"), cases())
def test_cpu_builds_runs_checks_and_matches_reference(
    name: str, schedule: str, tmp_path: Path
) -> None:
    need_mpicxx()
    files = emit_files(name, schedule, "cpu")
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
    assert result["program"] == name
    program, _ = scheduled(name, schedule)
    ref = run_reference(program, 0)
    for out in program.outputs:
        dtype = program.type_of(out).dtype.value
        got = nm.load_npy(dump / f"{out}.npy", dtype)
        want = ref.global_value(out)
        assert got.shape == want.shape
        cmp = nm.compare(got, want, dtype)
        assert cmp.ok, f"{out}: {cmp.describe()}"
