"""`cocoviz run --mpi` on overlapped groups that chunk rows (issue 26, item 4): groups
with no collective, groups whose values are sliced along the last dimension, and the
exit code of a failure of the MPI executor itself.

Chunk k of a value on a rank is laid out as the emitter lays it out
(`cocoviz.exec.layout.chunk_positions`, docs/schedules.md, overlap); the runs are
compared with the reference of the unscheduled program as `run` compares them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from mpi_support import mpi, run_and_compare  # noqa: F401 - mpi is a fixture

from cocoviz.cli import main
from cocoviz.emit.body import view_of
from cocoviz.errors import ExitCode, InputError, InternalError
from cocoviz.exec import mpi_run
from cocoviz.exec.layout import (
    chunk_positions,
    chunked_slices,
    global_flat_index,
    locate,
    rank_positions,
)
from cocoviz.exec.mpi_worker import is_internal
from cocoviz.ir.lower import load_program

needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


# the reproducer of the issue: every value replicated, no collective in the group
REPLICATED_MLP = """program mlp
ranks 2
dim M = 8, K = 16, F = 32
input x : {dt}[M, K] replicated
input w1 : {dt}[K, F] replicated
input w2 : {dt}[F, K] replicated
h = matmul(x, w1)
a = gelu(h)
y = matmul(a, w2)
output y

schedule ol {{
  overlap(h, a, y, chunks=2)
}}
"""

# h and a sliced along the last dimension; the bias is read at global positions
COLUMN_MLP = """program column_mlp
ranks 2
dim M = 8, K = 16, F = 32
input x : {dt}[M, K] replicated
input w1 : {dt}[K, F] sliced(1)
input w2 : {dt}[F, K] sliced(0)
input b : {dt}[F] replicated
h = matmul(x, w1)
a = gelu(h + b)
y = matmul(a, w2)
s = allreduce(+, y)
output s

schedule no_collective {{
  overlap(h, a, y, chunks=2)
}}
schedule with_allreduce {{
  overlap(h, a, y, s, chunks=4)
}}
"""

# a value sliced along the last dimension gathered inside the group, dropout drawn at
# the global positions of block-sliced and replicated chunks, a row-wise op on chunks
GATHERED_COLUMNS = """program gathered_columns
ranks 2
dim B = 2, S = 4, K = 16, F = 32
input x : {dt}[B, S, K] replicated
input w1 : {dt}[K, F] sliced(1)
input b : {dt}[F] replicated
input r : {dt}[B, S, F] replicated
input g : {dt}[F] replicated
h = matmul(x, w1)
a = dropout(gelu(h + b), 0.1) + r
ag = allgather(a)
n = layernorm(ag, g, g, eps=1e-5)
o = dropout(n, 0.2) * 2
output o

