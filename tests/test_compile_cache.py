"""The tests' compiler cache (tests/compile_cache.py): a compile of the same sources and
arguments is served from the cache with the compiler's output replayed; a change of code,
of a header beside the source or of an argument compiles anew; a comment-only line does
not; a failed compile is not kept."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from compile_cache import normalized
from conftest import need_tool

WRAPPER = Path(__file__).resolve().parent / "compile_cache.py"


def _compile(cache: Path, tree: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cxx = shutil.which("g++")
    need_tool(cxx, "a C++ compiler (g++)", mpi=True)
    cmd = [sys.executable, str(WRAPPER), str(cache), "--", str(cxx), "-Wall", *flags]
    cmd += ["-c", "prog.cpp", "-o", "prog.o"]
    return subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)


def _entries(cache: Path) -> int:
    return sum(1 for p in cache.iterdir() if p.is_dir())


@pytest.mark.build
def test_a_compile_is_kept_and_replayed(tmp_path: Path) -> None:
    cache, tree = tmp_path / "cache", tmp_path / "tree"
    cache.mkdir()
    tree.mkdir()
    (tree / "prog.h").write_text("inline int twice(int x) { return 2 * x; }\n")
    src = '// prog.cpp, mode {}\n#include "prog.h"\nint f() {{ int unused; return twice(1); }}\n'
    (tree / "prog.cpp").write_text(src.format("a"))
    first = _compile(cache, tree)
    assert first.returncode == 0 and "unused" in first.stderr, first.stderr
    assert _entries(cache) == 1
    (tree / "prog.o").unlink()
    (tree / "prog.cpp").write_text(src.format("b"))  # a comment-only line: the same compile
    again = _compile(cache, tree)
    assert again.returncode == 0 and again.stderr == first.stderr
    assert (tree / "prog.o").exists() and _entries(cache) == 1
    (tree / "prog.h").write_text("inline int twice(int x) { return x + x; }\n")  # a header
    assert _compile(cache, tree).returncode == 0 and _entries(cache) == 2
    assert _compile(cache, tree, "-O1").returncode == 0 and _entries(cache) == 3  # a flag
    (tree / "prog.cpp").write_text(src.format("b").replace("return", "retur"))
    assert _compile(cache, tree).returncode != 0 and _entries(cache) == 3  # failed: not kept


def test_only_whole_comment_lines_are_blanked() -> None:
    text = b"// a\nint x; // b\n  // c\n#define M \\\n// d\n// e \\\nint y;\n"
    assert normalized(text) == b"\nint x; // b\n\n#define M \\\n// d\n// e \\\nint y;\n"
    raw = b'// a\nconst char* s = R"(\n// b\n)";\n'
    assert normalized(raw) == raw
