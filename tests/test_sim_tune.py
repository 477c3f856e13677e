"""The tuner: candidates built with the schedule transformations, ranked by the model."""

from __future__ import annotations

import pytest
import sim_programs as sp

from cocoviz import samples
from cocoviz.ir.lower import RanksOverride, load_file
from cocoviz.ir.syntax import parse_steps
from cocoviz.schedule.chunks import best_chunks
from cocoviz.schedule.tune import TuneProgress, schedule_label, tune, write_schedule
from cocoviz.sim.hardware import load_profile
from cocoviz.sim.timeline import makespan
from cocoviz.sim.warnings import chunk_times
from cocoviz.sim.workload import Context


def _apply(program, steps):  # type: ignore[no-untyped-def]
    from cocoviz.ir.transforms import as_transformation

    for s in steps:
        program = as_transformation(s).apply(program)
    return program


def test_adam_lists_the_papers_schedules_with_times():
    p = load_file(samples.path("adam"), ranks=RanksOverride(n=16))
    hw = load_profile("v100-dgx2")
    result = tune(p, hw)
    by_name = {c.name: c for c in result.candidates}
    assert {"AR-C", "RS-C×6-AG", "fuse(RS-C-AG)", "AR-C×6"} <= set(by_name)
    assert by_name["AR-C"].block == "ar_c"
    assert by_name["RS-C×6-AG"].block == "rs_c_ag"
    assert by_name["fuse(RS-C-AG)"].block == "fused"
    assert result.best.name == "fuse(RS-C-AG)"
    times = [c.time_s for c in result.candidates]
    assert times == sorted(times)
    # Every candidate's time is the model's time for its steps.
    for c in result.candidates:
        assert c.time_s == pytest.approx(makespan(_apply(p, c.steps), hw))
    # The tuner keeps the output's layout: w stays replicated (no asslice(w)).
    assert not any("asslice(m, v, w)" in s for c in result.candidates for s in c.steps)


def test_megatron_overlap_wins_with_in_kernel_collectives():
    p = load_file(samples.path("megatron_mlp"))
    result = tune(p, load_profile("v100-dgx2"), collectives="nccl-device")
    best = result.best
    assert best.name.startswith("ol(MM, fuse(RS-C-AG)")
    k = int(best.name.split("K=")[1].split(")")[0])
    assert k in (2, 4, 8, 16)
    assert any(s.startswith("overlap(layer, sum_rs") and f"chunks={k}" in s for s in best.steps)
    assert best.time_s < result.baseline_s


def test_megatron_overlap_is_ranked_even_when_it_loses():
    # CoCoNet's configuration (H = 3072, 16 ranks on two nodes) with separate NCCL calls
    # per chunk on H100: the model ranks overlapped schedules below the best unchunked
    # one (each chunk pays the collectives' latency).
    coconet = load_file(
        samples.path("megatron_mlp"), {"B": 8, "S": 1024, "H": 3072}, RanksOverride(n=16)
    )
    result = tune(coconet, load_profile("h100-dgx"))
    overlapped = [c for c in result.candidates if c.name.startswith("ol(")]
    chunked = [c for c in overlapped if "K=" in c.name]  # the others are decomposed (DEC)
    assert {int(c.name.split("K=")[1].split(")")[0]) for c in chunked} >= {2, 4, 8, 16}
    assert not result.best.name.startswith("ol(")
    assert result.best.time_s < min(c.time_s for c in overlapped)


def test_pipeline_finds_the_sliced_send():
    result = tune(load_file(samples.path("pipeline_stage")), load_profile("h100-dgx"))
    assert "P2P" in result.best.name and "RS" in result.best.name
    assert result.best.time_s < result.baseline_s / 2


def test_progress_is_reported():
    seen: list[TuneProgress] = []
    tune(load_file(samples.path("sgd")), load_profile("h100-dgx"), progress=seen.append)
    counts = [p.evaluated for p in seen]
    assert counts and counts == sorted(counts) and counts[-1] >= 4
    assert seen[-1].regions_done == seen[-1].regions == 1
    assert all(p.elapsed_s >= 0 for p in seen)


def test_best_schedule_round_trips_through_a_sched_file(tmp_path):
    p = load_file(samples.path("lamb"))
    result = tune(p, load_profile("a100-dgx"))
    out = tmp_path / "best.sched"
    write_schedule(result.best, out)
    steps = [str(s) for s in parse_steps(out.read_text(), str(out))]
    assert steps == list(result.best.steps)
    assert makespan(_apply(p, steps), load_profile("a100-dgx")) == pytest.approx(result.best.time_s)


def test_best_chunks_is_the_fastest_legal_count():
    p = sp.program(sp.MLP_FUSED, H=12288)
    hw = load_profile("v100-dgx2")
    k = best_chunks(p, ["layer", "sum_rs"], hw)
    times = chunk_times(Context(p, hw), _group(p), (2, 4, 8, 16))
    assert k == min(times, key=times.__getitem__)
    assert k in (2, 4, 8, 16)
    # Rows that 16 does not divide: only the legal counts are tried.
    odd = sp.program(sp.MLP_FUSED, B=3, S=4)  # 12 rows
    assert best_chunks(odd, ["layer", "out"], hw) in (2, 4)
    with pytest.raises(ValueError, match="legal"):
        best_chunks(sp.program(sp.MLP_FUSED, B=1, S=1), ["layer", "sum_rs"], hw)


def _group(p):  # type: ignore[no-untyped-def]
    from cocoviz.ir.nodes import Group, GroupKind

    return Group(GroupKind.OVERLAPPED, ("layer", p.groups[0]), None)


def test_labels_name_the_structure():
    assert schedule_label(sp.program(sp.MLP_AR_C)) == "MM-AR-C"
    assert schedule_label(sp.program(sp.MLP_FUSED)) == "MM-fuse(RS-C-AG)"
    assert schedule_label(sp.overlap_chunks(8)) == "ol(MM, fuse(RS-C-AG), K=8)"
    assert schedule_label(sp.program(sp.ADAM_AR_C)) == "AR-C"
    assert schedule_label(sp.program(sp.ADAM_RS_C_AG)) == "RS-C×6-AG"
