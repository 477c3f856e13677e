"""Type, shape and layout inference: one test per rule of DESIGN §2.3–2.4 (dtypes, shapes,
elementwise layouts, row-wise ops, reductions, matmul, collectives, update, pipeline
grids, divisibility), each with its errors."""

from __future__ import annotations

import pytest

from cocoviz.errors import InputError
from cocoviz.ir.graph import implicit_reductions
from cocoviz.ir.infer import infer_program
from cocoviz.ir.lower import RanksOverride, load_program
from cocoviz.ir.nodes import Op, Program
from cocoviz.ir.printer import format_stage
from cocoviz.ir.types import DType, TensorType

HEAD = "ranks 4\ndim B = 8, S = 16, H = 32, F = 64\nparam lr: f32 = 0.1, d: f64 = 2, k: i32 = 3\n"


def prog(body: str, head: str = HEAD, **kw: object) -> Program:
    return load_program(head + body, "t.coco", **kw)  # type: ignore[arg-type]


def ty(p: Program, name: str) -> str:
    """`dtype[shape] layout` of a stage, numeric shape, plus `@k` on pipeline grids."""
    t: TensorType = p.type_of(name)
    shape = ", ".join(str(s.value) for s in t.shape)
    at = f" @{t.pstage}" if p.grid.is_grid else ""
    return f"{t.dtype.value}[{shape}] {t.layout}{at}"


def error(body: str, head: str = HEAD, **kw: object) -> InputError:
    with pytest.raises(InputError) as info:
        prog(body, head, **kw)
    return info.value


def message(body: str, head: str = HEAD, **kw: object) -> str:
    return error(body, head, **kw).message


# --- dtypes (§2.3) -------------------------------------------------------------------------
def test_literals_take_the_tensor_dtype() -> None:
    p = prog("input x : f16[H] replicated\ny = x * 2 + 0.5\nz = 2 * 3\nw = 2 * 0.5\n")
    assert ty(p, "y") == "f16[32] replicated"
    assert ty(p, "z") == "i32[] replicated"  # two integer literals
    assert ty(p, "w") == "f32[] replicated"  # float beats int


def test_params_are_weak_against_tensors() -> None:
    p = prog("input x : bf16[H] replicated\ny = x * lr - d\n")
    assert ty(p, "y") == "bf16[32] replicated"


def test_scalar_stages_are_weak_too() -> None:
    p = prog("input x : f16[H] replicated\nn = norm(x)\ny = x / n\n")
    assert ty(p, "n") == "f32[] replicated"
    assert ty(p, "y") == "f16[32] replicated"


def test_two_scalars_promote() -> None:
    p = prog(
        "input h : f16[] replicated\ninput b : bf16[] replicated\n"
        "a = lr * d\nc = k * lr\ne = h * b\nf = k * 2\ng = h * h\n"
    )
    assert ty(p, "a") == "f64[] replicated"  # f64 beats f32
    assert ty(p, "c") == "f32[] replicated"  # float beats int
    assert ty(p, "e") == "f32[] replicated"  # f16 with bf16 gives f32
    assert ty(p, "f") == "i32[] replicated"
    assert ty(p, "g") == "f16[] replicated"


def test_tensors_of_different_dtypes_need_an_explicit_cast() -> None:
    err = error("input a : f16[H] replicated\ninput b : f32[H] replicated\ny = a + b\n")
    assert err.message == (
        "operands have different dtypes: 'a' is f16, 'b' is f32; mixing dtypes needs an "
        "explicit cast"
    )
    assert err.hint == "convert one of them, e.g. cast(f16, b)"
    assert (err.span.line, err.span.col) == (6, 9)  # under 'b'


def test_cast_converts() -> None:
    p = prog("input a : f16[H] replicated\ninput b : f32[H] replicated\ny = cast(f32, a) + b\n")
    assert ty(p, "y") == "f32[32] replicated"


def test_cast_needs_a_dtype() -> None:
    assert message("input a : f16[H] replicated\ny = cast(a, f32)\n") == (
        "cast: the first argument must be a dtype (f16 bf16 f32 f64 i32 i64)"
    )


