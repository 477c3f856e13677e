"""The test suite checks itself: the `build` marker is on every test that builds or
launches emitted code (tests/conftest.py's launch guard fails the others), and a missing
tool skips only through `need_tool`, which fails instead under COCOVIZ_REQUIRE_NVCC=1 /
COCOVIZ_REQUIRE_MPI=1 (README.md, "Tests")."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BUILD_MODULES, is_build, launch_guard, need_tool

TESTS = Path(__file__).resolve().parent

# ------------------------------------------------------------------ the launch guard


def _take_log() -> str:
    """The guard's record of this test's refused launches, emptied (so that the fixture
    does not fail this test for launches it made on purpose)."""
    log = Path(os.environ[launch_guard.LOG_VAR])
    text = log.read_text() if log.exists() else ""
    log.write_text("")
    return text


def test_a_test_not_marked_build_cannot_run_make() -> None:
    with pytest.raises(PermissionError, match="not marked `build` runs make"):
        subprocess.run(["make", "-C", "/nonexistent-dir"], capture_output=True, check=False)
    assert "runs make" in _take_log()


def test_nor_can_a_python_process_it_starts() -> None:
    code = "import subprocess; subprocess.run(['mpiexec', '-n', '2', 'true'])"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode != 0
    assert "PermissionError" in res.stderr, res.stderr
    assert "runs mpiexec" in _take_log()


def test_nor_a_shell_command_that_builds() -> None:
    with pytest.raises(PermissionError):
        subprocess.run("cd /nonexistent-dir && make", shell=True, check=False)
    with pytest.raises(PermissionError):
        os.system("nvcc -c x.cu")
    assert _take_log().count("\n") == 2


def test_toolchain_probes_and_other_programs_pass() -> None:
    forbidden = launch_guard.forbidden
    assert forbidden(["nvcc", "--version"]) is None
    assert forbidden(["/usr/local/cuda/bin/nvcc", "-dryrun", "-E", "-x", "cu", os.devnull]) is None
    assert forbidden(["mpicxx", "-show"]) is None
    assert forbidden(["git", "status"]) is None
    assert forbidden([sys.executable, "-c", "pass"]) is None
    assert forbidden(["g++-12", "-O2", "x.cpp"]) is not None
    assert forbidden(["/tmp/tree/run.sh", "--iters", "1"]) is not None
    assert forbidden(["bash", "-c", "./run.sh --emulate"]) is not None


@pytest.mark.build
def test_a_build_test_is_not_guarded() -> None:
    assert launch_guard.LOG_VAR not in os.environ


# Helpers that build or launch: a test calling one of them must be marked `build`.
BUILDERS = frozenset(
    {
        "need_nvcc",
        "need_mpicxx",
        "make",
        "build_emulated",
        "build_emulated_program",
        "emulation_lib",
        "run_and_compare",
        "run_mpi",
        "run_emulated",
    }
)
# tests that call a builder only on a path that is marked otherwise (pytest.param marks)
CONDITIONAL = {("test_readme", "test_readme_block_runs_as_documented")}


def _module_marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "mark.build" in ast.unparse(node.value)
    return False


def _calls(fn: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def test_every_test_calling_a_builder_is_marked_build() -> None:
    unmarked = []
    for path in sorted(TESTS.glob("test_*.py")):
        module = path.stem
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if module in BUILD_MODULES or _module_marked(tree):
            continue
        for fn in tree.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if not fn.name.startswith("test") or (module, fn.name) in CONDITIONAL:
                continue
            used = _calls(fn) & BUILDERS
            marked = any("mark.build" in ast.unparse(d) for d in fn.decorator_list)
            if used and not marked and not is_build(module, fn.name):
                unmarked.append(f"{module}::{fn.name} calls {', '.join(sorted(used))}")
    assert not unmarked, "\n".join(unmarked)


# ------------------------------------------------------------------ REQUIRE means no skip


def test_need_tool_skips_or_fails_under_require(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("COCOVIZ_REQUIRE_NVCC", "COCOVIZ_REQUIRE_MPI"):
        monkeypatch.delenv(var, raising=False)
    need_tool(True, "nvcc")  # found: nothing happens
    with pytest.raises(pytest.skip.Exception):
        need_tool(None, "nvcc")
    monkeypatch.setenv("COCOVIZ_REQUIRE_MPI", "1")
    with pytest.raises(pytest.fail.Exception, match="COCOVIZ_REQUIRE_MPI"):
        need_tool(None, "mpiexec", mpi=True)
    with pytest.raises(pytest.skip.Exception):
        need_tool(None, "nvcc")  # REQUIRE_MPI does not ask for nvcc
    monkeypatch.setenv("COCOVIZ_REQUIRE_NVCC", "1")
    with pytest.raises(pytest.fail.Exception, match="COCOVIZ_REQUIRE_NVCC"):
        need_tool(None, "nvcc")


# Skips that have nothing to do with a tool: the platform or the checkout lacks something
# no REQUIRE variable promises. (file, a fragment of the skip's source)
PLATFORM_SKIPS = {
    ("test_cli_help.py", "/dev/full"),
    ("test_hardening_input.py", "/dev/zero"),
    ("test_hardening_input.py", "HAS_REFERENCE"),
    ("test_hardening_mpi.py", "/proc/self/environ"),
    ("test_hardening_mpi.py", "the hard cap"),
    ("test_hardening_outputs.py", "mknod needs privileges"),
    ("test_hardening_runsh.py", "/proc/self/environ"),
    ("test_hardening_writes.py", "/proc/locks"),
    ("test_mpi_overlap_groups.py", "/proc/self/environ"),
    ("test_tune_regions.py", "needs git"),
    ("test_tune_regions.py", "is not in this checkout's history"),
}
TOOL_WORDS = re.compile(r"mpi|nvcc|\bmake\b|compil|toolchain|\+\+|cuda|nccl|cublas|emulat", re.I)
SKIPS = re.compile(r"\b(skip|skipif|importorskip)\s*\(")


def _skip_calls() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and SKIPS.search(ast.unparse(n.func) + "("):
                out.append((path.name, n.lineno, ast.unparse(n)))
    return out


def test_no_tool_skip_outside_need_tool() -> None:
    """Every skip is `need_tool`'s or a platform skip listed above whose text names no
    tool; under COCOVIZ_REQUIRE_* no test can skip for lack of nvcc, MPI or a compiler."""
    calls = _skip_calls()
    assert any(f == "conftest.py" for f, _, _ in calls)  # need_tool's own skip is seen
    stray = []
    for f, line, src in calls:
        if f == "conftest.py" and "set COCOVIZ_REQUIRE_NVCC=1 to make this a failure" in src:
            continue
        if f == Path(__file__).name:
            continue  # the pytest.raises(pytest.skip.Exception) checks above
        allowed = any(f == af and frag in src for af, frag in PLATFORM_SKIPS)
        if not allowed or TOOL_WORDS.search(src):
            stray.append(f"{f}:{line}: {src}")
    assert not stray, "skip through conftest.need_tool instead:\n" + "\n".join(stray)
