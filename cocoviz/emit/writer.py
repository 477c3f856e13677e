"""Writing an output tree atomically.

The files are written into a temporary directory next to the target, then moved into
place: a file whose content is unchanged is left alone (so `make` rebuilds nothing),
changed files replace the old ones with `os.replace` (atomic per file), and files that
cocoviz wrote last time but no longer emits are removed. The marker file
``.cocoviz-emit`` lists what cocoviz wrote; a non-empty directory without it is not
cocoviz's and is refused unless ``force``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import UsageError

MARKER = ".cocoviz-emit"
EXECUTABLE = frozenset({"run.sh"})


@dataclass(frozen=True)
class WriteResult:
    directory: Path
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]


def _owned(directory: Path) -> set[str] | None:
    """Files cocoviz wrote into `directory`, or None if it did not write it."""
    marker = directory / MARKER
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        return None
    return {f for f in files if isinstance(f, str)}


def write_tree(
    directory: str | os.PathLike[str], files: Mapping[str, str], force: bool = False
) -> WriteResult:
    """Write `files` (name → text) into `directory` atomically (see module docstring)."""
    target = Path(directory)
    for name in files:
        if "/" in name or name.startswith(".") or name in ("", ".."):
            raise ValueError(f"bad output file name {name!r}")
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target}: exists and is not a directory", hint="choose another -o DIR")
    owned: set[str] = set()
    if target.is_dir():
        previous = _owned(target)
        entries = [p.name for p in target.iterdir()]
        if previous is None and entries and not force:
            raise UsageError(
                f"{target}: the directory is not empty and cocoviz did not write it "
                f"(no {MARKER} marker)",
                hint="choose an empty or new directory, or pass --force to write into it anyway",
            )
        owned = previous or set()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, text in files.items():
            path = staging / name
            path.write_text(text, encoding="utf-8")
            if name in EXECUTABLE:
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        marker_text = json.dumps({"tool": "cocoviz", "files": sorted(files)}, indent=2) + "\n"
        (staging / MARKER).write_text(marker_text, encoding="utf-8")
        if not target.exists():
            os.replace(staging, target)
            return WriteResult(target, tuple(sorted(files)), (), ())
        written: list[str] = []
        unchanged: list[str] = []
        for name, text in sorted(files.items()):
            dest = target / name
            try:
                same = dest.is_file() and dest.read_text(encoding="utf-8") == text
            except (OSError, UnicodeDecodeError):
                same = False
            if same:
                unchanged.append(name)
                continue
            os.replace(staging / name, dest)
            written.append(name)
        removed = []
        for name in sorted(owned - set(files)):
            stale = target / name
            if stale.is_file():
                stale.unlink()
                removed.append(name)
        os.replace(staging / MARKER, target / MARKER)
        return WriteResult(target, tuple(written), tuple(unchanged), tuple(removed))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