def test_a_fractional_literal_against_an_integer_tensor_is_an_error() -> None:
    p = prog("input c : i32[H] replicated\ny = c * 2 + 3.0\nz = c / 2\n")
    assert ty(p, "y") == "i32[32] replicated"
    assert ty(p, "z") == "i32[32] replicated"  # integer division truncates
    assert message("input c : i32[H] replicated\ny = c * 0.5\n") == (
        "the literal 0.5 would be converted to i32 (the dtype of 'c') and lose its fraction"
    )


def test_float_functions_need_a_float_operand() -> None:
    err = error("input c : i64[H] replicated\ny = exp(c)\n")
    assert err.message == "exp needs a floating-point operand, got i64"
    assert err.hint == "cast it first, e.g. exp(cast(f32, c))"
    assert message("input c : i32[H] replicated\ny = dropout(c, 0.1)\n") == (
        "dropout needs a floating-point operand, got i32"
    )


def test_where_with_scalar_branches_takes_the_compared_dtype() -> None:
    p = prog("input x : f16[B, H] replicated\ny = where(x > 0, 1, 0)\nz = where(x < 1, x, 0)\n")
    assert ty(p, "y") == "f16[8, 32] replicated"
    assert ty(p, "z") == "f16[8, 32] replicated"


def test_comparisons_only_inside_where() -> None:
    err = error("input x : f16[H] replicated\ny = max(x > 0, x)\n")
    assert err.message == ("a comparison ('>') is only allowed as the first argument of where()")
    assert message("input x : f16[H] replicated\ny = where(x, x, 0)\n") == (
        "where: the first argument must be a comparison such as x > 0"
    )


def test_dropout_probability_is_a_literal_in_range() -> None:
    assert message("input x : f16[H] replicated\ny = dropout(x, 1)\n") == (
        "dropout: p must be in [0, 1), got 1"
    )
    assert message("input x : f16[H] replicated\ny = dropout(x, lr)\n") == (
        "dropout: the probability p must be a number literal"
    )
    assert ty(prog("input x : f16[H] replicated\ny = dropout(x, 0)\n"), "y") == (
        "f16[32] replicated"
    )


# --- shapes ----------------------------------------------------------------------------------
def test_trailing_dimension_broadcasting() -> None:
    p = prog(
        "input x : f16[B, S, H] replicated\ninput b : f16[H] replicated\n"
        "input c : f16[B, 1, H] replicated\ninput e : f16[S, 1] replicated\n"
        "y = x + b\nz = c + e\n"
    )
    assert ty(p, "y") == "f16[8, 16, 32] replicated"
    assert ty(p, "z") == "f16[8, 16, 32] replicated"
    assert [s.text for s in p.type_of("y").shape] == ["B", "S", "H"]


def test_shapes_that_do_not_broadcast() -> None:
    err = error("input x : f16[B, H] replicated\ninput b : f16[B] replicated\ny = x + b\n")
    assert err.message == ("shapes do not broadcast: [B, H], [B] (dimension -1: H = 32 vs B = 8)")


def test_sizes_compare_by_value_after_defines() -> None:
    body = "input x : f16[H] replicated\ninput y : f16[F] replicated\nz = x + y\n"
    assert "do not broadcast" in message(body)
    assert ty(prog(body, defines={"F": 32}), "z") == "f16[32] replicated"


def test_products_of_dimensions() -> None:
    p = prog("input w : f16[4*H, 2*B] replicated\ny = w * 2\n")
    assert ty(p, "y") == "f16[128, 16] replicated"
    assert [s.text for s in p.type_of("y").shape] == ["4*H", "2*B"]


# --- elementwise layouts (§2.4) --------------------------------------------------------------
def test_replicated_and_scalars_adopt_the_other_layout() -> None:
    p = prog(
        "input s : f16[B, H] sliced\ninput l : f16[B, H] local\ninput r : f16[B, H] replicated\n"
        "a = s + r * lr\nb = l + r\nc = r + 1\n"
    )
    assert ty(p, "a") == "f16[8, 32] sliced"
    assert ty(p, "b") == "f16[8, 32] local"
    assert ty(p, "c") == "f16[8, 32] replicated"
    # the replicated operand of a sliced value is made explicit as slice(r)
    assert format_stage(p.stage("a")) == "a = s + slice(r) * lr"


