"""`cocoviz tune FILE --sweep NAME=LO..HI`: per-size best and canonical schedules, the
crossover where the winner changes, and clean errors for a bad argument."""

from __future__ import annotations

import json

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.ir.lower import load_file
from cocoviz.schedule.tune import sweep
from cocoviz.sim.hardware import load_profile

H100 = load_profile("h100-dgx")


def _adam_sweep():  # type: ignore[no-untyped-def]
    path = samples.path("adam")
    values = [1 << k for k in range(16, 31)]
    return sweep(lambda v: load_file(path, {"N": v}), "N", values, H100)


def test_adam_crossover_is_where_the_per_size_predictions_put_it() -> None:
    result = _adam_sweep()
    crossings = result.crossovers
    assert crossings, "adam's winner changes between 2^16 and 2^30 on h100-dgx"
    points = {p.value: p for p in result.points}
    values = [p.value for p in result.points]
    for c in crossings:
        here = points[c.value]
        before = points[values[values.index(c.value) - 1]]
        assert here.time_of(c.winner) < here.time_of(c.loser)
        assert before.time_of(c.loser) <= before.time_of(c.winner)
        assert before.winner == c.loser and here.winner == c.winner
    # Every size's winner is the minimum of its canonical times.
    for p in result.points:
        assert p.time_of(p.winner) == min(t for _, t in p.canonical)
        assert p.best.time_s <= p.time_of(p.winner) + 1e-12
    # Latency-bound small tensors keep the allreduce; large ones pay for RS-C-AG.
    assert "[ar_c]" in result.points[0].winner and "[fused]" in result.points[-1].winner


def test_sweep_cli_prints_the_crossover(capsys: pytest.CaptureFixture[str]) -> None:
    result = _adam_sweep()
    assert main(["tune", "adam", "--sweep", "N=2^16..2^30"]) == 0
    out = capsys.readouterr().out
    for c in result.crossovers:
        k = c.value.bit_length() - 1
        assert f"{c.winner} beats {c.loser} from N = 2^{k} on h100-dgx" in out


def test_sweep_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "adam", "--sweep", "N=2^20..2^22", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dimension"] == "N" and [p["value"] for p in data["points"]] == [
        1 << 20,
        1 << 21,
        1 << 22,
    ]
    assert all(p["winner"] in {c["name"] for c in p["canonical"]} for p in data["points"])


@pytest.mark.parametrize(
    ("arg", "code", "message"),
    [
        ("M=2^16..2^20", 1, "adam has no dimension 'M'"),
        ("n=2^16..2^20", 1, "did you mean 'N'?"),
        ("N=2^20..2^16", 2, "LO is larger than HI"),
        ("N=1000..2^20", 2, "1000 is not a power of two"),
        ("N=2^16..2^99", 2, "2^99 is too large"),
        ("N=2^16..99999999999999999999999999", 2, "is too large"),
        ("N", 2, "--sweep expects NAME=LO..HI"),
        ("N=0..4", 2, "'0' is not a size"),
        ("N=3^2..2^4", 2, "'3^2' is not a size"),
    ],
)
def test_sweep_argument_errors_are_clean(
    capsys: pytest.CaptureFixture[str], arg: str, code: int, message: str
) -> None:
    assert main(["tune", "adam", "--sweep", arg]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_sweep_refuses_a_conflicting_define_and_output(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["tune", "adam", "--sweep", "N=2^4..2^5", "-D", "N=64"]) == 2
    assert "both set N" in capsys.readouterr().err
    out = str(tmp_path / "best.sched")
    assert main(["tune", "adam", "--sweep", "N=2^4..2^5", "-o", out]) == 2
    assert "does not combine with --sweep" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "dim"),
    [("adam", "N"), ("lamb", "N"), ("megatron_mlp", "S"), ("transformer_block", "S")],
)
def test_the_main_dimension_is_the_token_or_element_count(name: str, dim: str) -> None:
    from cocoviz.schedule.tune import main_dimension

    # megatron: B, S and H shape the allreduce; every weight has H, and S > B
    assert main_dimension(load_file(samples.path(name))) == dim


def test_no_collective_no_main_dimension_and_the_sizes_around_a_value() -> None:
    from cocoviz.ir.lower import load_program
    from cocoviz.schedule.tune import block_of, main_dimension, sweep_values

    p = load_program("ranks 2\ndim N = 8\ninput x : f32[N] local\ny = x + x\noutput y\n", "p")
    assert main_dimension(p) is None
    assert sweep_values(2048) == tuple(1 << k for k in range(5, 14))
    assert sweep_values(12) == (3, 6, 12, 24, 48)  # down as far as 12 divides
    assert sweep_values(0) == ()
    assert block_of("fuse(RS-C-AG) [fused]") == "fused" and block_of("AR-C×6") is None
