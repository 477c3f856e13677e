"""Diagnostics: the golden `samples/bad` files, and how a diagnostic is rendered.

Each `samples/bad/NAME.coco` holds one error class; `NAME.expected` holds the exit code
on its first line (`exit 1`) and then exactly what `cocoviz check samples/bad/NAME.coco`
writes to stderr. To regenerate after a deliberate change of wording, run

    COCOVIZ_UPDATE_GOLDEN=1 pytest tests/test_diagnostics.py

and read the diff.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from cocoviz.cli import main
from cocoviz.errors import Diagnostic, DiagnosticBag, InputError, Source, Span, did_you_mean
from cocoviz.ir.lower import load_program

ROOT = Path(__file__).resolve().parent.parent
BAD = ROOT / "samples" / "bad"
BAD_FILES = sorted(p.stem for p in BAD.glob("*.coco"))


def check(path: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", path])
    return rc, out.getvalue(), err.getvalue()


def test_every_bad_sample_has_its_expected_diagnostic() -> None:
    expected = sorted(p.stem for p in BAD.glob("*.expected"))
    assert expected == BAD_FILES
    assert len(BAD_FILES) >= 30


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_sample_golden(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("COCOVIZ_DEBUG", raising=False)
    rc, out, err = check(f"samples/bad/{name}.coco")
    got = f"exit {rc}\n{err}"
    golden = BAD / f"{name}.expected"
    if os.environ.get("COCOVIZ_UPDATE_GOLDEN"):
        golden.write_text(got, encoding="utf-8")
    assert got == golden.read_text(encoding="utf-8")
    assert rc == 1
    assert out == ""


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_sample_carets_sit_under_their_span(name: str) -> None:
    """Every caret row underlines part of the source line printed above it."""
    golden = (BAD / f"{name}.expected").read_text(encoding="utf-8").splitlines()[1:]
    for above, row in zip(golden, golden[1:], strict=False):
        if "^" not in row or "|" not in row:
            continue
        gutter = row.index("|")
        assert above[gutter] == "|", (name, above, row)
        start = row.index("^")
        if start == len(above):  # just past the end: an unexpected end of line or file
            continue
        marked = above[start : start + row.count("^")]
        assert marked.strip(), (name, above, row)  # not under blanks


def test_bad_samples_are_package_data() -> None:
    """`samples/` is the embedded package directory, so the bad samples ship too."""
    assert (ROOT / "cocoviz" / "samples" / "bad").resolve() == BAD.resolve()


# --- rendering ---------------------------------------------------------------------------
def span(text: str, line: int, col: int, end_col: int, end_line: int | None = None) -> Span:
    return Span(Source("f.coco", text), line, col, end_line or line, end_col)


def test_render_location_line_caret_and_hint() -> None:
    d = Diagnostic("unknown name 'q'", span("y = x + q\n", 1, 9, 10), hint="did you mean 'x'?")
    assert d.render() == (
        "f.coco:1:9: error: unknown name 'q'\n"
        "   1 | y = x + q\n"
        "     |         ^\n"
        "hint: did you mean 'x'?"
    )


def test_render_note_has_its_own_location() -> None:
    src = "a = 1\na = 2\n"
    d = Diagnostic(
        "'a' is already defined",
        span(src, 2, 1, 2),
        notes=(("first defined here", span(src, 1, 1, 2)),),
    )
    assert d.render().splitlines() == [
        "f.coco:2:1: error: 'a' is already defined",
        "   2 | a = 2",
        "     | ^",
        "f.coco:1:1: note: first defined here",
        "   1 | a = 1",
        "     | ^",
    ]


def test_render_multiline_span_underlines_to_end_of_line() -> None:
    d = Diagnostic("bad", span("y = relu(x +\n  1)\n", 1, 5, 4, end_line=2))
    assert d.render().splitlines()[2] == "     |     ^^^^^^^^"


def test_render_tabs_and_control_characters_take_one_column() -> None:
    d = Diagnostic("bad", span("\ty =\x0bq\n", 1, 6, 7))
    line, caret = d.render().splitlines()[1:]
    assert line == "   1 |  y = q"
    assert caret.index("^") == line.index("q")


def test_render_wide_characters_keep_the_caret_aligned() -> None:
    d = Diagnostic("bad", span("# 漢字\ny = 漢 + q\n", 2, 9, 10))
    line, caret = d.render().splitlines()[1:]
    assert caret == "     |          ^"  # 漢 takes two terminal columns


def test_render_caret_past_the_end_of_the_line() -> None:
    d = Diagnostic("unexpected end of file", span("y = (x\n", 1, 7, 8))
    assert d.render().splitlines()[2] == "     |       ^"


def test_render_span_on_a_line_that_does_not_exist_prints_no_excerpt() -> None:
    d = Diagnostic("bad", span("x\n", 9, 1, 2))
    assert d.render() == "f.coco:9:1: error: bad"


def test_render_lines_split_at_newline_only() -> None:
    """The parser counts '\\n' only; a form feed or \\x1c inside a line stays in it."""
    d = Diagnostic("bad", span("a\x1cb = q\nz\n", 1, 7, 8))
    assert d.render().splitlines()[1] == "   1 | a b = q"


def test_render_without_span_or_with_color() -> None:
    assert Diagnostic("no such file").render() == "error: no such file"
    colored = Diagnostic("bad", span("x\n", 1, 1, 2)).render(color=True)
    assert "\x1b[1;31merror\x1b[0m" in colored


def test_diagnostic_bag_reports_in_source_order() -> None:
    src = "a\nb\nc\n"
    bag = DiagnosticBag()
    bag.add(InputError("third", span(src, 3, 1, 2)))
    bag.add(InputError("first", span(src, 1, 1, 2)))
    bag.add(InputError("second", span(src, 2, 1, 2)))
    with pytest.raises(InputError) as info:
        bag.raise_if_any()
    assert [d.message for d in info.value.diagnostics] == ["first", "second", "third"]
    DiagnosticBag().raise_if_any()  # nothing collected: no error


def test_did_you_mean() -> None:
    assert did_you_mean("grd", ["grad", "w"]) == "did you mean 'grad'?"
    assert did_you_mean("zzz", ["grad", "w"]) is None


# --- several errors at once, and no traceback ever -----------------------------------------
def test_name_errors_in_declarations_and_stages_are_reported_together() -> None:
    text = (
        "ranks 4\n"
        "dim B = 8\n"
        "input x : f16[B, Q] replicated\n"  # unknown dimension
        "input w : f17[B] replicated\n"  # unknown dtype
        "y = relu(x) + zz\n"  # unknown name (x is not reported: it is declared)
        "y = w\n"  # duplicate
        "output nope\n"
    )
    with pytest.raises(InputError) as info:
        load_program(text, "m.coco")
    messages = [d.message for d in info.value.diagnostics]
    assert messages == [
        "unknown dimension 'Q'",
        "unknown dtype 'f17'",
        "unknown name 'zz'",
        "'y' is already defined",
        "unknown output 'nope'",
    ]


def test_a_failed_dimension_causes_no_second_error() -> None:
    text = "ranks 4\ndim N = 1.5\ninput x : f32[N] replicated\ny = x * 2\n"
    with pytest.raises(InputError) as info:
        load_program(text)
    assert [d.message for d in info.value.diagnostics] == [
        "dimension 'N' must be an integer, got '1.5'"
    ]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n# only a comment",
        "ranks",
        "ranks 4\ninput",
        "ranks 4\ny = (",
        "ranks 4\nschedule s {\n split(a)\n",
        "ranks 4\ninput x : f16[",
        "\x00",
        "ranks 4\ny = 1e999999\n",
        "ranks 4\ny = 99999999999999999999999\n",
        "ranks 99999999999999999999999\n",
        "ranks 4\nschedule s { overlap(a, b, chunks=1e400) }\n",
        "ranks 4\nfused {\n}\n",
        "ranks tp=2, tp=2\n",
    ],
)
def test_odd_inputs_end_in_a_diagnostic(text: str, tmp_path: Path) -> None:
    p = tmp_path / "odd.coco"
    p.write_text(text, encoding="utf-8")
    rc, _, err = check(str(p))
    assert rc in (0, 1), err
    assert "internal error" not in err and "Traceback" not in err
