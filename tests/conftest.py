"""Test-session setup: the parser cache and the `build` marker.

The parser cache (cocoviz/ir/syntax.py) goes to a directory of this session, so that
the tests, and the commands they start, never write into the user's ~/.cache.

The `build` marker (pyproject.toml): tests that compile or run emitted code, start MPI
processes or run the CUDA emulation. `python -m pytest -m "not build"` is the fast subset
for contributors (README.md says how long each takes); `python -m pytest`, which .ci/run
runs, still runs everything.

Whole modules are marked here, or single tests of modules that mix builds with quick
checks; a test may also carry `@pytest.mark.build` itself (tests/test_readme.py does).

The suite checks the marker: a test that is not marked `build` runs under the launch
guard (tests/launch_guard/sitecustomize.py), in its own process and in the Python
processes it starts, and fails when it launches a compiler, make, an MPI launcher or
emitted code.

Missing tools: every test that needs nvcc, MPI or a C++ toolchain calls `need_tool`,
which skips — or fails, when COCOVIZ_REQUIRE_NVCC=1 / COCOVIZ_REQUIRE_MPI=1 says the
tools must be there (.ci/run sets both). tests/test_suite_checks.py checks that no other
skip path exists.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# A suite started in the background of a non-interactive shell (`python -m pytest &`)
# inherits SIGINT ignored (POSIX), and so would every process it starts; the tests of
# Ctrl-C (run --mpi, run.sh, tune) need it delivered, as a terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# and a suite started under nohup inherits SIGHUP ignored, which the SIGHUP cases of the
# launcher tests send
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

GUARD_DIR = Path(__file__).resolve().parent / "launch_guard"
_spec = importlib.util.spec_from_file_location(
    "cocoviz_launch_guard", GUARD_DIR / "sitecustomize.py"
)
assert _spec is not None and _spec.loader is not None
launch_guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch_guard)


def _required(var: str) -> bool:
    return os.environ.get(var, "") not in ("", "0")


def tools_required(mpi: bool = False) -> str | None:
    """The COCOVIZ_REQUIRE_* variable that makes a missing tool a failure, or None.
    COCOVIZ_REQUIRE_NVCC requires every tool; COCOVIZ_REQUIRE_MPI the MPI and C++ ones
    (`mpi=True`)."""
    if _required("COCOVIZ_REQUIRE_NVCC"):
        return "COCOVIZ_REQUIRE_NVCC"
    if mpi and _required("COCOVIZ_REQUIRE_MPI"):
        return "COCOVIZ_REQUIRE_MPI"
    return None


def need_tool(found: object, what: str, *, mpi: bool = False) -> None:
    """The one way a test gives up for lack of a tool: nothing when `found` is true;
    otherwise a failure when a COCOVIZ_REQUIRE_* variable asks for the tool (`mpi=True`:
    an MPI or C++ tool, which COCOVIZ_REQUIRE_MPI also asks for), else a skip."""
    if found:
        return
    var = tools_required(mpi)
    if var is not None:
        pytest.fail(f"{what} is required ({var}=1) but was not found")
    pytest.skip(f"{what} not found (set COCOVIZ_REQUIRE_NVCC=1 to make this a failure)")


def has_mpiexec() -> bool:
    """mpiexec next to this Python (the mpich wheel) or on PATH."""
    import sys

    return Path(sys.executable).with_name("mpiexec").exists() or shutil.which("mpiexec") is not None


@pytest.fixture
def mpi_required() -> None:
    """A test that launches MPI processes: skip without mpiexec (fail under REQUIRE)."""
    need_tool(has_mpiexec(), "mpiexec", mpi=True)


def pytest_configure(config: pytest.Config) -> None:
    config._cocoviz_cache = tempfile.mkdtemp(prefix="cocoviz-test-cache-")  # type: ignore[attr-defined]
    os.environ["COCOVIZ_CACHE_DIR"] = config._cocoviz_cache  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(getattr(config, "_cocoviz_cache", ""), ignore_errors=True)


BUILD_MODULES = frozenset(
    [
        "test_emit_cpu",  # builds and runs every sample on the CPU target
        "test_emit_emulate",  # the emulation build and runs of every sample
        "test_emulate_mutations",  # emulation builds of seeded mistakes
        "test_mpi_run",  # `cocoviz run --mpi`
        "test_hardening_mpi",  # MPI launches, signals and timeouts
        "test_runtime_headers",  # compiles the runtime headers against numpy
        "test_emit_device_ptx",  # nvcc builds PTX of the device kernels
        "test_hardening_runsh",  # runs emitted trees' run.sh under the emulation
        "test_emulate_order",  # emulation builds, run under mpiexec
    ]
)
"""Modules every test of which builds or launches something."""

BUILD_TESTS = {
    "test_emit_cuda": {
        "test_cuda_compiles_and_links_warning_free",
        "test_cuda_avg_is_a_sum_and_a_division_kernel",
    },
    "test_emit_names": {"test_hostile_names_build_and_run"},
    "test_emit_build": {
        "test_emit_build_cpu",
        "test_compiler_errors_are_reported_as_build_failures",
        "test_a_missing_nvcc_is_named_with_a_hint",  # runs make on an emitted tree
        "test_a_missing_mpicxx_gets_an_mpi_hint",  # runs make
    },
    "test_batched_matmul": {
        "test_cpu_target_builds_runs_check_and_matches_reference",
        "test_cuda_builds_without_diagnostics",
        "test_cuda_emulation_runs_check_and_matches_reference",
        "test_mpi_run_matches_reference",
    },
    "test_tui_app": {"test_emit_writes_a_cpu_tree_that_builds"},
    "test_headless_edges": {
        "test_run_sh_takes_mpiexec_from_path_unless_mpiexec_is_set",  # runs an emitted run.sh
    },
    "test_emulate_graphs": {
        "test_graph_and_host_launches_check_and_agree",
        "test_capture_failure_falls_back_to_the_host",
        "test_emulation_refuses_what_cuda_refuses_during_capture",
        "test_graph_launch_checks_what_a_direct_run_checks",
    },
    "test_toolchain": {
        "test_nvcc_builds_nccl_cublas_mpi_program_sm90",
        "test_makefile_variables_build_sm80",
        "test_mpicxx_openmp_program_runs_on_4_ranks",
    },
}
"""Single tests (by function name) of modules that are otherwise quick."""


def is_build(module: str, function: str) -> bool:
    return module in BUILD_MODULES or function in BUILD_TESTS.get(module, ())


def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of this session's caches, shared by its xdist workers: the parent of a
    worker's base temp directory (pytest-<n>), or the base temp directory itself without
    xdist (its parent, pytest-of-<user>, outlives the session)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def emulation_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's emulation builds: the runtime library and the emulated trees
    (tests/emit_support.py, `build_emulated`)."""
    return session_dir(tmp_path_factory) / "emulation"


