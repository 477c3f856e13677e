"""The printer: print → parse → structurally equal Program, for every sample, generated
GPT stacks and every construct of the language; and the printed text itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.ir.lower import RanksOverride, load_program
from cocoviz.ir.nodes import Group, GroupKind, Program
from cocoviz.ir.printer import format_expr, format_number, format_program
from cocoviz.samples.gpt import gpt_stack


def round_trip(program: Program, path: str = "p.coco") -> Program:
    text = format_program(program)
    again = load_program(text, path)
    assert again == program, text
    assert format_program(again) == text  # printing is a fixed point
    return again


@pytest.mark.parametrize("name", samples.names())
def test_every_sample_round_trips(name: str) -> None:
    round_trip(load_program(samples.text(name), f"{name}.coco"), f"{name}.coco")


@pytest.mark.parametrize("name", samples.names())
def test_annotated_output_parses_to_the_same_program(name: str) -> None:
    p = load_program(samples.text(name), f"{name}.coco")
    assert load_program(format_program(p, annotate=True), f"{name}.coco") == p


@pytest.mark.parametrize("layers", [1, 2, 12])
def test_gpt_stacks_round_trip(layers: int) -> None:
    p = load_program(gpt_stack(layers), f"gpt{layers}.coco")
    assert len(p.stages) == 21 * layers
    round_trip(p)


def test_round_trip_with_defines_and_ranks_overrides() -> None:
    p = load_program(
        samples.text("megatron_mlp"), "m.coco", defines={"H": 1024}, ranks=RanksOverride(n=8)
    )
    text = format_program(p)
    assert "dim B = 2, S = 2048, H = 1024" in text and "ranks 8\n" in text
    round_trip(p)


CONSTRUCTS = """\
program constructs
ranks tp=4, pp=2
dim B = 2, S = 8, H = 16
param lr: f32 = 0.001, shift: f64 = -0.5, steps: i32 = 3

input x : f16[B, S, H] sliced(-1)
input xr : f16[B, S, H] replicated
input g : f16[H] replicated
input bb : f16[H] replicated
input w : f16[H, 4*H] sliced(1)
input wk : f16[H, H] sliced(0)
input m : f32[B, S, H] replicated
input c : i32[H] replicated
input s : f32[] replicated
input y1 : f16[B, S, H] replicated @stage 1

neg = -(x - 1) * -2 + (-x) / (x + x)
mix = max(x, 0.5) - min(x, 2) + pow(x, 2.0) * sqrt(abs(x)) + rsqrt(x + 1)
fun = exp(x) + log(x + 1) + tanh(x) + sigmoid(x) + relu(x) + gelu(x)
sel = where(xr > 0, xr, 0) + where(xr != 1, 1, xr)
cst = cast(f32, xr) + m * lr
dr = dropout(dropout(xr, 0.1), 0.2) + dropout(xr, 0.3)
ln = layernorm(xr, g, bb, eps=0.001) + rmsnorm(xr, g) + softmax(xr)
ln2 = layernorm(xr, g, bb)
red = sum(x) + norm(xr) * amax(m)
sl = slice(xr, 1) + slice(xr, -2) * 1
sl2 = slice(xr) * 2
mm = matmul(x, wk)
mm2 = matmul(xr, w)
ar = allreduce(max, mm)
rs = reducescatter(avg, xr)
ag = allgather(rs)
bc = broadcast(xr, root=2)
rd = reduce(*, xr, root=1)
ir = c / 2 + steps
sn = send(ag)
on1 = sn + y1
m1 = update(m, m * 0.5 + cst)

output on1, m1, neg, mix, fun, sel, dr, ln, ln2, red, sl, sl2, mm2, ar, bc, rd, ir

