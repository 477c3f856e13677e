"""The reference of simulated ranks: inputs, layouts, global indexing, collectives,
pipeline grids, input validation, memory estimate."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from cocoviz import numerics as nx
from cocoviz.errors import ExitCode, InputError, UsageError
from cocoviz.exec.layout import global_flat_index
from cocoviz.exec.reference import estimate_bytes, run_reference
from cocoviz.ir.lower import RanksOverride, load_file, load_program

F32 = np.float32


def prog(text: str) -> Any:
    return load_program(text, "t.coco")


@pytest.mark.parametrize(
    ("decl", "shape"),
    [
        ("f16[B, S, H] replicated", (2, 3, 8)),
        ("f32[B, S, H] local", (4, 2, 3, 8)),
        ("bf16[B, S, H] sliced", (2, 3, 8)),
        ("f32[B, S, H] sliced(2)", (2, 3, 8)),
        ("i32[B, S, H] sliced(1)", (2, 4, 8)),
    ],
)
def test_inputs_come_from_the_shared_generator(decl: str, shape: tuple[int, ...]) -> None:
    dims = "B = 2, S = 4, H = 8" if "sliced(1)" in decl else "B = 2, S = 3, H = 8"
    p = prog(f"program t\nranks 4\ndim {dims}\ninput x : {decl}\ny = x\noutput y\n")
    res = run_reference(p, seed=11)
    ty = p.input("x").ty
    n = int(np.prod(shape))
    expected = nx.generate_input("x", ty.dtype.value, n, 11).reshape(shape)
    np.testing.assert_array_equal(res.global_value("x"), expected)
    for r in range(4):  # each rank holds exactly its part, by global index
        idx = global_flat_index(ty, 4, r)
        np.testing.assert_array_equal(res.storage("x", r), expected.reshape(-1)[idx])


def test_seed_changes_inputs() -> None:
    p = prog("program t\nranks 2\ninput x : f32[16] replicated\ny = x\noutput y")
    assert not np.array_equal(
        run_reference(p, seed=0).global_value("y"), run_reference(p, seed=1).global_value("y")
    )


BIAS = """program t
ranks 4
dim B = 2, S = 3, H = 8
input x : f32[B, S, H] {layout}
input b : f32[H] replicated
y = dropout(x + b, 0.25) * 2
output y
"""


def test_bias_on_flat_slices_is_indexed_by_global_position() -> None:
    # 48 elements over 4 ranks: chunks of 12, not a multiple of H = 8, so each rank's
    # chunk starts in the middle of a row.
    sliced = prog(BIAS.format(layout="sliced"))
    rep = prog(BIAS.format(layout="replicated"))
    rs, rr = run_reference(sliced), run_reference(rep)
    assert rs.storage("y", 1).shape == (12,)
    np.testing.assert_array_equal(rs.global_value("y"), rr.global_value("y"))
    x, b = rr.global_value("x"), rr.global_value("b")
    keep = nx.dropout_keep("y#0", 0, 0.25, 0, 48).reshape(2, 3, 8)
    expected = np.where(keep, (x + b) * F32(1 / 0.75), F32(0)) * F32(2)
    np.testing.assert_array_equal(rs.global_value("y"), expected)
    # CoCoNet's local indexing (b[i % H] with i the local index) would read the wrong
    # bias element on ranks whose chunk starts mid-row:
    chunk = x.reshape(-1)[12:24]
    wrong = chunk + b[np.arange(12) % 8]
    right = chunk + b[(12 + np.arange(12)) % 8]
    assert not np.array_equal(wrong, right)
    np.testing.assert_array_equal(
        (rs.storage("y", 1) != 0), nx.dropout_keep("y#0", 0, 0.25, 12, 12)
    )


def test_bias_on_dim_slices() -> None:
    text = BIAS.format(layout="sliced(2)").replace(
        "dim B = 2, S = 3, H = 8", "dim B = 2, S = 3, H = 8"
    )
    rs = run_reference(prog(text))
    rr = run_reference(prog(BIAS.format(layout="replicated")))
    np.testing.assert_array_equal(rs.global_value("y"), rr.global_value("y"))
    assert rs.storage("y", 3).shape == (2, 3, 2)


def test_lower_rank_sliced_operand_aligned_with_result() -> None:
    text = """program t
