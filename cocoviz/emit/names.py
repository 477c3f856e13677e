"""C identifiers and literals from source names: nothing from a `.coco` file reaches
emitted code except through these functions."""

from __future__ import annotations

import math
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def c_ident(text: str, prefix: str) -> str:
    """A C/C++ identifier for `text`: `prefix` + the name with every character outside
    ``[A-Za-z0-9_]`` replaced and runs of underscores broken up (identifiers holding
    ``__`` are reserved in C++). The prefix keeps it off keywords and macros."""
    body = _UNSAFE.sub("_", text)
    body = re.sub(r"_{2,}", lambda m: "_" + "u" * (len(m.group(0)) - 1) + "_", body)
    out = f"{prefix}{body}" if prefix else body
    out = re.sub(r"_{2,}", "_", out)
    if not out or out[0].isdigit():
        out = "n_" + out
    return out


class NameTable:
    """Hands out unique identifiers."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def fresh(self, text: str, prefix: str) -> str:
        base = c_ident(text, prefix)
        name, n = base, 2
        while name in self._used:
            name = f"{base}_{n}"
            n += 1
        self._used.add(name)
        return name


def c_string(text: str) -> str:
    """A C string literal spelling `text` exactly: printable ASCII letters, digits and a
    few punctuation characters as themselves, every other byte as an octal escape."""
    out = ['"']
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch.isascii() and (ch.isalnum() or ch in "_#.-+ :/=,()[]"):
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    out.append('"')
    return "".join(out)


def c_double(value: float | int) -> str:
    """A C double literal that round-trips exactly (or a named constant for inf/nan)."""
    v = float(value)
    if math.isnan(v):
        return "(0.0 / 0.0)"
    if math.isinf(v):
        return "(1.0 / 0.0)" if v > 0 else "(-1.0 / 0.0)"
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return text


# Stems the emitted tree uses itself: the launcher, the runtime header, the Makefile and
# its targets, the emulation build directory (compared lower-case: on a case-insensitive
# file system `Main.cu` is `main.cu`).
_RESERVED_STEMS = frozenset(
    {"main", "cocoviz_runtime", "makefile", "all", "run", "clean", "emulate", "emu", "manifest"}
    | {"force"}  # the Makefile's FORCE target (the build stamp, docs/codegen.md)
)


def file_stem(name: str) -> str:
    """A safe file stem for the program's source file: a name the tree uses itself
    (`main`, `cocoviz_runtime`, `Makefile`, a make target) gets the suffix `_prog`."""
    stem = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "program"
    return f"{stem}_prog" if stem.lower() in _RESERVED_STEMS else stem
