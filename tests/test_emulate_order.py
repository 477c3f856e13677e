"""The emulation's adversarial order (COCOVIZ_EMU_ORDER=adversarial, COCOVIZ_EMU_SEED=n):
operations on non-blocking streams run later, one at a time, in a seeded random order
that respects only stream order, events and — with NCCL_LAUNCH_ORDER_IMPLICIT — NCCL's
implicit launch order; a send holds its stream until the receive is posted.

- the pipeline sample's schedules (2 stages x 2 tp ranks), the overlapped one with its
  send/recv on their own stream beside the tp group's collectives, pass `--check` under
  many seeds, with no watchdog and no hazard;
- without the implicit launch order the generated program keeps every NCCL call on one
  stream, and still passes;
- tests/programs/emu_cross_comm.cu: the same pipeline pattern written by hand is
  deadlock-free under the implicit launch order, and the adversarial order finds its
  deadlock without it (which the default order, every operation at enqueue, never
  shows); two communicators used in opposite orders deadlock on every seed;
- an order the emulation does not know is refused with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from emit_support import build_emulated, build_emulated_program, emit_files
from test_emit_emulate import run_emulated

from cocoviz.emit.toolchain import find_toolchain

PROGRAM = Path(__file__).parent / "programs" / "emu_cross_comm.cu"

# (schedule, seeds): the overlapped schedule gets the most; each run is about a second
PIPELINE_SEEDS = [("fused", 20), ("rs_p2p_c_ag", 3), ("ar_p2p_c", 3)]


def adversarial(seed: int, implicit: str | None = None) -> dict[str, str]:
    env = {"COCOVIZ_EMU_ORDER": "adversarial", "COCOVIZ_EMU_SEED": str(seed)}
    if implicit is not None:
        env["NCCL_LAUNCH_ORDER_IMPLICIT"] = implicit
    return env


def _passes(res: subprocess.CompletedProcess[str], what: str) -> None:
    assert res.returncode == 0, f"{what}:\n{res.stdout}{res.stderr}"
    assert "cocoviz emulation" not in res.stderr, f"{what}:\n{res.stderr}"
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass", f"{what}:\n{res.stderr}"


@pytest.mark.parametrize(("schedule", "seeds"), PIPELINE_SEEDS)
def test_pipeline_schedules_pass_under_adversarial_orders(
    schedule: str, seeds: int, emu_cache: Path
) -> None:
    tree = build_emulated(emit_files("pipeline_stage", schedule, "cuda"), emu_cache)
    start = time.monotonic()
    for seed in range(1, seeds + 1):
        res = run_emulated(tree, "--check", "--iters", "1", "--warmup", "0", env=adversarial(seed))
        _passes(res, f"{schedule}, COCOVIZ_EMU_SEED={seed}")
    assert time.monotonic() - start < 30 * seeds  # no run waited for the watchdog


def test_pipeline_without_implicit_launch_order_shares_one_stream(emu_cache: Path) -> None:
    """An explicit NCCL_LAUNCH_ORDER_IMPLICIT=0 puts the send/recv back on the comm
    stream: one order for every NCCL call, deadlock-free under any order of the rest."""
    tree = build_emulated(emit_files("pipeline_stage", "fused", "cuda"), emu_cache)
    for seed in range(1, 5):
        res = run_emulated(
            tree, "--check", "--iters", "1", "--warmup", "0", env=adversarial(seed, "0")
        )
        _passes(res, f"NCCL_LAUNCH_ORDER_IMPLICIT=0, COCOVIZ_EMU_SEED={seed}")


@pytest.fixture(scope="session")
def cross_comm(emu_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cross") / "emu_cross_comm"
    return build_emulated_program(PROGRAM, out, emu_cache)


def _run(
    program: Path, mode: str, env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    tc = find_toolchain()
    d = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    e = dict(os.environ, COCOVIZ_EMU_DIR=str(d), COCOVIZ_EMU_TIMEOUT="2", **env)
    for k in ("COCOVIZ_EMU_ORDER", "NCCL_LAUNCH_ORDER_IMPLICIT"):
        if k not in env:
            e.pop(k, None)
    return subprocess.run(
        tc.mpiexec_command(4, [program, mode]),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=e,
    )


def _deadlock(res: subprocess.CompletedProcess[str]) -> bool:
    if res.returncode == 0:
        assert res.stdout.count("ok ") == 4, res.stdout + res.stderr
        return False
    # the deadlock detector finds it as soon as every rank is blocked; the watchdog is the
    # backstop
    assert (
        "deadlock: every rank is blocked" in res.stderr or "watchdog: no progress" in res.stderr
    ), res.stdout + res.stderr
    return True


def test_pipeline_pattern_is_deadlock_free_under_implicit_launch_order(
    cross_comm: Path, tmp_path: Path
) -> None:
    for seed in range(1, 9):
        res = _run(cross_comm, "pipeline", adversarial(seed, "1"), tmp_path)
        assert not _deadlock(res), f"COCOVIZ_EMU_SEED={seed}:\n{res.stderr}"


def test_adversarial_order_finds_the_deadlock_without_implicit_launch_order(
    cross_comm: Path, tmp_path: Path
) -> None:
    # the default order runs every operation at enqueue, in host order: no deadlock shows
    assert not _deadlock(_run(cross_comm, "pipeline", {}, tmp_path))
    found = None
    for seed in range(1, 11):
        res = _run(cross_comm, "pipeline", adversarial(seed, "0"), tmp_path)
        if _deadlock(res):
            found = res
            break
    assert found is not None, "no seed of 1..10 reached the cross-communicator deadlock"
    # the cycle: a send waiting for its receiver, a collective waiting for a peer
    assert "waiting for the receiver to post its ncclRecv" in found.stderr, found.stderr
    assert "ncclReduceScatter" in found.stderr or "ncclAllGather" in found.stderr, found.stderr
    assert "NCCL_LAUNCH_ORDER_IMPLICIT off" in found.stderr, found.stderr


def test_opposite_orders_on_two_communicators_deadlock_on_every_seed(
    cross_comm: Path, tmp_path: Path
) -> None:
    for seed in (1, 2):
        res = _run(cross_comm, "opposite", adversarial(seed, "1"), tmp_path)
        assert _deadlock(res), res.stdout + res.stderr
        assert "ncclAllReduce" in res.stderr, res.stderr


def test_unknown_order_is_refused(cross_comm: Path, tmp_path: Path) -> None:
    res = _run(cross_comm, "pipeline", {"COCOVIZ_EMU_ORDER": "random"}, tmp_path)
    assert res.returncode != 0
    assert "COCOVIZ_EMU_ORDER=random is not an order the emulation knows" in res.stderr, res.stderr
