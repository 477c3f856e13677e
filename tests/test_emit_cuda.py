"""The CUDA target compiles and links, for sm_80, sm_90 and sm_100 in one nvcc invocation
per file, against NCCL, cuBLAS and MPI from the wheels, warning-free under -Wall, for every
sample × canonical schedule × --collectives mode. Distinct source trees are built once,
and distinct source files compiled once (tests/compile_cache.py: most schedules emit the
same program source in both modes; main.cu, which names the mode, is compiled for each).
Nothing runs here: running is the emulation's part (tests/test_emit_emulate.py)."""

from __future__ import annotations

import fcntl

import pytest
from compile_cache import cached_compiler
from conftest import session_dir
from emit_support import (
    AVG_PROGRAM,
    cases,
    diagnostics,
    emit_files,
    emit_text,
    make,
    need_nvcc,
    source_key,
    write,
)

CUDA_CASES = [(n, s, m) for n, s in cases() for m in ("nccl", "nccl-device")]


@pytest.mark.parametrize(("name", "schedule", "mode"), CUDA_CASES)
def test_cuda_compiles_and_links_warning_free(
    name: str, schedule: str, mode: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    need_nvcc()
    files = emit_files(name, schedule, "cuda", mode)
    _build_once(files, name, f"{name}/{schedule}/{mode}", tmp_path_factory)


@pytest.mark.parametrize(("schedule", "mode"), [("chunked", "nccl"), ("fused", "nccl-device")])
def test_cuda_avg_is_a_sum_and_a_division_kernel(
    schedule: str, mode: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """NCCL's ncclAvg pre-multiplies floats by a rounded 1/G and sums integers in their
    storage type; the emitted code sums in the compute type and divides in a kernel."""
    files = emit_text(AVG_PROGRAM, schedule, "cuda", mode)
    cu = files["avg_int.cu"]
    assert "ncclAvg" not in cu
    assert "ncclInt64, ncclSum" in cu and "ncclFloat32, ncclSum" in cu
    need_nvcc()
    _build_once(files, "avg_int", f"avg_int/{schedule}/{mode}", tmp_path_factory)


def _build_once(
    files: dict[str, str], binary: str, label: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Build for sm_80, sm_90 (Hopper) and sm_100 (Blackwell), warning-free; one build
    per distinct source tree, shared by the xdist workers of this run, and one compile per
    distinct source file (tests/compile_cache.py)."""
    key = source_key(files, (".cu", ".h", ".cuh"))
    cache = session_dir(tmp_path_factory) / "cuda-builds"
    cache.mkdir(exist_ok=True)
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = cache / f"{key}.ok"
        if done.exists():
            return  # the identical sources were built warning-free by done.read_text()
        directory = tmp_path_factory.mktemp(label.replace("/", "."))
        write(directory, files)
        nvcc = cached_compiler("$(CUDA_HOME)/bin/nvcc", cache / "objects")
        res = make(directory, "ARCH=sm_80 sm_90 sm_100", f"NVCC={nvcc}")
        assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stderr[-4000:]
        assert not diagnostics(res), "\n".join(diagnostics(res))
        assert (directory / binary).exists()
        done.write_text(label)


def test_nccl_device_lowering_is_one_kernel_with_lsa_barriers() -> None:
    """--collectives nccl-device turns RS → compute → AG into one device-API kernel."""
    files = emit_files("megatron_mlp", "fused", "cuda", "nccl-device", small=False)
    cu = files["megatron_mlp.cu"]
    assert "ncclDevCommCreate" in cu and "ncclCommWindowRegister" in cu
    assert "ncclMemAlloc" in cu
    assert "reqs.lsaBarrierCount = S->dev_ctas" in cu
    assert "cudaDevAttrMultiProcessorCount" in cu
    assert "S->dev.lsaSize != S->dev.nRanks" in cu
    # the multimem (NVLS) variant where NCCL reports multimem support
    assert "ncclCommQueryProperties" in cu and "reqs.lsaMultimem = S->multimem" in cu
    assert "if (S->multimem)" in cu and "ncclGetLsaMultimemPointer(win_src" in cu
    kernel = cu[cu.index("__global__ void __launch_bounds__(kThreads) d_sch_") :]
    kernel = kernel[: kernel.index("\n}\n")]
    # LSA pointers hoisted, barrier, peer reads, compute, peer writes, barrier
    pointers = kernel.index("ncclGetLsaPointer(win_src")
    first = kernel.index("bar.sync")
    read = kernel.index("load_pack<8>(src_peer[s]")
    write_ = kernel.index("store_pack<8>(out0_peer[s]")
    last = kernel.rindex("bar.sync")
    assert pointers < first < read < write_ < last
    assert "(dev.lsaRank + 1 + s) % kPeers" in kernel  # peers from rank + 1 on
    assert "ncclReduceScatter" not in cu.split("namespace sch")[1]
