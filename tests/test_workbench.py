"""The workbench the TUI displays, driven without Textual: parse generations, steps as
StepFailure values, per-step caches, comparison, teach mode, autosave and emitted code."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.emit.emitter import Emitted
from cocoviz.ir.lower import load_program
from cocoviz.schedule import StepFailure, apply_step
from cocoviz.sim.hardware import Hardware, load_profile
from cocoviz.sim.timeline import Timeline
from cocoviz.workbench import (
    Accepted,
    Refused,
    Source,
    Workbench,
    Written,
    open_source,
    state,
    teach,
)

HW = load_profile("h100-dgx")


def _opened(source: Source, hw: Hardware = HW, **kwargs: object) -> Workbench[Timeline]:
    """A workbench on `source` with its first text parsed (as the TUI opens it)."""
    wb: Workbench[Timeline] = Workbench(source, hw=hw, view=lambda tl: tl, **kwargs)  # type: ignore[arg-type]
    gen = wb.begin_parse(source.text, source.steps)
    assert wb.accept(gen, wb.parse(source.text)) is Accepted.OPENED
    return wb


def _simulate_shown(wb: Workbench[Timeline]) -> None:
    """What the TUI's simulation worker does, with the work in another thread."""
    todo = wb.timelines_to_simulate()
    with ThreadPoolExecutor(1) as pool:
        simulated = pool.submit(wb.simulate, todo).result()
    wb.store_timelines(simulated)


def _edit(wb: Workbench[Timeline], text: str) -> Accepted:
    gen = wb.begin_parse(text)
    return wb.accept(gen, wb.parse(text))


def test_steps_apply_undo_redo_and_jump_with_failures_as_values() -> None:
    wb = _opened(open_source("megatron_mlp"))
    assert wb.position == 0 and wb.program is wb.base
    first = wb.apply("split(sum)")
    assert not isinstance(first, StepFailure) and wb.program is first
    refused = wb.apply("fuse(layer, out)")
    assert isinstance(refused, StepFailure) and refused.step == "fuse(layer, out)"
    assert wb.failed is refused and wb.position == 1 and wb.program is first
    assert not isinstance(wb.apply("reorder(sum)"), StepFailure)
    assert wb.failed is None
    assert wb.applied_steps == ["split(sum)", "reorder(sum)"]
    assert wb.command_line() == "cocoviz apply megatron_mlp 'split(sum)' 'reorder(sum)'"

    assert wb.undo() and wb.undo() and not wb.undo()
    assert wb.position == 0 and wb.recorded_steps == ["split(sum)", "reorder(sum)"]
    assert wb.redo() and wb.position == 1 and wb.program is first
    assert wb.jump(2) and wb.position == 2
    assert not wb.jump(2) and not wb.jump(3)
    assert wb.jump(0) and wb.applied_steps == []
    # A new step after an undo drops the undone ones.
    assert not isinstance(wb.apply("split(sum)"), StepFailure)
    assert wb.recorded_steps == ["split(sum)"] and not wb.redo()


def test_a_workbench_without_a_program_refuses_steps() -> None:
    bad = samples.text("megatron_mlp").replace("dropout(sum + b", "dropout(sum + bias")
    wb: Workbench[Timeline] = Workbench(
        open_source("megatron_mlp", text=bad), hw=HW, view=lambda tl: tl
    )
    gen = wb.begin_parse(bad)
    assert wb.accept(gen, wb.parse(bad)) is Accepted.ERROR
    assert wb.error is not None and "bias" in wb.error.message
    assert wb.session is None and wb.program is None and wb.teach_steps == []
    refused = wb.apply("split(sum)")
    assert isinstance(refused, StepFailure) and "no program" in refused.message
    assert not wb.undo() and wb.timelines_to_simulate() == [] and wb.code_jobs("cpu") == []