def test_local_with_local_is_local() -> None:
    p = prog("input a : f32[H] local\ninput b : f32[H] local\ny = a * b\n")
    assert ty(p, "y") == "f32[32] local"


def test_same_slicing_is_sliced() -> None:
    p = prog(
        "input a : f16[B, H] sliced(1)\ninput b : f16[B, H] sliced(-1)\n"
        "input c : f16[B, H] sliced\ninput e : f16[B, H] sliced(0)\ny = a + b\nz = c + e\n"
    )
    assert ty(p, "y") == "f16[8, 32] sliced(1)"
    assert ty(p, "z") == "f16[8, 32] sliced"  # sliced(0) ≡ sliced


def test_differently_sliced_operands_are_an_error() -> None:
    err = error("input a : f16[B, H] sliced(1)\ninput b : f16[B, H] sliced\ny = a + b\n")
    assert err.message == (
        "sliced operands are sliced differently: 'a' is sliced(1), 'b' is sliced"
    )
    assert err.hint == "both operands must hold the same global elements on every rank"


def test_sliced_with_local_is_an_error() -> None:
    err = error("input a : f16[H] sliced\ninput b : f16[H] local\ny = a + b\n")
    assert err.message == "cannot combine sliced 'a' with local 'b'"
    assert err.hint is not None and "reduce it first" in err.hint


def test_broadcast_operand_with_flat_sliced_value_stays_whole() -> None:
    p = prog("input x : f16[B, S, H] sliced\ninput b : f16[H] replicated\ny = x + b\n")
    assert ty(p, "y") == "f16[8, 16, 32] sliced"
    assert format_stage(p.stage("y")) == "y = x + b"  # b is not sliced: global indexing


def test_lower_rank_sliced_operand_aligned_with_the_result() -> None:
    p = prog("input x : f16[B, H] sliced(1)\ninput b : f16[H] sliced\ny = x + b\n")
    assert ty(p, "y") == "f16[8, 32] sliced(1)"


def test_lower_rank_sliced_operand_with_replicated_full_shape() -> None:
    p = prog("input x : f16[B, H] replicated\ninput b : f16[H] sliced\ny = x + b\n")
    assert ty(p, "y") == "f16[8, 32] sliced(1)"
    assert format_stage(p.stage("y")) == "y = slice(x, 1) + b"


def test_lower_rank_sliced_operand_misaligned() -> None:
    err = error("input x : f16[B, H] sliced(0)\ninput b : f16[H] sliced\ny = x + b\n")
    assert err.message == (
        "'b' is sliced along H (dimension 0 of [H]), but 'x' is sliced along B (dimension 0 "
        "of [B, H]): a sliced broadcast operand must be sliced along the result's sliced "
        "dimension"
    )


def test_lower_rank_sliced_operand_with_local() -> None:
    assert message("input x : f16[B, H] local\ninput b : f16[H] sliced\ny = x + b\n") == (
        "cannot combine sliced 'b' with local 'x'"
    )


def test_slice_of_replicated_values() -> None:
    p = prog("input r : f16[B, H] replicated\na = slice(r)\nb = slice(r, -1)\nc = slice(r, 0)\n")
    assert ty(p, "a") == "f16[8, 32] sliced"
    assert ty(p, "b") == "f16[8, 32] sliced(1)"
    assert ty(p, "c") == "f16[8, 32] sliced"
    assert message("input s : f16[H] sliced\ny = slice(s)\n") == (
        "slice() takes a replicated value; 's' is sliced"
    )
    assert message("input r : f16[H] replicated\ny = slice(r, 1)\n") == (
        "slice dimension 1 is out of range for [H]"
    )


# --- row-wise ops ---------------------------------------------------------------------------
ROW = "input g : f16[H] replicated\ninput b : f16[H] replicated\n"


def test_rowwise_on_replicated_and_local() -> None:
    p = prog(
        ROW + "input r : f16[B, H] replicated\ninput l : f16[B, H] local\n"
        "a = layernorm(r, g, b)\nc = rmsnorm(l, g)\ne = softmax(l)\n"
    )
    assert ty(p, "a") == "f16[8, 32] replicated"
    assert ty(p, "c") == "f16[8, 32] local"
    assert ty(p, "e") == "f16[8, 32] local"


