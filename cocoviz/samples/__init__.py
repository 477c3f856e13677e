"""The embedded sample programs (also in the repository's `samples/`)."""

from __future__ import annotations

import re
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


def named_by(file: str | Path) -> str | None:
    """The sample a FILE argument names (`adam`, `adam.coco`) when no such file exists;
    None for anything else (a path that exists, or one with a directory in it)."""
    text = str(file)
    if Path(text).exists() or "/" in text or "\\" in text:
        return None
    stem = text.removesuffix(".coco")
    return stem if stem in names() else None


def description(name: str) -> str:
    """The first sentence of a sample's header comment (whole, however many lines)."""
    words: list[str] = []
    for line in text(name).splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    header = " ".join(words)
    end = re.search(r"\.(?= |$)", header)
    return header[: end.end()] if end else header


def coconet_config(name: str) -> tuple[dict[str, int], str | None, str | None]:
    """CoCoNet's own configuration of a sample, as its header comment gives it (the
    samples are sized for the default hardware; this is the paper's): the `-D`
    overrides, the `--ranks` value and the `--hw` profile (None where not given).
    Raises KeyError when the comment gives none."""
    words: list[str] = []
    for line in text(name).splitlines():
        if line.startswith("#"):
            words += line.lstrip("#").split()
    header = " ".join(words)
    at = header.find("CoCoNet's own configuration")
    if at < 0:
        raise KeyError(f"{name}: no CoCoNet configuration in its comments")
    tail = header[at:]
    defines = {m[1]: int(m[2]) for m in re.finditer(r"-D (\w+)=(\d+)", tail)}
    ranks = re.search(r"--ranks (\S+)", tail)
    hw = re.search(r"--hw (\S+)", tail)
    return defines, ranks[1] if ranks else None, hw[1] if hw else None