def test_an_edit_replays_the_steps_and_drops_the_cached_timelines() -> None:
    source = open_source("megatron_mlp", schedule="fused")
    wb = _opened(source)
    assert wb.applied_steps == list(source.steps) and wb.position == len(source.steps)
    _simulate_shown(wb)
    old = wb.program
    assert wb.timeline(wb.position) is not None and wb.timeline(0) is not None
    assert wb.timelines_to_simulate() == []

    # A parse overtaken by a newer text changes nothing.
    edited = "# edited\n" + wb.text
    stale = wb.begin_parse(edited)
    assert wb.accept(stale - 1, wb.parse(edited)) is Accepted.STALE
    assert wb.accept(stale, wb.parse(edited)) is Accepted.PARSED
    assert wb.text == edited and wb.program is not old
    assert wb.applied_steps == list(source.steps)
    assert wb.timeline(wb.position) is None and wb.timeline(0) is None
    assert len(wb.timelines_to_simulate()) == 2

    # A text with an error keeps the last program that parsed, and its steps.
    program = wb.program
    assert _edit(wb, wb.text + "\nout2 = nope\n") is Accepted.ERROR
    assert wb.error is not None and wb.program is program
    assert _edit(wb, edited) is Accepted.PARSED and wb.error is None


def test_a_step_that_no_longer_applies_after_an_edit_is_the_failure() -> None:
    wb = _opened(open_source("megatron_mlp"))
    wb.apply("split(sum)")
    renamed = wb.text.replace("sum", "total")
    assert _edit(wb, renamed) is Accepted.PARSED
    assert wb.position == 0 and wb.failed is not None and wb.failed.step == "split(sum)"


def test_compare_mode_picks_the_step_compared_with() -> None:
    wb = _opened(open_source("megatron_mlp"))
    assert wb.compare_mode == "off" and wb.compare_index() is None
    assert wb.cycle_compare() == "previous" and wb.compare_index() is None  # nothing yet
    wb.apply("split(sum)")
    wb.apply("reorder(sum)")
    assert wb.compare_index() == 1
    assert wb.cycle_compare() == "unscheduled" and wb.compare_index() == 0
    assert wb.cycle_compare() == "off" and wb.compare_index() is None
    wb.cycle_compare()
    assert len(wb.timelines_to_simulate()) == 3  # the current step, the previous, step 0
    _simulate_shown(wb)
    shown = wb.comparison()
    assert shown.index == 2 and shown.label == "step 2"
    assert shown.against == 1 and shown.against_label == "step 1"
    assert shown.current is wb.timeline(2) and shown.compare is wb.timeline(1)
    assert shown.current is not None and shown.compare is not None


def test_teach_mode_walks_the_schedule_with_the_models_numbers() -> None:
    wb = _opened(open_source("megatron_mlp"), teach=True, teach_best=False)  # the block
    taught = wb.teach_steps
    assert taught == [str(s) for s in wb.base.schedules[-1].steps]  # type: ignore[union-attr]
    assert wb.teaching and wb.compare_mode == "previous"
    note = wb.teach_note()
    assert note.position == 0 and note.total == len(taught) and note.step is None
    assert note.text == teach.INTRO and note.next_step == taught[0]

    for i in range(1, len(taught) + 1):
        assert not wb.teach_finished
        assert not isinstance(wb.teach_next(), StepFailure)
        assert wb.position == i
        _simulate_shown(wb)
        note = wb.teach_note()
        assert note.step is not None and note.step.startswith(taught[i - 1].rstrip(")"))
        assert "Predicted time" in note.text
        assert note.next_step == (taught[i] if i < len(taught) else None)
    assert wb.teach_finished and wb.teach_next() is None

    # Back one step, then next: the recorded step is redone, not applied again.
    program = wb.program
    assert wb.undo() and wb.teach_next() is program

    # Turning teach mode on keeps the first steps taught, and starts again from the
    # unscheduled program after any other step.
    wb.set_teaching(False)
    wb.jump(0)
    wb.apply(taught[0])
    assert not wb.set_teaching(True) and wb.position == 1
    wb.set_teaching(False)
    wb.jump(0)
    assert not isinstance(wb.apply("overlap(layer, sum)"), StepFailure)
    assert wb.set_teaching(True) and wb.position == 0 and wb.teaching


