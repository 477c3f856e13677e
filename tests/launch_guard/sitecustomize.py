"""The launch guard of the fast subset (tests/conftest.py installs it).

A test not marked `build` (pyproject.toml) compiles nothing and launches no MPI job and
no emitted program. The guard refuses such a launch — a compiler, make, an MPI
launcher, an emitted tree's run.sh or a binary built outside the system and this Python
— records it in the file named by COCOVIZ_TEST_LAUNCH_LOG, and raises PermissionError;
the conftest fixture then fails the test whatever the code under test did with the
error. Version probes (`nvcc --version`, `mpicxx -show`, `nvcc -dryrun`), which the
toolchain search runs (cocoviz/emit/toolchain.py), are not builds and pass.

This file is also the `sitecustomize` of Python processes that such a test starts
(conftest puts this directory first on PYTHONPATH), so `python -m cocoviz emit --build`
in a child process is refused as well. It does nothing unless the variable is set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

LOG_VAR = "COCOVIZ_TEST_LAUNCH_LOG"

BUILD_TOOLS = frozenset(
    {
        "make", "gmake", "cmake", "ninja",
        "nvcc", "cc", "c++", "gcc", "g++", "clang", "clang++", "ld",
        "mpicc", "mpicxx", "mpic++", "mpiexec", "mpirun", "mpiexec.hydra", "hydra_pmi_proxy",
    }
)  # fmt: skip
"""Programs whose launch is a build or an MPI job (by base name, versions stripped)."""

PROBES = frozenset(
    {
        "--version", "-v", "-V", "-dumpversion", "-dumpfullversion", "--list-gpu-code",
        "-show", "--showme", "-showme", "-compile-info", "-link-info", "--help", "-h",
        "-dryrun", "-E", "-x", "cu", os.devnull,
    }
)  # fmt: skip
"""Arguments of a toolchain probe: a launch whose arguments all are among these builds
nothing (cocoviz/emit/toolchain.py runs `nvcc -dryrun -E -x cu /dev/null`)."""

_SHELL_BUILD = re.compile(
    r"(^|[\s;&|/(])(make|nvcc|mpicxx|mpicc|mpiexec|mpirun|[gc]\+\+|run\.sh)\b"
)
_SYSTEM = ("/usr/", "/bin/", "/sbin/", "/lib", "/opt/", "/etc/", "/proc/")


def _base(argv0: str) -> str:
    name = os.path.basename(argv0)
    return re.sub(r"-\d+(\.\d+)*$", "", name)  # g++-12 → g++


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def forbidden(argv: object) -> str | None:
    """Why launching `argv` is a build or a run of emitted code; None if it is not."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        args = [os.fsdecode(argv)]
    else:
        try:
            args = [os.fsdecode(a) for a in argv]  # type: ignore[union-attr]
        except TypeError:
            return None
    if not args:
        return None
    exe = _base(args[0])
    rest = args[1:]
    if exe in BUILD_TOOLS:
        if rest and all(a in PROBES for a in rest):
            return None
        return f"runs {exe} (a compiler, make or an MPI launcher)"
    if exe in ("sh", "bash", "dash", "zsh") and "-c" in rest:
        script = " ".join(rest[rest.index("-c") + 1 :][:1])
        if _SHELL_BUILD.search(script):
            return f"runs a shell command that builds or launches: {script[:120]!r}"
        return None
    if exe == "run.sh":
        return "runs an emitted tree's run.sh"
    # a venv's python is a link to the system's: resolved, it is not emitted code
    path = os.path.realpath(args[0]) if os.sep in args[0] else None
    if path is not None and _is_elf(path):
        prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
        prefixes.add(os.path.dirname(os.path.realpath(sys.executable)))
        if not path.startswith(_SYSTEM) and not any(path.startswith(p + os.sep) for p in prefixes):
            return (
                f"runs the binary {path}, built outside the system and this Python (emitted code)"
            )
    return None


def _refuse(argv: object) -> None:
    why = forbidden(argv)
    if why is None:
        return
    log = os.environ.get(LOG_VAR)
    if not log:
        return
    shown = argv if isinstance(argv, str) else " ".join(map(str, argv))  # type: ignore[call-overload]
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"pid {os.getpid()}: {why}: {shown}\n")
    raise PermissionError(
        f"a test not marked `build` {why}: {shown} (mark it @pytest.mark.build; tests/conftest.py)"
    )


_installed = False


def install() -> None:
    """Wrap every way this process starts a program (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded_execute_child(self, args, executable, *rest, **kw):  # type: ignore[no-untyped-def]
        shell = rest[7] if len(rest) > 7 else kw.get("shell", False)
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if shell:
            _refuse(["sh", "-c", os.fsdecode(argv[0])])
        else:
            _refuse([executable, *argv[1:]] if executable else argv)
        return execute_child(self, args, executable, *rest, **kw)

    subprocess.Popen._execute_child = guarded_execute_child  # type: ignore[attr-defined]

    def wrap(name: str, argv_of):  # type: ignore[no-untyped-def]
        original = getattr(os, name, None)
        if original is None:
            return

        def guarded(*a, **kw):  # type: ignore[no-untyped-def]
            _refuse(argv_of(a))
            return original(*a, **kw)

        setattr(os, name, guarded)

    wrap("system", lambda a: ["sh", "-c", a[0]])
    wrap("posix_spawn", lambda a: [a[0], *list(a[1])[1:]])
    wrap("posix_spawnp", lambda a: [a[0], *list(a[1])[1:]])
    for name in ("execv", "execve", "execvp", "execvpe"):
        wrap(name, lambda a: [a[0], *list(a[1])[1:]])


if os.environ.get(LOG_VAR):
    install()
