"""The prepared GPU check (`bench/gpu_check.sh` → `bench/gpu_check.py`) without a GPU:
which cases it emits, and how it reads Nsight Compute's CSV. (`--dry-run`, which also
builds every tree, is run by hand: it takes minutes.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cocoviz import samples
from cocoviz.ir.lower import load_file

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_cases_cover_every_sample_schedule_on_one_rank(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    chk = gpu_check.Check(tmp_path / "out", tmp_path / "work", 600, 2, "sm_90")
    chk.emit_all()
    labels = {c.label: c for c in chk.cases}
    for name in samples.names():
        if name in gpu_check.SKIPPED:
            continue
        for block in load_blocks(name):
            assert f"{name}.{block}.nccl" in labels
            assert f"{name}.{block}.nccl-device" in labels
    assert any("pipeline_stage" in s for s in chk.skipped)
    # the device API applies to the fused RS → C → AG only; elsewhere the trees coincide
    assert labels["megatron_mlp.fused.nccl-device"].same_as is None
    assert labels["megatron_mlp.mm_ar_c.nccl-device"].same_as == "megatron_mlp.mm_ar_c.nccl"
    assert {c.label for c in chk.cases if c.scalar} == {
        f"{x}.scalar" for x in gpu_check.SCALAR_CASES
    }
    for c in chk.cases:
        assert c.program.grid.group == 1
        assert (c.directory / "run.sh").exists() == (c.same_as is None)
    # Nsight Compute times the nccl-device kernel alone too (issue 15), once run
    dev = labels["megatron_mlp.fused.nccl-device"]
    assert not gpu_check.profiled(dev)
    dev.run = {"time_ms": 1.0}
    assert gpu_check.profiled(dev)
    labels["megatron_mlp.fused.nccl"].run = {"time_ms": 1.0}
    assert gpu_check.profiled(labels["megatron_mlp.fused.nccl"])


def load_blocks(name: str) -> list[str]:
    return [b.name for b in load_file(samples.path(name)).schedules]


def test_reads_nsight_compute_raw_csv(gpu_check: ModuleType) -> None:
    text = (
        "==PROF== Connected to process 7\n"
        '"ID","Process ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum",'
        '"gpu__time_duration.sum"\n'
        '"","","","byte","byte","nsecond"\n'
        '"0","7","void cocoviz_prog::<unnamed>::sch::<unnamed>::k_sch_gf(Buffers, long)",'
        '"201,326,592","67,108,864","60000"\n'
    )
    (row,) = gpu_check._parse_ncu(text)
    assert row["kernel"] == "k_sch_gf"
    assert row["bytes"] == 268435456
    assert row["time_us"] == pytest.approx(60.0)
    assert row["pct"] == pytest.approx(100 * 268435456 / 60000 / 4800)
    assert gpu_check._parse_ncu("no profile") == []
