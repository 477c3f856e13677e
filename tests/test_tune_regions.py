"""The tuner region by region (issue 34; docs/cost-model.md, The tuner: regions).

The rule (clean cuts no candidate step crosses), classes of regions the same up to
renaming, the best schedule put together against the same candidates judged on the whole
program (and against every combination where there are few), the samples' rankings as
the whole-program search gives them, the budget, the stop request, the progress
callback, and the CLI's progress bar, budget and Ctrl-C.
"""

from __future__ import annotations

import io
import json
import random
import re
import signal
import threading
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.ir.lower import load_file, load_program
from cocoviz.ir.nodes import Program
from cocoviz.samples.gpt import gpt_stack
from cocoviz.schedule import structured
from cocoviz.schedule.regions import canonical_form, classes_of, clean_cuts, find_regions
from cocoviz.schedule.search import Monitor, TuneProgress, schedule_label
from cocoviz.schedule.steps import apply_steps
from cocoviz.schedule.structured import clear_cache, tune_in_context
from cocoviz.schedule.tune import tune
from cocoviz.sim.hardware import load_profile
from cocoviz.sim.timeline import makespan

PROGRAMS = Path(__file__).parent / "programs"
HW = load_profile("h100-dgx")


def _gpt(layers: int) -> Program:
    return load_program(gpt_stack(layers), f"gpt{layers}.coco")


def _program(name: str) -> Program:
    if name.startswith("gpt"):
        return _gpt(int(name[3:]))
    return load_file(PROGRAMS / f"{name}.coco")


# ---------------------------------------------------------------------------------------
# The rule


def test_a_gpt_layer_is_cut_between_its_halves_and_after_each_matmul_alone():
    regions = find_regions(_gpt(2))
    assert [r.stages for r in regions if r.tuned] == [
        ("l0_o", "l0_ao", "l0_ab", "l0_h", "l0_hn"),
        ("l0_y", "l0_ys", "l0_yb", "l0_yd", "x1", "l1_xn"),
        ("l1_o", "l1_ao", "l1_ab", "l1_h", "l1_hn"),
        ("l1_y", "l1_ys", "l1_yb", "l1_yd", "x2"),
    ]
    # the matmul feeding a collective stays with it (overlap, decompose take the pair)
    assert all(r.stages[0] in ("l0_o", "l1_o", "l0_y", "l1_y") for r in regions if r.tuned)
    # every stage in exactly one region, in program order
    names = [n for r in regions for n in r.stages]
    assert names == [s.name for s in _gpt(2).stages]


def test_a_stage_that_reads_only_inputs_blocks_every_cut_before_it():
    head = """
program side
ranks 4
dim N = 1024
input g : f32[N] local
input w : f32[N] replicated
a = g * 2
b = a + 1
"""
    plain = load_program(head + "c = b * 3\nd = c + 1\noutput d\n", "plain.coco")
    assert clean_cuts(plain) == [True, True, True, True]
    # `n` reads only an input: it could run first, so no cut before it is clean, nor the
    # one after it (the prefix then has two ends, b and n)
    side = load_program(head + "n = norm(w)\nc = b * n\nd = c + 1\noutput d\n", "side.coco")
    assert clean_cuts(side) == [False, False, False, True, True]


def test_identical_layers_share_one_search_and_the_count_does_not_grow():
    clear_cache()
    counts = {}
    for layers in (2, 4, 8):
        result = tune(_gpt(layers), HW)
        assert result.regions == 5 * layers + 1 and result.kinds == 3
        counts[layers] = result.evaluated
    assert counts[2] == counts[4] == counts[8]


def test_canonical_form_is_the_region_up_to_renaming():
    regions = find_regions(_gpt(4))
    attention = [r for r in regions if r.stages[0].endswith("_o")]
    assert len({r.key for r in attention}) == 1
    first, other = attention[0], attention[2]
    assert first.real("v0") != other.real("v0")
    assert other.real("v3_rs") == other.names[3] + "_rs"
    # a region of another size is another class
    hetero = find_regions(_program("hetero_stack"))
    assert len(classes_of(hetero)) > len({r.key for r in hetero if r.tuned})
    mlps = [r for r in hetero if r.stages[0].endswith("_y")]
    assert len({r.key for r in mlps}) == 3
    # renaming does not change the key; a program's own form is a fixed point
    key, names = canonical_form(first.key)
    assert key == first.key and names == tuple(f"v{i}" for i in range(len(names)))


