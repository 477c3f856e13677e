"""The nccl-device lowering's real-hardware rules, run in the emulation (docs/codegen.md,
"The nccl-device kernel on real hardware"):

- without NCCL's device API (``COCOVIZ_EMU_DEVICE_API=0``: no device-API support, NULL
  windows, as NCCL without symmetric memory) every rank runs the ``--collectives nccl``
  lowering of the same schedule, passes ``--check``, and the run's JSON line says so
  (``"lowering": "nccl"``);
- ranks with different SM counts (``COCOVIZ_EMU_SM_COUNT=132,114,132,114``, and 2,1,2,1 at a
  size whose message needs two CTAs) launch one grid, agreed before ``ncclDevCommCreate``;
  a tree that does not agree is reported (its barrier counts, or its grids, differ);
- a multimem kernel that synchronises through the unicast LSA barrier, or releases a
  peer's window reached through its unicast mapping without ``fence.proxy.alias``, is
  reported with the emitted file:line.

Each tree is built once (tests/emit_support.py); hand-edited copies are rebuilt."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from emit_support import (
    EMU_TEST_FLAGS,
    build_emulated,
    compare_dumps,
    emit_files,
    emulation_lib,
    make,
    scheduled,
)
from test_emit_emulate import run_emulated

from cocoviz import samples
from cocoviz.emit.emitter import emit
from cocoviz.ir.lower import RanksOverride, load_file
from cocoviz.ir.nodes import Program, unscheduled
from cocoviz.schedule import apply_block, find_block

pytestmark = pytest.mark.build

DEVICE_KERNELS = {"adam": True, "lamb": False, "megatron_mlp": True}
"""Whether the sample's `fused` schedule has a device-API kernel under nccl-device (lamb's
fused groups hold a cross-rank norm: they stay on the host API, docs/codegen.md)."""

ENVS = {
    "no-device-api": {"COCOVIZ_EMU_DEVICE_API": "0"},
    "mixed-sm-counts": {"COCOVIZ_EMU_SM_COUNT": "132,114,132,114"},
}


def sample_at(name: str, dims: dict[str, int]) -> tuple[Program, dict[str, str]]:
    """The sample's `fused` schedule at `dims` on 4 ranks, and its nccl-device tree."""
    p0 = load_file(samples.path(name), dims, RanksOverride.parse("4"))
    p = apply_block(p0, find_block(p0, "fused"))
    files = emit(
        p, unscheduled(p0), target="cuda", collectives="nccl-device", schedule_name="fused"
    )
    return p, files.files


def run(tree: Path, env: dict[str, str], *args: str) -> tuple[int, str, dict[str, object] | None]:
    """`run.sh --emulate --check` once: exit status, stderr, the JSON line (None if none)."""
    res = run_emulated(tree, "--check", "--iters", "1", "--warmup", "0", *args, env=env)
    lines = [ln for ln in res.stdout.strip().splitlines() if ln.startswith("{")]
    return res.returncode, res.stderr + res.stdout, json.loads(lines[-1]) if lines else None


def edited(base: Path, stem: str, tmp: Path, emu_cache: Path, *subs: tuple[str, str]) -> Path:
    """A copy of an emitted tree whose scheduled program has each (regex, replacement)
    applied once, rebuilt against the emulation."""
    tree = tmp / "edited"
    shutil.copytree(base, tree, ignore=shutil.ignore_patterns("dump", ".built", ".passed"))
    prog = tree / f"{stem}.cu"
    text = prog.read_text()
    start = text.index("namespace sch {")
    head, body = text[:start], text[start:]
    for pattern, replacement in subs:
        body, n = re.subn(pattern, replacement, body, count=1)
        assert n == 1, f"not found: {pattern}"
    prog.write_text(head + body)
    res = make(tree, "emulate", f"EMU_LIB={emulation_lib(emu_cache)}", EMU_TEST_FLAGS)
    assert res.returncode == 0, res.stdout + res.stderr
    return tree


def line_of(path: Path, needle: str, nth: int = 1) -> int:
    """The 1-based line of the `nth` line of `path` after "namespace sch {" holding `needle`."""
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("namespace sch {"))
    found = [i + 1 for i, ln in enumerate(lines) if i > start and needle in ln]
    return found[nth - 1]


@pytest.mark.parametrize("env", sorted(ENVS))
@pytest.mark.parametrize("name", sorted(DEVICE_KERNELS))
def test_nccl_device_tree_passes_check_and_names_its_lowering(
    name: str, env: str, emu_cache: Path, tmp_path: Path
) -> None:
    program, _ = scheduled(name, "fused", ranks="4")
    tree = build_emulated(emit_files(name, "fused", "cuda", "nccl-device", ranks="4"), emu_cache)
    dump = tmp_path / "dump"
    rc, out, result = run(tree, ENVS[env], "--dump", str(dump))
    assert rc == 0 and result is not None, out
    assert result["check"] == "pass", out
    assert "cocoviz emulation" not in out, out
    device = DEVICE_KERNELS[name] and env != "no-device-api"
    assert result["lowering"] == ("nccl-device" if device else "nccl"), out
    if DEVICE_KERNELS[name] and env == "no-device-api":
        # every rank says why, and that they all fell back
        for r in range(4):
            assert f"rank {r}: NCCL reports no device-API support" in out, out
    compare_dumps(program, dump)