def test_a_program_without_a_schedule_has_nothing_to_teach() -> None:
    text = re.sub(r"\nschedule \w+ \{.*?\n\}", "", samples.text("megatron_mlp"), flags=re.S)
    wb = _opened(open_source("megatron_mlp", text=text), teach=True, teach_best=False)
    assert wb.teach_steps == [] and wb.teach_note().total == 0


def test_autosave_round_trip(tmp_path: Path) -> None:
    source = open_source("megatron_mlp")
    wb = _opened(source, state_root=tmp_path)
    assert wb.saved() is None
    wb.autosave()
    assert _opened(source, state_root=tmp_path).saved() is None  # the same as opened
    wb.apply("split(sum)")
    edited = "# edited\n" + wb.text
    _edit(wb, edited)
    path = wb.autosave()
    assert path.is_relative_to(tmp_path)

    again = _opened(source, state_root=tmp_path)
    saved = again.saved()
    assert saved is not None and saved.source == edited and saved.steps == ("split(sum)",)
    assert saved == state.read(source.key, tmp_path)
    gen = again.begin_parse(saved.source, saved.steps)
    assert again.accept(gen, again.parse(saved.source)) is Accepted.PARSED
    assert again.text == edited and again.applied_steps == ["split(sum)"]


def _emitted(wb: Workbench[Timeline], target: str) -> None:
    jobs = wb.code_jobs(target)  # type: ignore[arg-type]
    with ThreadPoolExecutor(1) as pool:
        wb.store_code(pool.submit(wb.emit_code, jobs).result())


def test_emitted_code_per_step_and_target() -> None:
    wb = _opened(open_source("megatron_mlp"))
    assert wb.code("cpu").current is None
    _emitted(wb, "cpu")
    cpu = wb.code("cpu")
    assert isinstance(cpu.current, Emitted) and cpu.previous is None
    assert {"megatron_mlp.cpp", "main.cpp", "Makefile"} <= set(cpu.current.files)
    assert wb.code("cuda").current is None and wb.code_jobs("cpu") == []

    wb.apply("split(sum)")
    jobs = wb.code_jobs("cpu")
    assert [j.steps for j in jobs] == [("split(sum)",)]  # step 0's code is cached
    _emitted(wb, "cpu")
    cpu = wb.code("cpu")
    assert isinstance(cpu.current, Emitted) and isinstance(cpu.previous, Emitted)
    assert cpu.current.files["megatron_mlp.cpp"] != cpu.previous.files["megatron_mlp.cpp"]
    assert "split(sum)" in cpu.current.files["manifest.json"]

    _emitted(wb, "cuda")
    cuda = wb.code("cuda")
    assert isinstance(cuda.current, Emitted) and "megatron_mlp.cu" in cuda.current.files

    # An edit makes every step's code stale.
    _edit(wb, "# edited\n" + wb.text)
    assert wb.code("cpu").current is None and len(wb.code_jobs("cpu")) == 2


def test_emitting_to_a_directory(tmp_path: Path) -> None:
    wb = _opened(open_source("megatron_mlp", schedule="fused"))
    job = wb.emit_job("cpu")
    assert job is not None and job.steps == tuple(wb.applied_steps)
    out = wb.write(job, tmp_path / "out")
    assert isinstance(out, Written)
    assert set(out.result.written) == set(out.emitted.files)
    assert '"group": "overlapped"' in (tmp_path / "out" / "manifest.json").read_text()

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not cocoviz's")
    refused = wb.write(job, foreign)
    assert isinstance(refused, Refused) and refused.title == "not emitted"
    assert "cocoviz did not write it" in refused.message


