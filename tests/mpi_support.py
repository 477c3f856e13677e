"""What the tests of `cocoviz run --mpi` share: the `mpi` fixture (a missing mpiexec
fails under COCOVIZ_REQUIRE_MPI / COCOVIZ_REQUIRE_NVCC, else skips) and a run whose dumps
are compared with the reference of the unscheduled program."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import has_mpiexec, need_tool

from cocoviz import numerics as nx
from cocoviz.cli import main
from cocoviz.exec.dumps import dumped_values
from cocoviz.exec.reference import run_reference
from cocoviz.ir.lower import RanksOverride, load_file


@pytest.fixture
def mpi() -> None:
    need_tool(has_mpiexec(), "mpiexec", mpi=True)


def run_and_compare(tmp_path: Path, text: str, schedule: str, ranks: int, capsys) -> None:
    """`cocoviz run --mpi --dump`: exit 0, the run's check passes, and every dumped array
    equals the reference of the unscheduled program by `run`'s own comparison."""
    src = tmp_path / "prog.coco"
    src.write_text(text)
    dump = tmp_path / "dump"
    argv = [
        "run",
        str(src),
        "--schedule",
        schedule,
        "--mpi",
        "--ranks",
        str(ranks),
        "--dump",
        str(dump),
        "--json",
    ]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert report["ok"] and report["check"], report
    original = load_file(src, None, RanksOverride.parse(str(ranks)))
    ref = run_reference(original)
    stage_of = {d.name: d.stage for d in dumped_values(original)}
    for row in report["check"]:
        name, dtype = row["name"], row["dtype"]
        got = nx.load_npy(dump / f"{name}.npy", dtype)
        c = nx.compare(got, ref.global_value(stage_of[name]), dtype)
        assert c.ok, (name, c)
