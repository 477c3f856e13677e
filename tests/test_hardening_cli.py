"""Hostile command-line values and files that used to end in an internal error (exit 70):
each is one clear diagnostic with a usage (2) or input (1) exit code."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from cocoviz.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["model-table", "-b", "0", "-e", "0"],
        ["model-table", "-b", "2K", "-e", "1K"],
        ["model-table", "-e", "²K"],
        ["verify", "sgd", "-D", "N=64", "--max-mem", "inf"],
        ["verify", "sgd", "-D", "N=64", "--max-mem", "nan"],
        ["verify", "sgd", "-D", "N=64", "--max-mem", "1e400"],
        ["samples", "--gpt", "0"],
        ["samples", "--gpt", "100000"],
        ["samples", "--gpt", "٣"],
        ["check", "sgd", "--seed", "-1"],
        ["check", "sgd", "--seed", str(2**64)],
        ["check", "sgd", "--seed", "٣"],
    ],
)
def test_bad_numbers_are_usage_errors(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "internal error" not in err


def test_a_collective_of_an_expression_is_refused_by_the_emitter(tmp_path: Path, capsys) -> None:
    src = tmp_path / "c.coco"
    src.write_text(
        "ranks 4\ndim N = 64\ninput z : f32[N] replicated\nh = allreduce(+, z * 2)\noutput h\n"
    )
    assert main(["check", str(src)]) == 0
    assert main(["emit", str(src), "-o", str(tmp_path / "o"), "--target", "cpu"]) == 1
    err = capsys.readouterr().err
    assert f"{src}:4:1: error: the emitter needs the operand of allreduce 'h'" in err
    assert "hint: name it first" in err


def test_a_sched_file_that_never_ends_is_refused(tmp_path: Path, capsys) -> None:
    link = tmp_path / "z.sched"
    os.symlink("/dev/zero", link)
    assert main(["simulate", "sgd", "--schedule", str(link)]) == 1
    assert "not a regular file (a device)" in capsys.readouterr().err


def test_a_very_long_source_line_is_shown_around_the_caret(tmp_path: Path, capsys) -> None:
    src = tmp_path / "long.coco"
    src.write_text(
        "ranks 4\ndim N = 8\ninput x : f32[N] replicated\ny = x" + " " * 5000 + "+ zz\noutput y\n"
    )
    assert main(["check", str(src)]) == 1
    lines = capsys.readouterr().err.splitlines()
    shown = [ln for ln in lines if ln.startswith("   4 | ")]
    assert len(shown) == 1 and len(shown[0]) < 200 and shown[0].endswith("zz")
    caret = lines[lines.index(shown[0]) + 1]
    assert caret.index("^") == shown[0].index("zz")


@pytest.mark.parametrize("saved_at", [math.nan, math.inf, -1.0, 1e300])
def test_an_autosave_with_a_saved_at_that_is_not_a_time_is_ignored(
    tmp_path: Path, saved_at: float
) -> None:
    import json

    from cocoviz.workbench import state

    state.write(state.Autosave("k", "src", ("split(x)",), 1.0), root=tmp_path)
    slot = next(p for p in tmp_path.rglob("*") if p.is_file())
    data = json.loads(slot.read_text())
    data["saved_at"] = saved_at
    slot.write_text(json.dumps(data))
    assert state.read("k", root=tmp_path) is None