# ---------------------------------------------------------------------------------------
# The best schedule against the whole program


@pytest.mark.parametrize("name", ["gpt2", "gpt4", "gpt8", "hetero_stack", "hetero_mixed"])
def test_region_by_region_finds_what_the_whole_program_search_finds(name: str):
    program = _program(name)
    result = tune(program, HW)
    assert result.regions > 1 and result.complete
    checked = tune_in_context(program, HW)
    assert checked.applies
    assert result.best.time_s == pytest.approx(checked.best.time_s, rel=1e-9)
    assert result.best.steps == checked.best.steps
    # what is shown is what the model predicts for the steps on the whole program
    scheduled = apply_steps(program, result.best.steps, HW)
    assert makespan(scheduled, HW) == pytest.approx(result.best.time_s, rel=1e-9)
    assert schedule_label(scheduled) == result.best.name
    assert result.baseline_s == pytest.approx(makespan(program, HW), rel=1e-9)


@pytest.mark.parametrize("name", ["hetero_mixed", "seqpar_mlp"])
def test_region_by_region_finds_the_best_of_every_combination(name: str):
    program = _program(name)
    checked = tune_in_context(program, HW, exhaustive=True)
    assert checked.applies
    result = tune(program, HW)
    assert result.best.time_s == pytest.approx(checked.best.time_s, rel=1e-9)
    assert result.best.steps == checked.best.steps


def test_any_combination_takes_the_sum_of_its_regions_times():
    program = _program("hetero_stack")
    regions = find_regions(program)
    kinds = structured._search_classes(HW, "nccl", regions, Monitor())
    comb = structured._Combined(program, HW, "nccl", regions, kinds, Monitor())
    rng = random.Random(34)
    for _ in range(12):
        choice = [rng.randrange(len(k.ranked)) for k in kinds]
        c = comb.candidate(choice)
        assert c is not None
        scheduled = apply_steps(program, c.steps, HW)
        assert makespan(scheduled, HW) == pytest.approx(c.time_s, rel=1e-9)
        assert schedule_label(scheduled) == c.name