schedule gather {{
  overlap(h, a, ag, chunks=2)
}}
schedule all_rows {{
  overlap(h, a, ag, n, o, chunks=8)
}}
"""


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_group_without_collective_matches_reference(tmp_path: Path, dt: str, capsys) -> None:
    run_and_compare(tmp_path, REPLICATED_MLP.format(dt=dt), "ol", 2, capsys)


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("schedule", ["no_collective", "with_allreduce"])
def test_values_sliced_along_the_last_dimension(
    tmp_path: Path, schedule: str, ranks: int, dt: str, capsys
) -> None:
    run_and_compare(tmp_path, COLUMN_MLP.format(dt=dt), schedule, ranks, capsys)


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("schedule", ["gather", "all_rows"])
def test_gathered_columns_dropout_and_rows(
    tmp_path: Path, schedule: str, ranks: int, dt: str, capsys
) -> None:
    run_and_compare(tmp_path, GATHERED_COLUMNS.format(dt=dt), schedule, ranks, capsys)


# --- the exit-code rule -------------------------------------------------------------


def _processes_of(marker: Path) -> list[int]:
    """Live processes (not zombies) whose environment holds `marker`."""
    key = str(marker).encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if key in env and stat[stat.rindex(")") + 2] not in "ZX":
            found.append(int(d.name))
    return found


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
@needs_proc
def test_executor_failure_is_an_internal_error_not_a_failed_build(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """An exception inside the workers that is nobody's input (here every rank asked for
    a value the program does not have) ends `run` with exit 70, naming the MPI executor,
    the rank and the exception, never with exit 5; nothing of the run is left."""
    src = tmp_path / "prog.coco"
    src.write_text(REPLICATED_MLP.format(dt="f32"))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    monkeypatch.setattr(mpi_run.tempfile, "tempdir", str(jobs))
    real = mpi_run.run_mpi
    monkeypatch.setattr(
        mpi_run, "run_mpi", lambda p, names, **kw: real(p, [*names, "no_such_value"], **kw)
    )
    rc = main(["run", str(src), "--schedule", "ol", "--mpi", "--ranks", "2"])
    err = capsys.readouterr().err
    assert rc == ExitCode.INTERNAL != ExitCode.BUILD
    assert "internal error" in err
    # every rank fails the same way; which one reports first is a race
    assert re.search(r"the MPI executor failed on rank [01]: KeyError: 'no_such_value'", err)
    assert list(jobs.glob("cocoviz-mpi-*")) == []
    assert _processes_of(jobs) == []


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
def test_executor_failure_through_the_api(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(mpi_run.tempfile, "tempdir", str(tmp_path))
    prog = load_program(REPLICATED_MLP.format(dt="f32"))
    with pytest.raises(InternalError, match=r"MPI executor failed on rank \d: KeyError"):
        mpi_run.run_mpi(prog, ["y", "no_such_value"])
    assert list(tmp_path.glob("cocoviz-mpi-*")) == []


def test_which_worker_exceptions_are_internal() -> None:
    assert is_internal(ValueError("cannot reshape"))
    assert is_internal(KeyError("a"))
    assert is_internal(AssertionError())
    assert is_internal(InternalError("broken"))
    assert not is_internal(InputError("the input file changed"))
    assert not is_internal(MemoryError())
    assert not is_internal(OSError(28, "No space left on device"))
    assert not is_internal(KeyboardInterrupt())


# --- the layout of chunks -----------------------------------------------------------

LAYOUTS = """program layouts
ranks 4
dim B = 2, S = 8, H = 16
input rep : f32[B, S, H] replicated
input loc : f32[B, S, H] local
input flat : f32[B, S, H] sliced
input cols : f32[B, S, H] sliced(2)
input mid : f32[B, S, H] sliced(1)
out = rep * 1
output out
"""


@pytest.mark.parametrize("name", ["rep", "loc", "flat", "cols", "mid"])
@pytest.mark.parametrize("chunks", [2, 4, 8])
def test_chunk_positions_follow_the_emitters_views(name: str, chunks: int) -> None:
    """Chunk k of a value on rank r is the emitter's: for its `chunked` view the global
    elements from k·n/K + r·n/(K·G) on, otherwise the k-th 1/K of the rank's storage; the
    chunks of a rank tile what it stores (or, chunk by chunk, the whole value)."""
    prog = load_program(LAYOUTS)
    ty = prog.type_of(name)
    G, n = 4, ty.numel
    view = view_of(ty, G, chunks)
    assert chunked_slices(ty) is (view.kind == "chunked")
    covered = []
    for r in range(G):
        held = rank_positions(ty, G, r)
        parts = [chunk_positions(ty, G, r, chunks, k) for k in range(chunks)]
        assert all(p.size == view.count // chunks for p in parts)
        for k, p in enumerate(parts):
            if view.kind == "chunked":
                lo = k * n // chunks + r * n // (chunks * G)
                assert np.array_equal(p, np.arange(lo, lo + p.size))
            else:
                c = held.size // chunks
                assert np.array_equal(p, held[k * c : (k + 1) * c])
        covered.append(np.concatenate(parts))
        if view.kind != "chunked":
            assert np.array_equal(covered[-1], held)
        if ty.layout.is_sliced and view.kind == "block":
            assert np.array_equal(held, global_flat_index(ty, G, r).reshape(-1))
    if ty.layout.is_sliced:
        assert np.array_equal(np.sort(np.concatenate(covered)), np.arange(n))


def test_locate_finds_views_slices_and_gathers() -> None:
    held = np.arange(10, 20, dtype=np.int64)
    assert locate(held, held.copy()) is None
    assert locate(held, np.arange(12, 15, dtype=np.int64)) == slice(2, 5)
    assert np.array_equal(locate(held, np.array([19, 10, 10])), [9, 0, 0])
    blocks = np.array([0, 1, 4, 5, 8, 9], dtype=np.int64)
    assert np.array_equal(locate(blocks, np.array([4, 9, 0])), [2, 5, 0])
    shuffled = np.array([4, 5, 0, 1], dtype=np.int64)
    assert np.array_equal(locate(shuffled, np.array([0, 1, 4, 5])), [2, 3, 0, 1])
    with pytest.raises(LookupError):
        locate(blocks, np.array([2]))
    with pytest.raises(LookupError):
        locate(held, np.array([20]))
