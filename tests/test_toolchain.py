"""cocoviz.emit.toolchain finds nvcc, NCCL, cuBLAS and MPI, and its flags really build.

The CUDA program includes mpi.h, nccl.h, nccl_device.h (a kernel on an LSA barrier and
ncclGetLsaPointer) and cublas_v2.h, calls MPI_Init, ncclCommInitRank and cublasGemmEx,
and is compiled *and linked* for sm_90 with `Toolchain.nvcc_command` and for sm_80 through
a Makefile made of `Toolchain.make_variables` (no GPU here, so it is not run). The CPU
program is built with the found mpicxx and -fopenmp and runs under ``mpiexec -n 4``.

Missing tools skip these tests, unless ``COCOVIZ_REQUIRE_NVCC=1`` (or, for MPI,
``COCOVIZ_REQUIRE_MPI=1``) makes that a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from conftest import need_tool

from cocoviz.emit.toolchain import (
    CudaToolkit,
    Toolchain,
    arch_number,
    find_toolchain,
    link_arg,
)
from cocoviz.errors import BuildError


def need(found: object, what: str, mpi: bool = False) -> None:
    """Skip when a tool is missing; fail instead under COCOVIZ_REQUIRE_NVCC=1 (or, for
    MPI tools, COCOVIZ_REQUIRE_MPI=1): tests/conftest.py's need_tool."""
    need_tool(found, what, mpi=mpi)


def run(
    cmd: list[str], cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, check=False, cwd=cwd, env=env
    )
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def toolchain() -> Toolchain:
    return find_toolchain()


@pytest.fixture(scope="module")
def cuda_toolchain(toolchain: Toolchain) -> Toolchain:
    need(toolchain.cuda, "nvcc (the CUDA toolkit)")
    need(toolchain.nccl, "NCCL (NCCL_HOME or nvidia-nccl-cu13)")
    need(toolchain.cublas, "cuBLAS (CUBLAS_HOME or nvidia-cublas)")
    need(toolchain.mpi, "MPI (mpicxx)", mpi=True)
    return toolchain


# ------------------------------------------------------------------ discovery


def test_link_arg_prefers_plain_so_then_soname(tmp_path: Path) -> None:
    assert link_arg(tmp_path, "nccl") is None
    (tmp_path / "libnccl.so.2.32.3").touch()
    assert link_arg(tmp_path, "nccl") == "-l:libnccl.so.2.32.3"
    (tmp_path / "libnccl.so.1").touch()
    (tmp_path / "libnccl.so.2").touch()
    assert link_arg(tmp_path, "nccl") == "-l:libnccl.so.2"
    (tmp_path / "libnccl.so").touch()
    assert link_arg(tmp_path, "nccl") == "-lnccl"
    # libcublasLt.so.13 must not be taken for libcublas.
    (tmp_path / "libcublasLt.so.13").touch()
    assert link_arg(tmp_path, "cublas") is None


def _fake_library(home: Path, header: str, lib: str) -> Path:
    (home / "include").mkdir(parents=True)
    (home / "lib").mkdir()
    (home / "include" / header).write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 29\n")
    (home / "lib" / lib).touch()
    return home


def test_homes_from_the_environment(tmp_path: Path) -> None:
    nccl = _fake_library(tmp_path / "nccl", "nccl.h", "libnccl.so.2")
    cublas = _fake_library(tmp_path / "cublas", "cublas_v2.h", "libcublas.so.12")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "NCCL_HOME": str(nccl),
        "CUBLAS_HOME": str(cublas),
        "MPI_HOME": str(tmp_path / "nompi"),
        "CUDA_HOME": str(tmp_path / "nocuda"),
    }
    tc = find_toolchain(env)
    assert tc.nccl is not None and tc.nccl.source == "NCCL_HOME"
    assert tc.nccl.link_args == ("-l:libnccl.so.2",)
    assert tc.nccl.version == (2, 29)
    assert tc.cublas is not None and tc.cublas.link_args == ("-l:libcublas.so.12",)
    # Explicit homes that lack the tool are reported, not replaced by a fallback.
    assert tc.mpi is None and tc.cuda is None
    assert any("MPI_HOME" in n for n in tc.notes)
    assert any("CUDA_HOME" in n for n in tc.notes)
    assert [m.split(" ")[0] for m in tc.missing("cuda")] == ["MPI", "the"]
    with pytest.raises(BuildError, match="MPI_HOME"):
        tc.require("cpu")

    bad = find_toolchain({**env, "NCCL_HOME": str(tmp_path / "cublas")})
    assert bad.nccl is None and any("nccl.h" in n for n in bad.notes)


