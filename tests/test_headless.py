"""Everything outside `cocoviz/tui/` imports without Textual, and nothing imports mpi4py at
module scope (docs/architecture.md, layers).

Every module of the package is found with `pkgutil.walk_packages` (and checked against
the `.py` files on disk, so that a directory the walk cannot see fails here instead of
going unchecked). One fresh interpreter, in which `textual` and `mpi4py` cannot be
imported, imports each module outside `cocoviz.tui`; a module that needs either, directly
or through another module, fails with the chain of imports that reached it.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import cocoviz

PACKAGE_DIR = Path(cocoviz.__file__).resolve().parent
TUI = "cocoviz.tui"
BLOCKED = ("textual", "mpi4py")
SCRIPTS = {"cocoviz.__main__", "cocoviz.cli.__main__", "cocoviz.tui.__main__"}
"""`python -m` entry points: importing one runs the program, so only their imports are
checked (they import `cocoviz.cli` and `cocoviz.tui.app`, which the walk covers)."""


def _walked(unreadable: list[str] | None = None) -> list[str]:
    """Every module name of the package; `unreadable` collects the packages the walk could
    not import (so could not look inside)."""
    sink = unreadable if unreadable is not None else []
    found = pkgutil.walk_packages(cocoviz.__path__, "cocoviz.", onerror=sink.append)
    return ["cocoviz"] + sorted(m.name for m in found)


def _on_disk() -> set[str]:
    out: set[str] = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.add(".".join(parts))
    return out


def _is_tui(module: str) -> bool:
    return module == TUI or module.startswith(TUI + ".")


# Runs in the fresh interpreter: argv[1] is the JSON list of modules to import. Prints a
# JSON object: failures (module -> [the blocked package, then the cocoviz modules being
# imported when it was asked for, outermost first]), errors (module -> any other
# exception its import raised) and the blocked packages loaded in the end.
_PROBE = r"""
import importlib, json, sys, traceback

BLOCKED = {blocked!r}


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked for the headless check: {{name}}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
failures = {{}}
errors = {{}}
for module in json.loads(sys.argv[1]):
    try:
        importlib.import_module(module)
    except Exception as err:
        if not (isinstance(err, ImportError) and (err.name or "").split(".")[0] in BLOCKED):
            where = traceback.extract_tb(err.__traceback__)[-1]
            errors[module] = f"{{type(err).__name__}}: {{err}} ({{where.filename}}:{{where.lineno}})"
            continue
        chain = []
        for frame, _ in traceback.walk_tb(err.__traceback__):
            name = frame.f_globals.get("__name__", "")
            if name.startswith("cocoviz") and frame.f_code.co_name == "<module>":
                if name not in chain:
                    chain.append(name)
        failures[module] = [err.name] + chain
import cocoviz.cli

cocoviz.cli.build_parser()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({{"failures": failures, "errors": errors, "loaded": loaded}}))
"""


def test_the_walk_sees_every_module() -> None:
    unreadable: list[str] = []
    walked = _walked(unreadable)
    assert set(walked) == _on_disk(), (
        "modules on disk that pkgutil.walk_packages does not find (a directory without "
        f"__init__.py, or a package that fails to import: {unreadable}): "
        f"{sorted(_on_disk() - set(walked))}"
    )
    # The modules the old hand-written list missed are among them.
    for m in (
        "cocoviz.ir.transforms",
        "cocoviz.schedule",
        "cocoviz.sim.timeline",
        "cocoviz.emit.render",
        "cocoviz.exec.reference",
        "cocoviz.numerics",
        "cocoviz.tui.widgets.timeline",
    ):
        assert m in walked


def test_nothing_outside_the_tui_imports_textual_or_mpi4py() -> None:
    modules = [m for m in _walked() if not _is_tui(m) and m not in SCRIPTS]
    code = _PROBE.format(blocked=BLOCKED)
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(modules)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    problems = [
        f"{m} imports {info[0]} (through {' → '.join(info[1:] + [info[0]])})"
        for m, info in sorted(report["failures"].items())
    ]
    assert not problems, "headless modules need a blocked package:\n" + "\n".join(problems)
    broken = [f"{m}: {e}" for m, e in sorted(report["errors"].items())]
    assert not broken, "modules that fail to import:\n" + "\n".join(broken)
    assert report["loaded"] == [], f"imported anyway: {report['loaded']}"