def test_rowwise_on_flat_sliced_whole_rows() -> None:
    # 8*32 / 4 = 64 elements a rank: two whole rows of 32
    p = prog(ROW + "input x : f16[B, H] sliced\ny = layernorm(x, g, b)\n")
    assert ty(p, "y") == "f16[8, 32] sliced"


def test_rowwise_on_flat_sliced_splitting_rows() -> None:
    err = error(
        ROW + "input x : f16[B, H] sliced\ny = softmax(x)\n", "ranks 16\ndim B = 2, H = 32\n"
    )
    assert err.message == (
        "softmax works on whole rows, but each rank's chunk of 'x' (64 / 16 = 4 elements) "
        "splits rows of length H = 32"
    )


def test_rowwise_on_sliced_dimension() -> None:
    p = prog(ROW + "input x : f16[B, S, H] sliced(1)\ny = layernorm(x, g, b)\n")
    assert ty(p, "y") == "f16[8, 16, 32] sliced(1)"
    err = error(ROW + "input x : f16[B, H] sliced(1)\ny = layernorm(x, g, b)\n")
    assert err.message == (
        "layernorm works on whole rows of the last dimension, but 'x' is sliced along it "
        "(sliced(1))"
    )


def test_rowwise_parameters() -> None:
    assert message(ROW + "input x : f16[B, S] replicated\ny = layernorm(x, g, b)\n") == (
        "layernorm: 'g' must have shape [S] (the last dimension of 'x'), got [H]"
    )
    assert (
        message("input g : f32[H] replicated\ninput x : f16[B, H] replicated\ny = rmsnorm(x, g)\n")
        == "rmsnorm: 'g' is f32 but 'x' is f16"
    )
    assert (
        message("input g : f16[H] sliced\ninput x : f16[B, H] replicated\ny = rmsnorm(x, g)\n")
        == "rmsnorm: 'g' must be replicated, got sliced"
    )
    assert message("input x : f16[] replicated\ny = softmax(x)\n") == (
        "softmax needs a tensor of rank ≥ 1, got a scalar"
    )
    assert message(ROW + "input x : f16[B, H] replicated\ny = layernorm(x, g)\n") == (
        "layernorm takes 3 arguments (layernorm(x, gamma, beta, eps=1e-5)), got 2"
    )


# --- reductions ----------------------------------------------------------------------------
def test_reduction_of_sliced_is_a_replicated_scalar_via_an_implicit_reduction() -> None:
    p = prog("input x : f16[B, H] sliced\nn = norm(x)\nm = amax(x) + sum(x)\n")
    assert ty(p, "n") == "f32[] replicated"
    assert ty(p, "m") == "f32[] replicated"
    assert [(s, e.op) for s, e in implicit_reductions(p)] == [
        ("n", Op.NORM),
        ("m", Op.AMAX),
        ("m", Op.SUM),
    ]


def test_reduction_of_local_is_a_local_scalar() -> None:
    p = prog("input g : f64[H] local\nn = sum(g)\n")
    assert ty(p, "n") == "f64[] local"
    assert implicit_reductions(p) == []


def test_reduction_dtypes() -> None:
    p = prog("input a : bf16[H] replicated\ninput i : i32[H] replicated\nx = sum(a)\ny = sum(i)\n")
    assert ty(p, "x") == "f32[] replicated"
    assert ty(p, "y") == "i32[] replicated"


# --- matmul --------------------------------------------------------------------------------
MM = "input x : f16[B, S, H] {xl}\ninput w : f16[H, F] {wl}\ny = matmul(x, w)\n"


@pytest.mark.parametrize(
    ("xl", "wl", "result"),
    [
        ("replicated", "replicated", "f16[8, 16, 64] replicated"),
        ("sliced(2)", "sliced(0)", "f16[8, 16, 64] local"),  # sliced on K: partial sums
        ("sliced(0)", "replicated", "f16[8, 16, 64] sliced"),  # rows
        ("sliced(1)", "replicated", "f16[8, 16, 64] sliced(1)"),
        ("sliced", "replicated", "f16[8, 16, 64] sliced"),  # flat: whole rows of K
        ("replicated", "sliced(1)", "f16[8, 16, 64] sliced(2)"),  # columns → sliced(-1)
        ("local", "replicated", "f16[8, 16, 64] local"),
        ("local", "local", "f16[8, 16, 64] local"),
    ],
)
def test_matmul_layouts(xl: str, wl: str, result: str) -> None:
    assert ty(prog(MM.format(xl=xl, wl=wl)), "y") == result


