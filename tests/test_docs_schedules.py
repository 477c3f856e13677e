"""Every code block of docs/schedules.md is checked.

- A ```coco block parses, and each of its schedule blocks applies.
- A ```sched block parses as steps.
- A block after `<!-- after: SAMPLE: STEP; STEP -->` is exactly the annotated program
  that those steps give on samples/SAMPLE.coco.
- A ```text block after `<!-- refused: SAMPLE: STEP; STEP -->` is exactly the rendered
  error of the last step.

Regenerate the expected blocks with `COCOVIZ_UPDATE_GOLDEN=1` and read the diff.
"""

from __future__ import annotations

import os
import re

import pytest
from transforms_util import ROOT

from cocoviz.errors import ScheduleError
from cocoviz.ir.lower import load_program
from cocoviz.ir.printer import format_program
from cocoviz.ir.syntax import parse_steps
from cocoviz.schedule import apply_block, apply_steps

DOC = ROOT / "docs" / "schedules.md"
BLOCK = re.compile(r"(?:<!-- (after|refused): (\w+): (.*?) -->\n)?```(\w+)\n(.*?)```", re.S)
UPDATE = os.environ.get("COCOVIZ_UPDATE_GOLDEN") == "1"


def _sample(name: str):  # type: ignore[no-untyped-def]
    return load_program((ROOT / "samples" / f"{name}.coco").read_text(), f"{name}.coco")


def _steps(text: str):  # type: ignore[no-untyped-def]
    return [s for part in text.split(";") for s in parse_steps(part.strip(), "<step>")]


def _expected(kind: str, name: str, steps: str) -> str:
    program = _sample(name)
    if kind == "after":
        return format_program(apply_steps(program, _steps(steps)), schedules=False, annotate=True)
    with pytest.raises(ScheduleError) as info:
        apply_steps(program, _steps(steps))
    return info.value.render() + "\n"


def test_docs_code_blocks() -> None:
    text = DOC.read_text(encoding="utf-8")
    blocks = list(BLOCK.finditer(text))
    assert len(blocks) > 20
    out, last = [], 0
    for m in blocks:
        kind, name, steps, lang, body = m.groups()
        if kind:
            want = _expected(kind, name, steps)
            if UPDATE:
                out.append(text[last : m.start(5)] + want)
                last = m.end(5)
            else:
                assert body == want, f"docs/schedules.md: {kind}: {name}: {steps}"
        elif lang == "coco":
            program = load_program(body, "doc.coco")
            for b in program.schedules:
                apply_block(program, b)
        elif lang == "sched":
            assert parse_steps(body)
    if UPDATE:
        DOC.write_text("".join(out) + text[last:], encoding="utf-8")