ranks 4
dim B = 2, S = 3, H = 8
input h : f32[B, S, H] sliced(2)
input c : f32[H] sliced
z = h + c
output z
"""
    res = run_reference(prog(text))
    np.testing.assert_array_equal(
        res.global_value("z"), res.global_value("h") + res.global_value("c")
    )


AR_VS_RS = """program t
ranks {g}
dim N = {n}
input g : {dt}[N] local
ar = allreduce({op}, g)
rs = reducescatter({op}, g)
ag = allgather(rs)
output ar, ag
"""


@pytest.mark.parametrize("dt", ["f16", "bf16", "f32", "i32"])
@pytest.mark.parametrize("op", ["+", "avg", "*", "max"])
@pytest.mark.parametrize("g", [2, 3, 8])
def test_allreduce_and_reducescatter_allgather_are_bit_identical(dt: str, op: str, g: int) -> None:
    res = run_reference(prog(AR_VS_RS.format(g=g, n=g * 40, dt=dt, op=op)))
    ar, ag = res.global_value("ar"), res.global_value("ag")
    assert ar.dtype == ag.dtype
    assert ar.tobytes() == ag.tobytes()


def test_replicated_values_agree_on_every_rank() -> None:
    res = run_reference(prog(AR_VS_RS.format(g=4, n=16, dt="f32", op="+")))
    for r in range(1, 4):
        assert res.storage("ar", r).tobytes() == res.storage("ar", 0).tobytes()


PIPE = """program p
ranks tp=2, pp=2
dim N = 8
input x : f32[N] local
input b : f32[N] replicated @stage 1
s = allreduce(+, x)
t = send(s)
u = t + b
v = send(x)
output u, v
"""


def test_pipeline_send_moves_storage_to_the_same_tp_rank_of_the_next_stage() -> None:
    p = prog(PIPE)
    res = run_reference(p)
    x = res.global_value("x")  # [T, N] on stage 0
    s = x[0] + x[1]
    np.testing.assert_array_equal(res.storage("s", 0), s)
    np.testing.assert_array_equal(res.storage("s", 1), s)
    for tp in range(2):  # world rank = pp·T + tp
        np.testing.assert_array_equal(res.storage("t", 2 + tp), s)
        np.testing.assert_array_equal(res.storage("v", 2 + tp), x[tp])
    np.testing.assert_array_equal(res.global_value("u"), s + res.global_value("b"))
    with pytest.raises(KeyError, match="pipeline stage 1"):
        res.storage("t", 0)
    with pytest.raises(KeyError, match="pipeline stage 0"):
        res.storage("x", 3)


def test_pipeline_sample_on_a_2x2_grid() -> None:
    p = load_file(
        "cocoviz/samples/pipeline_stage.coco",
        defines={"B": 2, "S": 4, "H": 8},
        ranks=RanksOverride.parse("tp=2,pp=2"),
    )
    res = run_reference(p)
    assert res.global_value("out").shape == (2, 4, 8)
    mlp = load_file(
        "cocoviz/samples/megatron_mlp.coco",
        defines={"B": 2, "S": 4, "H": 8},
        ranks=RanksOverride(n=2),
    )
    # Stage 0 of the pipeline computes the same allreduce as the MLP on 2 ranks, and the
    # same generator feeds both; only the dropout ids differ (out#0 in both).
    ref = run_reference(mlp)
    np.testing.assert_array_equal(res.global_value("sum"), ref.global_value("sum"))
    np.testing.assert_array_equal(res.global_value("out"), ref.global_value("out"))


GIVEN = """program t
ranks 2
dim N = 4
input a : f16[N] replicated
input g : f32[N] local
input s : bf16[N] sliced
ar = allreduce(+, g)
y = a + cast(f16, ar)
z = s * 2
output y, z
"""


def test_given_inputs_are_used() -> None:
    p = prog(GIVEN)
    a = np.arange(4, dtype=np.float16)
    g = np.arange(8, dtype=F32).reshape(2, 4)
    s = np.array([1.0, 2.0, 3.0, 1.00390625], dtype=F32)  # the last is between bf16 values
    res = run_reference(p, inputs={"a": a, "g": g, "s": s})
    np.testing.assert_array_equal(res.global_value("y"), a + (g[0] + g[1]).astype(np.float16))
    np.testing.assert_array_equal(res.global_value("z"), nx.round_bf16(s) * 2)
    np.testing.assert_array_equal(res.storage("g", 1), g[1])
    np.testing.assert_array_equal(res.storage("s", 1), nx.round_bf16(s[2:]))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"q": np.zeros(4)}, "has no input named 'q'"),
        (
            {"a": np.zeros(4, dtype=F32)},
            r"input 'a' is declared f16\[N\] replicated \(numpy float16\), but the given array has dtype float32",
        ),
        (
            {"a": np.zeros(5, dtype=np.float16)},
            r"expected an array of shape \[4\] \(its global shape\), got \[5\]",
        ),
        ({"g": np.zeros(4, dtype=F32)}, r"expected an array of shape \[2, 4\] \(\[G, \*shape\]"),
        ({"s": np.zeros(4, dtype=np.float16)}, r"bf16\[N\] sliced \(numpy float32\)"),
    ],
)
def test_given_inputs_are_validated(inputs: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        run_reference(prog(GIVEN), inputs=inputs)
    assert info.value.exit_code == ExitCode.INPUT


def test_unknown_input_suggests_a_name() -> None:
    with pytest.raises(InputError) as info:
        run_reference(prog(GIVEN), inputs={"gg": np.zeros((2, 4), F32)})
    assert info.value.hint == "did you mean 'g'?"


def test_memory_refusal_suggests_smaller_sizes() -> None:
    p = load_file(  # CoCoNet's configuration (samples.coconet_config): 16 ranks
        "cocoviz/samples/megatron_mlp.coco",
        defines={"B": 8, "S": 1024, "H": 3072},
        ranks=RanksOverride(n=16),
    )
    assert estimate_bytes(p) > 1 << 30
    with pytest.raises(UsageError) as info:
        run_reference(p, max_mem=1 << 30)
    err = info.value
    assert err.exit_code == ExitCode.USAGE
    assert "more than the limit of 1.0 GiB" in err.message
    assert err.hint is not None and "-D B=2" in err.hint and "--ranks" in err.hint


def test_memory_estimate_bounds_the_real_peak() -> None:
    p = load_file(
        "cocoviz/samples/megatron_mlp.coco",
        defines={"B": 2, "S": 64, "H": 256},
        ranks=RanksOverride(n=4),
    )
    tracemalloc.start()
    try:
        run_reference(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    est = estimate_bytes(p)
    assert peak <= est, (peak, est)
    assert peak >= est / 4, (peak, est)


def test_keep_frees_intermediates() -> None:
    text = "program t\nranks 2\ninput x : f32[8] replicated\na = x * 2\nb = a + 1\noutput b"
    res = run_reference(prog(text), keep=())
    np.testing.assert_array_equal(res.global_value("b"), res.initial_value("x") * 2 + 1)
    with pytest.raises(KeyError, match="no value named 'a'"):
        res.global_value("a")


def test_unknown_param_is_an_input_error() -> None:
    text = (
        "program t\nranks 2\nparam lr: f32 = 0.1\ninput x : f32[8] replicated\ny = x * lr\noutput y"
    )
    with pytest.raises(InputError, match="no param named 'lf'"):
        run_reference(prog(text), params={"lf": 1.0})


@pytest.mark.parametrize("layout", ["sliced", "sliced(1)", "sliced(2)"])
def test_two_dimensional_broadcast_operand(layout: str) -> None:
    # q[S, H] is read at the global (s, h) of every result element, whatever the slicing;
    # with 4 ranks the flat chunks (12 elements) start mid-row.
    text = f"""program t
ranks 4
dim B = 2, S = 4, H = 6
input x : f32[B, S, H] {layout}
input q : f32[S, H] replicated
input c : f32[S, 1] replicated
z = x * q - c
output z
"""
    if layout == "sliced(2)":
        text = text.replace("H = 6", "H = 8")
    res = run_reference(prog(text))
    x, q, c = (res.global_value(n) for n in "xqc")
    np.testing.assert_array_equal(res.global_value("z"), x * q - c)