@pytest.mark.parametrize(
    ("xl", "wl", "says"),
    [
        ("sliced(2)", "replicated", "declare 'w' sliced(0)"),
        ("sliced(2)", "sliced(1)", "declare 'w' sliced(0)"),
        ("sliced(0)", "sliced(1)", "make 'w' replicated"),
        ("local", "sliced(1)", "make 'w' replicated"),
        ("replicated", "local", "reduce 'w' first"),
        ("replicated", "sliced(0)", "slice 'x' on its last dimension"),
        ("sliced(1)", "local", "make 'w' replicated"),
    ],
)
def test_matmul_layout_errors_say_which_operand_to_change(xl: str, wl: str, says: str) -> None:
    err = error(MM.format(xl=xl, wl=wl))
    assert err.message.startswith(f"matmul: 'x' is {xl.replace('sliced(0)', 'sliced')} and 'w' is")
    assert err.hint is not None and says in err.hint, err.hint


def test_matmul_layout_error_exact() -> None:
    err = error(MM.format(xl="sliced(2)", wl="replicated"))
    assert err.message == (
        "matmul: 'x' is sliced(2) and 'w' is replicated, but a left operand sliced on the "
        "contraction dimension K needs a right operand sliced on K too"
    )
    assert err.hint == (
        "declare 'w' sliced(0) to get local partial sums (then allreduce them), or make 'x' "
        "replicated"
    )


def test_matmul_flat_sliced_left_operand_must_hold_whole_rows() -> None:
    err = error(
        "input x : f16[B, H] sliced\ninput w : f16[H, H] replicated\ny = matmul(x, w)\n",
        "ranks 16\ndim B = 2, H = 32\n",
    )
    assert err.message == (
        "matmul: 'x' is flat-sliced but each rank's chunk (4 elements) is not whole rows of "
        "length K = 32"
    )


def test_matmul_contraction_shows_symbolic_and_numeric_sizes() -> None:
    err = error(
        "input x : f16[B, H] replicated\ninput w : f16[F, H] replicated\ny = matmul(x, w)\n"
    )
    assert err.message == (
        "matmul: contraction sizes differ: 'x'[B, H] has K = H = 32, 'w'[F, H] has K = F = 64"
    )


def test_matmul_contraction_is_compared_after_defines() -> None:
    body = "input x : f16[B, H] replicated\ninput w : f16[F, H] replicated\ny = matmul(x, w)\n"
    assert ty(prog(body, defines={"F": 32}), "y") == "f16[8, 32] replicated"


def test_matmul_shape_errors_come_before_layout_errors() -> None:
    # illegal layouts (sliced on K × replicated) and a wrong K: the shape error wins
    err = error("input x : f16[B, H] sliced(1)\ninput w : f16[F, H] replicated\ny = matmul(x, w)\n")
    assert err.message.startswith("matmul: contraction sizes differ")


def test_matmul_ranks_and_dtypes() -> None:
    assert message(
        "input x : f16[H] replicated\ninput w : f16[H, H] replicated\ny = matmul(x, w)\n"
    ) == ("matmul: the left operand 'x' must have rank ≥ 2, got [H]")
    assert message(
        "input x : f16[B, H] replicated\ninput w : f16[H] replicated\ny = matmul(x, w)\n"
    ) == ("matmul: the right operand 'w' must have rank ≥ 2, got [H]")
    err = error(
        "input x : f16[B, H] replicated\ninput w : f32[H, H] replicated\ny = matmul(x, w)\n"
    )
    assert err.message == (
        "matmul: operands have different dtypes: 'x' is f16, 'w' is f32; mixing dtypes "
        "needs an explicit cast"
    )
    assert (
        message(
            "input x : i32[B, H] replicated\ninput w : i32[H, H] replicated\ny = matmul(x, w)\n"
        )
        == "matmul needs floating-point operands"
    )


