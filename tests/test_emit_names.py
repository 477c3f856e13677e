"""Names from the source never reach C unsanitized: stages named like C/C++ keywords,
macros, reserved identifiers or the emitter's own variables build and run; string
literals escape every byte outside a small safe set."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from emit_support import diagnostics, make, need_mpicxx, write

from cocoviz.emit.emitter import emit
from cocoviz.emit.names import c_ident, c_string
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import unscheduled

HOSTILE = """\
program int
ranks 2
dim N = 64
param main: f32 = 2
input B : f32[N] local
input C : f32[N] replicated
input P : f32[N] replicated
return = allreduce(+, B)
while = update(C, return * main + P)
__LINE__ = dropout(while, 0.25) + P
NULL = sum(__LINE__)
define = __LINE__ / NULL
output define, while
"""


def test_c_ident_and_c_string() -> None:
    assert c_ident("while", "v_") == "v_while"
    assert "__" not in c_ident("__LINE__", "v_")
    assert c_ident("a b;c", "v_") == "v_a_b_c"
    assert c_string('x"; system("rm -rf /"); //') == (
        '"x\\042\\073 system(\\042rm -rf /\\042)\\073 //"'
    )
    assert c_string("é\n") == '"\\303\\251\\012"'


def test_hostile_names_build_and_run(tmp_path: Path) -> None:
    need_mpicxx()
    p = load_program(HOSTILE, "hostile.coco")
    files = emit(p, unscheduled(p), target="cpu").files
    declared = re.compile(
        r"\b(?:float|double|int64_t|auto|void)\*?\s+(return|while|NULL|define|main|__LINE__)\b"
    )
    for n, text in files.items():
        if n.endswith((".cpp", ".h")) and n != "cocoviz_runtime.h":
            assert not declared.search(text), declared.search(text)
    write(tmp_path, files)
    res = make(tmp_path)
    assert res.returncode == 0 and not diagnostics(res), "\n".join(diagnostics(res)) or res.stderr
    run = subprocess.run(
        [str(tmp_path / "run.sh"), "--check", "--iters", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["program"] == "int"
