"""What makes loading a large program cheap, against the plain way it stands in for: the
fast lexer's word path (cocoviz/ir/fastparse.py) against lark's lexer, the input types
lowering works out once per distinct declaration, the inference rules memoized by operand
types, and dropout ids given while the names are resolved."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from cocoviz.errors import CocovizError
from cocoviz.ir import fastparse, infer, syntax
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import Op
from cocoviz.samples.gpt import gpt_stack

SAMPLES = Path(__file__).resolve().parents[1] / "cocoviz" / "samples"

# Pieces of lines that the word path and the regular expression must lex alike: names,
# keywords, numbers with and without exponents, every punctuation and comparison,
# comments, separators and blanks; and, more rarely, characters no token starts with
# (or that `str.split` and `str.isidentifier` would take and the lexer refuses).
_PIECES = [
    *"abxE_019.+-*/=,:@()[]{}<>;#", " ", " ", "\n",
    "==", "<=", "!=", "1e-5", "1.5e+3", "2E7", ".5", "2.", "0x1", "4H", "x.y", "  ",
    "input", "dim", "ranks", "fused", "\r\n", "# c(d)", "l0_w1", "4096", "4*H", "\t", "\r", "\f",
]  # fmt: skip
_REFUSED = [*"\v\x1c\x85\xa0é$'!"]


def _piece(rng: random.Random) -> str:
    return rng.choice(_REFUSED if rng.random() < 0.03 else _PIECES)


def _lark_tokens(text: str) -> list[tuple[str, str, int, int, int]]:
    """The tokens lark's lexer makes of `text` (raises on a bad character or a limit)."""
    state = SimpleNamespace(text=SimpleNamespace(text=text))
    return [
        (t.type, t.value, t.line, t.column, t.end_column)  # type: ignore[misc]
        for t in syntax._lexer().lex(state, None)
    ]


def test_the_fast_lexer_makes_the_tokens_of_lark_s_lexer() -> None:
    rng = random.Random(3)
    texts = [gpt_stack(2), (SAMPLES / "moe_layer.coco").read_text()]
    texts += ["".join(_piece(rng) for _ in range(rng.randint(1, 16))) for _ in range(4000)]
    accepted = 0
    for text in texts:
        try:
            fast = fastparse.tokenize(text)
        except fastparse.Fallback:
            continue  # lark lexes it, and reports what is wrong
        accepted += 1
        assert fast[-1][0] == "$END"
        assert fast[:-1] == _lark_tokens(text), repr(text)
    assert accepted > 1000


def test_inputs_declared_alike_share_one_type_and_fail_each_alone() -> None:
    head = "ranks 4\ndim N = 64\n"
    p = load_program(head + "input a : f32[N, 2*N] sliced(1)\ninput b : f32[N, 2*N] sliced(1)\n")
    assert p.inputs[0].ty is p.inputs[1].ty
    assert str(p.inputs[1].ty) == "f32[N, 2*N] sliced(1)"
    with pytest.raises(CocovizError) as err:
        load_program(head + "input a : f32[M] replicated\ninput b : f32[M] replicated\n")
    assert [d.span.line for d in err.value.diagnostics if d.span] == [3, 4]
    with pytest.raises(CocovizError, match="input 'b' is sliced over 4 ranks"):
        load_program(head + "input a : f32[N] sliced\ninput b : f32[3] sliced\n")


def _fresh_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every inference rule applied anew (no type known from an earlier node)."""
    monkeypatch.setattr(infer, "_type_key", lambda e, args: None)


@pytest.mark.parametrize("name", ["gpt", "moe_layer", "pipeline_stage", "ulysses_attention"])
def test_memoized_rules_type_as_the_rules_do(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = gpt_stack(4) if name == "gpt" else (SAMPLES / f"{name}.coco").read_text()
    memoized = load_program(text)
    _fresh_types(monkeypatch)
    fresh = load_program(text)
    assert memoized == fresh
    assert [s.ty for s in memoized.stages] == [s.ty for s in fresh.stages]


def test_a_rule_that_failed_fails_again_with_its_own_operands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = (
        "ranks tp=2, pp=2\ndim N = 8\n"
        "input a : f32[N] replicated\ninput b : f32[N] replicated @stage 1\n"
        "x = a + a\ny = a + a\nz = x + b\n"
    )
    with pytest.raises(CocovizError) as memoized:
        load_program(text)
    _fresh_types(monkeypatch)
    with pytest.raises(CocovizError) as fresh:
        load_program(text)
    assert memoized.value.render() == fresh.value.render()
    assert "'x' is on stage 0" in memoized.value.render()


def test_dropout_ids_count_the_stage_s_dropout_calls_in_source_order() -> None:
    p = load_program(
        "ranks 2\ndim N = 8\ninput x : f32[N] replicated\n"
        "y = dropout(dropout(x, 0.1) + dropout(x, 0.2, id=z, k=3), 0.3) + dropout(x, 0.4)\n"
        "w = dropout(y, 0.5)\n"
    )
    tags = [e.tag for s in p.stages for e in s.expr.walk() if e.op is Op.DROPOUT]
    assert tags == ["y#0", "y#1", "z#3", "y#3", "w#0"]