def test_arch_rules() -> None:
    assert arch_number("sm_90") == 90 and arch_number("sm_90a") == 90
    with pytest.raises(ValueError, match="sm_80"):
        arch_number("90")
    cuda13 = CudaToolkit(Path("/cuda"), Path("/cuda/bin/nvcc"), (13, 0), ())
    assert cuda13.supports("sm_80") and cuda13.supports("sm_90")
    assert not cuda13.supports("sm_70")
    tc = Toolchain(cuda13, None, None, None, None)
    with pytest.raises(BuildError, match="CUDA 13.0 cannot build sm_70"):
        tc.check_arch("sm_70")
    with pytest.raises(BuildError, match="not a CUDA architecture"):
        tc.check_arch("volta")
    with pytest.raises(BuildError, match="NCCL"):
        tc.require("cuda", "sm_90")


def test_found_toolchain(cuda_toolchain: Toolchain) -> None:
    tc = cuda_toolchain
    assert tc.cuda is not None and tc.nccl is not None and tc.cublas is not None
    assert tc.mpi is not None
    assert tc.cuda.supports("sm_80") and tc.cuda.supports("sm_90")
    assert (tc.nccl.include_dir / "nccl.h").exists()
    assert tc.nccl_device_api, "NCCL >= 2.28 with nccl_device.h is expected"
    assert tc.cublas.link_args[0] in ("-lcublas", "-l:libcublas.so.13")
    assert (tc.mpi.include_dirs[0] / "mpi.h").exists()
    assert tc.missing("cuda") == ()
    assert "NCCL" in tc.describe()


def test_finding_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from cocoviz.emit.toolchain import find_toolchain\n"
        "find_toolchain()\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('nvidia', 'mpi4py')]\n"
        "print(heavy)\n"
    )
    res = run([sys.executable, "-c", code])
    assert res.stdout.strip() == "[]"


def test_make_variables_refer_to_homes(cuda_toolchain: Toolchain) -> None:
    v = cuda_toolchain.make_variables("sm_80")
    assert v["ARCH"] == "sm_80"
    assert v["NCCL_INC"] == "$(NCCL_HOME)/include"
    assert v["CUBLAS_LIBDIR"] == "$(CUBLAS_HOME)/lib"
    assert "$(ARCH)" in v["NVCCFLAGS"] and "-Wall" in v["NVCCFLAGS"]
    assert v["CUDA_CPPFLAGS"].startswith("-isystem ")
    assert "-fopenmp" in v["CXXFLAGS"]
    assert list(v)[:3] == ["CUDA_HOME", "NVCC", "ARCH"]


# ------------------------------------------------------------------- CUDA build


CUDA_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <nccl_device.h>

#define REQUIRE(what, ok)                                    \
  do {                                                       \
    if (!(ok)) {                                             \
      std::fprintf(stderr, "%s failed\n", what);             \
      MPI_Abort(MPI_COMM_WORLD, 1);                          \
    }                                                        \
  } while (0)

