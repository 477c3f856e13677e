"""Test-session setup: the parser cache and the `build` marker.

The parser cache (cocoviz/ir/syntax.py) goes to a directory of this session, so that
the tests, and the commands they start, never write into the user's ~/.cache.

The `build` marker (pyproject.toml): tests that compile or run emitted code, start MPI
processes or run the CUDA emulation. `python -m pytest -m "not build"` is the fast subset
for contributors (README.md says how long each takes); `python -m pytest`, which .ci/run
runs, still runs everything.

Whole modules are marked here, or single tests of modules that mix builds with quick
checks; a test may also carry `@pytest.mark.build` itself (tests/test_readme.py does).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


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
    ]
)
"""Modules every test of which builds or launches something."""

BUILD_TESTS = {
    "test_emit_cuda": {
        "test_cuda_compiles_and_links_warning_free",
        "test_cuda_avg_is_a_sum_and_a_division_kernel",
    },
    "test_emit_build": {
        "test_emit_build_cpu",
        "test_compiler_errors_are_reported_as_build_failures",
    },
    "test_emit_names": {"test_hostile_names_build_and_run"},
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        function = getattr(item, "originalname", None) or item.name
        if is_build(module, function):
            item.add_marker(pytest.mark.build)
