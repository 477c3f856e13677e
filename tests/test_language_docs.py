"""docs/language.md stays true: every ```coco block is a program cocoviz accepts, and
every ```coco-error block fails with exactly the diagnostic shown in the ```text block
that follows it (as `cocoviz check` prints it, for a file named example.coco).

After a deliberate change of wording, `COCOVIZ_UPDATE_GOLDEN=1 pytest
tests/test_language_docs.py` rewrites those text blocks; read the diff.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from cocoviz.cli import main
from cocoviz.errors import CocovizError
from cocoviz.ir.lower import load_program
from cocoviz.ir.syntax import parse_steps

DOC = Path(__file__).resolve().parent.parent / "docs" / "language.md"
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```\n", re.M | re.S)


def blocks() -> list[tuple[str, str, int]]:
    """(info string, body, line number) of every fenced block."""
    text = DOC.read_text(encoding="utf-8")
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)
    ]


def error_cases() -> list[tuple[str, str | None, int]]:
    """(program, the text block after it or None, line) for every coco-error block."""
    out = []
    bs = blocks()
    for i, (info, body, line) in enumerate(bs):
        if info == "coco-error":
            nxt = bs[i + 1] if i + 1 < len(bs) and bs[i + 1][0] == "text" else None
            out.append((body, nxt[1] if nxt else None, line))
    return out


COCO = [(body, line) for info, body, line in blocks() if info == "coco"]
ERRORS = error_cases()


def test_the_reference_has_examples() -> None:
    assert len(COCO) >= 10
    assert len(ERRORS) >= 20
    assert {info for info, _, _ in blocks()} <= {"coco", "coco-error", "text"}


@pytest.mark.parametrize(("body", "line"), COCO, ids=[f"line{line}" for _, line in COCO])
def test_coco_blocks_are_accepted(body: str, line: int, tmp_path: Path) -> None:
    program = load_program(body, "example.coco")
    for block in program.schedules:
        for step in block.steps:
            assert parse_steps(str(step)) == (step,)
    # and `cocoviz check` accepts it too, schedules included
    path = tmp_path / "example.coco"
    path.write_text(body, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", str(path)])
    assert (rc, err.getvalue()) == (0, "")


@pytest.mark.parametrize(
    ("body", "expected", "line"), ERRORS, ids=[f"line{line}" for _, _, line in ERRORS]
)
def test_coco_error_blocks_fail_with_the_stated_diagnostic(
    body: str, expected: str | None, line: int
) -> None:
    with pytest.raises(CocovizError) as info:
        load_program(body, "example.coco")
    rendered = info.value.render() + "\n"
    if os.environ.get("COCOVIZ_UPDATE_GOLDEN"):
        _update(line, rendered)
        return
    assert expected is not None, f"the coco-error block at line {line} needs a ```text block"
    assert rendered == expected


def _update(line: int, rendered: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        if text.count("\n", 0, m.start()) + 1 != line:
            continue
        rest = text[m.end() :]
        nxt = re.match(r"\n*```text\n.*?^```\n", rest, re.M | re.S)
        new_block = f"\n```text\n{rendered}```\n"
        rest = new_block + rest[nxt.end() :] if nxt else new_block + rest
        DOC.write_text(text[: m.end()] + rest, encoding="utf-8")
        return
