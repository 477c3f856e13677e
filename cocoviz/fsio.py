"""Writing files safely: the one writer behind every command that writes.

Every file is written to a temporary file beside its destination (so on the same file
system: a rename never crosses devices, and writing onto a mount point works), flushed
to disk, then renamed over the destination. A reader sees the old file or the new one,
never a truncated one; a full disk leaves the old file as it was. Temporary files are
created with ``O_EXCL | O_NOFOLLOW``. `write_file`, the writer of every file a user
names, never replaces a file the command read, refuses an existing file the tool did
not write unless forced, and writes through a device, FIFO or link to one (``/dev/null``
stays a device).

Reading goes through `open_regular`: regular files only, opened without blocking,
bounded (`read_bytes`, `read_text`, `read_toml_text`; `read_regular` for the tool's own
files, whose absence is not an error).

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
import select
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cocoviz.errors import CocovizError, InputError, UsageError

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


MAX_READ_BYTES = 16 << 20
"""The most any file the tool reads may hold unless its reader says otherwise (a
program's limit, `syntax_tree.MAX_SOURCE_BYTES`)."""

_NOCTTY = getattr(os, "O_NOCTTY", 0)

_inputs: set[tuple[int, int]] | None = None
"""(device, inode) of every file read through this module while a command runs
(`command_inputs`); None outside a command (the TUI, a library caller)."""


@contextlib.contextmanager
def command_inputs() -> Iterator[None]:
    """Remember the files read while the block runs, so that no file written in it
    replaces one of them (`simulate x.coco --trace x.coco`)."""
    global _inputs
    saved, _inputs = _inputs, set()
    try:
        yield
    finally:
        _inputs = saved


def _remember(st: os.stat_result) -> None:
    if _inputs is not None:
        _inputs.add((st.st_dev, st.st_ino))


def is_input(st: os.stat_result) -> bool:
    """Whether the file `st` describes was read by the command that is running."""
    return _inputs is not None and (st.st_dev, st.st_ino) in _inputs


class ReadError(InputError):
    """A file that cannot be read as asked (exit 1). `reason` says why: ``missing``,
    ``directory``, ``special`` (a device, FIFO or socket), ``too-large``, ``too-deep``,
    ``encoding`` or ``system``."""

    def __init__(self, message: str, reason: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def size_text(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit:,} bytes"


def _read_fd(fd: int, limit: int) -> bytes | None:
    """At most `limit` bytes from `fd`; None when it holds more."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None
    return b"".join(chunks)


def open_regular(
    path: str | os.PathLike[str], what: str = "file", *, follow: bool = True, remember: bool = True
) -> int:
    """A read-only descriptor of the regular file at `path`, opened without blocking
    (a FIFO without a writer, a terminal or a device never holds the command up) and
    checked on the open file (a file swapped for a FIFO after a check cannot hang it).
    A `ReadError` for anything else: nothing there, a directory, a device, a FIFO, a
    socket, a symbolic link when not `follow`, or a system refusal. The file is
    remembered as an input of the running command (`command_inputs`) when `remember`."""
    p = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | _NOCTTY
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise ReadError(f"{p}: no such {what}", "missing") from None
    except IsADirectoryError:
        raise ReadError(f"{p}: is a directory, expected a {what}", "directory") from None
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise ReadError(
                f"{p}: not a regular file (a symbolic link), expected a {what}", "special"
            ) from None
        if err.errno == errno.ENXIO:  # a socket, or a device without its driver
            raise ReadError(
                f"{p}: not a regular file (a socket?), expected a {what}", "special"
            ) from None
        said = err.strerror or str(err)
        raise ReadError(f"{p}: cannot read ({said})", "system") from None
    try:
        st = os.fstat(fd)
    except OSError as err:
        os.close(fd)
        raise ReadError(f"{p}: cannot read ({err.strerror or err})", "system") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = _kind(st.st_mode)
        reason = "directory" if stat.S_ISDIR(st.st_mode) else "special"
        said = (
            f"is a directory, expected a {what}"
            if reason == "directory"
            else (f"not a regular file ({kind}), expected a {what}")
        )
        raise ReadError(
            f"{p}: {said}",
            reason,
            hint=None
            if reason == "directory"
            else "name a regular file (a device such as "
            "/dev/zero never ends, a FIFO may never be written)",
        )
    if remember:
        _remember(st)
    return fd


def read_bytes(
    path: str | os.PathLike[str], what: str = "file", limit: int = MAX_READ_BYTES
) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them: the one reader
    of every file a user names (programs, schedules, hardware profiles, measurement
    logs). A `ReadError` with one diagnostic for each refusal (see `open_regular`, and a
    file larger than `limit`)."""
    fd = open_regular(path, what)
    try:
        data = _read_fd(fd, limit)
    except OSError as err:
        raise ReadError(f"{path}: cannot read ({err.strerror or err})", "system") from None
    finally:
        os.close(fd)
    if data is None:
        raise ReadError(
            f"{path}: too large: a {what} may hold at most {size_text(limit)}",
            "too-large",
            hint="is it the right file?",
        )
    return data


def read_text(path: str | os.PathLike[str], what: str = "file", limit: int = MAX_READ_BYTES) -> str:
    """`read_bytes` decoded as UTF-8 (a `ReadError` when it is not), newlines as text
    mode reads them (CR LF and CR become LF)."""
    data = read_bytes(path, what, limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ReadError(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start})",
            "encoding",
            hint=f"save the {what} as UTF-8",
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


MAX_TOML_BYTES = 1 << 20
"""A TOML file the tool reads (a hardware profile) holds at most this."""


def read_toml_text(
    path: str | os.PathLike[str],
    what: str = "TOML file",
    error: Callable[[str], CocovizError] | None = None,
) -> str:
    """`read_text` of a TOML file, refused when its nesting is too deep for the TOML
    parser (which recurses once per level of nested arrays and inline tables). A
    refusal is a `ReadError`, or an `error(message)` (with the same diagnostic) when
    given, so that a caller's own error type is what its callers catch."""
    import tomllib

    try:
        text = read_text(path, what, MAX_TOML_BYTES)
        try:
            tomllib.loads(text)
        except RecursionError:
            raise ReadError(
                f"{path}: nested too deeply for a {what}",
                "too-deep",
                hint="the arrays and tables of a TOML file nest a few levels at most",
            ) from None
        except tomllib.TOMLDecodeError:
            pass  # reported by the caller, with its own context
    except ReadError as err:
        if error is None:
            raise
        mine = error(err.message)
        mine.diagnostics = err.diagnostics
        raise mine from None
    return text


def read_regular(
    path: Path, limit: int = 256 << 20, *, own: bool = False, follow: bool = False
) -> bytes | None:
    """The bytes of a regular file (at most `limit`, and owned by this user when
    `own`), without following a symbolic link (unless `follow`) and without blocking; None for anything
    else (a link, a directory, a FIFO, nothing, an unreadable or larger file). For files
    the tool itself wrote (markers, caches), whose absence is not an error."""
    try:
        fd = open_regular(path, follow=follow, remember=False)
    except ReadError:
        return None
    try:
        if own and hasattr(os, "getuid") and os.fstat(fd).st_uid != os.getuid():
            return None
        return _read_fd(fd, limit)
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
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:  # a non-blocking pipe or terminal that is full: wait
                select.select([], [self.fd], [])
                continue
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


def read_head(path: Path, size: int, *, follow: bool = True) -> bytes | None:
    """The first `size` bytes of a regular file (through a link when `follow`), without
    blocking; None for anything else. Enough to recognize a file by its header."""
    try:
        fd = open_regular(path, follow=follow, remember=False)
    except ReadError:
        return None
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_tail(path: Path, size: int) -> bytes | None:
    """The last `size` bytes of a regular file (not through a link, without blocking);
    None for anything else. Enough to recognize a file by a trailer the tool wrote."""
    try:
        fd = open_regular(path, follow=False, remember=False)
    except ReadError:
        return None
    try:
        end = os.fstat(fd).st_size
        return os.pread(fd, size, max(0, end - size))
    except OSError:
        return None
    finally:
        os.close(fd)


def write_file(
    path: str | os.PathLike[str],
    content: Content,
    *,
    executable: bool = False,
    force: bool = False,
    ours: Callable[[Path], bool] | None = None,
    writer: str = "cocoviz",
) -> None:
    """Write one file: the one guarded writer of every file a command names.

    - A file the running command read (`command_inputs`) is never replaced.
    - An existing regular file that `ours` does not recognize as the tool's is refused
      unless `force`.
    - A regular file is written atomically (see the module docstring); a symbolic link
      to a regular file keeps the link and replaces its target the same way.
    - A destination that is not a regular file (``/dev/null``, ``/dev/stdout``, a
      terminal, a FIFO, or a link to one) is written through, as a shell redirection
      does: opened for writing, never replaced; a block device (a disk) is refused.

    Its directory must exist."""
    dest, st = check_output(path, force=force, ours=ours, writer=writer)
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_through(dest, content, st)
        return
    staged = stage(dest, content, executable=executable)
    staged.commit()
    sync_directory(dest.parent)


def check_output(
    path: str | os.PathLike[str],
    *,
    force: bool = False,
    ours: Callable[[Path], bool] | None = None,
    writer: str = "cocoviz",
) -> tuple[Path, os.stat_result | None]:
    """The checks `write_file` makes before writing, without writing: a command calls it
    on its output paths before its work, so a path it would refuse fails at once. Returns
    the destination (a link to a regular file resolved) and its status (None when it does
    not exist yet); an OutputError names what is wrong (`writer`: who writes such files,
    as the refusal of a file it did not write names it)."""
    dest = Path(path)
    st = lstat(dest, "write")
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(dest)
        except FileNotFoundError:
            raise OutputError(
                f"cannot write '{dest}': it is a symbolic link to nothing",
                hint="remove the link, or choose another path",
            ) from None
        except OSError as err:
            raise os_error(err, dest) from None
        if stat.S_ISREG(st.st_mode):
            dest = Path(os.path.realpath(dest))
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(
                f"cannot write '{path}': it is a directory", hint="name a file instead"
            )
        if is_input(st):
            raise OutputError(
                f"cannot write '{path}': it is an input of this command",
                hint="choose another output file",
            )
        if not stat.S_ISREG(st.st_mode):
            if stat.S_ISBLK(st.st_mode):
                raise OutputError(
                    f"cannot write '{dest}': it is a block device (a disk)",
                    hint="write to a file, or to /dev/stdout and redirect it",
                )
            return dest, st
        if ours is not None and not force and not ours(dest):
            raise OutputError(
                f"cannot write '{path}': the file exists and was not written by {writer}",
                hint="pass --force to overwrite it, or choose another name",
            )
    parent = dest.parent
    if lstat(parent, "write") is None:
        raise OutputError(
            f"cannot write '{dest}': the directory '{parent}' does not exist",
            hint="create it first, or choose another path",
        )
    return dest, st


def _write_through(dest: Path, content: Content, st: os.stat_result) -> None:
    """Write `content` into the device or FIFO at `dest` as ``> dest`` would (a block
    device is refused by `check_output`)."""
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | _NOCTTY
    try:
        fd = os.open(dest, flags)
    except OSError as err:
        if err.errno == errno.ENXIO:
            what = "a FIFO that no process reads" if stat.S_ISFIFO(st.st_mode) else "a socket"
            raise OutputError(
                f"cannot write '{dest}': it is {what}",
                hint="start the reader first, or write to a file",
            ) from None
        raise os_error(err, dest) from None
    try:
        # Writes block as a shell's would; the descriptor is ours alone (a new open of
        # the device or FIFO), so nothing shared changes.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        sink = Sink(fd)
        if isinstance(content, str):
            sink.write(content.encode("utf-8"))
        elif isinstance(content, bytes):
            sink.write(content)
        else:
            content(sink)
    except OSError as err:
        raise os_error(err, dest) from None
    finally:
        os.close(fd)


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


def claim_directory(
    d: Path, marker: str, option: str, note: str, *, force: bool | None = False
) -> Path:
    """The directory `option` names, checked and created before a command's work: new,
    empty, or holding `marker` (an earlier run of the same command wrote it); a non-empty
    directory without the marker is the user's and is refused unless `force` (None: the
    command has no --force). Writes the marker (`note`) into it."""
    exists = lstat(d, "write") is not None
    if exists and not d.is_dir():
        raise UsageError(f"{option} {d}: exists and is not a directory")
    if exists and not force and read_regular(d / marker) is None:
        try:
            entries = [n for n in os.listdir(d) if not n.startswith(TMP_PREFIX)]
        except OSError as err:
            raise os_error(err, d, "read the directory") from None
        if entries:
            raise UsageError(
                f"{option} {d}: the directory is not empty and was not written by cocoviz",
                hint="choose a new directory" + ("" if force is None else ", or pass --force"),
            )
    with locked_directory(d):
        write_file(d / marker, note)
    return d


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
