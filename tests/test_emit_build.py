"""`cocoviz emit --build`: runs make in the output directory; a compiler error is a
build failure (exit 5) that shows the compiler's error lines."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import need_tool
from emit_support import need_mpicxx

from cocoviz.cli import main
from cocoviz.emit.emitter import build, missing_tools
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


def _path_without(tool: str) -> str:
    """$PATH without the directories that hold `tool`."""
    keep = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d) / tool).exists()
    ]
    return os.pathsep.join(keep)


def test_a_missing_nvcc_is_named_with_a_hint(tmp_path: Path, monkeypatch, capsys) -> None:
    """Without nvcc, `emit --build` shows make's own diagnostic (not only `Error 127`) and
    says what to install or run instead."""
    need_tool(shutil.which("make"), "make", mpi=True)
    monkeypatch.setenv("PATH", _path_without("nvcc"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("NVCC", str(tmp_path / "no-cuda" / "bin" / "nvcc"))
    assert shutil.which("nvcc") is None
    out = tmp_path / "o"
    argv = ["emit", "sgd", "-o", str(out), "-D", "N=64", "--ranks", "2", "--build"]
    assert main(argv) == ExitCode.BUILD
    err = capsys.readouterr().err
    missing = f"{tmp_path / 'no-cuda' / 'bin' / 'nvcc'}: No such file or directory"
    assert missing in err
    assert "Error 127" in err
    assert "install the CUDA toolkit" in err
    assert "--emulate" in err and "--target cpu" in err


@pytest.mark.parametrize(
    ("output", "tools"),
    [
        (
            "make: /opt/cuda/bin/nvcc: No such file or directory\nmake: *** [Makefile:42: main.o] "
            "Error 127\n",
            ["/opt/cuda/bin/nvcc"],
        ),
        ("/bin/sh: 1: mpicxx: not found\nmake: *** [Makefile:9: x] Error 127\n", ["mpicxx"]),
        ("make[1]: g++: No such file or directory\n", ["g++"]),
        ("bash: line 1: nvcc: command not found\n", ["nvcc"]),
        # a compiler's missing header is an error line of its own, not a missing tool
        ("main.cu:1:10: fatal error: foo.h: No such file or directory\n", []),
    ],
)
def test_missing_tools_are_read_from_make_output(output: str, tools: list[str]) -> None:
    assert missing_tools(output) == tools


def test_a_missing_mpicxx_gets_an_mpi_hint(tmp_path: Path) -> None:
    need_tool(shutil.which("make"), "make", mpi=True)
    (tmp_path / "Makefile").write_text("all:\n\tno-such-dir/mpicxx -c x.cpp\n")
    with pytest.raises(BuildError) as err:
        build(tmp_path)
    assert "no-such-dir/mpicxx: No such file or directory" in err.value.message
    assert err.value.hint is not None and "pip install mpich" in err.value.hint
