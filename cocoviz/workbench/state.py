"""Autosave of a TUI session: the source text and the applied steps, per file.

Saved under the user's state directory (``$XDG_STATE_HOME/cocoviz`` or
``~/.local/state/cocoviz``) after every change, written atomically, and offered back
when the same file (or sample) is opened again. No Textual here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cocoviz import fsio


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "cocoviz"


@dataclass(frozen=True)
class Autosave:
    """What a crash must not lose."""

    key: str  # the file's absolute path, or "sample:<name>"
    source: str
    steps: tuple[str, ...]
    saved_at: float

    def describe(self) -> str:
        try:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.saved_at))
        except (OverflowError, OSError, ValueError):
            when = "at an unknown time"
        steps = f"{len(self.steps)} step{'s' if len(self.steps) != 1 else ''}"
        return f"saved {when}, {steps}"


MAX_AUTOSAVE_BYTES = 64 << 20
"""An autosave holds a source (at most 16 MiB, JSON-escaped) and its steps."""


def _slot(key: str, root: Path) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", key.rsplit("/", 1)[-1])[:40] or "session"
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:10]
    return root / "autosave" / f"{stem}-{digest}.json"


def write(save: Autosave, root: Path | None = None) -> Path:
    path = _slot(save.key, root or state_dir())
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(save)
    data["steps"] = list(save.steps)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autosave-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read(key: str, root: Path | None = None) -> Autosave | None:
    """The autosave for `key`, or None (also when the file is unreadable or corrupt)."""
    path = _slot(key, root or state_dir())
    # a regular file of this user's, bounded, never blocking (a FIFO or a huge file there
    # is ignored, as a corrupt one is)
    raw = fsio.read_regular(path, MAX_AUTOSAVE_BYTES, own=True)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        return Autosave(
            key=str(data["key"]),
            source=str(data["source"]),
            steps=tuple(str(s) for s in data["steps"]),
            saved_at=_timestamp(data["saved_at"]),
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _timestamp(value: object) -> float:
    """A saved_at in seconds since the epoch; anything else (NaN, inf, absurd) → ValueError."""
    t = float(value)  # type: ignore[arg-type]
    if not 0.0 <= t <= 1e11:  # NaN fails too
        raise ValueError(f"not a time: {value!r}")
    return t


def clear(key: str, root: Path | None = None) -> None:
    _slot(key, root or state_dir()).unlink(missing_ok=True)
