"""The command line as a new user meets it: every command and option explains itself,
output piped into `head` is not an error, and steps may follow the options."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import build_parser, main


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_has_a_description_and_every_option_a_help_text() -> None:
    missing: list[str] = []
    for name, p in _subcommands().items():
        if not p.description:
            missing.append(f"{name}: no description")
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing


def test_hw_help_lists_the_profiles_and_the_default() -> None:
    from cocoviz.sim.hardware import DEFAULT_PROFILE, list_profiles

    for name in ("simulate", "tui", "model-table", "emit"):
        hw = next(a for a in _subcommands()[name]._actions if "--hw" in a.option_strings)
        assert f"default {DEFAULT_PROFILE}" in str(hw.help)
        assert all(profile in str(hw.help) for profile in list_profiles())


def test_sample_descriptions_are_whole_sentences(capsys) -> None:  # type: ignore[no-untyped-def]
    for name in samples.names():
        text = samples.description(name)
        assert text.endswith("."), (name, text)
        assert text in " ".join(
            line.lstrip("#").strip() for line in samples.text(name).splitlines()
        ), name
    assert main(["samples"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in samples.names():
        assert samples.description(name) in out


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "adam"],
        ["show", "adam", "--graph"],
        ["show", "adam"],
        ["tune", "sgd"],
        ["model-table"],
        ["samples"],
    ],
    ids=lambda a: " ".join(a),
)
def test_output_cut_short_by_the_reader_is_not_an_error(argv: list[str]) -> None:
    env = {**os.environ, "COLUMNS": "120"}
    cmd = [sys.executable, "-m", "cocoviz", *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    rc = proc.wait(timeout=120)
    err = proc.stderr.read().decode()
    assert first, err
    assert rc == 0, err
    assert "Exception ignored" not in err and "Traceback" not in err, err


def test_steps_may_come_after_the_options(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["apply", "sgd", "--ranks", "4", "split(g1)", "-D", "N=64", "reorder(g1)"]) == 0
    out = capsys.readouterr().out
    assert "reducescatter" in out and "allgather" in out
    assert main(["apply", "sgd", "split(g1)", "--json", "--ranks", "4", "reorder(g1)"]) == 0
    assert '"reorder(g1)"' in capsys.readouterr().out


def test_an_unknown_option_or_argument_is_still_a_usage_error(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["apply", "sgd", "--bogus", "split(g1)"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert main(["show", "sgd", "extra"]) == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize(
    "argv",
    [["simulate", "adam"], ["check", "adam"], ["show", "adam"], ["tune", "sgd"]],
    ids=lambda a: " ".join(a),
)
def test_output_to_a_full_disk_is_a_clear_error(argv: list[str]) -> None:
    """/dev/full fails every write with ENOSPC: the command says its output could not be
    written (exit 2), never an internal error nor Python's "Exception ignored"."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "cocoviz", *argv], stdout=full, stderr=subprocess.PIPE,
            timeout=120, env={**os.environ, "COLUMNS": "120"},
        )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "cannot write the output" in err and "the file system is full" in err, err
    assert "internal error" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize(
    "argv", [["simulate", "adam"], ["show", "adam"], ["check", "adam"]], ids=" ".join
)
def test_a_bounded_command_ends_with_all_of_its_output(  # type: ignore[no-untyped-def]
    argv: list[str], capsys, monkeypatch
) -> None:
    """Check, show, apply and simulate end the process without finalizing its objects
    (`cli.entry`): what they printed is flushed first, byte for byte what `main` prints."""
    monkeypatch.setenv("COLUMNS", "120")
    proc = subprocess.run(
        [sys.executable, "-m", "cocoviz", *argv], capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert main(argv) == 0
    assert proc.stdout.decode() == capsys.readouterr().out
