"""CUDA graphs: the emitted launcher captures one iteration of the scheduled program
(NCCL and cuBLAS calls included) and launches it every iteration; `--no-graph` runs it
from the host. In the emulation a capture records what is enqueued instead of running it
and a launch runs it again, with the same checks (docs/codegen.md, "CUDA graphs").

- emitted samples (elementwise, cross-rank norms, an overlap schedule on three streams, a
  pipeline's send/recv) pass `--check` both ways, and their outputs are bit-identical;
- a capture that cannot begin falls back to the host, says so, and the result says
  `"graph": false`;
- tests/programs/emu_capture.cu: what CUDA refuses during a capture (cudaMalloc, a
  synchronous copy, stream and device synchronization, a fork not joined back, a wait on an
  event from outside, the legacy stream, NCCL's registrations) is refused the same way;
  a hazard inside a graph and a collective whose ranks disagree are found when it runs;
- manifest.json says which program's iteration is a graph."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from emit_support import build_emulated, build_emulated_program, emit_files
from test_emit_emulate import run_emulated

from cocoviz.emit.toolchain import find_toolchain

PROGRAM = Path(__file__).parent / "programs" / "emu_capture.cu"

GRAPH_CASES = [
    ("adam", "fused", "4"),
    ("lamb", "fused", "4"),
    ("megatron_mlp", "fused", "4"),  # overlapped chunks: main, compute and comm streams
    ("pipeline_stage", "ar_p2p_c", "tp=2,pp=2"),  # ncclSend/ncclRecv in a group
]


def _result(res: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cocoviz emulation" not in res.stderr, res.stderr
    out: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize(("name", "schedule", "ranks"), GRAPH_CASES)
def test_graph_and_host_launches_check_and_agree(
    name: str, schedule: str, ranks: str, emu_cache: Path, tmp_path: Path
) -> None:
    tree = build_emulated(emit_files(name, schedule, "cuda", ranks=ranks), emu_cache)
    dumps = {}
    for flags in ((), ("--no-graph",)):
        dump = tmp_path / ("host" if flags else "graph")
        res = run_emulated(
            tree, "--check", "--iters", "2", "--warmup", "1", "--dump", str(dump), *flags
        )
        result = _result(res)
        assert result["check"] == "pass", res.stderr
        assert result["graph"] is (not flags)
        dumps[dump.name] = {p.name: p.read_bytes() for p in sorted(dump.glob("*.npy"))}
    assert dumps["graph"] and dumps["graph"] == dumps["host"]


def test_capture_failure_falls_back_to_the_host(emu_cache: Path) -> None:
    tree = build_emulated(emit_files("adam", "fused", "cuda", ranks="2"), emu_cache)
    res = run_emulated(
        tree, "--check", "--iters", "1", "--warmup", "0", env={"COCOVIZ_EMU_CAPTURE": "0"}
    )
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass" and result["graph"] is False
    assert (
        "adam: rank 0: cudaStreamBeginCapture failed (cudaErrorStreamCaptureUnsupported: "
        "operation not permitted when stream is capturing); every iteration runs from the host "
        "(graph: false)" in res.stderr
    )


@pytest.fixture(scope="module")
def capture_program(emu_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("capture") / "emu_capture"
    return build_emulated_program(PROGRAM, out, emu_cache)


def _run_capture(program: Path, what: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    tc = find_toolchain()
    env = dict(os.environ, COCOVIZ_EMU_DIR=str(tmp_path), COCOVIZ_EMU_TIMEOUT="10")
    return subprocess.run(
        tc.mpiexec_command(2, [program, what]),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
    )


def test_emulation_refuses_what_cuda_refuses_during_capture(
    capture_program: Path, tmp_path: Path
) -> None:
    res = _run_capture(capture_program, "rules", tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    for rule in (
        "replay",
        "cudaMalloc",
        "cudaStreamSynchronize",
        "cudaMemcpy",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "unjoined",
        "isolation",
        "legacy stream",
        "ncclCommWindowRegister",
        "relaxed",
    ):
        # both ranks' lines, which mpiexec may forward interleaved ("ok xok x\n\n")
        assert res.stdout.count(f"ok {rule}") == 2, f"{rule}:\n{res.stdout}{res.stderr}"
    assert (
        "stream capture invalidated: cudaMalloc is not allowed while a stream captures"
        in res.stderr
    )


@pytest.mark.parametrize(
    ("what", "caught_by"),
    [("hazard", "hazard: read after write"), ("mismatch", "collective mismatch")],
)
def test_graph_launch_checks_what_a_direct_run_checks(
    capture_program: Path, tmp_path: Path, what: str, caught_by: str
) -> None:
    """Found when the graph runs, not when it is captured (which runs nothing)."""
    res = _run_capture(capture_program, what, tmp_path)
    assert res.returncode != 0
    assert res.stdout.count("captured") == 2, res.stdout + res.stderr
    assert caught_by in res.stderr, res.stderr
    if what == "hazard":  # both accesses named at their capture's call sites
        lines = PROGRAM.read_text().splitlines()
        copy = 1 + lines.index("  COCOVIZ_LAUNCH(copy, 1, 32, 0, w.s2)(y, w.x, kN);")
        add = 1 + next(i for i, t in enumerate(lines) if "before the join: unordered" in t)
        assert f"emu_capture.cu:{copy}" in res.stderr and f"emu_capture.cu:{add}" in res.stderr


def test_manifest_says_the_scheduled_iteration_is_a_graph() -> None:
    data = json.loads(emit_files("megatron_mlp", "fused", "cuda")["manifest.json"])
    assert data["iteration"]["cuda_graph"] is True
    assert "--no-graph" in data["iteration"]["launches"]

    def collective_graphs(steps: list[dict[str, Any]]) -> list[object]:
        out = []
        for s in steps:
            if "cuda_graph" in s:
                out.append(s["cuda_graph"])
            for item in s.get("per_chunk", []):
                out += collective_graphs(item["steps"])
        return out

    sched = collective_graphs(data["scheduled"]["steps"])
    ref = collective_graphs(data["unscheduled"]["steps"])
    assert sched and all(g is True for g in sched)
    assert ref and all(g is False for g in ref)
