"""Writing files safely: the one writer behind every command that writes.

Every file is written to a temporary file beside its destination (so on the same file
system: a rename never crosses devices, and writing onto a mount point works), flushed
to disk, then renamed over the destination. A reader sees the old file or the new one,
never a truncated one; a full disk leaves the old file as it was. The rename replaces
a symbolic link at the destination instead of writing through it, and temporary files
are created with ``O_EXCL | O_NOFOLLOW``, so no link makes cocoviz write elsewhere.

Names written into a directory must be plain file names (no ``/``, not ``.``/``..``), so
nothing escapes the directory the user named. `locked_directory` serializes writers of
one directory (two `cocoviz emit -o DIR` at once) with ``flock`` on the directory.

Every `OSError` a user can cause (read-only or full file system, a missing parent, a
name that is too long, a file where a directory should be) becomes an `OutputError`:
which path, what the system said, and what to do about it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import UsageError

TMP_PREFIX = ".cocoviz-tmp-"
"""Temporary files beside a destination start with this (and are removed on failure)."""
LOCK_FILE = ".cocoviz-lock"
"""Lock file used only where a directory itself cannot be locked."""

_HINTS = {
    errno.ENOSPC: "the file system is full: free some space or write somewhere else",
    errno.EDQUOT: "your disk quota is used up: free some space or write somewhere else",
    errno.EROFS: "the file system is read-only: choose a directory you can write to",
    errno.EACCES: "you may not write there: choose a directory you can write to",
    errno.EPERM: "you may not write there: choose a directory you can write to",
    errno.ENAMETOOLONG: "a file name may have at most 255 bytes: choose a shorter name",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another path",
    errno.EISDIR: "it is a directory: name a file instead",
    errno.ELOOP: "too many symbolic links in the path: choose another path",
    errno.EMLINK: "the directory holds too many entries: choose another directory",
    errno.EIO: "the device reported an I/O error: check the disk, or write somewhere else",
}


class OutputError(UsageError):
    """A file or directory that cannot be written as asked (exit 2: the path given on the
    command line is unusable, or the file system refused it)."""


def os_error(err: OSError, path: str | os.PathLike[str], action: str = "write") -> OutputError:
    """The diagnostic for an `OSError` while doing `action` on `path`."""
    said = err.strerror or str(err)
    hint = _HINTS.get(err.errno or 0)
    if err.errno == errno.ENOENT:
        parent = Path(path).parent
        hint = f"the directory '{parent}' does not exist: create it first, or choose another"
    return OutputError(f"cannot {action} '{path}': {said}", hint=hint)


def plain_name(name: object) -> bool:
    """Whether `name` is a file name that stays inside its directory (no separator, not
    ``.``, ``..`` or empty, no NUL)."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        return False
    seps = {"/", "\0", os.sep} | ({os.altsep} if os.altsep else set())
    return not any(s in name for s in seps)


def lstat(path: Path, action: str = "access") -> os.stat_result | None:
    """`os.lstat`, or None when nothing (no file, or a file in the way of a directory)
    is there; other errors (a name that is too long, …) are an OutputError."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise os_error(err, path, action) from None


def read_regular(path: Path) -> bytes | None:
    """The bytes of a regular file, without following a symbolic link; None for anything
    else (a link, a directory, nothing, an unreadable file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def make_directory(path: Path) -> None:
    """Create `path` and its parents; an OutputError when that fails or a non-directory
    is in the way."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(
            f"cannot create the directory '{path}': a file of that name exists",
            hint="choose another name",
        ) from None
    except OSError as err:
        raise os_error(err, path, "create the directory") from None


class Sink:
    """A binary file-like object over a file descriptor, for writers such as `np.save`.
    Writes go through `os.write` until every byte is written."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        return size

    def flush(self) -> None:
        pass


Content = bytes | str | Callable[[Sink], object]
"""What to write: bytes, text (UTF-8), or a function that writes into a `Sink`."""


@dataclass(frozen=True)
class Staged:
    """A temporary file holding a destination's new content, not yet in place."""

    tmp: Path
    dest: Path

    def commit(self) -> None:
        """Rename the temporary file over the destination (replacing a link there, not
        its target); an OutputError when that fails, and the temporary file is gone."""
        try:
            os.replace(self.tmp, self.dest)
        except OSError as err:
            self.discard()
            raise os_error(err, self.dest) from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


def stage(dest: Path, content: Content, *, executable: bool = False) -> Staged:
    """Write `content` to a new temporary file in `dest`'s directory, flushed to disk.
    The caller commits or discards it."""
    mode = 0o777 if executable else 0o666  # less the umask, as for any new file
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = dest.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:
            continue
        except OSError as err:
            raise os_error(err, dest) from None
    staged = Staged(tmp, dest)
    try:
        sink = Sink(fd)
        if isinstance(content, str):
            sink.write(content.encode("utf-8"))
        elif isinstance(content, bytes):
            sink.write(content)
        else:
            content(sink)
        os.fsync(fd)
    except OSError as err:
        staged.discard()
        raise os_error(err, dest) from None
    except BaseException:
        staged.discard()
        raise
    finally:
        os.close(fd)
    return staged


def sync_directory(path: Path) -> None:
    """Flush a directory's entries (the renames in it) to disk, where that is possible."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file(path: str | os.PathLike[str], content: Content, *, executable: bool = False) -> None:
    """Write one file atomically (see the module docstring). Its directory must exist."""
    dest = Path(path)
    st = lstat(dest, "write")
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write '{dest}': it is a directory", hint="name a file instead")
    parent = dest.parent
    if lstat(parent, "write") is None:
        raise OutputError(
            f"cannot write '{dest}': the directory '{parent}' does not exist",
            hint="create it first, or choose another path",
        )
    staged = stage(dest, content, executable=executable)
    staged.commit()
    sync_directory(parent)


def replace_files(
    directory: Path, files: Mapping[str, Content], executable: frozenset[str] = frozenset()
) -> None:
    """Write several files into `directory`: all are staged first, then renamed into
    place, so a full disk leaves every old file as it was. Names must be plain."""
    for name in files:
        if not plain_name(name):
            raise ValueError(f"not a plain file name: {name!r}")
    staged: list[Staged] = []
    try:
        for name, content in files.items():
            staged.append(stage(directory / name, content, executable=name in executable))
        while staged:
            staged[0].commit()
            staged.pop(0)
    finally:
        for s in staged:
            s.discard()
    sync_directory(directory)


def remove_stale_temporaries(directory: Path) -> None:
    """Remove temporary files a killed writer left in `directory` (hold its lock)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.name.startswith(TMP_PREFIX) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


@contextlib.contextmanager
def locked_directory(path: Path, create: bool = True) -> Iterator[Path]:
    """Hold an exclusive lock on `path` (created with its parents when `create`) while
    writing into it; a second writer waits until the first is done."""
    if create:
        make_directory(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise os_error(err, path, "open the directory") from None
    lock_fd: int | None = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            # Some network file systems cannot lock a directory: lock a file in it.
            try:
                lock_fd = os.open(
                    path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
                )
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            except OSError as err:
                raise os_error(err, path / LOCK_FILE, "lock") from None
        yield path
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
        os.close(fd)
