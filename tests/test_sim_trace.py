"""Chrome/Perfetto trace export: the trace event format, checked field by field."""

from __future__ import annotations

import copy
import json

import pytest
import sim_programs as sp

from cocoviz import samples
from cocoviz.ir.lower import load_file
from cocoviz.sim.hardware import load_profile
from cocoviz.sim.predict import simulate
from cocoviz.sim.trace import to_trace, validate_trace, write_trace


def _traces():  # type: ignore[no-untyped-def]
    hw = load_profile("h100-dgx")
    yield simulate(load_file(samples.path("pipeline_stage")), hw)
    yield simulate(sp.overlap_chunks(4), hw)
    yield simulate(sp.program(sp.NORM_FUSED), hw)
    yield simulate(sp.program(sp.PIPE_RS, "tp=6,pp=2"), hw)


def test_trace_is_well_formed_with_one_named_process_per_rank():
    for tl in _traces():
        trace = to_trace(tl)
        assert validate_trace(trace, range(tl.world)) == []
        events = trace["traceEvents"]
        names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
        assert sorted(e["pid"] for e in names) == list(range(tl.world))
        threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
        assert threads == {(r, t) for r in range(tl.world) for t in (0, 1)}
        slices = [e for e in events if e["ph"] == "X"]
        assert len(slices) == len(tl.events)
        assert all({"bytes", "flops", "stage"} <= set(e["args"]) for e in slices)
        json.dumps(trace)  # serializable


def test_flows_cover_streams_ranks_and_pipeline_stages_with_unique_ids():
    tl = simulate(load_file(samples.path("pipeline_stage")), load_profile("h100-dgx"))
    events = to_trace(tl)["traceEvents"]
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    ids = [e["id"] for e in starts]
    assert len(ids) == len(set(ids)) == len(ends)
    assert all(e["bp"] == "e" for e in ends)
    by_id = {e["id"]: e for e in ends}
    across_ranks = [s for s in starts if by_id[s["id"]]["pid"] != s["pid"]]
    across_streams = [
        s for s in starts if by_id[s["id"]]["pid"] == s["pid"] and by_id[s["id"]]["tid"] != s["tid"]
    ]
    assert {(s["pid"], by_id[s["id"]]["pid"]) for s in across_ranks} == {
        (r, r + 8) for r in range(8)
    }
    assert across_streams


def test_overlap_trace_shows_chunks_and_contention():
    tl = simulate(sp.overlap_chunks(4, H=12288), load_profile("v100-dgx2"))
    slices = [e for e in to_trace(tl, ranks=[0])["traceEvents"] if e["ph"] == "X"]
    chunks = [e["args"].get("chunk") for e in slices if e["cat"] == "matmul"]
    assert chunks == ["1/4", "2/4", "3/4", "4/4"]
    assert any("slowdown" in e["args"] for e in slices)


def test_a_subset_of_ranks_keeps_only_flows_between_them():
    tl = simulate(load_file(samples.path("pipeline_stage")), load_profile("h100-dgx"))
    trace = to_trace(tl, ranks=[0, 1])
    assert validate_trace(trace, [0, 1]) == []
    assert not [e for e in trace["traceEvents"] if e["ph"] in "sf" and e["pid"] > 1]


def test_write_trace(tmp_path):
    tl = simulate(sp.program(sp.MLP_FUSED), load_profile("h100-dgx"))
    out = tmp_path / "t.json"
    n = write_trace(tl, out)
    data = json.loads(out.read_text())
    assert len(data["traceEvents"]) == n
    assert validate_trace(data, range(16)) == []
    assert data["otherData"]["program"] == "megatron_mlp"


# The validator must reject what a viewer would misdraw.


@pytest.fixture()
def good():  # type: ignore[no-untyped-def]
    tl = simulate(load_file(samples.path("pipeline_stage")), load_profile("h100-dgx"))
    return to_trace(tl, ranks=[0, 8])


def _first(trace, ph):  # type: ignore[no-untyped-def]
    return next(e for e in trace["traceEvents"] if e["ph"] == ph)


def test_validator_rejects_missing_fields(good):
    bad = copy.deepcopy(good)
    del _first(bad, "X")["dur"]
    assert any("missing dur" in p for p in validate_trace(bad))


def test_validator_rejects_duplicate_flow_ids(good):
    bad = copy.deepcopy(good)
    s = [e for e in bad["traceEvents"] if e["ph"] == "s"]
    s[1]["id"] = s[0]["id"]
    assert any("ids must be unique" in p for p in validate_trace(bad))


def test_validator_rejects_unbound_flows(good):
    bad = copy.deepcopy(good)
    _first(bad, "f")["ts"] = 1e9
    assert any("inside no slice" in p for p in validate_trace(bad))
    bad = copy.deepcopy(good)
    del _first(bad, "f")["bp"]
    assert any("bp" in p for p in validate_trace(bad))


def test_validator_rejects_unnamed_or_duplicate_processes(good):
    bad = copy.deepcopy(good)
    bad["traceEvents"] = [
        e for e in bad["traceEvents"] if not (e["ph"] == "M" and e["name"] == "process_name")
    ]
    assert any("no process_name" in p for p in validate_trace(bad))
    bad = copy.deepcopy(good)
    bad["traceEvents"].append(copy.deepcopy(_first(bad, "M")))
    assert any("2 process_name" in p for p in validate_trace(bad))
    assert any("do not match ranks" in p for p in validate_trace(good, range(16)))


def test_validator_rejects_partially_overlapping_slices(good):
    bad = copy.deepcopy(good)
    x = _first(bad, "X")
    bad["traceEvents"].append({**x, "ts": x["ts"] + x["dur"] / 2, "dur": x["dur"]})
    assert any("without nesting" in p for p in validate_trace(bad))
