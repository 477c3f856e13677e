"""The hand-written parser (cocoviz/ir/fastparse.py) against the lark parser it stands in
for: on valid text both build the same syntax objects with the same spans; on text the
fast parser refuses, lark reports (so diagnostics are lark's); the fast parser never
accepts text lark rejects."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from typing import Any

import pytest
from test_hardening_input import fuzz_module

from cocoviz.errors import CocovizError, Source, Span
from cocoviz.ir import fastparse, syntax
from cocoviz.ir.nodes import MAX_EXPR_DEPTH
from cocoviz.samples.gpt import gpt_stack

_FUZZ = fuzz_module()


def same(a: Any, b: Any, path: str = "") -> str | None:
    """Where two parse results differ, spans included (None: nowhere)."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, Span):
        ka, kb = (a.line, a.col, a.end_line, a.end_col), (b.line, b.col, b.end_line, b.end_col)
        return None if ka == kb and a.source is b.source else f"{path}: span {ka} != {kb}"
    if isinstance(a, tuple | list):
        if len(a) != len(b):
            return f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if (r := same(x, y, f"{path}[{i}]")) is not None:
                return r
        return None
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            if (r := same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")) is not None:
                return r
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def compare(text: str, start: str = "start") -> str:
    source = Source("<t>", text)
    try:
        fast: tuple[Any, ...] | None = fastparse.parse(text, source, start)
    except fastparse.Fallback:
        fast = None
    try:
        slow: tuple[Any, ...] | None = syntax._run_lark(text, source, start)
    except CocovizError:
        slow = None
    if fast is None:
        return "refused"
    assert slow is not None, f"the fast parser accepts what lark rejects:\n{text[:2000]}"
    diff = same(fast, slow)
    assert diff is None, f"{diff}\n{text[:2000]}"
    return "same"


def corpus() -> list[tuple[str, str]]:
    return [*_FUZZ.corpus(), ("gpt3", gpt_stack(3))]


def test_valid_programs_parse_the_same() -> None:
    for name, text in corpus():
        assert compare(text) == "same", name


@pytest.mark.parametrize(
    "text",
    [
        "split(a)",
        "fuse(a, b); overlap(x, y, chunks=4)",
        "\n a(b=1,c)\n\n d()\n",
        "",
        ";;\n",
    ],
)
def test_steps_parse_the_same(text: str) -> None:
    assert compare(text, "sched_file") == "same"


def test_corrupted_programs() -> None:
    rng = random.Random(7)
    kinds = [
        _FUZZ.delete_token,
        _FUZZ.duplicate_token,
        _FUZZ.swap_names,
        _FUZZ.random_bytes,
        _FUZZ.truncate,
        _FUZZ.replace_number,
        _FUZZ.replace_word,
        _FUZZ.move_line,
    ]
    texts = [t for _, t in corpus() if len(t) < 20_000]
    outcomes = {"same": 0, "refused": 0}
    for _ in range(600):
        outcomes[compare(rng.choice(kinds)(rng, rng.choice(texts)))] += 1
    assert outcomes["same"] > 100 and outcomes["refused"] > 100, outcomes


HEAD = "ranks 4\ndim N = 64\ninput x : f32[N] replicated\n"


def test_deep_nests_fall_back_to_lark() -> None:
    deep = "y = " + "relu(" * (MAX_EXPR_DEPTH - 1) + "x" + ")" * (MAX_EXPR_DEPTH - 1) + "\n"
    with pytest.raises(fastparse.Fallback):
        fastparse.parse(HEAD + deep, Source("<t>", HEAD + deep), "start")
    assert len(syntax.parse_module(HEAD + deep).statements) == 4
    too_deep = "y = " + "-" * 50_000 + "x\n"
    with pytest.raises(CocovizError, match="nested too deeply"):
        syntax.parse_module(HEAD + too_deep)


def test_valid_text_does_not_import_lark() -> None:
    code = (
        "import sys; from cocoviz.ir.lower import load_program;"
        "from cocoviz.samples.gpt import gpt_stack;"
        "load_program(gpt_stack(2)); print('lark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