def test_every_listed_schedule_applies_and_takes_its_time():
    program = _gpt(2)
    result = tune(program, HW)
    times = [c.time_s for c in result.candidates]
    assert times == sorted(times)
    written = [c for c in result.candidates if not c.steps]
    assert len(written) == 1 and written[0].time_s == result.baseline_s
    for c in result.candidates[:: max(1, len(result.candidates) // 8)]:
        scheduled = apply_steps(program, c.steps, HW)
        assert makespan(scheduled, HW) == pytest.approx(c.time_s, rel=1e-9)
    # the program's block is ranked, tagged with its name
    assert [c.block for c in result.candidates if c.block] == ["fused"]


def test_a_block_that_is_a_ranked_schedule_tags_it():
    # hetero_mixed's block: the best of one class with the others as written is not a
    # listed schedule; the sample's blocks are (single region), so tag the gpt block here
    program = _gpt(2)
    result = tune(program, HW)
    fused = next(c for c in result.candidates if c.block == "fused")
    assert fused.steps == tuple(str(s) for s in program.schedules[0].steps)
    assert makespan(apply_steps(program, fused.steps, HW), HW) == pytest.approx(fused.time_s)


def test_a_name_a_step_would_make_but_the_program_has_is_paired_by_position():
    # layer 0's bias stage is called what split(l1_ys) would call its reducescatter
    text = gpt_stack(2).replace("l0_yb", "l1_ys_rs")
    program = load_program(text, "taken.coco")
    result = tune(program, HW)
    split = [c for c in result.candidates if "split(l1_ys)" in c.steps]
    assert split
    for c in split[:3]:
        after = " ".join(c.steps[c.steps.index("split(l1_ys)") :])
        assert re.search(r"\bl1_ys_rs\b", after) is None  # the program's stage
        assert "l1_ys_rs_2" in after or "_rs" not in after
        scheduled = apply_steps(program, c.steps, HW)
        assert makespan(scheduled, HW) == pytest.approx(c.time_s, rel=1e-9)


def test_a_sum_that_does_not_hold_falls_back_to_the_whole_program(monkeypatch):
    monkeypatch.setattr(structured._Combined, "_holds", lambda self, best, written: False)
    program = _program("hetero_mixed")
    result = tune(program, HW)
    assert result.regions == 1
    assert result.best.time_s == pytest.approx(tune(program, HW, structured=False).best.time_s)


# ---------------------------------------------------------------------------------------
# The samples


def _ranking(result):  # type: ignore[no-untyped-def]
    return [(c.name, c.steps, c.block, c.decomposed) for c in result.candidates]


@pytest.mark.parametrize("name", samples.names())
@pytest.mark.parametrize(("hw", "collectives"), [("h100-dgx", "nccl"), ("v100-dgx2", "nccl")])
def test_each_samples_ranking_is_the_whole_program_searchs(name: str, hw: str, collectives: str):
    program = load_file(samples.path(name))
    profile = load_profile(hw)
    whole = tune(program, profile, collectives=collectives, structured=False)
    default = tune(program, profile, collectives=collectives)
    assert _ranking(default) == _ranking(whole)
    assert [c.time_s for c in default.candidates] == [c.time_s for c in whole.candidates]
    assert default.evaluated == whole.evaluated
    # searched under canonical names and put back, region by region: the same ranking
    forced = tune(program, profile, collectives=collectives, structured=True)
    assert _ranking(forced) == _ranking(whole)
    for a, b in zip(forced.candidates, whole.candidates, strict=True):
        assert a.time_s == pytest.approx(b.time_s, rel=1e-12)
    assert forced.evaluated == whole.evaluated
    # the sample's own schedules rank as the model predicts them
    blocks = {c.block: c.time_s for c in whole.candidates if c.block}
    assert list(blocks) == sorted(blocks, key=blocks.__getitem__)


BEFORE = "503a1a3"
"""The last commit before the region-by-region tuner (issue 34)."""


def _tuner_before(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The tuner module of `BEFORE`, on this tree's model and steps (skips the test when
    the repository's history is not at hand)."""
    import importlib.util
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None:
        pytest.skip("needs git")
    proc = subprocess.run(
        ["git", "-C", str(root), "show", f"{BEFORE}:cocoviz/schedule/tune.py"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"commit {BEFORE} is not in this checkout's history")
    path = tmp_path / "tune_before.py"
    path.write_text(proc.stdout)
    spec = importlib.util.spec_from_file_location("tune_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tune_before"] = module  # (its dataclasses look their module up)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["tune_before"]
    return module


def test_each_samples_ranking_is_the_one_the_tuner_gave_before(tmp_path):
    before = _tuner_before(tmp_path)
    for name in samples.names():
        program = load_file(samples.path(name))
        for hw in ("h100-dgx", "v100-dgx2"):
            profile = load_profile(hw)
            old, new = before.tune(program, profile), tune(program, profile)
            assert [(c.name, c.steps, c.block, c.time_s) for c in new.candidates] == [
                (c.name, c.steps, c.block, c.time_s) for c in old.candidates
            ], (name, hw)
            assert (new.evaluated, new.baseline_s) == (old.evaluated, old.baseline_s)


def test_on_a_stack_the_best_beats_the_one_the_tuner_gave_before(tmp_path):
    # its compute regions ran into the next layer, where their fusions were refused
    before = _tuner_before(tmp_path)
    program = _gpt(2)
    old, new = before.tune(program, HW), tune(program, HW)
    assert new.best.time_s < old.best.time_s
    assert any(s.startswith("fuse(l0_yb, l0_yd, x1, l1_xn)") for s in new.best.steps)


# ---------------------------------------------------------------------------------------
# Budget, stop, progress, threads


def test_a_budget_returns_the_best_found_so_far_marked_as_such():
    clear_cache()
    program = _program("hetero_stack")
    result = tune(program, HW, budget_s=0.0)
    assert result.stopped == "budget" and not result.complete
    assert result.candidates and result.best.time_s <= result.baseline_s
    scheduled = apply_steps(program, result.best.steps, HW)
    assert makespan(scheduled, HW) == pytest.approx(result.best.time_s, rel=1e-9)
    assert tune(program, HW).complete  # an unfinished search is not kept


def test_stop_ends_the_search_between_candidates():
    clear_cache()
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 5

    result = tune(_gpt(2), HW, stop=stop)
    assert result.stopped == "stopped"
    assert result.evaluated < tune(_gpt(2), HW).evaluated


def test_progress_counts_candidates_and_regions_and_estimates_the_time_left():
    clear_cache()
    seen: list[TuneProgress] = []
    tune(_gpt(4), HW, progress=seen.append)
    counts = [p.evaluated for p in seen]
    assert counts == sorted(counts) and counts[-1] > 100
    done = [p.regions_done for p in seen]
    assert done == sorted(done) and seen[-1].regions_done == seen[-1].regions == 21
    assert any(p.remaining_s is not None and p.remaining_s > 0 for p in seen)
    # a cached search simulates nothing again
    again: list[TuneProgress] = []
    tune(_gpt(8), HW, progress=again.append)
    assert max(p.evaluated for p in again) == 0


def test_tune_runs_in_a_worker_thread_and_prints_nothing(capsys):
    clear_cache()
    out: list[object] = []
    seen: list[TuneProgress] = []
    stop = threading.Event()

    def work() -> None:
        out.append(tune(_gpt(2), HW, progress=seen.append, stop=stop.is_set))

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(timeout=120)
    assert out and seen
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


# ---------------------------------------------------------------------------------------
# The CLI


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _gpt_file(tmp_path: Path, layers: int) -> str:
    path = tmp_path / f"gpt{layers}.coco"
    path.write_text(gpt_stack(layers))
    return str(path)


def test_the_progress_bar_shows_on_a_terminal(tmp_path, monkeypatch, capsys):
    from cocoviz.cli import sim

    clear_cache()
    monkeypatch.setattr(sim, "_PROGRESS_AFTER_S", 0.0)
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    assert main(["tune", _gpt_file(tmp_path, 2), "--top", "2"]) == 0
    drawn = term.getvalue()
    assert "tuning gpt2" in drawn and "candidates" in drawn and "regions" in drawn
    assert "gpt2 on h100-dgx" in capsys.readouterr().out


def test_the_progress_bar_stays_off_in_pipes_and_with_json(tmp_path, monkeypatch, capsys):
    from cocoviz.cli import sim

    clear_cache()
    monkeypatch.setattr(sim, "_PROGRESS_AFTER_S", 0.0)
    file = _gpt_file(tmp_path, 2)
    assert main(["tune", file, "--top", "2"]) == 0  # stderr is not a terminal here
    assert capsys.readouterr().err == ""
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    clear_cache()
    assert main(["tune", file, "--top", "2", "--json"]) == 0
    assert term.getvalue() == ""
    data = json.loads(capsys.readouterr().out)
    assert data["complete"] and data["regions"] == 11 and data["kinds"] == 3


def test_a_quick_tune_draws_no_bar(monkeypatch, capsys):
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    assert main(["tune", "sgd"]) == 0
    assert term.getvalue() == ""


def test_budget_marks_the_output(tmp_path, capsys):
    clear_cache()
    file = _gpt_file(tmp_path, 2)
    best = tmp_path / "best.sched"
    assert main(["tune", file, "--budget", "0.001", "--json", "-o", str(best)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert not data["complete"] and data["stopped"] == "budget"
    assert "best found so far" in best.read_text()
    clear_cache()
    assert main(["tune", file, "--budget", "0.001", "--top", "1"]) == 0
    assert "the best found in 0.001 s (the search did not finish)" in capsys.readouterr().out
    assert main(["tune", file, "--budget", "0"]) == 2
    assert main(["tune", file, "--budget", "nan"]) == 2
    assert main(["tune", "adam", "--budget", "5", "--sweep", "N=2^16..2^18"]) == 2


def test_ctrl_c_prints_the_best_so_far(tmp_path, monkeypatch, capsys):
    import cocoviz.schedule.search as search_module

    clear_cache()
    real = search_module.makespan
    calls = []

    def interrupted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 10:
            signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(search_module, "makespan", interrupted)
    assert main(["tune", _gpt_file(tmp_path, 2), "--top", "3"]) == 130
    out = capsys.readouterr()
    assert "interrupted: the best schedules found so far" in out.err
    assert "interrupted" in out.out and "predicted" in out.out
    # the handler is put back: a later Ctrl-C interrupts as usual
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
