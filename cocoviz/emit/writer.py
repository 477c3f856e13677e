"""Writing an output tree safely.

The directory is created if needed and locked (`fsio.locked_directory`), so two
writers of one directory take turns. Every changed file is first staged as a temporary
file inside the directory (the same file system, so writing onto a mount point works),
then all are renamed into place: a full disk leaves the old tree as it was, and a
symbolic link at a destination is replaced, never written through.

The marker file ``.cocoviz-emit`` lists the files cocoviz wrote there with the SHA-256
of what it wrote (``sha256``: name → hash). On the next emit into the directory:

- a file whose content is already what would be written is left alone (so `make`
  rebuilds nothing); when nothing changes, nothing at all is written, the marker
  included (a re-emit into a read-only tree succeeds);
- a file that still holds what cocoviz wrote (its hash matches the marker) is replaced;
- a file the user changed (or one the marker holds no hash for, a link, anything not
  a regular file) is kept and reported (`WriteResult.kept`), or replaced with
  ``force``; it is then no longer listed, since cocoviz did not write what it holds;
- a file cocoviz wrote but no longer emits is removed only when its hash matches;
  otherwise it is kept and dropped from the marker.

Only plain file names count (an entry such as ``../x`` or ``/x`` is ignored, so a crafted
marker cannot touch anything outside the directory). A non-empty directory without the
marker is not cocoviz's and is refused unless ``force``.
"""

from __future__ import annotations

import contextlib
import hashlib
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
    kept: tuple[str, ...] = ()
    """Files the user changed since cocoviz wrote them (or cocoviz cannot tell): not
    overwritten (without ``force``), not removed."""


def _emittable(name: object) -> bool:
    """A name the emitter could have written: a plain file name, not hidden."""
    return fsio.plain_name(name) and not str(name).startswith(".")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class _Marker:
    hashes: dict[str, str | None]
    """Each file cocoviz wrote → the SHA-256 of what it wrote (None: not recorded)."""
    ignored: tuple[str, ...]
    raw: bytes


def _owned(directory: Path) -> _Marker | None:
    """What the marker says cocoviz wrote into `directory`; None if cocoviz did not
    write it (no readable marker that is a regular file)."""
    raw = fsio.read_regular(directory / MARKER, 64 << 20)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        return None
    sums = data.get("sha256")
    sums = sums if isinstance(sums, dict) else {}
    hashes: dict[str, str | None] = {}
    for f in files:
        if _emittable(f):
            h = sums.get(f)
            hashes[f] = h if isinstance(h, str) else None
    bad = tuple(f if isinstance(f, str) else repr(f) for f in files if not _emittable(f))
    return _Marker(hashes, bad, raw)


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
        recorded = previous.hashes if previous else {}
        changed: dict[str, fsio.Content] = {}
        unchanged: list[str] = []
        kept: list[str] = []
        hashes: dict[str, str] = {}
        for name, text in sorted(files.items()):
            data = text.encode("utf-8")
            new = digest(data)
            st = fsio.lstat(target / name, "write")
            if st is None:
                changed[name] = data
            elif stat.S_ISDIR(st.st_mode):
                raise UsageError(
                    f"{target / name}: is a directory where cocoviz writes a file",
                    hint="move it away, or choose another -o DIR",
                )
            else:
                current = fsio.read_regular(target / name) if stat.S_ISREG(st.st_mode) else None
                if current == data:
                    unchanged.append(name)
                elif force or (current is not None and digest(current) == recorded.get(name)):
                    changed[name] = data
                else:  # the user's now: kept, and not listed as cocoviz's
                    kept.append(name)
                    continue
            hashes[name] = new
        fsio.replace_files(target, changed, EXECUTABLE)
        removed = []
        for name in sorted(set(recorded) - set(files)):
            stale = target / name
            st = fsio.lstat(stale, "remove")
            if st is None or not stat.S_ISREG(st.st_mode):
                continue
            current = fsio.read_regular(stale)
            if current is None or digest(current) != recorded[name]:
                continue  # changed by the user, or never verifiable: never deleted
            try:
                stale.unlink()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise fsio.os_error(err, stale, "remove") from None
            removed.append(name)
        marker = {"tool": "cocoviz", "files": sorted(hashes), "sha256": hashes}
        marker_bytes = (json.dumps(marker, indent=2, sort_keys=True) + "\n").encode()
        if previous is None or previous.raw != marker_bytes:
            fsio.replace_files(target, {MARKER: marker_bytes})
    ignored = previous.ignored if previous else ()
    return WriteResult(
        target, tuple(changed), tuple(unchanged), tuple(removed), ignored, tuple(kept)
    )
