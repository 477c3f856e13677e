"""The headless edges of issue 28 (items 8, 9): `--json` errors are JSON on stdout with
the text diagnostic's fields; `run --mpi --hostfile FILE` and `--mpi-args` reach mpiexec
(two loopback "hosts"); the emitted run.sh takes `mpiexec` from PATH unless `MPIEXEC`
says otherwise."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from mpi_support import mpi  # noqa: F401 - the fixture

from cocoviz.cli import main
from cocoviz.errors import UsageError
from cocoviz.exec import mpi_run

SMALL = ["--ranks", "4", "-D", "B=2", "-D", "S=8", "-D", "H=32"]

# --- --json errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["apply", "megatron_mlp", "fuse(nope, out)", "--json"],
        ["simulate", "no_such_file.coco", "--json"],
        ["run", "megatron_mlp", "--hostfile", "hosts", "--json"],
    ],
    ids=["step", "file", "usage"],
)
def test_a_json_command_that_fails_prints_its_diagnostic_as_json(argv, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc != 0
    report = json.loads(out)
    assert report["ok"] is False and report["exit_code"] == rc
    (diag,) = report["errors"]
    # the same fields as the text diagnostic on stderr
    where = f"{diag['file']}:{diag['line']}:{diag['col']}: " if diag["line"] else ""
    assert f"{where}{diag['severity']}: {diag['message']}" in err, (diag, err)
    if diag["hint"]:
        assert f"hint: {diag['hint']}" in err


def test_a_json_command_that_succeeds_prints_no_error(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["simulate", "megatron_mlp", "--json"]) == 0
    assert "errors" not in json.loads(capsys.readouterr().out)


# --- run --mpi --hostfile / --mpi-args ----------------------------------------------------------


def test_hostfile_and_mpi_args_are_checked_before_a_process_starts(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# two loopback hosts\nlocalhost:2\n127.0.0.1:2\n")
    assert mpi_run.launcher_args(hosts, ["-genv", "X", "1"]) == [
        "-hostfile",
        str(hosts.resolve()),
        "-genv",
        "X",
        "1",
    ]
    assert mpi_run.launcher_args(None, []) == []
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(UsageError, match="expected a host on a line"):
        mpi_run.launcher_args(empty, [])
    with pytest.raises(UsageError, match="expected a readable text file"):
        mpi_run.launcher_args(tmp_path / "missing", [])


@pytest.mark.parametrize("flag", [["--hostfile", "hosts"], ["--mpi-args", "-genv X 1"]])
def test_hostfile_and_mpi_args_need_mpi(flag, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["run", "megatron_mlp", *SMALL, *flag]) == 2
    assert f"{flag[0]} is for real processes: add --mpi" in capsys.readouterr().err


def test_unbalanced_mpi_args_are_a_usage_error(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["run", "megatron_mlp", *SMALL, "--mpi", "--mpi-args", "-genv 'X"]) == 2
    assert "--mpi-args: expected shell words" in capsys.readouterr().err


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
def test_run_mpi_on_two_loopback_hosts_with_mpi_args(tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n127.0.0.1:2\n")
    launched: list[list[str]] = []
    launch = mpi_run.MpiJob.launch

    def spy(self, cmd):  # type: ignore[no-untyped-def]
        launched.append(list(cmd))
        return launch(self, cmd)

    monkeypatch.setattr(mpi_run.MpiJob, "launch", spy)
    argv = ["run", "megatron_mlp", "--schedule", "fused", *SMALL, "--mpi"]
    argv += ["--hostfile", str(hosts), "--mpi-args", "-genv COCOVIZ_TEST_ARG 1", "--json"]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert report["ok"] and report["ranks"] == 4
    (cmd,) = launched
    n = cmd.index("-n")
    assert cmd[1:n] == ["-hostfile", str(hosts.resolve()), "-genv", "COCOVIZ_TEST_ARG", "1"]


@pytest.mark.build
@pytest.mark.usefixtures("mpi")
def test_a_host_mpiexec_cannot_reach_is_named(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The hostfile reaches mpiexec: a host it cannot reach is in the error."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\nno-such-host.invalid:2\n")
    argv = ["run", "megatron_mlp", *SMALL, "--mpi", "--hostfile", str(hosts), "--timeout", "60"]
    assert main(argv) != 0
    assert "no-such-host.invalid" in capsys.readouterr().err


# --- run.sh and mpiexec -------------------------------------------------------------------------


def _fake_mpiexec(path: Path, tag: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{tag} $*"\n')
    path.chmod(0o755)


def test_run_sh_takes_mpiexec_from_path_unless_mpiexec_is_set(tmp_path: Path) -> None:
    out = tmp_path / "sgd"
    assert (
        main(["emit", "sgd", "--target", "cpu", "-o", str(out), "-D", "N=64", "--ranks", "2"]) == 0
    )
    script = (out / "run.sh").read_text()
    assert re.search(r"\$\{MPIEXEC:-\$\(command -v mpiexec \|\| echo [^)]+\)\}", script), script
    on_path = tmp_path / "bin" / "mpiexec"
    _fake_mpiexec(on_path, "from-path")
    chosen = tmp_path / "chosen" / "mpiexec"
    _fake_mpiexec(chosen, "from-MPIEXEC")
    env = {k: v for k, v in os.environ.items() if k not in ("MPIEXEC", "MPIRUN")}
    env["PATH"] = f"{on_path.parent}:/usr/bin:/bin"

    def run(**more: str) -> str:
        done = subprocess.run(
            [str(out / "run.sh"), "--iters", "1"],
            env={**env, **more},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()

    assert run() == "from-path -n 2 ./sgd --iters 1"
    assert run(MPIEXEC=str(chosen)) == "from-MPIEXEC -n 2 ./sgd --iters 1"
