"""Golden snapshots of emitted trees: megatron_mlp's overlapped `fused` schedule and
adam's `fused` schedule (CUDA, --collectives nccl, the samples' own sizes). The files
are compared as text; regenerate deliberately with COCOVIZ_UPDATE_GOLDEN=1 and read the
diff. Machine-specific Makefile paths and the manifest's predicted times are masked."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from emit_support import emit_files

GOLDEN = Path(__file__).parent / "golden" / "emit"
UPDATE = os.environ.get("COCOVIZ_UPDATE_GOLDEN") == "1"
RUNTIME = ("cocoviz_runtime.h", "cocoviz_runtime.cuh")


def _drop_predictions(value: object) -> object:
    if isinstance(value, dict):
        return {k: _drop_predictions(v) for k, v in value.items() if not k.startswith("predicted")}
    if isinstance(value, list):
        return [_drop_predictions(v) for v in value]
    return value


def _mask(name: str, text: str) -> str:
    if name == "manifest.json":
        # predicted times follow the cost model, which has its own tests
        return json.dumps(_drop_predictions(json.loads(text)), indent=2) + "\n"
    if name in ("Makefile", "run.sh"):
        # toolchain paths found at emit time differ between machines
        text = re.sub(r"^(\w+) \?= .*$", r"\1 ?= <found at emit time>", text, flags=re.M)
        text = re.sub(r"\$\{MPIEXEC:-[^}]*\}", "${MPIEXEC:-<found>}", text)
    return text


@pytest.mark.parametrize(("name", "schedule"), [("megatron_mlp", "fused"), ("adam", "fused")])
def test_emitted_files_match_golden(name: str, schedule: str) -> None:
    files = emit_files(name, schedule, "cuda", small=False)
    directory = GOLDEN / f"{name}.{schedule}"
    if UPDATE:
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink()
        for n, text in files.items():
            if n not in RUNTIME:
                (directory / n).write_text(_mask(n, text))
    expected = sorted(p.name for p in directory.iterdir())
    assert expected == sorted(n for n in files if n not in RUNTIME)
    for n in expected:
        assert _mask(n, files[n]) == (directory / n).read_text(), f"{name}.{schedule}/{n} changed"