def test_ranks_with_different_sm_counts_launch_one_grid(emu_cache: Path, tmp_path: Path) -> None:
    """At N = 65536 adam's message needs two CTAs: ranks with 2 and 1 SMs agree on one (the
    fewest), before ncclDevCommCreate; a tree that skips the agreement asks for different
    barrier counts (ncclDevCommCreate's requirements differ), and one that launches another
    grid on some ranks leaves blocks waiting for peers that never run them (reported)."""
    program, files = sample_at("adam", {"N": 65536})
    manifest = json.loads(files["manifest.json"])
    device = [s for s in manifest["scheduled"]["steps"] if s["kind"] == "device"]
    assert device and device[0]["ctas_needed"] == 2
    base = build_emulated(files, emu_cache)
    sms = {"COCOVIZ_EMU_SM_COUNT": "2,1,2,1"}
    rc, out, result = run(base, sms, "--dump", str(tmp_path / "dump"))
    assert rc == 0 and result is not None and result["check"] == "pass", out
    assert result["lowering"] == "nccl-device", out
    compare_dumps(program, tmp_path / "dump")

    unagreed = edited(
        base, "adam", tmp_path / "a", emu_cache, (r"sms = least_over_ranks\(ctx, sms\);", "")
    )
    rc, out, _ = run(unagreed, sms)
    assert rc != 0 and "collective mismatch" in out and "ncclDevCommCreate" in out, out

    launch = r"(const int ctas = )(S->dev_ctas < 2 \? S->dev_ctas : 2);"
    per_rank = edited(
        base, "adam", tmp_path / "b", emu_cache, (launch, r"\g<1>tp % 2 == 1 ? 1 : (\2);")
    )
    rc, out, _ = run(per_rank, {})
    assert rc != 0, out
    assert "LSA barrier 0 (round 1): this rank's kernel runs" in out, out
    assert "launch one grid on every rank" in out, out


def test_multimem_kernel_on_the_unicast_barrier_is_reported(
    emu_cache: Path, tmp_path: Path
) -> None:
    """The issue's hand edit: the multimem kernel opens the unicast form of the barrier."""
    base = build_emulated(emit_files("adam", "fused", "cuda", "nccl-device", ranks="4"), emu_cache)
    tree = edited(
        base, "adam", tmp_path, emu_cache, (r"blockIdx\.x, /\*multimem=\*/true\);", "blockIdx.x);")
    )
    prog = tree / "adam.cu"
    session = line_of(prog, "ncclLsaBarrierSession<ncclCoopCta> bar(", nth=2)  # the _mc kernel's
    load = line_of(prog, "::cocoviz::multimem_ld_reduce_add<")
    rc, out, _ = run(tree, {})
    assert rc == 3, out
    assert "multimem barrier: a kernel that issues multimem operations synchronises" in out, out
    assert f"barrier session opened at adam.cu:{session} without multimem = true" in out, out
    assert f"multimem operation at adam.cu:{load}" in out, out
    assert "launch of d_sch_g1_rs_device_mc" in out, out


def test_unfenced_unicast_window_access_before_the_multimem_arrive_is_reported(
    emu_cache: Path, tmp_path: Path
) -> None:
    """At N = 1000 each rank's shard (250 f16 elements) ends in a 2-element tail that the
    multimem kernel reduces and gathers through the peers' unicast mappings: with the
    fence.proxy.alias it passes, without it the multimem arrive is reported."""
    program, files = sample_at("adam", {"N": 1000})
    base = build_emulated(files, emu_cache)
    rc, out, result = run(base, {}, "--dump", str(tmp_path / "dump"))
    assert rc == 0 and result is not None and result["check"] == "pass", out
    assert result["lowering"] == "nccl-device", out
    compare_dumps(program, tmp_path / "dump")
    tree = edited(
        base,
        "adam",
        tmp_path,
        emu_cache,
        (r"if \(scalar_from < 250\) ::cocoviz::fence_proxy_alias\(\);", ""),
    )
    first_peer_load = line_of(tree / "adam.cu", "COCOVIZ_LD(src_peer[0]", nth=2)  # the _mc kernel's
    rc, out, _ = run(tree, {})
    assert rc == 3, out
    assert (
        f"accessed a peer's window through its unicast mapping (at adam.cu:{first_peer_load})"
        in out
    ), out
    assert "with no fence.proxy.alias between them" in out, out