@pytest.fixture(scope="session")
def emu_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return emulation_cache(tmp_path_factory)


FIRST_MODULES = ("test_calibrate_local", "test_emit_cuda", "test_toolchain")
"""Modules that run first, in this order: the longest test (`calibrate --local`, about 90 s
of micro-runs), then the nvcc builds (several seconds each)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        function = getattr(item, "originalname", None) or item.name
        if is_build(module, function):
            item.add_marker(pytest.mark.build)
    # Longest first: xdist hands the tests out in this order, so the modules that build or
    # launch go first and the quick ones fill in at the end, where a long test would run
    # alone on one worker. A module stays in one piece (its module-scoped fixtures are set
    # up once), and the order within each group is the collection's.
    rank: dict[Path, int] = {}
    for item in items:
        module = item.path.stem
        if module in FIRST_MODULES:
            r = FIRST_MODULES.index(module)
        else:
            r = len(FIRST_MODULES) + (item.get_closest_marker("build") is None)
        rank[item.path] = min(rank.get(item.path, r), r)
    items.sort(key=lambda item: rank[item.path])


@pytest.fixture(autouse=True)
def _launch_guard(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory
) -> Iterator[None]:
    """Fail a test not marked `build` that compiles code or launches MPI or emitted code
    (the launch guard refuses the launch; this makes the refusal a failure whatever the
    code under test did with it)."""
    if request.node.get_closest_marker("build") is not None:
        yield
        return
    log = tmp_path_factory.mktemp("launch-guard") / "launches.log"
    monkeypatch.setenv(launch_guard.LOG_VAR, str(log))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(GUARD_DIR) + (os.pathsep + path if path else ""))
    launch_guard.install()
    yield
    if log.exists() and log.read_text().strip():
        pytest.fail(
            "this test is not marked `build` but launched a build, MPI or emitted code "
            "(mark it @pytest.mark.build, or add it to tests/conftest.py):\n" + log.read_text(),
            pytrace=False,
        )
