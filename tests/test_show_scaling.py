"""`show`, `show --json` and `show --graph` cost linear time in the program: stage, type
and group lookups go through name maps kept with the (immutable) program (issue 31,
item 7)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import time
from pathlib import Path

from cocoviz.cli import main
from cocoviz.ir.lower import load_program
from cocoviz.samples.gpt import gpt_stack


def chain(n: int) -> str:
    body = [f"s{i} = s{i - 1} * 2" for i in range(1, n)]
    return "\n".join(
        ["ranks 4", "dim N = 64", "input x : f32[N] replicated", "s0 = x * 2", *body]
        + [f"output s{n - 1}", ""]
    )


def test_every_stage_looked_up_by_name_is_linear() -> None:
    program = load_program(chain(20_000), "chain")
    start = time.process_time()
    for s in program.stages:
        assert program.stage(s.name) is s
        assert program.has_stage(s.name)
        assert program.type_of(s.name) == s.ty
        assert program.group_of(s.name) is None
    assert time.process_time() - start < 2.0  # a scan per lookup: 2e8 comparisons, 10 s+


def test_lookups_keep_the_program_a_value() -> None:
    program = load_program(chain(50), "chain")
    program.stage("s3")  # builds the map
    again = load_program(chain(50), "chain")
    assert program == again and hash(program) == hash(again)
    fewer = dataclasses.replace(program, stages=program.stages[:10])
    assert fewer.has_stage("s9") and not fewer.has_stage("s10")
    assert program.has_stage("s10")
    first = program.stages[0]
    renamed = dataclasses.replace(program, stages=(dataclasses.replace(first, name="t"),))
    assert renamed.stage("t").name == "t" and not renamed.has_stage("s0")


def _cpu(argv: list[str]) -> float:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        start = time.process_time()
        assert main(argv) == 0
        return time.process_time() - start


def test_show_json_and_graph_grow_linearly(tmp_path: Path) -> None:
    small, large = tmp_path / "small.coco", tmp_path / "large.coco"
    small.write_text(gpt_stack(60))
    large.write_text(gpt_stack(240))
    for mode in ("--json", "--graph"):
        _cpu(["show", str(small), mode])  # imports
        ratio = _cpu(["show", str(large), mode]) / _cpu(["show", str(small), mode])
        assert ratio < 7, (mode, ratio)  # 4x the layers; quadratic was 12x and more
