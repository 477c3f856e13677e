"""`cocoviz run --mpi` on grids with a dp axis (docs/language.md, rank grids): one MPI
communicator per tp group and one per dp group (MPI_Comm_split), inputs in their global
forms, dumps equal to the reference of the unscheduled program."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import has_mpiexec, need_tool

from cocoviz import numerics as nx
from cocoviz.cli import main
from cocoviz.exec.reference import run_reference
from cocoviz.ir.lower import RanksOverride, load_file

pytestmark = pytest.mark.build

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "programs"


@pytest.fixture(autouse=True)
def mpi() -> None:
    need_tool(has_mpiexec(), "mpiexec", mpi=True)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("program", "ranks", "schedule"),
    [
        ("grid_dp_tp", "dp=2,tp=1", "split_dp"),
        ("grid_dp_tp", "dp=2,tp=2", None),
        ("grid_dp_tp", "dp=4,tp=2", "split_dp"),
        ("grid_dp_pp", "dp=2,tp=2,pp=2", "split_dp"),
        ("grid_dp_zero", "dp=2,tp=2", "zero"),  # split and reorder over dp
    ],
)
def test_mpi_run_dumps_equal_the_reference(
    tmp_path: Path, program: str, ranks: str, schedule: str | None
) -> None:
    src = PROGRAMS / f"{program}.coco"
    dump = tmp_path / "dump"
    argv = ["run", str(src), "--mpi", "--ranks", ranks, "--dump", str(dump), "--json"]
    if schedule:
        argv += ["--schedule", schedule]
    rc, out, err = run(*argv)
    assert rc == 0, err
    report = json.loads(out)
    assert report["ok"] and report["check"], report
    ref = run_reference(load_file(src, None, RanksOverride.parse(ranks)))
    p = ref.program
    names = [*p.outputs, *p.updates()]
    for name in names:
        got = nx.load_npy(dump / f"{name}.npy", p.type_of(name).dtype.value)
        np.testing.assert_array_equal(got, ref.global_value(name))


def test_mpi_run_reads_inputs_in_their_global_forms(tmp_path: Path) -> None:
    src = PROGRAMS / "grid_dp_tp.coco"
    rng = np.random.default_rng(1)
    inputs = tmp_path / "in"
    inputs.mkdir()
    xt = rng.standard_normal((2, 16, 8)).astype(np.float32)  # local over dp: [D, …]
    dh = rng.standard_normal((2, 8, 32)).astype(np.float32)
    m = rng.standard_normal((16, 32)).astype(np.float32)  # sliced over dp: the global value
    for name, a in (("xt", xt), ("dh", dh), ("m", m)):
        np.save(inputs / f"{name}.npy", a)
    dump = tmp_path / "dump"
    rc, out, err = run(
        "run", str(src), "--mpi", "--inputs", str(inputs), "--dump", str(dump), "--json"
    )
    assert rc == 0, err
    assert json.loads(out)["ok"]
    gsum = nx.load_npy(dump / "gsum.npy", "f32")
    np.testing.assert_allclose(gsum, (xt[0] @ dh[0] + xt[1] @ dh[1]) / 2, rtol=1e-5)
    np.save(inputs / "xt.npy", xt[0])
    rc, _, err = run("run", str(src), "--mpi", "--inputs", str(inputs))
    assert rc == 1
    assert "expected shape [2, 16, 8] ([D, …]: one value per dp replica" in err


@pytest.mark.parametrize("schedule", ["as_written", "fused_adam"])
def test_zero1_sample_runs_on_mpi(tmp_path: Path, schedule: str) -> None:
    from cocoviz import samples

    defines = {"B": 8, "H": 16, "F": 32}
    dump = tmp_path / "dump"
    argv = ["run", "zero1_tp_mlp", "--mpi", "--ranks", "dp=2,tp=2", "--schedule", schedule]
    argv += [a for k, v in defines.items() for a in ("-D", f"{k}={v}")]
    rc, out, err = run(*argv, "--dump", str(dump), "--json")
    assert rc == 0, err
    assert json.loads(out)["ok"]
    p = load_file(samples.path("zero1_tp_mlp"), defines, RanksOverride.parse("dp=2,tp=2"))
    ref = run_reference(p)
    for name in ("dx", "w1", "w2", "m1", "v1", "m2", "v2"):
        got = nx.load_npy(dump / f"{name}.npy", "f32")
        np.testing.assert_array_equal(got, ref.global_value(name))


@pytest.mark.parametrize(
    ("sample", "defines", "schedule"),
    [
        ("megatron_mlp", {"B": 2, "S": 8, "H": 16}, "ol_mm_ar_c"),  # a chunk pipeline
        ("zero3_layer", {"T": 16, "H": 16, "F": 16}, "shard_overlap"),  # decomposed rings
    ],
)
def test_a_tp_program_on_a_dp_grid_runs_each_replica_alike(
    tmp_path: Path, sample: str, defines: dict[str, int], schedule: str
) -> None:
    """Every value replicated over dp: the tp program, run by each of D replicas on its
    own tp communicator (the overlapped groups included)."""
    argv = ["run", sample, "--mpi", "--ranks", "dp=2,tp=2", "--schedule", schedule, "--json"]
    argv += [a for k, v in defines.items() for a in ("-D", f"{k}={v}")]
    rc, out, err = run(*argv)
    assert rc == 0, err
    report = json.loads(out)
    assert report["ok"] and report["check"], report
