"""The parser (`cocoviz.ir.syntax`): every statement of DESIGN §2.2, lexical rules, spans,
and syntax errors as `InputError`s with a location (never a lark exception)."""

from __future__ import annotations

import threading

import pytest

from cocoviz.errors import InputError
from cocoviz.ir import syntax as syn
from cocoviz.ir.nodes import Expr, Op, StepCall
from cocoviz.ir.syntax import parse_module, parse_steps


def stmts(text: str) -> tuple[object, ...]:
    return parse_module(text, "t.coco").statements


def only(text: str) -> object:
    (st,) = stmts(text)
    return st


def syntax_error(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        parse_module(text, "t.coco")
    return info.value


# --- statements ------------------------------------------------------------------------
def test_program_statement() -> None:
    st = only("program my_model")
    assert isinstance(st, syn.ProgramStmt) and st.name.text == "my_model"
    assert (st.span.line, st.span.col, st.span.end_col) == (1, 1, 17)


def test_ranks_flat_and_grid() -> None:
    flat = only("ranks 16")
    assert isinstance(flat, syn.RanksStmt) and flat.n is not None and flat.n.value == 16
    grid = only("ranks tp=8, pp=2")
    assert isinstance(grid, syn.RanksStmt) and grid.grid is not None
    (n1, v1), (n2, v2) = grid.grid
    assert (n1.text, v1.value, n2.text, v2.value) == ("tp", 8, "pp", 2)


def test_dim_statement_with_several_items() -> None:
    st = only("dim A = 8, B = 1024")
    assert isinstance(st, syn.DimStmt)
    assert [(n.text, v.value) for n, v in st.items] == [("A", 8), ("B", 1024)]


def test_param_statement_with_negative_and_float_defaults() -> None:
    st = only("param lr: f32 = 1e-3, t: f32 = 1, shift: f64 = -0.5")
    assert isinstance(st, syn.ParamStmt)
    got = [(n.text, d.text, v.value, neg) for n, d, v, neg in st.items]
    assert got == [("lr", "f32", 0.001, False), ("t", "f32", 1, False), ("shift", "f64", 0.5, True)]


def test_input_statement_parts() -> None:
    st = only("input w : f16[4*H, H, 8] sliced(-1) @stage 1")
    assert isinstance(st, syn.InputStmt)
    assert st.name.text == "w" and st.dtype.text == "f16"
    assert [[f.text for f in s.factors] for s in st.sizes] == [["4", "H"], ["H"], ["8"]]
    assert st.layout.text == "sliced"
    assert st.layout_arg is not None
    assert (st.layout_arg[0].value, st.layout_arg[1]) == (1, True)
    assert st.stage_kw is not None and st.stage_kw.text == "stage"
    assert st.stage is not None and st.stage.value == 1
    assert st.layout_span is not None and st.layout_span.col == st.layout.span.col
    assert st.layout_span.end_col == st.layout_span.col + len("sliced(-1)")


def test_scalar_input_has_an_empty_shape() -> None:
    st = only("input s : f32[] replicated")
    assert isinstance(st, syn.InputStmt) and st.sizes == ()


def test_output_statement() -> None:
    st = only("output a, b")
    assert isinstance(st, syn.OutputStmt) and [n.text for n in st.names] == ["a", "b"]


def test_assignment_and_operator_precedence() -> None:
    st = only("y = a + b * -c / d - e")
    assert isinstance(st, syn.Assign)
    e = st.expr
    # ((a + ((b * (-c)) / d)) - e)
    assert e.op is Op.SUB
    add = e.args[0]
    assert add.op is Op.ADD and add.args[1].op is Op.DIV
    assert add.args[1].args[0].op is Op.MUL
    assert add.args[1].args[0].args[1].op is Op.NEG


def test_calls_keyword_arguments_comparisons_and_reduction_operators() -> None:
    st = only("y = where(x >= 0, layernorm(x, g, b, eps=1e-6), allreduce(+, x))")
    assert isinstance(st, syn.Assign)
    call = st.expr
    assert isinstance(call, syn.Call) and call.name.text == "where"
    cond, ln, ar = call.args
    assert isinstance(cond, syn.Cmp) and cond.op is Op.GE
    assert isinstance(ln, syn.Call) and isinstance(ln.args[3], syn.Kw)
    assert ln.args[3].name.text == "eps"
    assert isinstance(ar, syn.Call) and isinstance(ar.args[0], syn.RedTok)
    assert ar.args[0].text == "+"
    star = only("y = allreduce(*, x)")
    assert isinstance(star, syn.Assign) and star.expr.args[0].text == "*"


def test_schedule_block_steps() -> None:
    st = only("schedule fused {\n  split(sum)   # comment\n  overlap(a, b, chunks=4); dce()\n}")
    assert isinstance(st, syn.ScheduleStmt) and st.name.text == "fused"
    assert [str(s) for s in st.steps] == ["split(sum)", "overlap(a, b, chunks=4)", "dce()"]
    assert st.steps[1].kwargs == (("chunks", 4),)
    assert st.steps[1].span is not None and st.steps[1].span.line == 3
    assert [sp.col for sp in st.steps[1].arg_spans if sp] == [11, 14]


def test_empty_schedule_block() -> None:
    st = only("schedule as_written {\n}")
    assert isinstance(st, syn.ScheduleStmt) and st.steps == ()


def test_fused_and_overlapped_blocks() -> None:
    text = (
        "overlapped chunks=4 {\n  a = matmul(x, w)\n  fused {\n    b = a + 1\n    c = b * 2\n  }\n}"
    )
    st = only(text)
    assert isinstance(st, syn.OverlappedStmt)
    assert st.chunks_kw.text == "chunks" and st.chunks.value == 4
    assert isinstance(st.items[0], syn.Assign)
    assert isinstance(st.items[1], syn.FusedStmt) and len(st.items[1].items) == 2


def test_parse_steps_for_sched_files_and_the_command_line() -> None:
    steps = parse_steps("# a .sched file\nsplit(sum)\nreorder(sum); fuse(sum_rs, out)\n")
    assert steps == (
        StepCall("split", ("sum",)),
        StepCall("reorder", ("sum",)),
        StepCall("fuse", ("sum_rs", "out")),
    )
    assert parse_steps("overlap(a, b, chunks=8)")[0].kwargs == (("chunks", 8),)
    assert parse_steps("") == ()


def test_step_keyword_values_are_integers() -> None:
    with pytest.raises(InputError, match=r"overlap: chunks= must be an integer, got '2.5'"):
        parse_steps("overlap(a, b, chunks=2.5)")


# --- lexical rules ------------------------------------------------------------------------
def test_semicolons_and_newlines_both_end_statements() -> None:
    a = stmts("ranks 4; dim N = 8\ninput x : f32[N] replicated; y = x + 1; output y")
    b = stmts("ranks 4\ndim N = 8\ninput x : f32[N] replicated\ny = x + 1\noutput y\n")
    assert [type(s) for s in a] == [type(s) for s in b]
    assert len(a) == 5


def test_comments_blank_lines_and_crlf() -> None:
    text = "# head\r\n\r\nranks 4   # trailing\r\n\r\n\r\n# only comment\r\ndim N = 8 # x\r\n"
    assert [type(s) for s in stmts(text)] == [syn.RanksStmt, syn.DimStmt]


def test_newlines_inside_parentheses_and_brackets_do_not_end_a_statement() -> None:
    text = "input x : f16[\n  B,\n  H\n] replicated\ny = layernorm(\n  x,   # the input\n  g,\n  b\n)\nz = (a\n  + b)\n"
    kinds = [type(s) for s in stmts(text)]
    assert kinds == [syn.InputStmt, syn.Assign, syn.Assign]


def test_newline_after_a_closed_parenthesis_ends_the_statement() -> None:
    assert len(stmts("y = (a + b)\nz = 1")) == 2


def test_keywords_are_names_except_at_the_start_of_a_statement() -> None:
    # function names, dtypes, layout words and statement keywords inside expressions
    st = stmts("sum = allreduce(+, layer)\nout = sum + input * output + f32 + sliced")
    assert isinstance(st[1], syn.Assign)
    refs = [e.name for e in st[1].expr.walk() if e.op is Op.REF]
    assert refs == ["sum", "input", "output", "f32", "sliced"]


def test_a_keyword_cannot_start_an_assignment() -> None:
    err = syntax_error("output = x")
    assert err.message == "syntax error: unexpected '='; expected a name"


def test_numbers() -> None:
    (st,) = stmts("y = 1 + 2.5 + .5 + 1. + 1e3 + 2E-2")
    values = [e.value for e in st.expr.walk() if e.op is Op.CONST]
    assert values == [1, 2.5, 0.5, 1.0, 1000.0, 0.02]
    assert isinstance(values[0], int) and isinstance(values[4], float)


def test_empty_and_comment_only_files_have_no_statements() -> None:
    assert stmts("") == ()
    assert stmts("\n\n# nothing here\n   \n") == ()


# --- spans ------------------------------------------------------------------------------
def test_spans_of_expressions() -> None:
    (st,) = stmts("out = dropout(sum + b, 0.1) + r")
    assert isinstance(st, syn.Assign)
    assert (st.span.col, st.span.end_col) == (1, 32)
    e = st.expr
    assert isinstance(e, Expr)
    assert (e.span.col, e.span.end_col) == (7, 32)
    call = e.args[0]
    assert isinstance(call, syn.Call)
    assert (call.span.col, call.span.end_col) == (7, 28)  # includes the ')'
    assert (call.name.span.col, call.name.span.end_col) == (7, 14)
    inner = call.args[0]
    assert (inner.span.col, inner.span.end_col) == (15, 22)


def test_parenthesized_expression_span_includes_the_parentheses() -> None:
    (st,) = stmts("y = 2 * (a + b)")
    mul = st.expr
    assert (mul.args[1].span.col, mul.args[1].span.end_col) == (9, 16)
    assert (mul.span.col, mul.span.end_col) == (5, 16)


def test_negation_span_includes_the_sign() -> None:
    (st,) = stmts("y = -x")
    assert (st.expr.span.col, st.expr.span.end_col) == (5, 7)


def test_span_lines_across_a_multiline_call() -> None:
    (st,) = stmts("y = relu(\n  x\n)")
    assert (st.expr.span.line, st.expr.span.end_line, st.expr.span.end_col) == (1, 3, 2)


def test_spans_point_into_the_named_source() -> None:
    (st,) = parse_module("y = x", "model.coco").statements
    assert st.span.path == "model.coco"
    assert st.span.source is not None and st.span.source.text == "y = x"


# --- syntax errors ------------------------------------------------------------------------
def test_unexpected_token_names_the_token_and_what_was_expected() -> None:
    err = syntax_error("ranks 4\ny = x +* 2\n")
    assert err.message == ("syntax error: unexpected '*'; expected '(', '-', a name or a number")
    assert (err.span.line, err.span.col, err.span.end_col) == (2, 8, 9)


def test_unexpected_end_of_file_names_the_unclosed_bracket() -> None:
    err = syntax_error("ranks 4\ny = relu(x * (x + 1)\n")
    assert err.message == (
        "syntax error: unexpected end of file; the '(' at line 2 is never closed"
    )
    assert (err.span.line, err.span.col) == (2, 21)  # just after the last token
    (note,) = err.diagnostics[0].notes
    assert note[0] == "'(' opened here" and note[1] is not None and note[1].col == 9
    assert err.hint == "add the missing ')'"


def test_unclosed_schedule_block() -> None:
    err = syntax_error("schedule s {\n  split(a)\n")
    assert err.message.endswith("the '{' at line 1 is never closed")
    assert err.hint == "add the missing '}'"


def test_unexpected_end_of_file_without_open_brackets() -> None:
    err = syntax_error("ranks 4\ny = x +")
    assert (
        err.message == "syntax error: unexpected end of file; expected '(', '-', a name or a number"
    )
    assert (err.span.line, err.span.col) == (2, 8)


def test_unexpected_end_of_line() -> None:
    err = syntax_error("ranks 4\noutput\n")
    assert err.message == "syntax error: unexpected end of line; expected a name"
    assert (err.span.line, err.span.col) == (2, 7)


def test_unexpected_character() -> None:
    err = syntax_error("y = x $ 2")
    assert err.message == "syntax error: unexpected character '$'"
    assert (err.span.col, err.span.end_col) == (7, 8)
    err = syntax_error("ranks 4\ny = x\x0b")
    assert err.message == "syntax error: unexpected character '\\x0b'"
    err = syntax_error("y = 漢")
    assert err.message == "syntax error: unexpected character '漢'"


def test_misspelled_keyword_hint() -> None:
    err = syntax_error("ranks 4\ninptu x : f32[8] replicated\n")
    assert err.hint == "did you mean 'input'? a statement starts with a keyword or 'NAME ='"


def test_unmatched_closing_bracket() -> None:
    err = syntax_error("y = x)\n")
    assert err.message.startswith("syntax error: unexpected ')'")


def test_parsing_is_safe_from_several_threads() -> None:
    texts = [f"ranks 4\ny{i} = relu(x{i}) + {i}\n" for i in range(8)]
    results: dict[int, str] = {}

    def work(i: int) -> None:
        for _ in range(30):
            (_, st) = parse_module(texts[i], f"f{i}.coco").statements
            assert st.span.path == f"f{i}.coco"
            results[i] = st.name.text

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"y{i}" for i in range(8)}


def test_trailing_comma_hint() -> None:
    err = syntax_error("y = max(\n  a,\n  b,   # the second\n)\n")
    assert err.message.startswith("syntax error: unexpected ')'")
    assert err.hint == "remove the ',' before ')': a trailing comma is not allowed"