// Each rank sums element i over its LSA peers' windows, between two LSA barriers.
__global__ void peer_sum(ncclWindow_t win, size_t offset, float* out, size_t count,
                         ncclDevComm dev) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dev, ncclTeamTagLsa(), blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_relaxed);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    float acc = 0.0f;
    for (int peer = 0; peer < dev.lsaSize; ++peer) {
      acc += static_cast<const float*>(ncclGetLsaPointer(win, offset, peer))[i];
    }
    out[i] = acc;
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_release);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  ncclUniqueId id;
  if (rank == 0) REQUIRE("ncclGetUniqueId", ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  REQUIRE("ncclCommInitRank", ncclCommInitRank(&comm, nranks, id, rank) == ncclSuccess);

  const size_t count = 1 << 16, bytes = count * sizeof(float);
  void* window_buf = nullptr;
  REQUIRE("ncclMemAlloc", ncclMemAlloc(&window_buf, bytes) == ncclSuccess);
  ncclWindow_t win;
  REQUIRE("ncclCommWindowRegister",
          ncclCommWindowRegister(comm, window_buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC) ==
              ncclSuccess);
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.lsaBarrierCount = 4;
  ncclDevComm dev;
  REQUIRE("ncclDevCommCreate", ncclDevCommCreate(comm, &reqs, &dev) == ncclSuccess);
  REQUIRE("lsaSize", dev.lsaSize == nranks);

  float* out = nullptr;
  REQUIRE("cudaMalloc", cudaMalloc(&out, bytes) == cudaSuccess);
  peer_sum<<<4, 256>>>(win, 0, out, count, dev);
  REQUIRE("launch", cudaGetLastError() == cudaSuccess);

  cublasHandle_t handle;
  REQUIRE("cublasCreate", cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  REQUIRE("cublasGemmEx",
          cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &alpha, out, CUDA_R_32F,
                       64, out + 4096, CUDA_R_32F, 64, &beta, out + 8192, CUDA_R_32F, 64,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  REQUIRE("cudaDeviceSynchronize", cudaDeviceSynchronize() == cudaSuccess);

  cublasDestroy(handle);
  cudaFree(out);
  ncclDevCommDestroy(comm, &dev);
  ncclCommWindowDeregister(comm, win);
  ncclMemFree(window_buf);
  ncclCommDestroy(comm);
  MPI_Finalize();
  if (rank == 0) std::printf("ok\n");
  return 0;
}
"""

# Warnings are errors both in nvcc's front end and in the host compiler.
STRICT_NVCC = ["-Werror", "all-warnings", "-Xcompiler", "-Werror"]


def _check_binary(exe: Path, tc: Toolchain) -> None:
    assert tc.nccl is not None and tc.cublas is not None
    dyn = run(["readelf", "-d", str(exe)]).stdout
    for soname in ("libnccl.so.2", "libcublas.so.", "libmpi.so"):
        assert soname in dyn, f"{soname} not linked:\n{dyn}"
    # The wheels' directories are not on the loader path: the binary must carry them.
    assert str(tc.nccl.lib_dir) in dyn and str(tc.cublas.lib_dir) in dyn
    ldd = run(["ldd", str(exe)]).stdout
    assert "not found" not in ldd, ldd


def _assert_quiet(res: subprocess.CompletedProcess[str]) -> None:
    # Compilers warn on stderr (make echoes the command, "all-warnings" included, on stdout).
    assert "warning" not in res.stderr.lower(), res.stderr


def test_nvcc_builds_nccl_cublas_mpi_program_sm90(
    cuda_toolchain: Toolchain, tmp_path: Path
) -> None:
    src = tmp_path / "prog.cu"
    src.write_text(CUDA_PROGRAM)
    exe = tmp_path / "prog"
    cmd = cuda_toolchain.nvcc_command([src], exe, "sm_90")
    assert "-isystem" in cmd and any(a.startswith("-rpath,") for a in cmd)
    res = run(cmd[:1] + STRICT_NVCC + cmd[1:])
    _assert_quiet(res)
    _check_binary(exe, cuda_toolchain)


MAKEFILE_RULES = """
prog: prog.cu
\t$(NVCC) $(NVCCFLAGS) $(STRICT) $(CUDA_CPPFLAGS) $< -o $@ $(CUDA_LDFLAGS) $(CUDA_LDLIBS)
"""


def test_makefile_variables_build_sm80(cuda_toolchain: Toolchain, tmp_path: Path) -> None:
    make = run(["sh", "-c", "command -v make || true"]).stdout.strip()
    need(make, "make")
    (tmp_path / "prog.cu").write_text(CUDA_PROGRAM)
    lines = [f"{k} ?= {v}" for k, v in cuda_toolchain.make_variables("sm_90").items()]
    lines.append("STRICT = " + " ".join(STRICT_NVCC))
    (tmp_path / "Makefile").write_text("\n".join(lines) + "\n" + MAKEFILE_RULES)
    env = {k: v for k, v in os.environ.items() if k not in ("ARCH", "NVCCFLAGS", "CXXFLAGS")}
    res = run([make, "ARCH=sm_80", "prog"], cwd=tmp_path, env=env)
    assert "-arch=sm_80" in res.stdout
    _assert_quiet(res)
    _check_binary(tmp_path / "prog", cuda_toolchain)


# -------------------------------------------------------------------- CPU build


CPU_PROGRAM = r"""
#include <mpi.h>
#include <omp.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  long local = 0;
  int threads = 0;
#pragma omp parallel for reduction(+ : local) reduction(max : threads)
  for (int i = 0; i < 100000; ++i) {
    local += (i % 7) + rank;
    threads = omp_get_num_threads();
  }
  long total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  int min_threads = 0;
  MPI_Allreduce(&threads, &min_threads, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) std::printf("ranks=%d threads=%d sum=%ld\n", nranks, min_threads, total);
  MPI_Finalize();
  return 0;
}
"""


def _expected_cpu_sum(nranks: int) -> int:
    per_rank = sum(i % 7 for i in range(100000))
    return sum(per_rank + 100000 * r for r in range(nranks))


def test_mpicxx_openmp_program_runs_on_4_ranks(toolchain: Toolchain, tmp_path: Path) -> None:
    need(toolchain.mpi, "MPI (mpicxx, mpiexec)", mpi=True)
    src = tmp_path / "cpu.cpp"
    src.write_text(CPU_PROGRAM)
    exe = tmp_path / "cpu"
    cmd = toolchain.mpicxx_command([src], exe)
    assert "-fopenmp" in cmd
    res = run(cmd[:1] + ["-Werror", "-Wextra"] + cmd[1:])
    _assert_quiet(res)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = run(toolchain.mpiexec_command(4, [exe]), env=env).stdout.strip()
    assert out == f"ranks=4 threads=2 sum={_expected_cpu_sum(4)}"
