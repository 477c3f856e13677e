"""The import layers of the package (docs/architecture.md, layers), checked on the source.

Every import in `cocoviz/**.py` counts: module-level, function-local, under
``TYPE_CHECKING``, and ``importlib.import_module("…")`` with a literal name. Each module
belongs to a unit (a subpackage such as ``cocoviz.sim``, or a top-level module such as
``cocoviz.errors``); a unit may import its own modules and the units of lower layers.
Units sharing a layer may import each other only where the layer says so, and nothing
may form an import cycle between units. A violation names the file and line, the
importing and the imported module, and the rule.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import cocoviz

PACKAGE_DIR = Path(cocoviz.__file__).resolve().parent
ROOT = PACKAGE_DIR.parent

ENTRY_POINTS = "<python -m entry points>"
"""The unit of every ``__main__`` module: a script, on top of everything, that nothing
imports."""


@dataclass(frozen=True)
class Layer:
    name: str
    units: frozenset[str]
    peers_import_each_other: bool = False
    """Whether two different units of this layer may import each other."""


# The layer order of docs/architecture.md, bottom first. A unit imports only units of
# lower layers (and, where `peers_import_each_other`, those of its own layer).
LAYERS: tuple[Layer, ...] = (
    Layer("errors", frozenset({"cocoviz", "cocoviz.errors"})),
    Layer(
        "neutral",
        frozenset(
            {
                "cocoviz.fsio",
                "cocoviz.style",
                "cocoviz.timefmt",
                "cocoviz.samples",
                "cocoviz.batching",
            }
        ),
    ),
    Layer("ir", frozenset({"cocoviz.ir"})),
    Layer(
        "numerics (dtype facts shared by executors and emitters)", frozenset({"cocoviz.numerics"})
    ),
    Layer("simulator and executors", frozenset({"cocoviz.sim", "cocoviz.exec"})),
    Layer("schedule", frozenset({"cocoviz.schedule"})),
    Layer("emitter", frozenset({"cocoviz.emit"})),
    Layer("workbench", frozenset({"cocoviz.workbench"})),
    Layer("front ends", frozenset({"cocoviz.tui", "cocoviz.cli"}), peers_import_each_other=True),
    Layer("entry points", frozenset({ENTRY_POINTS})),
)

ALLOWED: dict[tuple[str, str], str] = {
    ("cocoviz.exec.mpi_run", "cocoviz.sim.timeline"): (
        "a measured run is turned into a simulator Timeline, so that its summary and "
        "trace are the simulator's code"
    ),
    ("cocoviz.exec.mpi_run", "cocoviz.sim.workload"): "the same: the Timeline's kinds and streams",
}
"""Imports between units of one layer that are there on purpose, with the reason."""

THIRD_PARTY_ONLY_IN: dict[str, frozenset[str]] = {"textual": frozenset({"cocoviz.tui"})}
"""Third-party packages only the given units may import."""


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    importer: str
    imported: str
    annotation_only: bool = False
    """Under `if TYPE_CHECKING:`: names a type for annotations, never runs."""

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``from X import …`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path) -> Iterator[Import]:
    importer = _module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, importer, alias.name, id(node) in typing_only)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(importer, is_package, node)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                # `from cocoviz import numerics` imports the module cocoviz.numerics.
                target = sub if module.startswith("cocoviz") and _exists(sub) else module
                yield Import(path, node.lineno, importer, target, id(node) in typing_only)
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id == "import_module")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield Import(path, node.lineno, importer, node.args[0].value)


def _all_imports() -> list[Import]:
    return [
        imp
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if "__pycache__" not in path.parts
        for imp in _imports(path)
    ]


def _unit(module: str) -> str:
    """The subpackage or top-level module `module` belongs to."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return ENTRY_POINTS
    return ".".join(parts[:2])


def _layer_index() -> dict[str, int]:
    return {u: i for i, layer in enumerate(LAYERS) for u in layer.units}


def _violation(imp: Import, rank: dict[str, int]) -> str | None:
    """What is wrong with one import (None when it keeps to the layers)."""
    top = imp.imported.split(".")[0]
    if top != "cocoviz":
        allowed = THIRD_PARTY_ONLY_IN.get(top)
        if allowed is not None and _unit(imp.importer) not in allowed:
            return (
                f"{imp.where()}: {imp.importer} → {imp.imported}: only "
                f"{', '.join(sorted(allowed))} may import {top}"
            )
        return None
    src, dst = _unit(imp.importer), _unit(imp.imported)
    if src == dst and src != ENTRY_POINTS:
        return None
    if (imp.importer, imp.imported) in ALLOWED:
        return None
    if dst not in rank:
        what = "is in no layer" if _exists(imp.imported) else "does not exist"
        return (
            f"{imp.where()}: {imp.importer} → {imp.imported}: {dst} {what} "
            "(place a new package in LAYERS)"
        )
    if src not in rank:
        return f"{imp.where()}: {imp.importer} → {imp.imported}: {src} is in no layer"
    rs, rd = rank[src], rank[dst]
    if rd < rs:
        return None
    if dst == ENTRY_POINTS:
        return f"{imp.where()}: {imp.importer} → {imp.imported}: nothing imports a __main__"
    if rd == rs:
        if LAYERS[rs].peers_import_each_other:
            return None
        return (
            f"{imp.where()}: {imp.importer} → {imp.imported}: {src} and {dst} share the "
            f"'{LAYERS[rs].name}' layer, whose units do not import each other"
        )
    return (
        f"{imp.where()}: {imp.importer} → {imp.imported}: {src} ('{LAYERS[rs].name}' layer) "
        f"imports {dst} from the higher '{LAYERS[rd].name}' layer"
    )


