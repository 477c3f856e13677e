"""Every numeric option is checked against one range when the command line is parsed:
a hostile value is a usage error (exit 2) with the option named, never an overflow, an
unbounded allocation or an internal error (issue 31, items 1 and 2)."""

from __future__ import annotations

import contextlib
import io

import pytest

from cocoviz.cli import main
from cocoviz.cli.inspect import MAX_GPT_LAYERS
from cocoviz.ir.lower import load_program
from cocoviz.samples.gpt import gpt_stack

HUGE = "9" * 400


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


OPTIONS = [
    ("run", "sgd", "--max-mem"),
    ("verify", "sgd", "--max-mem"),
    ("run", "sgd", "--timeout"),
    ("run", "sgd", "--iters"),
    ("simulate", "sgd", "--width"),
    ("tune", "sgd", "--top"),
    ("tune", "sgd", "--budget"),
    ("model-table", "--ranks"),
    ("model-table", "--ranks-per-node"),
    ("samples", "--gpt"),
]
VALUES = [HUGE, "-" + HUGE, "10000000000", "0", "-1", "nan", "inf", "1e400", "0x10", "", "١٢"]


@pytest.mark.parametrize("option", OPTIONS, ids=[" ".join(o) for o in OPTIONS])
@pytest.mark.parametrize("value", VALUES)
def test_hostile_numbers_are_usage_errors(option: tuple[str, ...], value: str) -> None:
    rc, _, err = run(*option, value)
    assert rc == 2, (option, value, rc, err)
    assert option[-1] in err and "Traceback" not in err and "internal error" not in err, err


def test_max_mem_of_four_hundred_digits_is_a_usage_error() -> None:
    rc, _, err = run("run", "sgd", "--max-mem", HUGE)
    assert rc == 2 and "--max-mem" in err, err


def test_a_hundred_million_columns_is_refused() -> None:
    rc, _, err = run("simulate", "sgd", "--width", "100000000")
    assert rc == 2 and "--width" in err and "1000" in err, err


def test_sizes_in_range_are_taken() -> None:
    rc, _, err = run("verify", "sgd", "--ranks", "2", "-D", "N=64", "--max-mem", "1.5G")
    assert rc == 0, err
    rc, out, err = run("simulate", "sgd", "--width", "40")
    assert rc == 0 and max(len(line) for line in out.splitlines()) < 160, err


def test_gpt_stack_over_what_loads_is_refused() -> None:
    rc, out, err = run("samples", "--gpt", "4000")
    assert rc == 2 and out == "" and f"1 .. {MAX_GPT_LAYERS}" in err, err


def test_the_largest_gpt_stack_loads() -> None:
    program = load_program(gpt_stack(MAX_GPT_LAYERS), "gpt")
    assert len(program.stages) > 20 * MAX_GPT_LAYERS