# --- whole right-hand side -------------------------------------------------------------------
@pytest.mark.parametrize(
    "call",
    ["allreduce(+, x)", "reducescatter(+, x)", "matmul(x, x)", "broadcast(x)", "update(x, x)"],
)
def test_communication_and_matmul_are_the_whole_right_hand_side(call: str) -> None:
    err = error(f"input x : f16[H, H] local\ny = 2 * {call}\n")
    fname = call.split("(")[0]
    assert err.message == f"{fname}(...) must be the whole right-hand side of a named stage"
    assert err.hint == (
        "name it first, so that a schedule can refer to it:\n"
        f"    y_{fname} = {call}\n"
        f"    y = 2 * y_{fname}"
    )


# --- collectives ----------------------------------------------------------------------------
COLL = "input l : f16[B, H] local\ninput r : f16[B, H] replicated\ninput s : f16[B, H] sliced(1)\n"


def test_collective_layouts() -> None:
    p = prog(
        COLL + "a = allreduce(+, l)\nb = allreduce(max, r)\nc = reducescatter(avg, l)\n"
        "e = reducescatter(+, r)\nf = allgather(s)\ng = allgather(c)\nh = broadcast(l, root=3)\n"
        "i = reduce(min, r, root=1)\n"
    )
    assert ty(p, "a") == "f16[8, 32] replicated"
    assert ty(p, "b") == "f16[8, 32] replicated"
    assert ty(p, "c") == "f16[8, 32] sliced"
    assert ty(p, "e") == "f16[8, 32] sliced"
    assert ty(p, "f") == "f16[8, 32] replicated"  # sliced(d) gathered too
    assert ty(p, "g") == "f16[8, 32] replicated"
    assert ty(p, "h") == "f16[8, 32] replicated"
    assert ty(p, "i") == "f16[8, 32] local"  # result on the root, zeros elsewhere


@pytest.mark.parametrize(
    ("stage", "text"),
    [
        ("allreduce(+, s)", "allreduce needs a local or replicated operand; 's' is sliced(1)"),
        (
            "reducescatter(+, s)",
            "reducescatter needs a local or replicated operand; 's' is sliced(1)",
        ),
        ("allgather(r)", "allgather needs a sliced operand; 'r' is replicated"),
        ("allgather(l)", "allgather needs a sliced operand; 'l' is local"),
        ("broadcast(s)", "broadcast needs a local or replicated operand; 's' is sliced"),
        ("reduce(+, s)", "reduce needs a local or replicated operand; 's' is sliced"),
        ("broadcast(r, root=4)", "broadcast: root 4 is not a rank of the group (0…3)"),
        ("allreduce(-, l)", "syntax error: unexpected ','"),
        (
            "allreduce(sum, l)",
            "allreduce: the first argument must be a reduction operator (+ * max min avg)",
        ),
        ("allreduce(l)", "allreduce takes 2 arguments (allreduce(OP, x)), got 1"),
    ],
)
def test_collective_errors(stage: str, text: str) -> None:
    assert message(COLL + f"y = {stage}\n").startswith(text)


def test_reducescatter_needs_divisible_numel() -> None:
    assert message("input l : f16[3, 5] local\ny = reducescatter(+, l)\n") == (
        "reducescatter of 'l' is sliced over 4 ranks but its 15 elements ([3, 5]) do not "
        "divide by 4"
    )


# --- update ---------------------------------------------------------------------------------
UPD = "input w : f32[H] {tl}\ninput e : f32[H] {el}\n"


@pytest.mark.parametrize(
    ("tl", "el", "result"),
    [
        ("replicated", "replicated", "f32[32] replicated"),
        ("sliced", "sliced", "f32[32] sliced"),
        ("local", "local", "f32[32] local"),
    ],
)
def test_update_layouts(tl: str, el: str, result: str) -> None:
    p = prog(UPD.format(tl=tl, el=el) + "u = update(w, w - e)\n")
    assert ty(p, "u") == result
    assert p.updates() == {"w": "u"}


def test_update_of_replicated_with_sliced_needs_an_allgather() -> None:
    body = UPD.format(tl="replicated", el="sliced") + "u = update(w, slice(w) - e)\n"
    p = prog(body + "full = allgather(u)\n")
    assert ty(p, "u") == "f32[32] sliced"
    err = error(body)
    assert err.message == (
        "update of replicated 'w' with a sliced value must be followed by an allgather of 'u'"
    )
    assert err.hint == "add `u_full = allgather(u)`, or declare 'w' sliced"