@pytest.mark.parametrize(("hw_name", "ranks"), [("h100-dgx", 16), ("a100-dgx", 8)])
def test_the_palettes_overlap_gets_the_k_apply_step_gives(hw_name: str, ranks: int) -> None:
    hw = load_profile(hw_name)
    text = samples.text("megatron_mlp").replace("ranks 16", f"ranks {ranks}", 1)
    wb = _opened(open_source("megatron_mlp", text=text), hw=hw)
    offered = wb.palette("layer")
    assert not isinstance(offered, str)
    entry = next(e for e in offered if e.step == "overlap(layer, sum)")
    assert entry.ok, entry
    _, resolved = apply_step(load_program(text, "megatron_mlp.coco"), entry.step, hw)
    k = re.search(r"chunks=(\d+)", str(resolved))
    assert k is not None and entry.shown.endswith(f"model: K={k.group(1)}"), entry.shown
    assert not isinstance(wb.apply(entry.step), StepFailure)
    assert wb.applied_steps == [str(resolved)]


def test_a_palette_for_an_unknown_stage_says_why() -> None:
    wb = _opened(open_source("megatron_mlp"))
    assert isinstance(wb.palette("nope"), str)


def test_stages_and_source_lines() -> None:
    wb = _opened(open_source("megatron_mlp"))
    assert wb.default_selection() == "sum"  # the first collective
    line = wb.source_line("out")
    assert line is not None and wb.stage_on_line(line) == "out"
    assert wb.source_line("nope") is None and wb.stage_on_line(10_000) is None
    # After reorder(sum) the program has no `sum`: its line selects nothing.
    wb.apply("split(sum)")
    wb.apply("reorder(sum)")
    sum_line = wb.source_line("sum")
    assert sum_line is not None and not wb.has_stage("sum")
    assert wb.stage_on_line(sum_line) is None


def test_the_workbench_imports_neither_textual_nor_rich() -> None:
    code = (
        "import sys, cocoviz.workbench\n"
        "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'rich'})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_crossover_sweep_of_the_main_dimension() -> None:
    from cocoviz.schedule.tune import SweepResult, main_dimension, sweep_values

    wb = _opened(open_source("adam"))
    assert wb.crossover() is None
    job = wb.crossover_job()
    assert job is not None and job.dim == "N" == main_dimension(wb.base)  # type: ignore[arg-type]
    assert job.values == sweep_values(1 << 28) and (1 << 28) in job.values
    assert wb.crossover_job() is None  # a worker runs it now: not asked for twice
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(wb.run_crossover, job).result()
    wb.store_crossover(job, result)
    assert isinstance(result, SweepResult) and wb.crossover() is result
    assert [p.value for p in result.points] == list(job.values)
    # the same crossover `cocoviz tune adam --sweep` reports: fused takes over from ar_c
    assert [(c.winner, c.loser) for c in result.crossovers] == [
        ("fuse(RS-C-AG) [fused]", "AR-C [ar_c]")
    ]
    assert wb.crossover_job() is None  # done

    # A new program drops it; a sweep finished for the old one is not kept.
    _edit(wb, "# edited\n" + wb.text)
    assert wb.crossover() is None
    wb.store_crossover(job, result)
    assert wb.crossover() is None
    assert wb.crossover_job() is not None


def test_a_size_the_program_refuses_is_left_out_of_the_sweep() -> None:
    text = "ranks 8\ndim N = 64\ninput x : f32[N] local\ny = allreduce(+, x)\noutput y\n"
    wb = _opened(Source(text, "p.coco", "p", "p.coco"))
    job = wb.crossover_job()
    assert job is not None and job.values == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    result = wb.run_crossover(job)
    assert not isinstance(result, str)
    assert [p.value for p in result.points] == list(job.values)  # local: every size divides
    sliced = text.replace("local", "sliced(0)").replace("allreduce(+, x)", "allgather(x)")
    wb = _opened(Source(sliced, "p.coco", "p", "p.coco"))
    job = wb.crossover_job()
    assert job is not None
    result = wb.run_crossover(job)
    assert not isinstance(result, str)
    assert [p.value for p in result.points] == [8, 16, 32, 64, 128, 256]  # N % 8 == 0
