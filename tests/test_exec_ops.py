"""Every op of the reference against a direct numpy formula, on small programs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cocoviz import numerics as nx
from cocoviz.exec.reference import RunResult, run_reference
from cocoviz.ir.lower import load_program

F32 = np.float32


def run(text: str, seed: int = 0, **kw: Any) -> RunResult:
    return run_reference(load_program(text, "t.coco"), seed, **kw)


def program(body: str, inputs: str, ranks: int = 2, dims: str = "N = 8") -> str:
    return f"program t\nranks {ranks}\ndim {dims}\n{inputs}\n{body}\n"


XY32 = "input x : f32[N] replicated\ninput y : f32[N] replicated"

UNARY: list[tuple[str, Callable[[Any], Any]]] = [
    ("sqrt(x)", np.sqrt),
    ("rsqrt(x)", lambda x: F32(1) / np.sqrt(x)),
    ("exp(x)", np.exp),
    ("log(x)", np.log),
    ("tanh(x - 0.5)", lambda x: np.tanh(x - F32(0.5))),
    ("sigmoid(x - 0.5)", lambda x: F32(1) / (F32(1) + np.exp(-(x - F32(0.5))))),
    ("relu(x - 0.5)", lambda x: np.maximum(x - F32(0.5), F32(0))),
    (
        "gelu(x - 0.5)",
        lambda x: (
            F32(0.5)
            * (x - F32(0.5))
            * (
                F32(1)
                + np.tanh(
                    F32(math.sqrt(2 / math.pi))
                    * ((x - F32(0.5)) + F32(0.044715) * (x - F32(0.5)) ** 3)
                )
            )
        ),
    ),
    ("abs(x - 0.5)", lambda x: np.abs(x - F32(0.5))),
    ("-x", np.negative),
]


@pytest.mark.parametrize(("expr", "formula"), UNARY, ids=[e for e, _ in UNARY])
def test_unary_f32(expr: str, formula: Callable[[Any], Any]) -> None:
    res = run(program(f"z = {expr}\noutput z", XY32))
    x = res.global_value("x")
    np.testing.assert_allclose(res.global_value("z"), formula(x), rtol=2e-7, atol=1e-7)
    assert res.global_value("z").dtype == np.float32


BINARY: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("x + y", np.add),
    ("x - y", np.subtract),
    ("x * y", np.multiply),
    ("x / y", np.divide),
    ("max(x, y)", np.maximum),
    ("min(x, y)", np.minimum),
    ("pow(x, y)", np.power),
    ("x * y + x / y - 2", lambda x, y: x * y + x / y - F32(2)),
]


@pytest.mark.parametrize(("expr", "formula"), BINARY, ids=[e for e, _ in BINARY])
def test_binary_f32_exact(expr: str, formula: Callable[[Any, Any], Any]) -> None:
    res = run(program(f"z = {expr}\noutput z", XY32))
    x, y = res.global_value("x"), res.global_value("y")
    np.testing.assert_array_equal(res.global_value("z"), formula(x, y))


def test_f16_computes_in_f32_and_rounds_once() -> None:
    res = run(program("z = x * 0.1 + x * x\noutput z", "input x : f16[N] replicated"))
    x = res.global_value("x").astype(F32)
    tenth = F32(np.float16(0.1))  # the weak scalar takes the tensor's dtype first
    expected = (x * tenth + x * x).astype(np.float16)
    np.testing.assert_array_equal(res.global_value("z"), expected)


def test_bf16_rounds_to_nearest_even_on_top_bits() -> None:
    res = run(program("z = x * 3 + 0.001\noutput z", "input x : bf16[N] replicated"))
    x = res.global_value("x")
    assert np.array_equal(x, nx.round_bf16(x))
    expected = nx.round_bf16(x * F32(3) + nx.round_bf16(np.float32(0.001)))
    np.testing.assert_array_equal(res.global_value("z"), expected)


def test_weak_float_param_in_integer_expression_truncates() -> None:
    text = (
        "program t\nranks 2\nparam a: f32 = 2.7\ninput x : i32[8] replicated\nz = x * a\noutput z"
    )
    res = run(text)
    x = res.global_value("x").astype(np.int64)
    np.testing.assert_array_equal(res.global_value("z"), (x * 2).astype(np.int32))
    res = run(text, params={"a": -1.5})  # truncation toward zero: -1
    np.testing.assert_array_equal(res.global_value("z"), (-x).astype(np.int32))


def test_scalar_scalar_promotion() -> None:
    text = "program t\nranks 2\nparam a: f32 = 0.1\ninput x : f64[4] replicated\nz = x * (1 - a)\noutput z"
    res = run(text)
    x = res.global_value("x")
    # 1 - a is an f32 scalar (float beats int), then converted to f64 for x.
    np.testing.assert_array_equal(res.global_value("z"), x * np.float64(F32(1) - F32(0.1)))


def test_literals_convert_from_their_source_value() -> None:
    res = run(program("z = x * 0.1 + 0.3\noutput z", "input x : f64[N] replicated"))
    x = res.global_value("x")
    np.testing.assert_array_equal(res.global_value("z"), x * 0.1 + 0.3)


def test_integer_division_truncates_toward_zero() -> None:
    res = run(program("z = (x - 8) / 3\noutput z", "input x : i32[N] replicated", dims="N = 64"))
    x = res.global_value("x").astype(np.int64) - 8
    expected = np.trunc(x / 3).astype(np.int32)
    np.testing.assert_array_equal(res.global_value("z"), expected)
    assert (x < 0).any() and (x % 3 != 0).any()


@pytest.mark.parametrize(
    ("cmp", "fn"),
    [
        ("x > y", np.greater),
        ("x >= y", np.greater_equal),
        ("x < y", np.less),
        ("x <= y", np.less_equal),
        ("x == y", np.equal),
        ("x != y", np.not_equal),
    ],
)
def test_where_with_comparisons(cmp: str, fn: Callable[[Any, Any], Any]) -> None:
    res = run(program(f"z = where({cmp}, x, y * 2)\noutput z", XY32, dims="N = 256"))
    x, y = res.global_value("x"), res.global_value("y")
    np.testing.assert_array_equal(res.global_value("z"), np.where(fn(x, y), x, y * F32(2)))


def test_cast() -> None:
    text = program(
        "h = cast(f16, x * 3.3)\nk = cast(i32, x * 10 - 5)\noutput h, k",
        "input x : f32[N] replicated",
        dims="N = 64",
    )
    res = run(text)
    x = res.global_value("x")
    np.testing.assert_array_equal(res.global_value("h"), (x * F32(3.3)).astype(np.float16))
    np.testing.assert_array_equal(
        res.global_value("k"), np.trunc(x * F32(10) - F32(5)).astype(np.int32)
    )


def test_dropout_matches_the_shared_generator() -> None:
    res = run(program("z = dropout(x, 0.3)\noutput z", XY32, dims="N = 4096"), seed=7)
    x = res.global_value("x")
    keep = nx.dropout_keep("z#0", 7, 0.3, 0, 4096)
    expected = np.where(keep, x * F32(1 / 0.7), F32(0))
    np.testing.assert_array_equal(res.global_value("z"), expected)
    assert 0.6 < keep.mean() < 0.8


def test_dropout_ids_count_occurrences_in_a_stage() -> None:
    res = run(program("z = dropout(x, 0.5) + dropout(x, 0.5)\noutput z", XY32, dims="N = 512"))
    x = res.global_value("x")
    k0 = nx.dropout_keep("z#0", 0, 0.5, 0, 512)
    k1 = nx.dropout_keep("z#1", 0, 0.5, 0, 512)
    expected = np.where(k0, x * F32(2), 0) + np.where(k1, x * F32(2), 0)
    np.testing.assert_array_equal(res.global_value("z"), expected)


def test_dropout_of_local_value_uses_stacked_index() -> None:
    res = run(program("z = dropout(g, 0.5)\noutput z", "input g : f32[N] local", ranks=4))
    g = res.global_value("g")  # [4, 8]
    keep = nx.dropout_keep("z#0", 0, 0.5, 0, 32).reshape(4, 8)
    np.testing.assert_array_equal(res.global_value("z"), np.where(keep, g * F32(2), 0))


def _layernorm(x: Any, g: Any, b: Any, eps: float) -> Any:
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=-1, keepdims=True)
    return d / np.sqrt(var + F32(eps)) * g + b


ROWS = "input x : f32[R, H] replicated\ninput g : f32[H] replicated\ninput b : f32[H] replicated"


@pytest.mark.parametrize("layout", ["replicated", "sliced", "sliced(0)"])
def test_rowwise_ops(layout: str) -> None:
    inputs = ROWS.replace("f32[R, H] replicated", f"f32[R, H] {layout}")
    body = (
        "ln = layernorm(x, g, b)\nrms = rmsnorm(x, g, eps=1e-3)\nsm = softmax(x * 4)\n"
        "output ln, rms, sm"
    )
    res = run(program(body, inputs, ranks=4, dims="R = 8, H = 16"))
    x, g, b = (res.global_value(n) for n in "xgb")
    np.testing.assert_allclose(
        res.global_value("ln"), _layernorm(x, g, b, 1e-5), rtol=1e-5, atol=1e-6
    )
    rms = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + F32(1e-3)) * g
    np.testing.assert_allclose(res.global_value("rms"), rms, rtol=1e-6, atol=1e-7)
    e = np.exp(x * 4 - (x * 4).max(axis=-1, keepdims=True))
    np.testing.assert_allclose(res.global_value("sm"), e / e.sum(axis=-1, keepdims=True), rtol=1e-6)


def test_rowwise_on_slices_is_bit_identical_to_replicated() -> None:
    body = "ln = layernorm(x, g, b)\noutput ln"
    rep = run(program(body, ROWS, ranks=4, dims="R = 8, H = 16"))
    sl = run(
        program(
            body, ROWS.replace("[R, H] replicated", "[R, H] sliced"), ranks=4, dims="R = 8, H = 16"
        )
    )
    np.testing.assert_array_equal(rep.global_value("ln"), sl.global_value("ln"))


def test_reductions_replicated() -> None:
    res = run(
        program(
            "s = sum(x)\nn = norm(x)\na = amax(x - 0.5)\noutput s, n, a",
            "input x : f16[N] replicated",
            dims="N = 1000",
        )
    )
    x = res.global_value("x").astype(F32)
    assert res.global_value("s").dtype == np.float32  # f32 result for f16 input
    assert res.global_value("s") == np.sum(x, dtype=F32)
    assert res.global_value("n") == np.sqrt(np.sum(x * x, dtype=F32))
    assert res.global_value("a") == np.max(np.abs(x - F32(0.5)))


def test_reductions_of_sliced_combine_partials_in_rank_order() -> None:
    res = run(
        program(
            "s = sum(x)\nn = norm(x)\na = amax(x)\noutput s, n, a",
            "input x : f32[N] sliced",
            ranks=4,
            dims="N = 1000",
        )
    )
    x = res.global_value("x")
    parts = [np.sum(c, dtype=F32) for c in np.split(x, 4)]
    squares = [np.sum(c * c, dtype=F32) for c in np.split(x, 4)]
    acc, acc2 = parts[0], squares[0]
    for p, q in zip(parts[1:], squares[1:], strict=True):
        acc, acc2 = F32(acc + p), F32(acc2 + q)
    assert res.global_value("s") == acc
    assert res.global_value("n") == np.sqrt(acc2)  # sqrt once, of the combined squares
    assert res.global_value("a") == x.max()
    for r in range(4):  # the combined scalar is replicated on every rank
        assert res.storage("s", r) == acc


def test_reduction_of_local_is_per_rank() -> None:
    res = run(program("s = sum(g)\noutput s", "input g : f32[N] local", ranks=4))
    g = res.global_value("g")
    np.testing.assert_array_equal(res.global_value("s"), np.sum(g, axis=1, dtype=F32))
    assert res.global_value("s").shape == (4,)


def test_implicit_reduction_inside_an_expression() -> None:
    res = run(
        program("z = x / norm(x)\noutput z", "input x : f32[N] sliced", ranks=4, dims="N = 64")
    )
    x = res.global_value("x")
    z = res.global_value("z")
    np.testing.assert_allclose(z, x / np.sqrt(np.sum(x.astype(np.float64) ** 2)), rtol=1e-6)


MM = "dim M = 4, K = 8, N = 6"


@pytest.mark.parametrize(
    ("la", "lb", "result_layout"),
    [
        ("replicated", "replicated", "replicated"),
        ("sliced(1)", "sliced(0)", "local"),
        ("sliced(0)", "replicated", "sliced"),
        ("replicated", "sliced(1)", "sliced(1)"),
    ],
)
def test_matmul_layouts(la: str, lb: str, result_layout: str) -> None:
    text = f"program t\nranks 2\n{MM}\ninput a : f16[M, K] {la}\ninput b : f16[K, N] {lb}\nc = matmul(a, b)\noutput c"
    p = load_program(text)
    assert str(p.stage("c").ty.layout) == result_layout
    res = run_reference(p)
    a = res.global_value("a").astype(F32)
    b = res.global_value("b").astype(F32)
    c = res.global_value("c")
    if result_layout == "local":
        parts = [
            (a[:, r * 4 : (r + 1) * 4] @ b[r * 4 : (r + 1) * 4]).astype(np.float16)
            for r in range(2)
        ]
        np.testing.assert_array_equal(c, np.stack(parts))
    else:
        np.testing.assert_array_equal(c, (a @ b).astype(np.float16))


def test_matmul_batched_flat_rows() -> None:
    text = "program t\nranks 4\ndim B = 2, S = 6, K = 8, N = 3\ninput x : f32[B, S, K] sliced\ninput w : f32[K, N] replicated\nc = matmul(x, w)\noutput c"
    res = run(text)
    x, w = res.global_value("x"), res.global_value("w")
    np.testing.assert_allclose(res.global_value("c"), x @ w, rtol=1e-6)
    assert res.storage("c", 1).size == 2 * 6 * 3 // 4


def test_update() -> None:
    text = program(
        "w1 = update(w, w - 0.5 * g)\noutput w1",
        "input w : f32[N] replicated\ninput g : f32[N] replicated",
    )
    res = run(text)
    w0, g = res.initial_value("w"), res.global_value("g")
    expected = w0 - F32(0.5) * g
    np.testing.assert_array_equal(res.global_value("w1"), expected)
    np.testing.assert_array_equal(res.global_value("w"), expected)  # the updated input
    assert not np.array_equal(res.initial_value("w"), expected)


def _ordered(parts: list[Any], fn: Callable[[Any, Any], Any]) -> Any:
    acc = parts[0].astype(F32)
    for p in parts[1:]:
        acc = fn(acc, p.astype(F32))
    return acc


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("+", np.add),
        ("*", np.multiply),
        ("max", np.maximum),
        ("min", np.minimum),
        ("avg", np.add),
    ],
)
def test_allreduce_ops(op: str, fn: Callable[[Any, Any], Any]) -> None:
    res = run(
        program(
            f"s = allreduce({op}, g)\noutput s", "input g : f16[N] local", ranks=4, dims="N = 64"
        )
    )
    g = res.global_value("g")
    acc = _ordered(list(g), fn)
    if op == "avg":
        acc = acc / F32(4)
    np.testing.assert_array_equal(res.global_value("s"), acc.astype(np.float16))


def test_allreduce_avg_of_integers_truncates() -> None:
    res = run(
        program(
            "s = allreduce(avg, g - 8)\noutput s", "input g : i32[N] local", ranks=3, dims="N = 64"
        )
    )
    g = res.global_value("g").astype(np.int64) - 8
    np.testing.assert_array_equal(
        res.global_value("s"), np.trunc(g.sum(axis=0) / 3).astype(np.int32)
    )


def test_reducescatter_allgather_broadcast_reduce() -> None:
    body = (
        "rs = reducescatter(max, g)\nag = allgather(rs)\nbc = broadcast(g, root=2)\n"
        "rd = reduce(+, g, root=1)\noutput ag, bc, rd"
    )
    res = run(program(body, "input g : f32[N] local", ranks=4, dims="N = 12"))
    g = res.global_value("g")
    np.testing.assert_array_equal(res.global_value("rs"), g.max(axis=0))
    np.testing.assert_array_equal(res.storage("rs", 2), g.max(axis=0)[6:9])
    np.testing.assert_array_equal(res.global_value("ag"), g.max(axis=0))
    np.testing.assert_array_equal(res.global_value("bc"), g[2])
    rd = res.global_value("rd")
    assert rd.shape == (4, 12)
    np.testing.assert_array_equal(rd[1], _ordered(list(g), np.add))
    assert not rd[[0, 2, 3]].any()
