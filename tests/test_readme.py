"""README.md stays true: every command in its ```sh blocks is run, and every ```text block
is the exact output of the command that precedes it.

- Each ```sh block runs, line by line and in order, with bash in a fresh temporary
  directory holding a copy of `samples/` (so nothing is written into the repository, and
  `out/` is that directory's), with this environment's `bin` first on PATH. A command
  exits 0 unless its trailing comment says `exit N`.
- A ```text block must follow a ```sh block directly; it is the output (stdout and stderr
  together, as a terminal shows them) of that block's last command, compared line by line
  after removing trailing spaces and trailing empty lines — nothing else is normalised:
  the outputs shown are deterministic (fixed seeds, no timings, no absolute paths).
- The ```coco block is `samples/megatron_mlp.coco`'s program (comments and spacing aside).
- Commands that cannot run here as written are in `NOT_RUN`, each with the reason and the
  check that stands in for it; any other command that is not run fails the test, and so
  does an entry of `NOT_RUN` that the README no longer has.
- Blocks that compile or run emitted code (`--build`, `run.sh`) or start MPI processes
  (`--mpi`) carry the `build` marker; they need make, mpicxx and (for the CUDA target) nvcc,
  and are skipped without them unless COCOVIZ_REQUIRE_MPI/NVCC=1 (.ci/run sets both).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import emulation_cache
from emit_support import emulation_lib, need_mpicxx, need_nvcc

from cocoviz import samples
from cocoviz.ir.lower import load_file

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^( *)```([\w-]*)\n(.*?)^\1```\n", re.M | re.S)
"""A fenced block, possibly indented (inside a list item)."""
EXIT = re.compile(r"\bexit (\d+)\b")
BUILD = re.compile(r"--build\b|--mpi\b|run\.sh\b")


@dataclass(frozen=True)
class Command:
    text: str
    """The command as written, without its comment."""
    comment: str
    line: int
    """Its line in README.md."""

    @property
    def exit_code(self) -> int:
        m = EXIT.search(self.comment)
        return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class Block:
    line: int
    commands: tuple[Command, ...]
    output: str | None
    """The ```text block right after it: its last command's output."""

    @property
    def build(self) -> bool:
        return any(BUILD.search(c.text) for c in self.commands)


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment) of a shell line: the comment starts at the first `#` outside
    quotes that follows a space."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def fences(text: str) -> list[tuple[str, str, int]]:
    """(info string, body, line number of the opening fence) of every fenced block."""
    return [
        (m.group(2), textwrap.dedent(m.group(3)), text.count("\n", 0, m.start()) + 1)
        for m in FENCE.finditer(text)
    ]


def readme_blocks() -> list[Block]:
    out: list[Block] = []
    fs = fences(README.read_text(encoding="utf-8"))
    for i, (info, body, line) in enumerate(fs):
        if info != "sh":
            continue
        commands = []
        pending = ""
        for j, raw in enumerate(body.splitlines(), start=line + 1):
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            text, comment = split_comment(pending + raw)
            pending = ""
            if text.strip():
                commands.append(Command(text.strip(), comment, j))
        following = fs[i + 1] if i + 1 < len(fs) else None
        output = following[1] if following and following[0] == "text" else None
        out.append(Block(line, tuple(commands), output))
    return out


BLOCKS = readme_blocks()

NOT_RUN: dict[str, str] = {
    "pip install -e '.[dev]' && cocoviz": (
        "installs into the running environment and opens the TUI, which needs a terminal; "
        "instead the extras named are checked against pyproject.toml and `cocoviz` is run "
        "without a terminal (test_the_tui_command_needs_a_terminal)"
    ),
    "pip install -e '.[dev]'": "installs (network, 1.4 GB); the extra is checked instead",
    "pip install -e .": "installs; what it installs is pyproject.toml's dependencies",
    "pip install -e '.[mpi]'": "installs; the extra is checked against pyproject.toml instead",
    "python -m pytest": (
        "the test suite this test belongs to; instead: .ci/run runs exactly this command"
    ),
    'python -m pytest -m "not build"': (
        "the test suite this test belongs to; instead: `build` is a registered marker and "
        "this test's build blocks carry it"
    ),
}
"""Commands of the README not run as written: the reason, and what is checked instead."""


def _commands() -> list[Command]:
    return [c for b in BLOCKS for c in b.commands]


