"""Writing an output tree safely.

The directory is created if needed and locked (`fsio.locked_directory`), so two
writers of one directory take turns. Every changed file is first staged as a temporary
file inside the directory (the same file system, so writing onto a mount point works),
then all are renamed into place: a file whose content is unchanged is left alone (so
`make` rebuilds nothing), a full disk leaves the old tree as it was, and a symbolic link
at a destination is replaced, never written through. Files that cocoviz wrote last time
but no longer emits are removed. The marker file ``.cocoviz-emit`` lists what cocoviz
wrote; only its plain file names count (an entry such as ``../x`` or ``/x`` is ignored,
so a crafted marker cannot remove anything outside the directory). A non-empty
directory without the marker is not cocoviz's and is refused unless ``force``.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cocoviz import fsio
from cocoviz.errors import UsageError

MARKER = ".cocoviz-emit"
EXECUTABLE = frozenset({"run.sh"})


@dataclass(frozen=True)
class WriteResult:
    directory: Path
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]
    ignored: tuple[str, ...] = ()
    """Entries of an existing marker that are not plain file names (left alone)."""


def _emittable(name: object) -> bool:
    """A name the emitter could have written: a plain file name, not hidden."""
    return fsio.plain_name(name) and not str(name).startswith(".")


def _owned(directory: Path) -> tuple[set[str], tuple[str, ...]] | None:
    """The files cocoviz wrote into `directory` and the marker's entries that are not
    file names in it; None if cocoviz did not write it (no readable marker that is a
    regular file)."""
    raw = fsio.read_regular(directory / MARKER)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        return None
    good = {f for f in files if _emittable(f)}
    bad = tuple(f if isinstance(f, str) else repr(f) for f in files if not _emittable(f))
    return good, bad


def _entries(directory: Path) -> list[str]:
    """What the directory holds, besides a writer's temporary and lock files."""
    try:
        names = os.listdir(directory)
    except OSError as err:
        raise fsio.os_error(err, directory, "read the directory") from None
    return [n for n in names if not n.startswith(fsio.TMP_PREFIX) and n != fsio.LOCK_FILE]


def write_tree(
    directory: str | os.PathLike[str], files: Mapping[str, str], force: bool = False
) -> WriteResult:
    """Write `files` (name → text) into `directory` (see the module docstring)."""
    target = Path(directory)
    for name in files:
        if not _emittable(name):
            raise ValueError(f"bad output file name {name!r}")
    created = fsio.lstat(target, "write") is None
    if not created and not target.is_dir():
        raise UsageError(f"{target}: exists and is not a directory", hint="choose another -o DIR")
    try:
        return _write_locked(target, files, force)
    except BaseException:
        if created:  # leave no empty directory behind (rmdir refuses a non-empty one)
            with contextlib.suppress(OSError):
                target.rmdir()
        raise


def _write_locked(target: Path, files: Mapping[str, str], force: bool) -> WriteResult:
    with fsio.locked_directory(target):
        previous = _owned(target)
        if previous is None and _entries(target) and not force:
            raise UsageError(
                f"{target}: the directory is not empty and cocoviz did not write it "
                f"(no {MARKER} marker)",
                hint="choose an empty or new directory, or pass --force to write into it anyway",
            )
        fsio.remove_stale_temporaries(target)
        owned, ignored = previous or (set(), ())
        changed: dict[str, fsio.Content] = {}
        unchanged: list[str] = []
        for name, text in sorted(files.items()):
            data = text.encode("utf-8")
            if fsio.read_regular(target / name) == data:
                unchanged.append(name)
            else:
                changed[name] = data
        fsio.replace_files(target, changed, EXECUTABLE)
        removed = []
        for name in sorted(owned - set(files)):
            stale = target / name
            st = fsio.lstat(stale, "remove")
            if st is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                continue
            try:
                stale.unlink()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise fsio.os_error(err, stale, "remove") from None
            removed.append(name)
        marker_text = json.dumps({"tool": "cocoviz", "files": sorted(files)}, indent=2) + "\n"
        fsio.replace_files(target, {MARKER: marker_text})
    return WriteResult(target, tuple(changed), tuple(unchanged), tuple(removed), ignored)