@pytest.mark.parametrize(
    ("tl", "el"),
    [
        ("replicated", "local"),
        ("sliced", "local"),
        ("local", "replicated"),
        ("sliced", "replicated"),
    ],
)
def test_update_layout_errors(tl: str, el: str) -> None:
    err = error(UPD.format(tl=tl, el=el) + "u = update(w, e)\n")
    assert err.message == f"update: cannot write a {el} value into {tl} input 'w'"
    assert err.hint


def test_update_target_must_be_an_input() -> None:
    assert message("input w : f32[H] replicated\nv = w * 2\nu = update(v, w)\n") == (
        "update: the first operand must be a program input, got 'v'"
    )


def test_update_value_has_the_shape_and_dtype_of_the_input() -> None:
    assert message("input w : f32[H] replicated\nu = update(w, 1.0)\n") == (
        "update: the new value of 'w' must be f32[H] like 'w' (no broadcasting or "
        "conversion), got f32[]"
    )
    assert message(
        "input w : f32[H] replicated\ninput h : f16[H] replicated\nu = update(w, h)\n"
    ).endswith("got f16[H]")


def test_an_input_is_updated_at_most_once() -> None:
    err = error("input w : f32[H] replicated\nu = update(w, w * 2)\nv = update(w, u * 2)\n")
    assert err.message == "input 'w' is updated twice (also by 'u')"
    assert err.hint == "an input is the target of at most one update"
    (note,) = err.diagnostics[0].notes
    assert note[0] == "first update 'u' is here"


def test_reads_of_an_updated_input_come_before_its_update() -> None:
    ok = prog("input w : f32[H] replicated\nn = norm(w)\nu = update(w, w / n)\n")
    assert ty(ok, "u") == "f32[32] replicated"
    # a read written after the update still reads the old value: it is ordered first
    later = prog("input w : f32[H] replicated\nu = update(w, w * 2)\nv = w * 3\n")
    assert [s.name for s in later.stages] == ["v", "u"]
    err = error("input w : f32[H] replicated\nu = update(w, w * 2)\nv = w + u\n")
    assert err.message == "'v' reads the old value of 'w' but also depends on its update 'u'"


# --- pipeline grids -------------------------------------------------------------------------
GRID = "ranks tp=4, pp=3\ndim H = 32\nparam lr: f32 = 0.1\n"


def test_stages_live_on_their_operands_pipeline_stage() -> None:
    p = prog(
        "input x : f16[H] replicated\ninput r : f16[H] replicated @stage 1\n"
        "a = x * lr\nb = send(a)\nc = b + r\nd = send(c)\ne = d * 2\n",
        GRID,
    )
    assert ty(p, "a") == "f16[32] replicated @0"  # params are on every stage
    assert ty(p, "b") == "f16[32] replicated @1"
    assert ty(p, "c") == "f16[32] replicated @1"
    assert ty(p, "e") == "f16[32] replicated @2"


def test_send_keeps_the_layout() -> None:
    p = prog("input s : f16[H] sliced\ny = send(s)\n", GRID)
    assert ty(p, "y") == "f16[32] sliced @1"


def test_operands_on_different_pipeline_stages() -> None:
    err = error(
        "input x : f16[H] replicated\ninput r : f16[H] replicated @stage 2\ny = x + r\n", GRID
    )
    assert err.message == (
        "operands live on different pipeline stages: 'x' is on stage 0, 'r' on stage 2"
    )
    assert err.hint == (
        "send it first: `x_next = send(x)` moves it from stage 0 to stage 1 "
        "(2 sends to reach stage 2)"
    )


def test_send_on_the_last_stage_or_without_a_grid() -> None:
    assert message("input x : f16[H] replicated @stage 2\ny = send(x)\n", GRID) == (
        "send of 'x' on the last pipeline stage (2): there is no next stage"
    )
    assert message("input x : f16[H] replicated\ny = send(x)\n") == (
        "send moves a value to the next pipeline stage, but this program has no pipeline stages"
    )


def test_stage_annotations() -> None:
    assert message("input x : f16[H] replicated @stage 1\n") == "'@stage' needs a pipeline grid"
    assert message("input x : f16[H] replicated @stage 3\n", GRID) == (
        "pipeline stage 3 does not exist (pp = 3)"
    )
    assert message("input x : f16[H] replicated @stag 1\n", GRID) == (
        "expected '@stage K', got '@stag'"
    )


