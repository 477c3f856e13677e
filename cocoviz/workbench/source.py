"""What a workbench opens: a `.coco` file, a sample by name, or the default sample, with
the steps to apply at start (a schedule block or a `.sched` file, docs/schedules.md) or,
in teach mode, the steps to teach.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cocoviz import samples
from cocoviz.ir.lower import load_program, read_source
from cocoviz.schedule import block_steps, load_sched

__all__ = ["Source", "open_source"]


@dataclass(frozen=True)
class Source:
    """A program's text and how it is named."""

    text: str
    label: str
    """The file name shown in the UI and given to the parser (`megatron_mlp.coco`)."""
    key: str
    """What the autosave is filed under: the absolute path, or `sample:<name>`."""
    command_file: str
    """What `cocoviz apply` is given for it: the path as typed, or the sample's name."""
    path: Path | None = None
    """The file, when it is one (None for a sample)."""
    steps: tuple[str, ...] = ()
    """The steps applied when it is opened."""
    teach_steps: tuple[str, ...] | None = None
    """The steps teach mode walks through; None: the program's last schedule block."""


def open_source(
    file: str | Path | None,
    *,
    text: str | None = None,
    schedule: str | None = None,
    teach: bool = False,
) -> Source:
    """The source for a file, a sample name, or the default sample (`file` None); `text`,
    when given, replaces the file's contents.

    `schedule` (a block name or a `.sched` file) is applied at start; with `teach` it is
    the schedule to teach instead, and nothing is applied. Raises CocovizError when the
    file cannot be read, or the schedule found (a block needs the text to parse).
    """
    path: Path | None = None
    if file is None:
        name = samples.DEFAULT
        text = samples.text(name) if text is None else text
        label, key, command_file = f"{name}.coco", f"sample:{name}", name
    else:
        p = Path(file)
        stem = samples.named_by(file)
        if stem is not None:
            text = samples.text(stem) if text is None else text
            label, key, command_file = f"{stem}.coco", f"sample:{stem}", stem
        else:
            if text is None:
                text = read_source(p)
            path = p
            label, key, command_file = p.name, str(p.resolve()), str(file)
    chosen: tuple[str, ...] = ()
    if schedule:
        if schedule.endswith(".sched"):
            calls = load_sched(Path(schedule))
        else:
            calls = block_steps(load_program(text, label), schedule)
        chosen = tuple(str(s) for s in calls)
    return Source(
        text,
        label,
        key,
        command_file,
        path,
        steps=() if teach else chosen,
        teach_steps=chosen if teach and schedule else None,
    )
