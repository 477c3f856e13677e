"""Random corruptions of the samples fed to `cocoviz check`: every run ends in success or
a diagnostic (exit 1, 2 or 3), never an uncaught exception or an internal error (70).

The corruptions are seeded, so a failure names a case that reproduces: the test prints
the corrupted text of the first failing case.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.samples.gpt import gpt_stack

CASES_PER_KIND = 420  # 5 kinds x 420 = 2,100 corruptions
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9.]+(?:[eE][-+]?[0-9]+)?|#[^\n]*|\n|\s+|.")
NOISE = list("()[]{},;:=@+-*/<>!#.\n\t ") + ["\x00", "\x0b", "é", "漢", "\r", "1e400", "-"]


def corpus() -> list[tuple[str, str]]:
    texts = [(n, samples.text(n)) for n in samples.names()]
    texts.append(("gpt2", gpt_stack(2, h=64, s=16, b=2)))
    return texts


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def delete_token(rng: random.Random, text: str) -> str:
    toks = tokens(text)
    for _ in range(rng.randint(1, 3)):
        if toks:
            del toks[rng.randrange(len(toks))]
    return "".join(toks)


def duplicate_token(rng: random.Random, text: str) -> str:
    toks = tokens(text)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(toks))
        toks.insert(i, toks[i])
    return "".join(toks)


def swap_names(rng: random.Random, text: str) -> str:
    toks = tokens(text)
    names = [i for i, t in enumerate(toks) if t[0].isalpha() or t[0] == "_"]
    for _ in range(rng.randint(1, 2)):
        i, j = rng.choice(names), rng.choice(names)
        toks[i], toks[j] = toks[j], toks[i]
    return "".join(toks)


def random_bytes(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(chars) + 1)
        if rng.random() < 0.5:
            chars[i:i] = rng.choice(NOISE)
        elif chars:
            chars[min(i, len(chars) - 1)] = chr(rng.randrange(1, 0x250))
    return "".join(chars)


def truncate(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(len(text) + 1)]


KINDS = {
    "delete": delete_token,
    "duplicate": duplicate_token,
    "swap": swap_names,
    "bytes": random_bytes,
    "truncate": truncate,
}


def run_check(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", str(path)])
    return rc, err.getvalue()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_corruptions_end_in_a_diagnostic(kind: str, tmp_path: Path) -> None:
    rng = random.Random(f"cocoviz-fuzz-{kind}")
    texts = corpus()
    path = tmp_path / "fuzz.coco"
    outcomes: dict[int, int] = {}
    for case in range(CASES_PER_KIND):
        name, text = texts[case % len(texts)]
        bad = KINDS[kind](rng, text)
        path.write_text(bad, encoding="utf-8")
        rc, err = run_check(path)
        outcomes[rc] = outcomes.get(rc, 0) + 1
        assert rc in (0, 1, 2, 3), (
            f"{kind} case {case} of {name}: exit {rc}\n{err}\n--- input ---\n{bad}"
        )
        if rc != 0:
            assert "error" in err and "Traceback" not in err, (kind, case, err)
            # a diagnostic with a location shows a source line and a caret
            first = err.splitlines()[0]
            if re.match(r"^\S+:\d+:\d+: error: ", first):
                assert "^" in err, (kind, case, err)
    # the corruptions are not all harmless, and not all fatal
    assert outcomes.get(1, 0) > CASES_PER_KIND // 10, outcomes
