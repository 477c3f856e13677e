"""The emulation's racecheck (docs/codegen.md, "Emulation"): the threads of one block between
two barriers are concurrent, so two of them touching one address of global or __shared__
memory, at least one writing, with no __syncthreads() between them, end the run
("cocoviz emulation: [rank R] intra-block race") naming both threads and both source lines,
as compute-sanitizer's racecheck does. The hazard checker treats a block as one agent; this
is what sees inside it.

- a hand-written shared-memory tree reduction without the __syncthreads() in its loop is
  reported with the lines of both accesses; with it, it is clean and sums right;
- two threads storing to one global address are reported; atomics are not;
- the emitted programs' block reduction goes through COCOVIZ_LD/ST so it is checked, and
  an emitted tree (lamb: norms reduce in shared memory) with that __syncthreads() deleted
  fails its emulated check with the race, while the tree as emitted passes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from emit_support import (
    EMU_TEST_FLAGS,
    build_emulated,
    build_emulated_program,
    emit_files,
    emulation_lib,
    make,
)
from test_emit_emulate import run_emulated

SOURCE = r"""
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

constexpr int kThreads = 64;

// a shared-memory tree reduction per block; `sync` = false leaves out the loop's barrier
__global__ void block_sum(const float* in, float* out, bool sync) {
  __shared__ float sh[kThreads];
  COCOVIZ_ST(sh, threadIdx.x) = COCOVIZ_LD(in, blockIdx.x * blockDim.x + threadIdx.x);
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float o = COCOVIZ_LD(sh, threadIdx.x + s);  // @read-partner
      const float m = COCOVIZ_LD(sh, threadIdx.x);
      COCOVIZ_ST(sh, threadIdx.x) = m + o;  // @write-own
    }
    if (sync) __syncthreads();
  }
  if (threadIdx.x == 0) COCOVIZ_ST(out, blockIdx.x) = COCOVIZ_LD(sh, 0);
}

__global__ void all_store(float* out) {
  COCOVIZ_ST(out, 0) = static_cast<float>(threadIdx.x);  // @store-one
}

__global__ void count(int* c) { atomicAdd(c, 1); }

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  const int n = 4 * kThreads;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i % 7);
  void* a = nullptr;
  void* b = nullptr;
  cudaMalloc(&a, n * sizeof(float));
  cudaMalloc(&b, n * sizeof(float));
  if (!std::strcmp(mode, "missing-sync") || !std::strcmp(mode, "with-sync")) {
    cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    COCOVIZ_LAUNCH(block_sum, 4, kThreads, 0, nullptr)(static_cast<float*>(a), static_cast<float*>(b),
                                                       !std::strcmp(mode, "with-sync"));
    std::vector<float> s(4);
    cudaMemcpy(s.data(), b, 4 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int k = 0; k < 4; ++k) {
      float want = 0;
      for (int i = 0; i < kThreads; ++i) want += h[k * kThreads + i];
      if (s[k] != want) {
        std::printf("block %d: sum %g, want %g\n", k, s[k], want);
        return 1;
      }
    }
  } else if (!std::strcmp(mode, "same-store")) {
    COCOVIZ_LAUNCH(all_store, 1, kThreads, 0, nullptr)(static_cast<float*>(b));
  } else if (!std::strcmp(mode, "atomics")) {
    cudaMemset(a, 0, sizeof(int));
    COCOVIZ_LAUNCH(count, 2, kThreads, 0, nullptr)(static_cast<int*>(a));
    int c = 0;
    cudaMemcpy(&c, a, sizeof(int), cudaMemcpyDeviceToHost);
    if (c != 2 * kThreads) return 1;
  }
  cudaDeviceSynchronize();
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
def program(tmp_path_factory: pytest.TempPathFactory, emu_cache: Path) -> Path:
    d = tmp_path_factory.mktemp("racecheck")
    src = d / "racecheck.cu"
    src.write_text(SOURCE.lstrip("\n"))
    return build_emulated_program(src, d / "racecheck", emu_cache)


