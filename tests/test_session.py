"""Sessions (undo, redo, jump, save and load) and the `apply`, `check` and `verify`
commands."""

from __future__ import annotations

from pathlib import Path

import pytest
from transforms_util import ROOT, SAMPLES, sample

from cocoviz.cli import main
from cocoviz.errors import InputError, ScheduleError
from cocoviz.ir.nodes import Program, StepCall
from cocoviz.schedule import (
    SCHED_HEADER,
    Session,
    StepFailure,
    apply_block,
    apply_schedule_arg,
    apply_steps,
)


def block(program: Program, name: str) -> tuple[StepCall, ...]:
    return next(b for b in program.schedules if b.name == name).steps


def test_undo_then_redo_gives_equal_programs() -> None:
    p = sample("megatron_mlp")
    s = Session(p)
    programs = [s.program]
    for step in block(p, "fused"):
        programs.append(s.apply_or_raise(step))
    while s.undo():
        assert s.program == programs[s.position]
    assert s.program is p
    assert not s.can_undo
    while s.redo():
        assert s.program == programs[s.position]
    assert s.position == 4 and not s.can_redo
    assert s.jump(2) == programs[2]
    assert [str(e.step) for e in s.history] == [
        "split(sum)",
        "reorder(sum)",
        "fuse(sum_rs, out)",
        "overlap(layer, sum_rs, chunks=4)",
    ]
    assert s.history[2].before == programs[2] and s.history[2].after == programs[3]


def test_applying_after_undo_drops_the_undone_steps() -> None:
    s = Session(sample("sgd"))
    s.apply_or_raise("split(g1)")
    s.apply_or_raise("reorder(g1)")
    s.undo()
    s.apply_or_raise("dce()")
    assert [str(x) for x in s.steps] == ["split(g1)", "dce()"]
    assert not s.can_redo


def test_a_refused_step_is_a_value_and_changes_nothing() -> None:
    s = Session(sample("sgd"))
    before = s.program
    result = s.apply("split(m1)")
    assert isinstance(result, StepFailure)
    assert result.message.startswith("split: 'm1' (update, f32[N] replicated) is not")
    assert "error: split:" in result.render()
    assert s.program is before and s.position == 0
    with pytest.raises(ScheduleError):
        s.apply_or_raise("split(m1)")


def test_saved_schedule_reapplies_to_the_same_program(tmp_path: Path) -> None:
    p = sample("megatron_mlp")
    s = Session(p)
    s.apply_all(["split(sum)", "reorder(sum)", "fuse(sum_rs, out)", "overlap(layer, sum_rs)"])
    path = tmp_path / "mlp.sched"
    s.save(path, "a comment")
    text = path.read_text()
    assert text.splitlines()[0] == SCHED_HEADER
    # the chunk count is resolved by the cost model (DESIGN §3) and recorded
    from cocoviz.schedule.chunks import best_chunks
    from cocoviz.sim.hardware import load_profile

    fused = s.history[2].after
    k = best_chunks(fused, ("layer", "sum_rs"), load_profile())
    assert f"overlap(layer, sum_rs, chunks={k})" in text
    assert Session.load(p, path).program == s.program
    assert apply_schedule_arg(p, str(path)) == s.program


def test_schedule_arg_block_names_and_files(tmp_path: Path) -> None:
    p = sample("sgd")
    assert apply_schedule_arg(p, "fused") == apply_block(p, p.schedules[2])
    assert apply_schedule_arg(p, "fused") == apply_steps(p, block(p, "fused"))
    with pytest.raises(ScheduleError) as info:
        apply_schedule_arg(p, "fusd")
    assert info.value.message == "sgd: no schedule named 'fusd'"
    assert info.value.hint == "did you mean 'fused'?"
    with pytest.raises(InputError) as err:
        apply_schedule_arg(p, str(tmp_path / "nope.sched"))
    assert err.value.message.endswith("nope.sched: no such schedule file")


def test_every_sample_checks_with_all_its_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    for name in SAMPLES:
        assert main(["check", str(ROOT / "samples" / f"{name}.coco")]) == 0
        out = capsys.readouterr().out
        names = ", ".join(b.name for b in sample(name).schedules)
        assert out.rstrip().endswith(f"schedules ok: {names}")


def test_check_reports_a_broken_step_at_the_step_with_a_note_at_the_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "samples" / "sgd.coco").read_text() + "\nschedule broken {\n  split(w1)\n}\n"
    path = tmp_path / "sgd.coco"
    path.write_text(text)
    assert main(["check", str(path)]) == 3
    err = capsys.readouterr().err
    n = len(text.splitlines()) - 1
    assert err.splitlines()[:5] == [
        f"{path}:{n}:3: error: split: 'w1' (update, f32[N] replicated) is not an allreduce",
        f"{n:>4} |   split(w1)",
        "     |   ^^^^^^^^^",
        f"{path}:18:1: note: 'w1' is defined here",
        "  18 | w1 = update(w, w - lr * m1)",
    ]


def test_apply_prints_the_program_without_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["apply", "megatron_mlp", "split(sum); reorder(sum)"]) == 0
    out = capsys.readouterr().out
    assert "out_s = dropout(sum_rs + b, 0.1, id=out) + slice(r)" in out
    assert "schedule" not in out


def test_apply_refused_step_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["apply", "megatron_mlp", "split(layer)"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("<step 1>:1:1: error: split: 'layer' (matmul")


def test_apply_output_writes_and_guards_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.sched"
    assert main(["apply", "sgd", "split(g1)", "-o", str(out)]) == 0
    assert out.read_text().splitlines()[-1] == "split(g1)"
    assert main(["apply", "sgd", "split(g1)", "reorder(g1)", "-o", str(out)]) == 0
    assert out.read_text().splitlines()[-1] == "reorder(g1)"
    mine = tmp_path / "mine.sched"
    mine.write_text("split(g1)\n")
    capsys.readouterr()
    assert main(["apply", "sgd", "dce()", "-o", str(mine)]) == 2
    assert "was not written by cocoviz" in capsys.readouterr().err
    assert mine.read_text() == "split(g1)\n"
    assert main(["apply", "sgd", "dce()", "-o", str(mine), "--force"]) == 0
    assert main(["apply", "sgd", "dce()", "-o", str(tmp_path / "x.txt")]) == 2


def test_apply_explain_lists_legal_steps_and_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["apply", "megatron_mlp", "--explain", "layer"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "steps for 'layer':"
    assert lines[1].split() == ["ok", "overlap(layer,", "sum,", "chunks=4)"]
    assert any(
        line.lstrip().startswith("no split(layer)") and "not an allreduce" in line for line in lines
    )


def test_verify_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "megatron_mlp", "-D", "B=2", "-D", "S=8", "-D", "H=16", "--ranks", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("schedule ") == 4 and "MISMATCH" not in out


def test_verify_mismatch_exits_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cocoviz.exec import verify
    real = verify.verify_programs

    def wrong(original: Program, scheduled: Program, **kw: object):  # type: ignore[no-untyped-def]
        import dataclasses

        report = real(original, scheduled, **kw)
        rows = tuple(dataclasses.replace(r, ok=False) for r in report.rows)
        return dataclasses.replace(report, rows=rows)

    monkeypatch.setattr(verify, "verify_programs", wrong)
    args = ["verify", "sgd", "-D", "N=64", "--ranks", "2", "--schedule", "ar_c"]
    assert main(args) == 4
    assert "MISMATCH" in capsys.readouterr().out