def test_the_readme_has_commands_and_outputs() -> None:
    text = README.read_text(encoding="utf-8")
    assert {info for info, _, _ in fences(text)} <= {"sh", "text", "coco"}
    assert len(_commands()) >= 15
    assert sum(b.output is not None for b in BLOCKS) >= 3
    # the first lines: install and open the TUI, then the test command
    first = BLOCKS[0]
    assert fences(text)[0][2] == 3
    assert [c.text for c in first.commands] == [
        "pip install -e '.[dev]' && cocoviz",
        "python -m pytest",
    ]


def test_every_text_block_follows_a_command_block() -> None:
    fs = fences(README.read_text(encoding="utf-8"))
    for i, (info, _, line) in enumerate(fs):
        if info == "text":
            assert i > 0 and fs[i - 1][0] == "sh", f"README.md:{line}: a text block with no command"


def test_the_not_run_list_is_exact() -> None:
    written = {c.text for c in _commands()}
    assert set(NOT_RUN) <= written, f"no longer in the README: {set(NOT_RUN) - written}"
    for b in BLOCKS:
        if b.output is not None:
            assert b.commands[-1].text not in NOT_RUN, f"README.md:{b.line}: output not checked"


def _extras() -> dict[str, list[str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return data["project"]["optional-dependencies"]


def test_the_install_commands_name_real_extras() -> None:
    extras = _extras()
    named = set()
    for c in _commands():
        if c.text.startswith("pip install"):
            named |= set(re.findall(r"\.\[([\w,]+)\]", c.text))
    assert named, "no install command found"
    for group in named:
        for extra in group.split(","):
            assert extra in extras, f"pip install names [{extra}], which pyproject.toml lacks"
    # `[dev]` is what the tests need: the CUDA wheels and MPI included
    assert "cocoviz[mpi,cuda]" in extras["dev"]


def test_the_test_commands_are_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == "python -m pytest"
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = data["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("build:") for m in markers)
    assert any(b.build for b in BLOCKS)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"  # stdout and stderr interleave as in a terminal
    env.pop("COCOVIZ_UPDATE_GOLDEN", None)
    return env


def test_the_tui_command_needs_a_terminal(tmp_path: Path) -> None:
    """`cocoviz` alone opens the TUI; without a terminal it says so (exit 2, usage)."""
    res = subprocess.run(
        ["cocoviz"],
        cwd=tmp_path,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert "the terminal UI needs a terminal" in res.stderr


def test_the_program_shown_is_the_sample() -> None:
    (body,) = [b for info, b, _ in fences(README.read_text(encoding="utf-8")) if info == "coco"]

    def code(text: str) -> list[str]:
        lines = (split_comment(ln)[0] for ln in text.splitlines())
        return [" ".join(ln.split()) for ln in lines if ln.strip()]

    sample = code(samples.path("megatron_mlp").read_text(encoding="utf-8"))
    end = next(i for i, ln in enumerate(sample) if ln.startswith("schedule "))
    assert code(body) == sample[:end]
    # the README says its CUDA binary needs one GPU per rank: 8
    assert load_file(samples.path("megatron_mlp")).grid.world == 8
    assert "8 GPUs" in README.read_text(encoding="utf-8")


def _block_params() -> list[object]:
    out = []
    for b in BLOCKS:
        if all(c.text in NOT_RUN for c in b.commands):
            continue
        marks = [pytest.mark.build] if b.build else []
        out.append(pytest.param(b, marks=marks, id=f"line{b.line}"))
    return out


@pytest.mark.parametrize("block", _block_params())
def test_readme_block_runs_as_documented(
    block: Block, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = _env()
    if block.build:
        need_mpicxx()
        if any(
            "--build" in c.text and not re.search(r"--target cpu|--emulate", c.text)
            for c in block.commands
        ):
            need_nvcc()
        if any("--emulate" in c.text for c in block.commands):
            # the emulation library, built once per session (docs/codegen.md: EMU_LIB)
            cache = emulation_cache(tmp_path_factory)
            env["EMU_LIB"] = str(emulation_lib(cache))
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "samples", work / "samples")
    output = ""
    for c in block.commands:
        if c.text in NOT_RUN:
            continue
        res = subprocess.run(
            ["bash", "-c", c.text],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=900,
            check=False,
        )
        assert res.returncode == c.exit_code, (
            f"README.md:{c.line}: `{c.text}` exited {res.returncode}, "
            f"expected {c.exit_code}:\n{res.stdout[-4000:]}"
        )
        output = res.stdout
    if block.output is not None:
        assert _normal(output) == _normal(block.output), (
            f"README.md:{block.line}: the text block is not what `{block.commands[-1].text}` "
            f"prints; it prints:\n{output}"
        )


def _normal(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
