"""The emulation's initcheck (docs/codegen.md, "Emulation"): a read of device memory that
nothing wrote since its cudaMalloc — no kernel store, copy, memset, NCCL or cuBLAS write —
ends the run ("cocoviz emulation: [rank R] uninitialized read"), naming the reading kernel
line or call site, the buffer (its cudaMalloc site) and the unwritten byte range, as
compute-sanitizer's initcheck does.

Hand-written programs, built against the emulation (tests/emit_support.py), one mode per
case: a kernel reading past what a copy wrote, a device-to-host copy of a buffer no one
wrote, an all-reduce of an unwritten send buffer on 2 ranks; and what must stay clean: a
memset buffer, cuBLAS with beta = 0 (C is not read), the check turned off."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import emulation_cache
from emit_support import build_emulated_program

from cocoviz.emit.toolchain import find_toolchain

pytestmark = pytest.mark.build

SOURCE = r"""
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// the call site the emulation reports (the emitted runtime's CHECK_* macros do the same)
#define CALL(x)                                                              \
  do {                                                                       \
    ::cocoviz_emu::set_site("test", __FILE__, __LINE__, #x);                 \
    if ((x) != 0) {                                                          \
      std::fprintf(stderr, "failed: %s\n", #x);                              \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

constexpr int kN = 256;

__global__ void copy(const float* in, float* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float v = COCOVIZ_LD(in, i);  // @load
    COCOVIZ_ST(out, i) = v;
  }
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  std::vector<float> h(kN, 1.0f);
  float* a = nullptr;
  float* b = nullptr;
  CALL(cudaMalloc(&a, kN * sizeof(float)));  // @malloc-a
  CALL(cudaMalloc(&b, kN * sizeof(float)));
  if (!std::strcmp(mode, "kernel")) {
    // the copy leaves the last 8 elements of a unwritten
    CALL(cudaMemcpy(a, h.data(), (kN - 8) * sizeof(float), cudaMemcpyHostToDevice));
    COCOVIZ_LAUNCH(copy, 4, 64, 0, nullptr)(a, b, kN);
    CALL(cudaDeviceSynchronize());
  } else if (!std::strcmp(mode, "memcpy")) {
    CALL(cudaMemcpy(h.data(), b, kN * sizeof(float), cudaMemcpyDeviceToHost));  // @d2h
  } else if (!std::strcmp(mode, "clean")) {
    CALL(cudaMemset(a, 0, kN * sizeof(float)));
    COCOVIZ_LAUNCH(copy, 4, 64, 0, nullptr)(a, b, kN);
    CALL(cudaMemcpy(h.data(), b, kN * sizeof(float), cudaMemcpyDeviceToHost));
  } else if (!std::strcmp(mode, "gemm-beta0")) {
    // C = A * B with beta = 0: cuBLAS does not read C, so an unwritten C is fine
    cublasHandle_t handle;
    CALL(cublasCreate(&handle));
    CALL(cudaMemcpy(a, h.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    float* c = nullptr;
    CALL(cudaMalloc(&c, kN * sizeof(float)));
    const float one = 1.0f, zero = 0.0f;
    CALL(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 16, 16, 16, &one, a, CUDA_R_32F, 16, a, CUDA_R_32F, 16,
                      &zero, c, CUDA_R_32F, 16, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CALL(cudaMemcpy(h.data(), c, kN * sizeof(float), cudaMemcpyDeviceToHost));
    CALL(cublasDestroy(handle));
  } else if (!std::strcmp(mode, "allreduce")) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ncclUniqueId id;
    if (rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    CALL(ncclCommInitRank(&comm, size, id, rank));
    CALL(ncclAllReduce(a, b, kN, ncclFloat32, ncclSum, comm, nullptr));  // @allreduce
    CALL(cudaDeviceSynchronize());
    CALL(ncclCommDestroy(comm));
    MPI_Finalize();
  }
  std::printf("ok %s\n", mode);
  return 0;
}
"""


def line_of(marker: str) -> int:
    for n, text in enumerate(SOURCE.lstrip("\n").splitlines(), start=1):
        if f"// {marker}" in text:
            return n
    raise AssertionError(marker)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("initcheck")
    src = d / "initcheck.cu"
    src.write_text(SOURCE.lstrip("\n"))
    cache = emulation_cache(tmp_path_factory)
    return build_emulated_program(src, d / "initcheck", cache)


def run(program: Path, mode: str, ranks: int = 0, **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("COCOVIZ_EMU_INITCHECK", None)
    e.update(COCOVIZ_EMU_TIMEOUT="30", **env)
    cmd = [str(program), mode]
    if ranks:
        cmd = find_toolchain().mpiexec_command(ranks, cmd)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=e)


def test_kernel_read_of_unwritten_bytes_is_reported(program: Path) -> None:
    res = run(program, "kernel")
    assert res.returncode == 3, res.stdout + res.stderr
    err = res.stderr
    assert "uninitialized read: a read of device memory that nothing wrote" in err, err
    assert f"initcheck.cu:{line_of('@load')}" in err, err  # the kernel's load
    # the first unwritten element the kernel reads: element 248 of 256 floats
    assert "unwritten: bytes [992, 996)" in err, err
    assert (
        "device allocation of 1024 bytes" in err and f"initcheck.cu:{line_of('@malloc-a')}" in err
    ), err
    assert "ok kernel" not in res.stdout


def test_copy_of_a_buffer_nothing_wrote_names_the_call_and_the_range(program: Path) -> None:
    res = run(program, "memcpy")
    assert res.returncode == 3, res.stdout + res.stderr
    err = res.stderr
    assert "uninitialized read" in err, err
    assert "cudaMemcpy(h.data(), b, kN * sizeof(float), cudaMemcpyDeviceToHost) at " in err, err
    assert f"initcheck.cu:{line_of('@d2h')}" in err, err
    assert "unwritten: bytes [0, 1024)" in err, err


def test_nccl_reads_are_checked_too(program: Path) -> None:
    res = run(program, "allreduce", ranks=2)
    assert res.returncode != 0, res.stdout + res.stderr
    err = res.stderr
    assert "uninitialized read" in err and "ncclAllReduce" in err, err
    assert f"initcheck.cu:{line_of('@allreduce')}" in err, err


@pytest.mark.parametrize("mode", ["clean", "gemm-beta0"])
def test_written_memory_and_unread_outputs_are_clean(program: Path, mode: str) -> None:
    res = run(program, mode)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cocoviz emulation" not in res.stderr, res.stderr
    assert f"ok {mode}" in res.stdout


def test_the_check_can_be_turned_off(program: Path) -> None:
    res = run(program, "kernel", COCOVIZ_EMU_INITCHECK="0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok kernel" in res.stdout
