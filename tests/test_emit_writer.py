"""The output directory: atomic writes, only changed files rewritten, stale files removed,
a foreign non-empty directory refused without --force; CLI options and refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cocoviz.cli import main
from cocoviz.emit.writer import MARKER, write_tree
from cocoviz.errors import UsageError


def test_new_directory_is_written_with_marker(tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = write_tree(out, {"a.cu": "A", "run.sh": "#!/bin/sh\n"})
    assert sorted(res.written) == ["a.cu", "run.sh"]
    assert (out / "a.cu").read_text() == "A"
    assert os.access(out / "run.sh", os.X_OK)
    assert json.loads((out / MARKER).read_text())["files"] == ["a.cu", "run.sh"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_only_changed_files_are_rewritten_and_stale_ones_removed(tmp_path: Path) -> None:
    out = tmp_path / "o"
    write_tree(out, {"a.cu": "A", "b.cu": "B", "c.cu": "C"})
    before = (out / "a.cu").stat().st_mtime_ns
    os.utime(out / "a.cu", ns=(before - 10**9, before - 10**9))
    old = (out / "a.cu").stat().st_mtime_ns
    res = write_tree(out, {"a.cu": "A", "b.cu": "B2"})
    assert res.unchanged == ("a.cu",) and res.written == ("b.cu",) and res.removed == ("c.cu",)
    assert (out / "a.cu").stat().st_mtime_ns == old
    assert (out / "b.cu").read_text() == "B2"
    assert not (out / "c.cu").exists()


def test_foreign_directory_is_refused_without_force(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="cocoviz did not write it"):
        write_tree(out, {"a.cu": "A"})
    assert not (out / "a.cu").exists()
    write_tree(out, {"a.cu": "A"}, force=True)
    assert (out / "a.cu").read_text() == "A" and (out / "notes.txt").read_text() == "keep me"


def test_empty_existing_directory_is_fine(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    write_tree(out, {"a.cu": "A"})
    assert (out / "a.cu").exists()


def test_cli_emit_writes_tree_and_refuses_foreign_dir(tmp_path: Path, capsys) -> None:
    out = tmp_path / "o"
    assert main(["emit", "megatron_mlp", "--schedule", "fused", "-o", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"megatron_mlp.cu", "main.cu", "Makefile", "run.sh", "manifest.json"} <= names
    assert main(["emit", "megatron_mlp", "-o", str(out), "--target", "cpu"]) == 0
    assert "megatron_mlp.cu" not in {p.name for p in out.iterdir()}  # stale file removed
    foreign = tmp_path / "f"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    capsys.readouterr()
    assert main(["emit", "megatron_mlp", "-o", str(foreign)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["emit", "megatron_mlp", "-o", str(foreign), "--force"]) == 0


def test_cli_refuses_volta(tmp_path: Path, capsys) -> None:
    assert main(["emit", "megatron_mlp", "-o", str(tmp_path / "o"), "--arch", "sm_70"]) == 2
    err = capsys.readouterr().err
    assert "CUDA 13 cannot build" in err and "sm_70" in err
    assert not (tmp_path / "o").exists()


def test_cli_collectives_needs_cuda(tmp_path: Path, capsys) -> None:
    argv = ["emit", "sgd", "-o", str(tmp_path / "o"), "--target", "cpu"]
    assert main([*argv, "--collectives", "nccl-device"]) == 2
    assert "--target cuda" in capsys.readouterr().err
