"""The embedded sample programs (also in the repository's `samples/`)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEFAULT = "megatron_mlp"


def names() -> list[str]:
    return sorted(
        p.name[: -len(".coco")]
        for p in resources.files(__name__).iterdir()
        if p.name.endswith(".coco")
    )


def text(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.coco").read_text(encoding="utf-8")


def path(name: str) -> Path:
    return Path(str(resources.files(__name__).joinpath(f"{name}.coco")))
