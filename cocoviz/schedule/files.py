"""`.sched` files: the steps of a schedule as text, one step a line (docs/schedules.md,
saved schedules).

A file cocoviz writes starts with two header lines, a versioned header and ``# steps: N``,
so a truncated file is detected instead of applying fewer steps; a hand-written file may
omit both. `apply -o` and `tune -o` add one comment line after them saying where the steps
come from (`format_sched`'s comment); comments are not checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from cocoviz.errors import InputError, Source, Span, UsageError, did_you_mean
from cocoviz.ir.lower import read_source
from cocoviz.ir.nodes import StepCall
from cocoviz.ir.syntax import parse_steps

SCHED_VERSION = 1
SCHED_MAGIC = "# cocoviz schedule"
"""Start of the first line of a `.sched` file written by cocoviz (`apply -o` and
`tune -o` overwrite only these); older cocoviz wrote exactly this line (no version)."""
SCHED_HEADER = f"{SCHED_MAGIC} v{SCHED_VERSION}"
"""First line of a `.sched` file written by this cocoviz. The second line is
``# steps: N``, so a truncated file is detected instead of applying fewer steps."""
_VERSIONED = re.compile(re.escape(SCHED_MAGIC) + r" v(\d+)")
_COUNT = re.compile(r"# steps: (\d+)")


def load_sched(path: str | Path) -> tuple[StepCall, ...]:
    """The steps of a `.sched` file."""
    p = Path(path)
    if not p.exists():
        hint = None
        if p.parent.is_dir():
            hint = did_you_mean(p.name, [q.name for q in p.parent.glob("*.sched")])
        raise InputError(f"{p}: no such schedule file", hint=hint)
    text = read_source(p, "schedule")
    steps = parse_steps(text, str(p))
    _check_complete(p, text, len(steps))
    return steps


def _check_complete(path: Path, text: str, count: int) -> None:
    """A versioned `.sched` file must hold as many steps as its ``# steps: N`` line says
    (a file without the version, hand-written or from an older cocoviz, is read as it
    is)."""
    source = Source(str(path), text)
    lines = source.lines
    first = lines[0].strip()

    def line(n: int) -> Span:
        return Span(source, n, 1, n, len(source.line(n)) + 1)

    start = text.strip()
    if start and start != SCHED_MAGIC and f"{SCHED_HEADER}\n# steps: ".startswith(start):
        raise InputError(
            f"{path}: the schedule file is truncated (it ends inside its header)",
            hint="save the schedule again",
        )
    m = _VERSIONED.fullmatch(first)
    if m is None:
        if first.startswith(SCHED_MAGIC) and first != SCHED_MAGIC:
            raise InputError(
                f"unrecognized schedule header '{first}'",
                line(1),
                hint=f"cocoviz writes '{SCHED_HEADER}'; a hand-written file may omit the line",
            )
        return
    version = int(m.group(1))
    if version > SCHED_VERSION:
        raise InputError(
            f"schedule file version {version} was written by a newer cocoviz "
            f"(this one reads version {SCHED_VERSION} and older)",
            line(1),
            hint="upgrade cocoviz",
        )
    said = _COUNT.fullmatch(lines[1].strip()) if len(lines) > 1 else None
    if said is None:
        raise InputError(
            f"{path}: the schedule file has no '# steps: N' line after its header "
            "(truncated, or edited by hand)",
            hint=f"save the schedule again, or remove the '{first}' line to read the file as it is",
        )
    expected = int(said.group(1))
    if count != expected:
        held = f"{count} step{'s' if count != 1 else ''}"
        raise InputError(
            f"the schedule file holds {held} but its header says {expected}: "
            "it is truncated or was edited",
            line(2),
            hint="save the schedule again, or correct the '# steps:' line if you edited it",
        )


def written_by_cocoviz(path: Path) -> bool:
    """Whether `path` is a `.sched` file cocoviz wrote (any version)."""
    from cocoviz import fsio  # the writers' module, imported by the commands that write

    raw = fsio.read_head(path, 4096)  # the header is on the first line
    if raw is None:
        return False
    first = raw.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    return first == SCHED_MAGIC or _VERSIONED.fullmatch(first) is not None


def check_sched_output(path: Path, force: bool, option: str = "-o") -> None:
    """`-o FILE.sched` writes a new file or replaces one cocoviz wrote; anything else
    needs --force. Checked before any work, so a refusal costs nothing."""
    if path.suffix != ".sched":
        raise UsageError(
            f"{option} {path}: a schedule file must end in .sched",
            hint="--schedule treats a name ending in .sched as a file, anything else as a block",
        )
    from cocoviz import fsio

    fsio.check_output(path, force=force, ours=written_by_cocoviz)


def save_sched(
    path: str | Path, steps: Iterable[StepCall | str], comment: str | None = None
) -> None:
    """Write a `.sched` file atomically (an OutputError when the system refuses)."""
    from cocoviz import fsio

    fsio.write_file(path, format_sched(steps, comment))


def format_sched(steps: Iterable[StepCall | str], comment: str | None = None) -> str:
    """`.sched` text: the versioned header, ``# steps: N``, an optional comment, one step
    per line."""
    shown = [str(s) for s in steps]
    lines = [SCHED_HEADER, f"# steps: {len(shown)}"]
    if comment:
        lines += [f"# {c}" if c else "#" for c in comment.splitlines()]
    lines += shown
    return "\n".join(lines) + "\n"


__all__ = [
    "SCHED_HEADER",
    "SCHED_MAGIC",
    "SCHED_VERSION",
    "check_sched_output",
    "format_sched",
    "load_sched",
    "save_sched",
    "written_by_cocoviz",
]