schedule s1 {
  split(ar)
  overlap(mm, ar_rs, chunks=4)
}
"""


def test_every_construct_round_trips() -> None:
    p = load_program(CONSTRUCTS, "constructs.coco")
    round_trip(p, "constructs.coco")


def test_printed_forms_of_constructs() -> None:
    text = format_program(load_program(CONSTRUCTS, "constructs.coco"))
    for line in [
        "ranks tp=4, pp=2",
        "param lr: f32 = 0.001, shift: f64 = -0.5, steps: i32 = 3",
        "input x : f16[B, S, H] sliced(2)",  # normal form of sliced(-1)
        "input w : f16[H, 4*H] sliced(1)",
        "input s : f32[] replicated",
        "input y1 : f16[B, S, H] replicated @stage 1",
        "neg = (-(x - 1)) * (-2) + (-x) / (x + x)",
        "sel = where(xr > 0, xr, 0) + where(xr != 1, 1, xr)",
        "dr = dropout(dropout(xr, 0.1), 0.2) + dropout(xr, 0.3)",
        "ln = layernorm(xr, g, bb, eps=0.001) + rmsnorm(xr, g) + softmax(xr)",
        "ln2 = layernorm(xr, g, bb)",
        "sl = slice(xr, 1) + slice(xr, 1) * 1",
        "sl2 = slice(xr) * 2",
        "ar = allreduce(max, mm)",
        "rs = reducescatter(avg, xr)",
        "bc = broadcast(xr, root=2)",
        "rd = reduce(*, xr, root=1)",
        "schedule s1 {\n  split(ar)\n  overlap(mm, ar_rs, chunks=4)\n}",
    ]:
        assert line in text, line


def test_sliced_zero_prints_in_normal_form() -> None:
    p = load_program(
        "ranks 4\ndim N = 8, M = 4\ninput a : f32[N, M] sliced(0)\n"
        "input b : f32[1, N] sliced(1)\ninput c : f32[N, M] sliced(-2)\n"
    )
    text = format_program(p)
    assert "input a : f32[N, M] sliced\n" in text
    assert "input b : f32[1, N] sliced\n" in text  # dims before 1 all have extent 1
    assert "input c : f32[N, M] sliced\n" in text


def test_canonical_slice_of_replicated_operands_is_printed() -> None:
    p = load_program(
        "ranks 4\ndim B = 8, H = 16\ninput a : f32[B, H] sliced(1)\ninput r : f32[B, H] replicated\n"
        "input bias : f32[H] replicated\ny = a + r + bias\n"
    )
    assert "y = a + slice(r, 1) + bias\n" in format_program(p)
    round_trip(p)


def test_dropout_ids_survive_moving_to_another_stage() -> None:
    """A dropout printed in a stage other than its source stage keeps its id."""
    p = load_program(
        "ranks 2\ndim N = 8\ninput x : f32[N] replicated\na = dropout(x, 0.5) + dropout(x, 0.5)\n"
    )
    (stage,) = p.stages
    d0, d1 = (e for e in stage.expr.walk() if e.op.value == "dropout")
    assert (d0.tag, d1.tag) == ("a#0", "a#1")
    assert format_expr(stage.expr, "a") == "dropout(x, 0.5) + dropout(x, 0.5)"
    assert format_expr(stage.expr, "b") == ("dropout(x, 0.5, id=a) + dropout(x, 0.5, id=a, k=1)")
    again = load_program(
        "ranks 2\ndim N = 8\ninput x : f32[N] replicated\n"
        "b = dropout(x, 0.5, id=a) + dropout(x, 0.5, id=a, k=1)\n"
    )
    tags = [e.tag for e in again.stages[0].expr.walk() if e.op.value == "dropout"]
    assert tags == ["a#0", "a#1"]


def test_nested_dropouts_are_numbered_in_source_order() -> None:
    p = load_program(
        "ranks 2\ndim N = 8\ninput x : f32[N] replicated\na = dropout(dropout(x, 0.1), 0.2)\n"
    )
    outer = p.stages[0].expr
    assert (outer.tag, outer.args[0].tag) == ("a#0", "a#1")


def test_groups_print_as_blocks_and_round_trip() -> None:
    text = (
        "ranks 4\ndim B = 4, H = 16\n"
        "input x : f16[B, H] sliced(1)\ninput w : f16[H, H] sliced\n"
        "input b : f16[H] replicated\n"
        "overlapped chunks=2 {\n  y = matmul(x, w)\n  fused {\n    s = reducescatter(+, y)\n"
        "    t = s + 1\n    u = allgather(t)\n  }\n}\n"
        "output u\n"
    )
    p = load_program(text)
    assert p.groups == (
        Group(GroupKind.OVERLAPPED, ("y", Group(GroupKind.FUSED, ("s", "t", "u"))), 2),
    )
    printed = format_program(p)
    assert (
        "overlapped chunks=2 {\n  y = matmul(x, w)\n  fused {\n    s = reducescatter(+, y)"
        in printed
    )
    round_trip(p)


def test_annotate_adds_type_comments() -> None:
    text = format_program(
        load_program(samples.text("megatron_mlp"), "megatron_mlp.coco"), annotate=True
    )
    assert "layer = matmul(x, w)             # f16[B, S, H] local" in text
    assert "sum = allreduce(+, layer)        # f16[B, S, H] replicated" in text
    grid = format_program(load_program(samples.text("pipeline_stage"), "p.coco"), annotate=True)
    assert "# f16[B, S, H] replicated @stage 1" in grid


def test_schedules_can_be_left_out() -> None:
    p = load_program(samples.text("sgd"), "sgd.coco")
    assert "schedule" in format_program(p)
    assert "schedule" not in format_program(p, schedules=False)


def test_program_name_from_a_file_stem_that_is_not_an_identifier() -> None:
    p = load_program("ranks 2\n", "my-model.v2.coco")
    assert p.name == "my_model_v2"
    assert load_program("ranks 2\n", "3d.coco").name == "_3d"
    round_trip(p)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1, "1"),
        (-3, "-3"),
        (2.0, "2.0"),
        (0.1, "0.1"),
        (1e-8, "1e-08"),
        (1e20, "1e+20"),
        (-0.5, "-0.5"),
        (True, "1"),
    ],
)
def test_format_number(value: float, text: str) -> None:
    assert format_number(value) == text


GOLDEN = Path(__file__).resolve().parent / "golden" / "printed"


@pytest.mark.parametrize("name", samples.names())
def test_printed_sample_golden(name: str) -> None:
    """`cocoviz show` text of every sample (annotated with inferred types), as golden text:
    a change of layout inference or printing shows up here as a diff to read.
    `COCOVIZ_UPDATE_GOLDEN=1` rewrites the files."""
    text = format_program(load_program(samples.text(name), f"{name}.coco"), annotate=True)
    golden = GOLDEN / f"{name}.coco"
    if os.environ.get("COCOVIZ_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")