def test_collectives_run_within_the_tensor_parallel_group() -> None:
    # G is tp = 4 on a 4x3 grid: 32 divides by 4 (but not by the world, 12)
    p = prog("input l : f16[H] local\ny = reducescatter(+, l)\n", GRID)
    assert ty(p, "y") == "f16[32] sliced @0"


# --- divisibility and layout declarations ---------------------------------------------------
def test_sliced_extent_must_divide_by_the_group() -> None:
    err = error("input x : f16[B, S, H] sliced(1)\n", "ranks 3\ndim B = 8, S = 16, H = 32\n")
    assert err.message == (
        "input 'x' is sliced along dimension 1 (S = 16), which does not divide by 3 ranks"
    )
    assert (err.span.col, err.span.end_col) == (24, 33)  # under sliced(1)


def test_flat_sliced_numel_must_divide_by_the_group() -> None:
    assert message("input x : f16[5, 3] sliced\n") == (
        "input 'x' is sliced over 4 ranks but its 15 elements ([5, 3]) do not divide by 4"
    )


def test_divisibility_after_defines_and_ranks_overrides() -> None:
    body = "input x : f16[B, H] sliced(1)\n"
    assert ty(prog(body), "x") == "f16[8, 32] sliced(1)"
    assert "does not divide by 4" in message(body, defines={"H": 30})
    assert "does not divide by 5" in message(body, ranks=RanksOverride(n=5))


def test_sliced_dimension_out_of_range() -> None:
    err = error("input x : f16[B, H] sliced(-3)\n")
    assert err.message == "sliced(-3) is out of range for 'x' of rank 2"
    assert err.hint == "dimensions are 0…1 (or -1…-2)"
    assert message("input x : f16[] sliced\n") == "scalar input 'x' cannot be sliced"


def test_layout_words() -> None:
    assert message("input x : f16[H] local(0)\n") == "layout 'local' takes no argument"
    err = error("input x : f16[H] slicd\n")
    assert err.message == "unknown layout 'slicd'" and err.hint == "did you mean 'sliced'?"


def test_normal_form_of_sliced_d() -> None:
    p = prog("input a : f16[1, 1, H] sliced(2)\ninput b : f16[1, B, H] sliced(2)\n")
    assert ty(p, "a") == "f16[1, 1, 32] sliced"
    assert ty(p, "b") == "f16[1, 8, 32] sliced(2)"


# --- names and declarations -----------------------------------------------------------------
def test_declarations() -> None:
    p = prog("input x : i64[H] replicated\n")
    assert p.type_of("x").dtype is DType.I64
    assert p.type_of("lr") == TensorType(DType.F32, (), p.type_of("lr").layout, None)
    assert message("input x : f16[H] replicated\ny = x + H\n") == (
        "'H' is a dimension, not a value"
    )
    assert message("input x : f16[H] replicated\ny = relu\n") == "'relu' is a function, not a value"
    assert message("input x : f16[H] replicated\ny = y + x\n") == "stage 'y' refers to itself"
    assert message("input x : f16[H] replicated\noutput x\n") == "output 'x' is not a stage"
    assert message("param p: i32 = 1.5\n") == "param 'p' is i32 but its default is not an integer"
    assert message("ranks 4\n", "ranks 2\n").startswith("a second 'ranks' statement")


def test_defines_and_ranks_overrides_are_usage_errors_when_wrong() -> None:
    from cocoviz.errors import UsageError

    with pytest.raises(UsageError, match="-D Q: the program has no dimension named 'Q'"):
        prog("", defines={"Q": 2})
    with pytest.raises(UsageError, match="pp=3 pipeline stages, which do not divide 8"):
        prog("", GRID, ranks=RanksOverride(n=8))
    assert prog("", GRID, ranks=RanksOverride(n=6)).grid.tp == 2


# --- re-typing by transformations -----------------------------------------------------------
def test_infer_program_retypes_to_the_same_program() -> None:
    from cocoviz import samples

    for name in samples.names():
        p = load_program(samples.text(name), f"{name}.coco")
        assert infer_program(p) == p
