"""The emulation's deadlock detector (docs/codegen.md, "Emulation"): every rank publishes
on its status board ($COCOVIZ_EMU_DIR/status-R) what it waits for and on whom — an
emulated NCCL wait, a blocking MPI call of the program (wrapped through MPI's profiling
interface), or its exit. Once every rank has stayed blocked in the same wait for
COCOVIZ_EMU_DEADLOCK_S seconds while the polling ones kept failing, no rank can progress:
the run ends with "deadlock: every rank is blocked", the wait-for cycle (which rank waits
for which operation on which peer) and every rank's wait — in about a second, not the
COCOVIZ_EMU_TIMEOUT watchdog's 60 s, which stays the backstop.

A hand-written program on 3 ranks: receives in a ring with no sends (a cycle of three
receives); a send to the wrong peer while the others reach an MPI barrier (a receive
against two ranks in MPI, the stray send shown with its sender); and, for the other side, a correct ring with one late rank per
round under a 50 ms detection window, which must pass."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import emulation_cache
from emit_support import build_emulated_program

from cocoviz.emit.toolchain import find_toolchain

pytestmark = pytest.mark.build

SOURCE = r"""
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CALL(x)                                                              \
  do {                                                                       \
    ::cocoviz_emu::set_site("test", __FILE__, __LINE__, #x);                 \
    if ((x) != 0) {                                                          \
      std::fprintf(stderr, "failed: %s\n", #x);                              \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* mode = argc > 1 ? argv[1] : "";
  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CALL(ncclCommInitRank(&comm, size, id, rank));
  cudaStream_t s;
  CALL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* buf = nullptr;
  CALL(cudaMalloc(&buf, 64 * sizeof(float)));
  CALL(cudaMemset(buf, 0, 64 * sizeof(float)));
  CALL(cudaDeviceSynchronize());
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  if (!std::strcmp(mode, "ring-ok")) {
    for (int k = 0; k < 12; ++k) {
      CALL(ncclGroupStart());
      CALL(ncclSend(buf, 16, ncclFloat32, next, comm, s));
      CALL(ncclRecv(buf + 32, 16, ncclFloat32, prev, comm, s));
      CALL(ncclGroupEnd());
      if (rank == k % size) usleep(150000);  // the others wait for this rank meanwhile
      CALL(ncclAllReduce(buf, buf + 16, 16, ncclFloat32, ncclSum, comm, s));
      CALL(cudaStreamSynchronize(s));
      if (rank == (k + 1) % size) usleep(100000);
      MPI_Barrier(MPI_COMM_WORLD);
    }
  } else if (!std::strcmp(mode, "recv-ring")) {
    CALL(ncclRecv(buf + 32, 16, ncclFloat32, prev, comm, s));  // @recv
    CALL(ncclSend(buf, 16, ncclFloat32, next, comm, s));
  } else if (!std::strcmp(mode, "wrong-peer")) {
    if (rank == 0) CALL(ncclSend(buf, 16, ncclFloat32, size - 1, comm, s));  // meant for rank 1
    if (rank == 1) CALL(ncclRecv(buf + 32, 16, ncclFloat32, 0, comm, s));  // @recv-from-0
    CALL(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  CALL(cudaStreamSynchronize(s));
  CALL(ncclCommDestroy(comm));
  std::printf("ok %s\n", mode);
  MPI_Finalize();
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
    d = tmp_path_factory.mktemp("deadlock")
    src = d / "deadlock.cu"
    src.write_text(SOURCE.lstrip("\n"))
    cache = emulation_cache(tmp_path_factory)
    return build_emulated_program(src, d / "deadlock", cache)


def run(
    program: Path, mode: str, tmp_path: Path, emu_dir: Path | None = None, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    d = emu_dir or tmp_path / f"run-{mode}-{len(list(tmp_path.iterdir()))}"
    d.mkdir(exist_ok=True)
    e = dict(os.environ)
    for k in ("COCOVIZ_EMU_DEADLOCK_S", "COCOVIZ_EMU_ORDER"):
        e.pop(k, None)
    e.update({"COCOVIZ_EMU_DIR": str(d), "COCOVIZ_EMU_TIMEOUT": "60"})
    e.update(env)
    start = time.monotonic()
    res = subprocess.run(
        find_toolchain().mpiexec_command(3, [program, mode]),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        env=e,
    )
    return res, time.monotonic() - start


def test_a_ring_of_receives_is_reported_as_a_cycle_at_once(program: Path, tmp_path: Path) -> None:
    res, took = run(program, "recv-ring", tmp_path)
    err = res.stderr
    assert res.returncode != 0, res.stdout + err
    assert "deadlock: every rank is blocked" in err, err
    assert "watchdog: no progress" not in err, err
    assert took < 30, f"{took:.1f} s: the detector should not wait for the 60 s watchdog"
    cycle = err[err.index("wait-for cycle:") : err.index("every rank:")]
    # each rank of the cycle waits for the ncclRecv from its predecessor, which waits too
    found = re.findall(r"rank (\d) waits: ncclRecv from rank (\d) .*-> needs rank (\d)", cycle)
    assert len(found) == 3, cycle
    for me, peer, needs in found:
        assert peer == needs == str((int(me) + 2) % 3), cycle
    assert f"deadlock.cu:{line_of('@recv')}" in cycle, cycle


def test_a_send_to_the_wrong_peer_is_reported_against_ranks_in_mpi(
    program: Path, tmp_path: Path
) -> None:
    res, took = run(program, "wrong-peer", tmp_path)
    err = res.stderr
    assert res.returncode != 0, res.stdout + err
    assert "deadlock: every rank is blocked" in err, err
    assert took < 30, f"{took:.1f} s"
    cycle = err[err.index("wait-for cycle:") : err.index("every rank:")]
    assert re.search(r"rank 1 waits: ncclRecv from rank 0 .*-> needs rank 0", cycle), cycle
    assert re.search(r"rank 0 is blocked in MPI: MPI_Barrier .*-> needs rank 1", cycle), cycle
    assert f"deadlock.cu:{line_of('@recv-from-0')}" in cycle, cycle
    # the whole picture: rank 2 sits in the barrier too, and rank 0's send went to it
    assert re.search(r"rank 2 is blocked in MPI: MPI_Barrier", err), err
    assert re.search(
        r"rank 0 is blocked in MPI: .*its sends not received: ncclSend to rank 2 ", err
    ), err


def test_ranks_that_only_wait_for_a_late_peer_are_not_a_deadlock(
    program: Path, tmp_path: Path
) -> None:
    res, _ = run(program, "ring-ok", tmp_path, COCOVIZ_EMU_DEADLOCK_S="0.05")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "cocoviz emulation" not in res.stderr, res.stderr
    assert res.stdout.count("ok ring-ok") == 3


def test_boards_left_by_an_earlier_run_are_not_read_as_this_one(
    program: Path, tmp_path: Path
) -> None:
    # a deadlocked run leaves its boards (blocked ranks) in the directory; the next run
    # there must not take them for its own ranks before they have started
    shared = tmp_path / "shared"
    res, _ = run(program, "recv-ring", tmp_path, emu_dir=shared)
    assert "deadlock: every rank is blocked" in res.stderr, res.stderr
    (shared / "watchdog").unlink()  # the report's claim, which the next run must make anew
    res, _ = run(program, "ring-ok", tmp_path, emu_dir=shared, COCOVIZ_EMU_DEADLOCK_S="0.05")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ok ring-ok") == 3


def test_without_the_detector_the_watchdog_still_ends_it(program: Path, tmp_path: Path) -> None:
    res, _ = run(
        program, "recv-ring", tmp_path, COCOVIZ_EMU_DEADLOCK_S="0", COCOVIZ_EMU_TIMEOUT="3"
    )
    assert res.returncode != 0, res.stdout + res.stderr
    assert "watchdog: no progress for 3 s" in res.stderr, res.stderr
    assert "deadlock: every rank is blocked" not in res.stderr, res.stderr
