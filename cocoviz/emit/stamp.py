"""The build stamp of an emitted tree (docs/codegen.md, "A binary from other sources").

When make links a binary it writes ``<binary>.stamp`` beside it: the POSIX ``cksum`` of
the files the binary is built from (`built_from`), concatenated in that order. ``run.sh``
computes the same sum over the tree as it is and refuses a binary whose stamp differs
(exit `STALE_EXIT`), and the Makefile rebuilds such a binary and its objects whatever the
files' modification times say. The stamp is the content, not a time, so it holds for a
tree copied to another machine and under clock skew.

`cksum` here is the POSIX algorithm itself, so cocoviz can tell without a shell whether
a binary in a tree was built from what the tree now holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

STALE_EXIT = 5
"""run.sh's exit status when the binary was built from other sources."""
NOT_BUILT_EXIT = 2
"""run.sh's exit status when the binary is not there."""
NOT_BUILD_INPUTS = frozenset({"run.sh", "manifest.json"})
"""Files of a tree that no binary is built from."""


def built_from(names: Iterable[str]) -> tuple[str, ...]:
    """The files of a tree (by name) that its binaries are built from, in stamp order."""
    return tuple(sorted(n for n in names if n not in NOT_BUILD_INPUTS))


def stamp_name(binary: str) -> str:
    return f"{binary}.stamp"


def _crc_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i << 24
        for _ in range(8):
            c = ((c << 1) ^ 0x04C11DB7) if c & 0x80000000 else (c << 1)
        table.append(c & 0xFFFFFFFF)
    return tuple(table)


_TABLE = _crc_table()


def cksum(data: bytes) -> str:
    """What POSIX ``cksum`` prints for `data` on its standard input: ``CRC SIZE``."""
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[(crc >> 24) ^ b]
    n = len(data)
    while n:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[(crc >> 24) ^ (n & 0xFF)]
        n >>= 8
    return f"{~crc & 0xFFFFFFFF} {len(data)}"


def sources_sum(directory: Path, names: Iterable[str]) -> str:
    """The sum run.sh computes: ``cat NAMES | cksum`` in `directory` (a missing file
    counts as empty, as ``cat`` skips it)."""
    data = bytearray()
    for n in names:
        try:
            data += (directory / n).read_bytes()
        except OSError:
            continue
    return cksum(bytes(data))


def is_current(directory: Path, binary: str, names: Iterable[str]) -> bool:
    """Whether `binary`'s stamp in `directory` is the sum of `names` as they are now."""
    try:
        stamp = (directory / stamp_name(binary)).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return False
    return stamp == sources_sum(directory, names)


def write_stamp(directory: Path, binary: str, names: Iterable[str]) -> None:
    """Stamp `binary` as built from `names` as they are now (what make does on a link)."""
    (directory / stamp_name(binary)).write_text(sources_sum(directory, names) + "\n")
