"""The headless core never imports Textual (or mpi4py at module scope)."""

import subprocess
import sys

CORE = [
    "cocoviz.cli",
    "cocoviz.errors",
    "cocoviz.ir",
    "cocoviz.ir.lower",
    "cocoviz.ir.printer",
    "cocoviz.ir.graph",
    "cocoviz.ir.draw",
    "cocoviz.emit",
    "cocoviz.exec",
    "cocoviz.sim",
]


def test_core_does_not_import_textual_or_mpi4py():
    code = (
        "import importlib, sys\n"
        f"for m in {CORE!r}:\n"
        "    importlib.import_module(m)\n"
        "import cocoviz.cli\n"
        "cocoviz.cli.build_parser()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'mpi4py'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"headless core imported: {out.stdout.strip()}"