def _cycles(imports: list[Import], unit: Callable[[str], str] | None = None) -> list[list[str]]:
    """Strongly connected groups of two or more units (Tarjan's algorithm); `unit` maps
    a module to the node it counts as (default: its unit, `_unit`)."""
    unit = unit or _unit
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.imported.split(".")[0] != "cocoviz":
            continue
        a, b = unit(imp.importer), unit(imp.imported)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle_edges(imports: list[Import], group: list[str]) -> list[str]:
    members = set(group)
    return sorted(
        f"{imp.where()}: {imp.importer} → {imp.imported}"
        for imp in imports
        if imp.imported.split(".")[0] == "cocoviz"
        and _unit(imp.importer) in members
        and _unit(imp.imported) in members
        and _unit(imp.importer) != _unit(imp.imported)
    )


def test_every_unit_has_a_layer() -> None:
    rank = _layer_index()
    units = {_unit(_module_name(p)) for p in PACKAGE_DIR.rglob("*.py")}
    missing = sorted(units - set(rank))
    assert not missing, f"units in no layer of LAYERS: {missing}"


def test_imports_keep_to_the_layers() -> None:
    rank = _layer_index()
    found = list(
        dict.fromkeys(v for imp in _all_imports() if (v := _violation(imp, rank)) is not None)
    )
    assert not found, f"{len(found)} import(s) break the layering:\n" + "\n".join(found)


def test_no_import_cycles_between_units() -> None:
    imports = _all_imports()
    cycles = _cycles(imports)
    text = [
        " ⇄ ".join(group) + ":\n    " + "\n    ".join(_cycle_edges(imports, group))
        for group in cycles
    ]
    assert not cycles, "import cycles between units:\n" + "\n".join(text)


MODULES_WITHOUT_CYCLES = (
    "cocoviz.cli",
    "cocoviz.emit",
    "cocoviz.exec",
    "cocoviz.ir",
    "cocoviz.schedule",
    "cocoviz.sim",
    "cocoviz.tui",
    "cocoviz.workbench",
)
"""Units inside which no two modules import each other at run time (directly or round a
longer loop): a shared piece lives in a module below both (`cocoviz.tui.host`,
`cocoviz.ir.syntax_tree`, `cocoviz.ir.transforms.base`, `cocoviz.sim.predict` above the
simulator and its warnings). An import under `if TYPE_CHECKING:` only names a type for an
annotation and is not counted."""


def _module_cycles(imports: list[Import], package: str) -> list[list[str]]:
    """Import cycles between the modules of `package` (a package imports its modules
    through its `__init__`, which is no module of a cycle here)."""
    inside = [
        imp
        for imp in imports
        if imp.importer.startswith(package + ".")
        and imp.imported.startswith(package + ".")
        and not imp.annotation_only
    ]
    return _cycles(inside, unit=lambda module: module)


@pytest.mark.parametrize("package", MODULES_WITHOUT_CYCLES)
def test_no_import_cycles_between_modules_of(package: str) -> None:
    imports = _all_imports()
    cycles = _module_cycles(imports, package)
    text = [
        " ⇄ ".join(group)
        + ":\n    "
        + "\n    ".join(
            f"{imp.where()}: {imp.importer} → {imp.imported}"
            for imp in imports
            if imp.importer in group and imp.imported in group
        )
        for group in cycles
    ]
    assert not cycles, f"import cycles inside {package}:\n" + "\n".join(text)


def test_the_checker_catches_what_it_should() -> None:
    rank = _layer_index()
    here = PACKAGE_DIR / "sim" / "x.py"

    def check(importer: str, imported: str) -> str | None:
        return _violation(Import(here, 7, importer, imported), rank)

    upward = check("cocoviz.sim.x", "cocoviz.tui.app")
    assert upward is not None and "cocoviz/sim/x.py:7" in upward
    assert "cocoviz.sim.x → cocoviz.tui.app" in upward and "higher 'front ends'" in upward
    peer = check("cocoviz.sim.x", "cocoviz.exec.ops")
    assert peer is not None and "share the" in peer
    assert check("cocoviz.ir.x", "cocoviz.numerics") is not None
    assert check("cocoviz.numerics", "cocoviz.ir.types") is None
    assert check("cocoviz.cli.x", "cocoviz.tui.app") is None
    assert check("cocoviz.tui.x", "cocoviz.cli") is None
    assert check("cocoviz.emit.x", "cocoviz.schedule") is None
    textual = check("cocoviz.sim.x", "textual.app")
    assert textual is not None and "only cocoviz.tui may import textual" in textual
    missing = check("cocoviz.cli.x", "cocoviz.nowhere")
    assert missing is not None and "does not exist" in missing
    imports = [
        Import(here, 1, "cocoviz.sim.x", "cocoviz.exec.y"),
        Import(here, 2, "cocoviz.exec.y", "cocoviz.sim.z"),
    ]
    assert _cycles(imports) == [["cocoviz.exec", "cocoviz.sim"]]
    # A TYPE_CHECKING import back counts (cocoviz.tui.commands once imported the app so).
    tui = PACKAGE_DIR / "tui" / "x.py"
    loop = [
        Import(tui, 1, "cocoviz.tui.app", "cocoviz.tui.commands"),
        Import(tui, 2, "cocoviz.tui.commands", "cocoviz.tui.app"),
        Import(tui, 3, "cocoviz.tui.app", "cocoviz.tui.host"),
    ]
    assert _module_cycles(loop, "cocoviz.tui") == [["cocoviz.tui.app", "cocoviz.tui.commands"]]
    assert _module_cycles(loop[::2], "cocoviz.tui") == []
