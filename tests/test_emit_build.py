"""`cocoviz emit --build`: runs make in the output directory; a compiler error is a
build failure (exit 5) that shows the compiler's error lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from emit_support import need_mpicxx

from cocoviz.cli import main
from cocoviz.emit.emitter import build
from cocoviz.errors import BuildError, ExitCode


def test_emit_build_cpu(tmp_path: Path) -> None:
    need_mpicxx()
    out = tmp_path / "o"
    argv = ["emit", "sgd", "--schedule", "fused", "-o", str(out), "--target", "cpu"]
    assert main([*argv, "-D", "N=64", "--ranks", "2", "--build"]) == 0
    assert (out / "sgd").exists()


def test_compiler_errors_are_reported_as_build_failures(tmp_path: Path, capsys) -> None:
    need_mpicxx()
    out = tmp_path / "o"
    assert main(["emit", "sgd", "-o", str(out), "--target", "cpu", "-D", "N=64"]) == 0
    src = out / "sgd.cpp"
    src.write_text(src.read_text() + "\nthis is not C++;\n")
    with pytest.raises(BuildError) as err:
        build(out)
    assert err.value.exit_code == ExitCode.BUILD
    assert "sgd.cpp" in err.value.message and "error" in err.value.message
