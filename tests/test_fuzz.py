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
from test_hardening_input import fuzz_module

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.samples.gpt import gpt_stack

CASES_PER_KIND = 420  # 5 kinds x 420 = 2,100 corruptions

_FUZZ = fuzz_module()  # bench/fuzz.py: the in-process fuzzer's corruptions
KINDS = {
    "delete": _FUZZ.delete_token,
    "duplicate": _FUZZ.duplicate_token,
    "swap": _FUZZ.swap_names,
    "bytes": _FUZZ.random_bytes,
    "truncate": _FUZZ.truncate,
}


def corpus() -> list[tuple[str, str]]:
    texts = [(n, samples.text(n)) for n in samples.names()]
    texts.append(("gpt2", gpt_stack(2, h=64, s=16, b=2)))
    return texts


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
