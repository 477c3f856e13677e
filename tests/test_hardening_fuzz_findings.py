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
