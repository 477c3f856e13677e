"""`cocoviz run --mpi`: real processes under mpiexec, checked against the reference and
against computations written directly in numpy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import has_mpiexec, need_tool

from cocoviz import numerics as nx
from cocoviz.cli import main
from cocoviz.exec.mpi_run import run_mpi
from cocoviz.exec.reference import run_reference
from cocoviz.ir.lower import RanksOverride, load_file, load_program

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


def _require_mpi() -> None:
    need_tool(has_mpiexec(), "mpiexec", mpi=True)


@pytest.fixture(autouse=True)
def _mpi() -> None:
    _require_mpi()


OVERLAPPED_MEGATRON = """program megatron_ol
ranks 4
dim B = 2, S = 8, H = 24
input w : f16[H, H] sliced
input b : f16[H] replicated
input x : f16[B, S, H] sliced(2)
input r : f16[B, S, H] replicated
overlapped chunks=4 {
  layer = matmul(x, w)
  fused {
    sum_rs = reducescatter(+, layer)
    out_s = dropout(sum_rs + b, 0.1, id=out) + slice(r)
    out = allgather(out_s)
  }
}
output out
"""


def test_overlapped_group_runs_chunked_and_matches_reference():
    # H = 24 on 4 ranks with 4 chunks: a rank's chunk piece (B·S·H/16 = 24 elements)
    # is one row, and the bias is read at global positions.
    prog = load_program(OVERLAPPED_MEGATRON)
    run = run_mpi(prog, ["out"])
    ref = run_reference(prog)
    c = nx.compare(run.outputs["out"], ref.global_value("out"), "f16")
    assert c.ok and c.max_abs == 0.0
    chunks = {(e.stage, e.chunk) for e in run.events if e.rank == 0}
    for stage in ("layer", "sum_rs", "out_s", "out"):
        assert {(stage, k) for k in range(4)} <= chunks
    # chunk-major issue: the matmul of chunk 1 starts before chunk 0's allgather ends
    ev = {(e.stage, e.chunk): e for e in run.events if e.rank == 0}
    assert ev[("layer", 1)].start < ev[("out", 0)].end


SMALL = {
    "sgd": {"N": 256},
    "adam": {"N": 256},
    "lamb": {"N": 256},
    "megatron_mlp": {"B": 2, "S": 8, "H": 16},
    "megatron_attention_out": {"B": 2, "S": 8, "H": 16},
    "transformer_block": {"B": 2, "S": 8, "H": 16},
    "pipeline_stage": {"B": 2, "S": 8, "H": 16},
    "ulysses_attention": {"S": 64, "NH": 8, "D": 8},
    "moe_layer": {"R": 8, "T": 16, "E": 8, "C": 4, "H": 16, "F": 32},
    "moe_routed": {"R": 8, "T": 16, "E": 8, "C": 4, "H": 16, "F": 32},
    "megatron_sp_block": {"S": 16, "B": 2, "H": 16},
    "zero3_layer": {"T": 16, "H": 16, "F": 16},
}
CASES = [
    (name, block.name)
    for name in sorted(SMALL)
    for block in load_file(SAMPLES / f"{name}.coco").schedules
]


@pytest.mark.parametrize(("name", "schedule"), CASES)
def test_every_sample_and_schedule_matches_reference(name, schedule, capsys):
    """`cocoviz run --mpi --ranks 4` (2×2 for the pipeline) matches the reference of the
    unscheduled program for every sample × canonical schedule."""
    ranks = "tp=2,pp=2" if name == "pipeline_stage" else "4"
    defines = [f"-D{k}={v}" for k, v in SMALL[name].items()]
    rc = main(
        [
            "run",
            str(SAMPLES / f"{name}.coco"),
            "--schedule",
            schedule,
            "--mpi",
            "--ranks",
            ranks,
            *defines,
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    assert report["ok"] and report["check"]


def test_pipeline_grid_send_between_stages():
    prog = load_file(
        SAMPLES / "pipeline_stage.coco", {"B": 2, "S": 4, "H": 16}, RanksOverride(tp=2, pp=2)
    )
    run = run_mpi(prog, ["out"])
    ref = run_reference(prog)
    assert nx.compare(run.outputs["out"], ref.global_value("out"), "f16").ok
    kinds = {(e.rank, e.kind) for e in run.events if e.stage == "recv"}
    assert {(0, "send"), (1, "send"), (2, "recv"), (3, "recv")} == kinds


SGD_NO_DROPOUT = SAMPLES / "sgd.coco"

MLP_DROPOUT0 = """program mlp0
ranks 4
dim B = 2, S = 4, H = 16
input w : f16[H, H]    sliced(0)
input b : f16[H]       replicated
input x : f16[B, S, H] sliced(2)
input r : f16[B, S, H] replicated
layer = matmul(x, w)
sum   = allreduce(+, layer)
out   = dropout(sum + b, 0.0) + r
output out
"""


def test_inputs_round_trip_sgd(tmp_path: Path):
    rng = np.random.default_rng(0)
    N, G = 64, 4
    g = rng.standard_normal((G, N)).astype(np.float32)
    w = rng.standard_normal(N).astype(np.float32)
    m = rng.standard_normal(N).astype(np.float32)
    ind = tmp_path / "in"
    ind.mkdir()
    for name, a in {"g": g, "w": w, "m": m}.items():
        np.save(ind / f"{name}.npy", a)
    dump = tmp_path / "out"
    rc = main(
        [
            "run",
            str(SAMPLES / "sgd.coco"),
            "--mpi",
            "--ranks",
            "4",
            "-D",
            f"N={N}",
            "--inputs",
            str(ind),
            "--dump",
            str(dump),
        ]
    )
    assert rc == 0
    lr, mu = np.float32(0.01), np.float32(0.9)
    m1 = mu * m + g.sum(axis=0, dtype=np.float32)
    w1 = w - lr * m1
    # updated inputs are dumped by the input's name (docs/codegen.md); w1 is also an output
    np.testing.assert_allclose(np.load(dump / "m.npy"), m1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(dump / "w.npy"), w1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(dump / "w1.npy"), w1, rtol=1e-5, atol=1e-6)
    assert not (dump / "m1.npy").exists()


def test_inputs_round_trip_megatron(tmp_path: Path):
    src = tmp_path / "mlp0.coco"
    src.write_text(MLP_DROPOUT0)
    rng = np.random.default_rng(1)
    B, S, H = 2, 4, 16
    arrays = {
        "w": rng.uniform(-1, 1, (H, H)).astype(np.float16),
        "b": rng.uniform(-1, 1, H).astype(np.float16),
        "x": rng.uniform(-1, 1, (B, S, H)).astype(np.float16),
        "r": rng.uniform(-1, 1, (B, S, H)).astype(np.float16),
    }
    ind = tmp_path / "in"
    ind.mkdir()
    for name, a in arrays.items():
        np.save(ind / f"{name}.npy", a)
    dump = tmp_path / "out"
    assert main(["run", str(src), "--mpi", "--inputs", str(ind), "--dump", str(dump)]) == 0
    f = {k: v.astype(np.float32) for k, v in arrays.items()}
    expect = (f["x"] @ f["w"]) + f["b"] + f["r"]
    got = np.load(dump / "out.npy").astype(np.float32)
    np.testing.assert_allclose(got, expect, rtol=1e-2, atol=2e-2)


def test_bad_inputs_are_rejected_before_launch(tmp_path: Path, capsys):
    ind = tmp_path / "in"
    ind.mkdir()
    np.save(ind / "g.npy", np.zeros((3, 64), np.float32))
    rc = main(
        [
            "run",
            str(SAMPLES / "sgd.coco"),
            "--mpi",
            "--ranks",
            "4",
            "-D",
            "N=64",
            "--inputs",
            str(ind),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "expected shape [4, 64]" in err and "local" in err
    np.save(ind / "g.npy", np.zeros((4, 64), np.float64))
    assert (
        main(
            [
                "run",
                str(SAMPLES / "sgd.coco"),
                "--mpi",
                "--ranks",
                "4",
                "-D",
                "N=64",
                "--inputs",
                str(ind),
            ]
        )
        == 1
    )
    assert "float64" in capsys.readouterr().err
    (ind / "g.npy").unlink()
    np.save(ind / "gg.npy", np.zeros((4, 64), np.float32))
    assert (
        main(
            [
                "run",
                str(SAMPLES / "sgd.coco"),
                "--mpi",
                "--ranks",
                "4",
                "-D",
                "N=64",
                "--inputs",
                str(ind),
            ]
        )
        == 1
    )
    assert "did you mean 'g'" in capsys.readouterr().err


def test_grid_that_does_not_fit_is_refused_before_launch(capsys):
    rc = main(["run", str(SAMPLES / "pipeline_stage.coco"), "--mpi", "--ranks", "3"])
    assert rc == 2
    assert "pp=2" in capsys.readouterr().err


def test_killed_rank_ends_the_run_with_its_name(tmp_path: Path):
    """Kill one worker mid-run with SIGKILL: the run ends non-zero within 30 s and names it."""
    cmd = [
        sys.executable,
        "-m",
        "cocoviz.cli.__main__",
        "run",
        str(SAMPLES / "sgd.coco"),
        "--mpi",
        "--ranks",
        "4",
        "-D",
        "N=65536",
        "--iters",
        "100000",
        "--no-check",
    ]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    pid = None
    while time.monotonic() < deadline and pid is None:
        for status in tmp_path.glob("cocoviz-mpi-*/status.1"):
            text = status.read_text()
            if text.startswith("started pid="):
                pid = int(text.split("=", 1)[1])
        time.sleep(0.05)
    assert pid is not None, "the run never started"
    for res in tmp_path.glob("cocoviz-mpi-*"):
        while not all((res / f"status.{r}").exists() for r in range(4)):
            time.sleep(0.05)
    time.sleep(0.5)  # mid-run
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the run did not end within 30 s of a rank being killed")
    assert time.monotonic() - killed_at < 30
    assert proc.returncode == 5
    assert "rank 1 was killed (signal SIGKILL)" in err


def test_missing_mpiexec_says_how_to_install(monkeypatch, capsys, tmp_path):
    import cocoviz.exec.mpi_run as mr

    monkeypatch.setattr(mr.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("MPI_HOME", raising=False)
    rc = main(["run", str(SAMPLES / "sgd.coco"), "--mpi", "--ranks", "2", "-D", "N=64"])
    err = capsys.readouterr().err
    assert rc == 5
    assert "mpiexec was not found" in err and "pip install 'cocoviz[mpi]'" in err


def test_missing_mpi4py_says_how_to_install(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "mpi4py" else real(n, *a)
    )
    rc = main(["run", str(SAMPLES / "sgd.coco"), "--mpi", "--ranks", "2", "-D", "N=64"])
    assert rc == 5
    assert "mpi4py is not installed" in capsys.readouterr().err


def test_dump_refuses_a_foreign_directory(tmp_path: Path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    rc = main(["run", str(SAMPLES / "sgd.coco"), "--ranks", "2", "-D", "N=64", "--dump", str(d)])
    assert rc == 2
    assert "not written by cocoviz" in capsys.readouterr().err
    assert (d / "notes.txt").read_text() == "keep me"


def test_json_report(capsys):
    rc = main(["run", str(SAMPLES / "sgd.coco"), "--mpi", "--ranks", "2", "-D", "N=64", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "mpi" and data["ok"] is True
    assert {s["stage"] for s in data["stages"]} >= {"g1", "m1", "w1"}


def test_trace_of_measured_run_is_valid(tmp_path: Path):
    from cocoviz.sim.trace import validate_trace

    out = tmp_path / "trace.json"
    src = tmp_path / "ol.coco"
    src.write_text(OVERLAPPED_MEGATRON)
    assert main(["run", str(src), "--mpi", "--trace", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    names = {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert len(names) == 4