def run(program: Path, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("COCOVIZ_EMU_RACECHECK", None)
    e.update(env)
    return subprocess.run(
        [str(program), mode], capture_output=True, text=True, timeout=120, check=False, env=e
    )


@pytest.mark.build
def test_missing_syncthreads_in_a_shared_reduction_is_reported_with_both_lines(
    program: Path,
) -> None:
    res = run(program, "missing-sync")
    assert res.returncode == 3, res.stdout + res.stderr
    err = res.stderr
    assert "intra-block race: write after read between two threads of one block" in err, err
    # thread 1 overwrites sh[1] (its own slot) after thread 0 read it as its partner at
    # s = 1: thread 0 ran the whole loop first, nothing held it at a barrier
    this = re.search(r"this access: write by thread \((\d+),0,0\) at (\S+)", err)
    earlier = re.search(r"earlier access: read by thread \((\d+),0,0\) at (\S+)", err)
    assert this and earlier, err
    assert this.group(2).endswith(f"racecheck.cu:{line_of('@write-own')}"), err
    assert earlier.group(2).endswith(f"racecheck.cu:{line_of('@read-partner')}"), err
    assert this.group(1) != earlier.group(1)
    assert "__shared__ memory" in err and "block (0,0,0) of kernel block_sum" in err, err


@pytest.mark.build
def test_the_reduction_with_its_barrier_is_clean_and_right(program: Path) -> None:
    res = run(program, "with-sync")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cocoviz emulation" not in res.stderr, res.stderr
    assert "ok with-sync" in res.stdout


@pytest.mark.build
def test_two_threads_storing_one_global_address_race(program: Path) -> None:
    res = run(program, "same-store")
    assert res.returncode == 3, res.stdout + res.stderr
    err = res.stderr
    assert "intra-block race: write after write" in err, err
    at = f"racecheck.cu:{line_of('@store-one')}"
    assert re.search(rf"this access: write by thread \(1,0,0\) at \S*{re.escape(at)}", err), err
    assert re.search(rf"earlier access: write by thread \(0,0,0\) at \S*{re.escape(at)}", err), err
    assert "device allocation of 1024 bytes" in err and "bytes [0, 4)" in err, err


@pytest.mark.build
def test_atomics_of_one_block_do_not_race(program: Path) -> None:
    res = run(program, "atomics")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok atomics" in res.stdout


@pytest.mark.build
def test_racecheck_can_be_turned_off(program: Path) -> None:
    # without the check only the fibers' one order (each thread runs to its next barrier)
    # is seen: whatever sums it gives, nothing names the race
    res = run(program, "missing-sync", COCOVIZ_EMU_RACECHECK="0")
    assert res.returncode != 3, res.stdout + res.stderr
    assert "intra-block race" not in res.stderr, res.stderr


def test_emitted_block_reduction_is_visible_to_racecheck() -> None:
    src = emit_files("lamb", "ar_c", "cuda", ranks="2")["lamb.cu"]
    body = src[src.index("__device__ T block_reduce") :]
    body = body[: body.index("\n}\n")]
    assert "COCOVIZ_ST(sh, threadIdx.x) = v;" in body
    assert "COCOVIZ_LD(sh, threadIdx.x + s)" in body
    assert not re.search(r"\bsh\[", body), body  # no unchecked shared access left


LOOP_BARRIER = "    }\n    __syncthreads();\n  }\n  const T r = COCOVIZ_LD(sh, 0);"


@pytest.mark.build
def test_emitted_tree_without_the_reduction_barrier_fails_its_check(
    emu_cache: Path, tmp_path: Path
) -> None:
    files = emit_files("lamb", "ar_c", "cuda", ranks="2")
    base = build_emulated(files, emu_cache)
    ok = run_emulated(base, "--check", "--iters", "1", "--warmup", "0")
    assert ok.returncode == 0 and "cocoviz emulation" not in ok.stderr, ok.stdout + ok.stderr
    tree = tmp_path / "mutant"
    shutil.copytree(base, tree, ignore=shutil.ignore_patterns("dump", ".built", ".passed"))
    prog = tree / "lamb.cu"
    text = prog.read_text()
    assert text.count(LOOP_BARRIER) == 1
    mutated = text.replace(LOOP_BARRIER, "    }\n  }\n  const T r = COCOVIZ_LD(sh, 0);")
    prog.write_text(mutated)
    res = make(tree, "emulate", f"EMU_LIB={emulation_lib(emu_cache)}", EMU_TEST_FLAGS)
    assert res.returncode == 0, res.stdout + res.stderr
    run_ = run_emulated(tree, "--check", "--iters", "1", "--warmup", "0")
    assert run_.returncode != 0, run_.stdout + run_.stderr
    assert "intra-block race" in run_.stderr, run_.stderr
    lines = re.findall(
        r"access: (?:read|write) by thread \(\d+,0,0\) at \S*lamb\.cu:(\d+)", run_.stderr
    )
    assert len(lines) >= 2, run_.stderr
    # both lines lie in block_reduce's loop
    src = mutated.splitlines()
    for n in lines[:2]:
        assert "COCOVIZ_" in src[int(n) - 1] and "sh" in src[int(n) - 1], src[int(n) - 1]
