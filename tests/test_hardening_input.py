"""Hostile and runaway input ends in one clear diagnostic, never an internal error.

Memory that steps leave behind, input size and statement limits, deep bracket nests,
long and deeply nested expressions, steps the palette offers that must apply, groups
written in source, absurd integers, and a seeded slice of the in-process fuzzer
(bench/fuzz.py).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import os
import sys
import time
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.errors import InputError, ScheduleError, UsageError
from cocoviz.ir import syntax_tree
from cocoviz.ir.lower import RanksOverride, load_file, load_program, parse_defines
from cocoviz.ir.nodes import MAX_EXPR_DEPTH
from cocoviz.ir.printer import format_program
from cocoviz.ir.transforms import as_transformation, legal_steps
from cocoviz.ir.transforms.base import Index

ROOT = Path(__file__).resolve().parent.parent
HAS_REFERENCE = importlib.util.find_spec("cocoviz.exec.verify") is not None


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def write(tmp_path: Path, text: str, name: str = "p.coco") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def assert_diagnostic(rc: int, err: str, code: int, *parts: str) -> None:
    """One clear message: the exit code, no traceback, no internal error, the parts."""
    assert rc == code, err
    assert "Traceback" not in err and "internal error" not in err, err
    for part in parts:
        assert part in err, err


HEAD = "ranks 4\ndim N = 64\ninput x : f32[N] replicated\ninput z : f32[N] local\n"


# --- 7: nothing a step makes outlives its program ----------------------------------------


def live_indexes() -> int:
    gc.collect()
    return sum(isinstance(o, Index) for o in gc.get_objects())


def test_indexes_do_not_outlive_their_programs() -> None:
    program = load_file(samples.path("megatron_mlp"))
    steps = [as_transformation(s) for s in program.schedules[-1].steps]
    before = live_indexes()  # other tests' programs may hold theirs
    for _ in range(200):
        p = program
        for t in steps:
            p = t.apply(p)
    del p
    grown = live_indexes() - before
    assert grown <= 2, f"{grown} more Index objects alive after 200 rounds of 4 steps"


def test_an_index_is_never_used_for_a_copy_of_its_program() -> None:
    from cocoviz.ir.transforms.base import index

    program = load_file(samples.path("sgd"))
    idx = index(program)
    copy = object.__new__(type(program))
    copy.__dict__.update(program.__dict__)  # a shallow copy carries the cached attribute
    assert index(copy) is not idx and index(copy).program is copy


# --- 8: input size and statement count -----------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_an_endless_device_is_refused() -> None:
    rc, _, err = run("check", "/dev/zero")
    assert_diagnostic(rc, err, 1, "/dev/zero: not a regular file (a device), expected a .coco file", "hint:")


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(syntax_tree, "MAX_SOURCE_BYTES", 1000)
    path = write(tmp_path, HEAD + "# padding\n" * 200)
    rc, _, err = run("check", path)
    assert_diagnostic(rc, err, 1, "p.coco: too large: a program file may hold at most 1,000 bytes")


def test_newlines_are_normalized_as_in_text_mode(tmp_path: Path) -> None:
    path = tmp_path / "crlf.coco"
    path.write_bytes(
        b"ranks 4\r\ndim N = 64\rinput x : f32[N] replicated\r\ny = x * 2\r\noutput y\r\n"
    )
    rc, out, err = run("check", str(path))
    assert rc == 0, err


def test_too_many_statements(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(syntax_tree, "MAX_STATEMENTS", 50)
    body = "".join(f"s{i} = x * {i}\n" for i in range(60))
    rc, _, err = run("check", write(tmp_path, HEAD + body + "output s1\n"))
    assert_diagnostic(rc, err, 1, ":51:1: error: too many statements: more than 50", "^")


def test_a_statement_with_too_many_tokens(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(syntax_tree, "MAX_STATEMENT_TOKENS", 100)
    rc, _, err = run("check", write(tmp_path, HEAD + "y = " + " + ".join(["x"] * 100) + "\n"))
    assert_diagnostic(rc, err, 1, "statement too long: more than 100 tokens", "hint: split")


def test_a_run_of_separators_is_cheap_and_harmless(tmp_path: Path) -> None:
    text = HEAD + ";" * 200_000 + "\n" * 200_000 + "y = x * 2;;;\n\n;output y\n"
    t0 = time.perf_counter()
    rc, _, err = run("check", write(tmp_path, text))
    assert rc == 0, err
    assert time.perf_counter() - t0 < 5


def test_a_semicolon_inside_brackets_is_reported_where_it_is() -> None:
    with pytest.raises(InputError) as e:
        load_program(HEAD + "y = (x +\n  ;  x)\noutput y\n")
    assert e.value.message.startswith("syntax error: unexpected ';'")
    assert (e.value.span.line, e.value.span.col) == (6, 3)


# --- 9: deep bracket nests lex in linear time ------------------------------------------------


def test_a_deep_bracket_nest_is_linear(tmp_path: Path) -> None:
    depth = 49_000  # just under the statement token limit; quadratic lexing took minutes
    text = HEAD + "y = " + "(" * depth + "x" + ")" * depth + "\noutput y\n"
    t0 = time.perf_counter()
    rc, out, err = run("check", write(tmp_path, text))
    assert rc == 0, err
    assert time.perf_counter() - t0 < 5


def test_mismatched_closers_in_a_deep_nest_are_linear() -> None:
    depth = 40_000
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="syntax error"):
        load_program(HEAD + "y = f(" + "[" * depth + ")" * depth + "\n")
    assert time.perf_counter() - t0 < 5


def test_an_unclosed_bracket_is_still_named() -> None:
    with pytest.raises(InputError) as e:
        load_program(HEAD + "y = relu((x + max(x, 1)\n")
    assert "the '(' at line 5 is never closed" in e.value.message
    assert e.value.diagnostics[0].notes[0][1].col == 10  # type: ignore[union-attr]


# --- 10: long and deeply nested expressions ---------------------------------------------------

CHAIN = (
    HEAD
    + "s = allreduce(+, z)\ny = "
    + " + ".join(["s"] + ["x"] * 1000)
    + "\nw = y * 2\noutput w\n"
)


def test_a_long_chain_works_everywhere(tmp_path: Path) -> None:
    path = write(tmp_path, CHAIN)
    t0 = time.perf_counter()
    rc, out, err = run("check", path)
    assert rc == 0, err
    assert time.perf_counter() - t0 < 5
    for args in (
        ("show", path),
        ("show", path, "--format", "json"),
        ("show", path, "--format", "dot"),
        ("apply", path, "split(s)", "reorder(s)"),
        ("apply", path, "fuse(y, w)"),
        ("apply", path, "--explain", "y"),
    ):
        rc, out, err = run(*args)
        assert rc == 0, (args, err)


def test_a_long_chain_round_trips_and_survives_steps() -> None:
    p = load_program(CHAIN, "chain.coco")
    assert load_program(format_program(p), "chain.coco") == p
    for step in ("split(s)", "reorder(s)", "fuse(s_rs, w)", "dce()"):
        p = as_transformation(step).apply(p)
    assert load_program(format_program(p), "chain.coco") == p


@pytest.mark.skipif(not HAS_REFERENCE, reason="no numpy reference in this build")
def test_a_long_chain_verifies(tmp_path: Path) -> None:
    sched = tmp_path / "c.sched"
    path = write(tmp_path, CHAIN)
    rc, _, err = run("apply", path, "split(s)", "reorder(s)", "-o", str(sched))
    assert rc == 0, err
    rc, out, err = run("verify", path, "--schedule", str(sched))
    assert rc == 0, err + out


@pytest.mark.parametrize(
    "expr",
    [
        " + ".join(["x"] * (MAX_EXPR_DEPTH + 2)),
        "relu(" * (MAX_EXPR_DEPTH + 1) + "x" + ")" * (MAX_EXPR_DEPTH + 1),
        "x + (" * (MAX_EXPR_DEPTH + 1) + "x" + ")" * (MAX_EXPR_DEPTH + 1),
        "-" * (MAX_EXPR_DEPTH + 1) + "x",
        "where(x > 0, " * (MAX_EXPR_DEPTH + 1) + "x" + ", 0)" * (MAX_EXPR_DEPTH + 1),
    ],
    ids=["chain", "calls", "right-nested", "negations", "where"],
)
def test_too_deep_an_expression_is_a_diagnostic(tmp_path: Path, expr: str) -> None:
    rc, _, err = run("check", write(tmp_path, HEAD + "y = " + expr + "\noutput y\n"))
    assert_diagnostic(
        rc,
        err,
        1,
        ":5:1: error: the expression of 'y' is nested too deeply: more than 2,000 levels",
        "hint: compute it in several stages",
    )


def test_nesting_up_to_the_limit_works(tmp_path: Path) -> None:
    n = MAX_EXPR_DEPTH - 1
    text = HEAD + "y = " + "relu(" * n + "x" + ")" * n + "\nw = -" + "(" * 5000 + "y" + ")" * 5000
    path = write(tmp_path, text + "\noutput w\n")
    for args in (("check", path), ("show", path, "--json"), ("apply", path, "fuse(y, w)")):
        rc, _, err = run(*args)
        assert rc == 0, (args, err)


# --- 11: the palette offers only steps that apply ---------------------------------------------

UPDATE_GATHERED = """ranks 4
dim N = 64
input x : f32[N] sliced
s1 = update(x, x * 2)
s2 = allgather(x)
s3 = s2 * 2
output s3, s1
"""

LANGUAGE_UPDATE = """ranks 4
dim N = 1024
param lr: f32 = 0.1
input w : f32[N] replicated
input m : f32[N] replicated
input g : f32[N] sliced
wn = norm(w)
m1 = update(m, 0.9 * slice(m) + g)
m2 = allgather(m1)
w1 = update(w, w - lr * m2 / wn)
output w1
"""


def offered(text: str, stage: str) -> dict[str, bool]:
    return {o.step: o.ok for o in legal_steps(load_program(text), stage)}


def test_reorder_after_an_update_of_the_gathered_input_is_refused(tmp_path: Path) -> None:
    assert offered(UPDATE_GATHERED, "s2")["reorder(s2)"] is False
    path = write(tmp_path, UPDATE_GATHERED)
    rc, _, err = run("apply", path, "reorder(s2)")
    assert_diagnostic(
        rc, err, 3, "reorder: nothing can move across 's2'", "'s3' comes after 's1', which updates"
    )
    rc, _, err = run("apply", path, "reorder(s2, s3)")
    assert_diagnostic(
        rc, err, 3, "cannot move 's3'", "hint: leave 's3' out of the region, or write it before"
    )


def test_reorder_keeps_the_gather_that_completes_an_update(tmp_path: Path) -> None:
    assert offered(LANGUAGE_UPDATE, "m2")["reorder(m2)"] is True
    p = as_transformation("reorder(m2)").apply(load_program(LANGUAGE_UPDATE))
    assert p.has_stage("m2") and p.stage("w1_s").expr.args[0].name == "w"
    assert as_transformation("dce()").apply(p).has_stage("m2")
    if HAS_REFERENCE:
        sched = tmp_path / "u.sched"
        path = write(tmp_path, LANGUAGE_UPDATE)
        rc, _, err = run("apply", path, "reorder(m2)", "-o", str(sched))
        assert rc == 0, err
        rc, out, err = run("verify", path, "--schedule", str(sched))
        assert rc == 0, err + out


@pytest.mark.parametrize("name", samples.names())
def test_every_offered_step_applies(name: str) -> None:
    program = load_file(samples.path(name))
    for target in [s.name for s in program.stages] + [i.name for i in program.inputs]:
        for option in legal_steps(program, target):
            if option.ok:
                as_transformation(option.step).apply(program)  # no error of any kind


# --- groups written in source obey the rules of fuse and overlap ----------------------------


def test_a_fused_block_of_one_stage_is_refused() -> None:
    with pytest.raises(InputError, match="a 'fused' block needs at least two stages"):
        load_program(HEAD + "y = x * 2\nfused {\n  w = y * 3\n}\noutput w\n")


def test_an_illegal_fused_block_is_refused() -> None:
    text = HEAD + "fused {\n  y = x * 2\n  s = allreduce(+, y)\n  w = s * 3\n}\noutput w\n"
    with pytest.raises(InputError) as e:
        load_program(text)
    assert e.value.message.startswith("this 'fused' block is not a legal group: 's' (allreduce")
    assert e.value.hint == "split first: split(s), then reorder(s)"


OVERLAPPED = """ranks 4
dim B = 4, H = 16
input x : f16[B, H] sliced(1)
input w : f16[H, H] sliced
overlapped chunks=2 {
  y = matmul(x, w)
  fused {
    s = reducescatter(+, y)
    t = s + 1
GATHER
  }
}
OUTSIDE
output u
"""


def test_an_overlapped_block_whose_slice_leaves_it_is_refused() -> None:
    legal = OVERLAPPED.replace("GATHER", "    u = allgather(t)").replace("OUTSIDE", "")
    assert len(load_program(legal).groups) == 1
    bad = OVERLAPPED.replace("GATHER", "").replace("OUTSIDE", "u = allgather(t)")
    with pytest.raises(InputError) as e:
        load_program(bad)
    assert e.value.message == (
        "this 'overlapped' block is not a legal group: 't' is sliced and read by 'u' outside "
        "the group; inside an overlapped group slices are laid out chunk by chunk, so no slice "
        "may leave it"
    )
    assert e.value.span is not None and e.value.span.line == 5


def test_a_step_that_would_break_an_overlapped_group_is_refused() -> None:
    p = load_file(samples.path("megatron_mlp"))
    for s in p.schedules[-1].steps:  # the fused schedule: r is read inside the group
        p = as_transformation(s).apply(p)
    options = {o.step: o for o in legal_steps(p, "r")}
    assert options["asslice(r)"].ok is False
    with pytest.raises(ScheduleError) as e:
        as_transformation("asslice(r)").apply(p)
    assert "it would break the overlapped group {layer, sum_rs, out_s, out}" in e.value.message


def test_printed_scheduled_samples_parse_back() -> None:
    for name in samples.names():
        p = load_file(samples.path(name))
        for block in p.schedules:
            q = p
            for s in block.steps:
                q = as_transformation(s).apply(q)
            assert load_program(format_program(q), f"{name}.coco") == q, (name, block.name)


# --- 13: integers ----------------------------------------------------------------------------

LONG = "1" * 5000


@pytest.mark.parametrize(
    "text",
    [
        f"ranks 4\ndim N = {LONG}\n",
        f"ranks {LONG}\n",
        f"ranks 4\nparam a: i32 = {LONG}\n",
        HEAD + f"y = x * {LONG}\n",
        HEAD + "y = x * " + "0" * 5000 + "1\n",
        HEAD + "y = allreduce(+, z)\nschedule s {\n  overlap(x, y, chunks=" + LONG + ")\n}\n",
    ],
    ids=["dim", "ranks", "param", "literal", "zeros", "chunks"],
)
def test_absurdly_long_integers_are_a_diagnostic(tmp_path: Path, text: str) -> None:
    rc, _, err = run("check", write(tmp_path, text))
    assert_diagnostic(rc, err, 1, "error: integer too long: 5,0", "hint: integers are 64-bit")


def test_a_long_integer_in_a_step_is_a_diagnostic() -> None:
    rc, _, err = run("apply", "megatron_mlp", f"overlap(layer, sum, chunks={LONG})")
    assert_diagnostic(rc, err, 1, "<step 1>:1:28: error: integer too long: 5,000 digits")


@pytest.mark.parametrize("value", ["²", "٣", "３", "1_0", "0x10", " ", "", LONG, "-" + LONG])
def test_defines_take_ascii_digits_only(value: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_defines([f"N={value}"])
    assert e.value.message.startswith("-D expects NAME=INTEGER")
    assert len(e.value.message) < 100


def test_define_range() -> None:
    assert parse_defines(["N=64", " H = 0012 "]) == {"N": 64, "H": 12}
    with pytest.raises(UsageError, match="too large"):
        parse_defines(["N=99999999999999999999"])
    with pytest.raises(UsageError, match="must be positive"):
        parse_defines(["N=-3"])


def test_defines_on_the_command_line() -> None:
    for value in ("²", "٣", LONG):
        rc, _, err = run("check", "sgd", "-D", f"N={value}")
        assert_diagnostic(rc, err, 2, "-D expects NAME=INTEGER")


@pytest.mark.parametrize("value", ["٣", "²", LONG, "tp=٣,pp=1", f"tp=2,pp={LONG}"])
def test_ranks_override_takes_ascii_digits_only(value: str) -> None:
    with pytest.raises(UsageError, match="--ranks expects"):
        RanksOverride.parse(value)


def test_too_many_ranks(tmp_path: Path) -> None:
    rc, _, err = run("check", write(tmp_path, "ranks 4611686018427387904\n"))
    assert_diagnostic(rc, err, 1, ":1:1: error: too many ranks", "at most 1,048,576")
    rc, _, err = run("check", write(tmp_path, "ranks tp=2048, pp=1024\n"))
    assert_diagnostic(rc, err, 1, "too many ranks: tp × pp = 2097152")
    rc, _, err = run("check", "sgd", "--ranks", "2000000")
    assert_diagnostic(rc, err, 2, "--ranks: too many ranks")


# --- the fuzzer, a seeded slice -------------------------------------------------------------


def fuzz_module():  # type: ignore[no-untyped-def]
    """bench/fuzz.py as a module (also the corruptions of tests/test_fuzz.py)."""
    spec = importlib.util.spec_from_file_location("cocoviz_bench_fuzz", ROOT / "bench" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("part", range(4))
def test_fuzz_slice(part: int) -> None:
    fuzz = fuzz_module()
    verify = 0.05 if HAS_REFERENCE else 0.0
    stats = fuzz.run(cases=550, seed=2024, verify_fraction=verify, start=part * 550)
    bad = stats.findings
    assert not bad, "\n\n".join(f.reproducer() + "\n" + f.trace for f in bad[:3])
    assert stats.outcomes["load: ok"] > 100 and stats.steps_applied > 50, stats


@pytest.mark.parametrize(
    "call",
    [
        "rmsnorm(x, x, eps=1e400)",
        "layernorm(x, x, x, eps=-1e400)",
        "dropout(x, 0.1, id=x, k=1e400)",
        "slice(x, 1e400)",
        "broadcast(x, root=99999999999999999999)",
    ],
)
def test_literal_arguments_are_in_range(tmp_path: Path, call: str) -> None:
    rc, _, err = run("check", write(tmp_path, HEAD + f"y = {call}\noutput y\n"))
    assert_diagnostic(rc, err, 1, ":5:", "out of range")
