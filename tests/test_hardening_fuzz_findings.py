"""What the final fuzz runs of issue 31 found (bench/fuzz_cli.py with the newer commands
and forms), each fixed and kept here: a nested manifest.json, an output refused only after
the work, a trace of every one of 65,536 ranks, and a hostile autosave.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.sim import predict
from cocoviz.sim.trace import MAX_TRACE_RANKS, validate_trace
from cocoviz.workbench import state


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def clean(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err


def test_check_tree_of_a_deeply_nested_manifest(tmp_path: Path) -> None:
    # json.loads raised RecursionError: exit 70
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "manifest.json").write_text("[" * 200_000)
    rc, _, err = run("check-tree", str(tree), "--no-build")
    clean(err)
    assert rc == 1 and "manifest.json: not a manifest cocoviz wrote (nested too deep)" in err


@pytest.mark.parametrize("make", ["dangling", "foreign", "directory"])
def test_trace_path_refused_before_the_simulation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: str
) -> None:
    # a --trace that write_file refuses was found out only after simulating (18 s of CPU
    # at --ranks 65536)
    out = tmp_path / "t.json"
    if make == "dangling":
        out.symlink_to(tmp_path / "missing")
    elif make == "foreign":
        out.write_text("mine\n")
    else:
        out.mkdir()
    simulated: list[object] = []

    def spy(*args: object, **kwargs: object) -> object:
        simulated.append(args)
        raise AssertionError("simulated before checking --trace")

    monkeypatch.setattr(predict, "simulate", spy)
    rc, _, err = run("simulate", "sgd", "--trace", str(out))
    clean(err)
    assert rc == 2 and f"cannot write '{out}'" in err and not simulated


def test_a_trace_of_a_huge_world_keeps_the_first_ranks(tmp_path: Path) -> None:
    # every one of 65,536 ranks was written: 125 MB and 18 s of CPU
    out = tmp_path / "t.json"
    rc, _, err = run("simulate", "adam", "--ranks", "4096", "--trace", str(out))
    clean(err)
    assert rc == 0, err
    assert f"for {MAX_TRACE_RANKS} of 4,096 ranks" in err
    trace = json.loads(out.read_text())
    pids = {e["pid"] for e in trace["traceEvents"]}
    assert pids == set(range(MAX_TRACE_RANKS))
    assert validate_trace(trace, range(MAX_TRACE_RANKS)) == []


def test_a_pipelined_huge_world_traces_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    rc, _, err = run("simulate", "pipeline_stage", "--ranks", "tp=512,pp=2", "--trace", str(out))
    clean(err)
    assert rc == 0, err
    trace = json.loads(out.read_text())
    pids = {e["pid"] for e in trace["traceEvents"]}
    half = MAX_TRACE_RANKS // 2
    assert pids == set(range(half)) | set(range(512, 512 + half))
    assert validate_trace(trace, pids) == []
    # the send from stage 0 to stage 1 is a flow between traced ranks
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    assert any(e["pid"] >= 512 for e in flows)


def test_small_worlds_trace_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    rc, _, err = run("simulate", "sgd", "--ranks", "8", "--trace", str(out))
    assert rc == 0 and "for 8 ranks" in err
    assert {e["pid"] for e in json.loads(out.read_text())["traceEvents"]} == set(range(8))


@pytest.mark.parametrize("kind", ["fifo", "nested", "huge", "link"])
def test_hostile_autosave_is_ignored(tmp_path: Path, kind: str) -> None:
    # the autosave was read with an unbounded, blocking read_text; a nested one raised
    # RecursionError
    key = "sample:sgd"
    saved = state.write(state.Autosave(key, samples.text("sgd"), ("split(g1)",), 1.0), tmp_path)
    assert state.read(key, tmp_path) is not None
    saved.unlink()
    if kind == "fifo":
        os.mkfifo(saved)
    elif kind == "nested":
        saved.write_text("[" * 100_000)
    elif kind == "huge":
        with saved.open("wb") as f:
            f.truncate(state.MAX_AUTOSAVE_BYTES + 1)
    else:
        other = tmp_path / "elsewhere.json"
        other.write_text(json.dumps({"key": key, "source": "x", "steps": [], "saved_at": 1}))
        saved.symlink_to(other)
    assert state.read(key, tmp_path) is None


@pytest.mark.parametrize(
    "argv",
    [
        # 60 s of CPU (killed by the fuzzer's limit): the reference at production size
        ["verify", "pipeline_stage", "--max-mem", "1P"],
        # 47 s of CPU
        ["run", "pipeline_stage", "--ranks", "tp=2,pp=2", "--json"],
    ],
)
def test_reference_work_is_bounded_before_it_starts(argv: list[str]) -> None:
    rc, out, err = run(*argv)
    clean(err)
    assert rc == 2 and "operations of work" in err and "raise --max-work" in err, err
    assert "B=2, S=2048, H=12288" in err
    if "--json" in argv:
        assert json.loads(out)["exit_code"] == 2


def test_max_work_raises_and_lowers_the_bound() -> None:
    small = ["verify", "megatron_mlp", "-D", "B=2", "-D", "S=8", "-D", "H=32"]
    rc, _, err = run(*small)
    assert rc == 0, err
    rc, _, err = run(*small, "--max-work", "10K")
    clean(err)
    assert rc == 2 and "more than the limit of 10 K" in err
    rc, _, err = run("run", "pipeline_stage", "-D", "S=16", "-D", "H=64", "--max-work", "1P")
    assert rc == 0, err


def test_work_estimate_counts_matmuls_and_elements() -> None:
    from cocoviz.exec.reference import ELEMENT_WORK, estimate_work
    from cocoviz.ir.lower import load_program

    p = load_program(
        "ranks 4\ndim M = 8, K = 16, N = 32\ninput a : f32[M, K] replicated\n"
        "input b : f32[K, N] sliced(1)\nc = matmul(a, b)\nd = c * 2\noutput d\n",
        "w.coco",
    )
    # per rank: c is [8, 8] from K = 16 (2·8·8·16), d's multiply, its operands c and 2
    per_rank = 2 * 8 * 8 * 16 + ELEMENT_WORK * (8 * 8 + 8 * 8 + 1)
    # the matmul's operands a and b are references: counted as elements too
    per_rank += ELEMENT_WORK * (8 * 16 + 16 * 8)
    assert estimate_work(p) == 4 * per_rank


@pytest.mark.parametrize("value", ["9" * 400, "-1", "0", "nan", "1e9", "1.5X", ""])
def test_max_work_rejects_bad_values(value: str) -> None:
    rc, _, err = run("verify", "sgd", "-D", "N=64", "--max-work", value)
    clean(err)
    assert rc == 2 and "--max-work" in err


def _emit(tmp_path: Path, *argv: str) -> Path:
    tree = tmp_path / "tree"
    rc, _, err = run("emit", *argv, "--target", "cpu", "-o", str(tree))
    assert rc == 0, err
    return tree


def test_check_tree_checks_the_reference_bounds_before_building(tmp_path: Path) -> None:
    # check-tree built and ran a full-size megatron_mlp tree (28 s of CPU) before the
    # reference refused it; now nothing is built (the launch guard would fail this test)
    tree = _emit(tmp_path, "megatron_mlp")
    before = sorted(p.name for p in tree.iterdir())
    rc, _, err = run("check-tree", str(tree))
    clean(err)
    assert rc == 2 and "operations of work" in err and "--max-work" in err, err
    assert sorted(p.name for p in tree.iterdir()) == before


def test_check_tree_keep_never_deletes_a_users_directory(tmp_path: Path) -> None:
    # --keep WORK removed WORK/inputs, WORK/tree and WORK/reference whatever they held
    tree = _emit(tmp_path, "sgd", "-D", "N=64")
    work = tmp_path / "work"
    (work / "inputs").mkdir(parents=True)
    (work / "inputs" / "mine.npy").write_text("precious")
    rc, _, err = run("check-tree", str(tree), "--keep", str(work), "--no-build")
    clean(err)
    assert rc == 2 and "--keep" in err and "not written by cocoviz" in err, err
    assert (work / "inputs" / "mine.npy").read_text() == "precious"
    # a new directory is claimed (its marker written) before the missing binary is found
    fresh = tmp_path / "fresh"
    rc, _, err = run("check-tree", str(tree), "--keep", str(fresh), "--no-build")
    clean(err)
    assert rc != 0 and (fresh / ".cocoviz-check-tree").is_file()


def test_emit_check_refuses_a_tree_too_big_to_check_before_writing(tmp_path: Path) -> None:
    # emit --build --check built and ran the tree before check-tree's reference refused
    out = tmp_path / "tree"
    rc, _, err = run(
        "emit", "megatron_mlp", "--target", "cpu", "--build", "--check", "-o", str(out)
    )
    clean(err)
    assert rc == 2 and "operations of work" in err, err
    assert not out.exists()
