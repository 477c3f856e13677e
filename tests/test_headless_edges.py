"""The headless edges of issue 28 (items 8, 9): `--json` errors are JSON on stdout with
the text diagnostic's fields; `run --mpi --hostfile FILE` and `--mpi-args` reach mpiexec
(two loopback "hosts"); the emitted run.sh takes `mpiexec` from PATH unless `MPIEXEC`
says otherwise; run.sh refuses a binary built from other sources (the build stamp) and
make rebuilds it whatever the files' times say; a failed build shows the compiler's own
lines; `apply --explain` agrees with applying and says only what holds; the `.sched`
header is what docs/schedules.md shows; a name a step makes, named before that step,
says which step makes it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import need_tool
from emit_support import need_mpicxx
from mpi_support import mpi  # noqa: F401 - the fixture

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.emit.emitter import compiler_messages
from cocoviz.emit.stamp import STALE_EXIT, built_from, cksum, sources_sum, write_stamp
from cocoviz.errors import ExitCode, ScheduleError, UsageError
from cocoviz.exec import mpi_run
from cocoviz.ir.lower import load_file, load_program
from cocoviz.ir.nodes import Op, Program, unscheduled
from cocoviz.ir.transforms.step import made_by
from cocoviz.schedule import Session
from cocoviz.schedule.files import SCHED_HEADER, load_sched

ROOT = Path(__file__).resolve().parent.parent

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


def _fake(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _fake_mpiexec(path: Path, tag: str) -> None:
    _fake(path, f'#!/bin/sh\necho "{tag} $*"\n')


def _emit(out: Path, target: str, *more: str) -> None:
    argv = ["emit", "sgd", "--target", target, "-o", str(out), "-D", "N=64", "--ranks", "2"]
    assert main([*argv, *more]) == 0


def _sources(out: Path) -> tuple[str, ...]:
    """The files the tree's binaries are built from, as its Makefile lists them: emitted
    files, not run.sh or the manifest."""
    m = re.search(r"^BUILT_FROM := (.*)$", (out / "Makefile").read_text(), re.M)
    assert m is not None
    names = tuple(m.group(1).split())
    emitted = json.loads((out / ".cocoviz-emit").read_text())["files"]
    assert names == built_from(names) and set(names) <= set(emitted), (names, emitted)
    assert {"Makefile", "main.cpp", "sgd.h"} <= set(names) or "main.cu" in names
    return names


def _fake_build(out: Path, binary: str) -> None:
    """What make leaves: the binary (here a script) and its stamp."""
    _fake(out / binary, "#!/bin/sh\necho ran\n")
    write_stamp(out, binary, _sources(out))


def _env(launcher_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MPIEXEC", "MPIRUN", "MPIRUN_ARGS")}
    env["PATH"] = f"{launcher_dir}:/usr/bin:/bin"
    return env


def _run_sh(out: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(out / "run.sh"), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.build
@pytest.mark.parametrize(("target", "np"), [("cpu", "-n"), ("cuda", "-np")])
def test_run_sh_takes_mpiexec_from_path_unless_mpiexec_is_set(
    tmp_path: Path, target: str, np: str
) -> None:
    out = tmp_path / "sgd"
    _emit(out, target)
    script = (out / "run.sh").read_text()
    assert re.search(r"\$\{MPIEXEC:-\$\(command -v mpiexec \|\| echo [^)]+\)\}", script), script
    _fake_build(out, "sgd")
    on_path = tmp_path / "bin" / "mpiexec"
    _fake_mpiexec(on_path, "from-path")
    chosen = tmp_path / "chosen" / "mpiexec"
    _fake_mpiexec(chosen, "from-MPIEXEC")
    env = _env(on_path.parent)

    def run(**more: str) -> str:
        done = _run_sh(out, {**env, **more}, "--iters", "1")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == f"from-path {np} 2 ./sgd --iters 1"
    assert run(MPIEXEC=str(chosen)) == f"from-MPIEXEC {np} 2 ./sgd --iters 1"


# --- a binary built from other sources (the build stamp) ----------------------------------------


def test_the_stamp_is_posix_cksum() -> None:
    """The Python sum is the one run.sh and the Makefile compute with `cksum`."""
    for data in (b"", b"a", b"x" * 300, bytes(range(256)) * 40):
        done = subprocess.run(["cksum"], input=data, capture_output=True, check=True)
        assert cksum(data) == done.stdout.decode().strip()


@pytest.mark.build
@pytest.mark.parametrize(
    ("target", "binary", "flag", "make"),
    [
        ("cpu", "sgd", (), "make"),
        ("cuda", "sgd", (), "make"),
        ("cuda", "sgd-emu", ("--emulate",), "make emulate"),
    ],
    ids=["cpu", "cuda", "emulate"],
)
def test_run_sh_refuses_a_binary_built_from_other_sources(
    tmp_path: Path, target: str, binary: str, flag: tuple[str, ...], make: str
) -> None:
    out = tmp_path / "o"
    _emit(out, target)
    launcher = tmp_path / "bin" / "mpiexec"
    _fake_mpiexec(launcher, "launched")
    env = _env(launcher.parent)

    missing = _run_sh(out, env, *flag)
    assert missing.returncode == 2
    assert f"run.sh: ./{binary} is not built: run '{make}' first" in missing.stderr

    _fake_build(out, binary)
    ok = _run_sh(out, env, *flag, "--iters", "1")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("launched ")

    # another schedule emitted into the tree without --build: the old binary is refused
    _emit(out, target, "--schedule", "fused")
    stale = _run_sh(out, env, *flag, "--iters", "1")
    assert stale.returncode == STALE_EXIT == 5, stale.stderr
    assert stale.stdout == ""  # nothing was launched
    assert stale.stderr == (
        f"run.sh: ./{binary} was built from other sources than this tree now holds "
        f"(emitted again or edited since): run '{make}' to rebuild it\n"
    )
    # an edit counts as much as a re-emit; a binary without a stamp is refused as well
    _fake_build(out, binary)
    assert _run_sh(out, env, *flag).returncode == 0
    with (out / "Makefile").open("a") as f:
        f.write("# edited\n")
    assert _run_sh(out, env, *flag).returncode == STALE_EXIT
    _fake_build(out, binary)
    (out / f"{binary}.stamp").unlink()
    assert _run_sh(out, env, *flag).returncode == STALE_EXIT


def test_docs_give_run_sh_s_exit_code_for_a_stale_binary() -> None:
    doc = (ROOT / "docs" / "codegen.md").read_text()
    section = doc[doc.index("**A binary from other sources.**") :]
    section = section[: section.index("\n## ")]
    assert f"**exit {STALE_EXIT}**" in section
    template = (ROOT / "cocoviz" / "templates" / "run.sh.jinja").read_text()
    shown = re.search(r"\n(run\.sh: \./megatron_mlp was built from[^\n]*)\n", section)
    assert shown is not None
    said = re.search(r'echo "(run\.sh: \./\$1 was built from[^"]*)"', template)
    assert said is not None
    assert shown.group(1) == said.group(1).replace("$1", "megatron_mlp").replace("$2", "make")
    assert f"exit {STALE_EXIT}\n" in template


def _touch_future(paths: list[Path]) -> None:
    later = time.time() + 3600  # built "in the future": a copied tree, or a skewed clock
    for p in paths:
        os.utime(p, (later, later))


def _make(out: Path, how: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["make", how, "--no-print-directory", "-C", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _up_to_date(out: Path, *args: str) -> bool:
    return _make(out, "-q", *args).returncode == 0


def _make_n(out: Path, *args: str) -> str:
    done = _make(out, "-n", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.build
def test_make_rebuilds_a_stale_binary_whatever_the_times_say(tmp_path: Path) -> None:
    """`make -n` on a CUDA tree whose binaries and objects look newer than every source
    but were built from other sources: both builds compile again (nothing is compiled
    here; make only says what it would run)."""
    need_tool(shutil.which("make"), "make", mpi=True)
    out = tmp_path / "o"
    _emit(out, "cuda")
    (out / "emu").mkdir()
    lib = tmp_path / "libcocoviz_emu.a"
    lib.write_text("")
    built = [out / n for n in ("main.o", "sgd.o", "sgd", "sgd-emu")]
    built += [out / "emu" / n for n in ("main.o", "sgd.o")]
    for p in built:
        p.write_text("")
    for binary in ("sgd", "sgd-emu"):
        write_stamp(out, binary, _sources(out))
    _touch_future([lib, *built])
    assert _up_to_date(out)
    assert _up_to_date(out, "emulate", f"EMU_LIB={lib}")

    _emit(out, "cuda", "--schedule", "fused")  # changes sgd.cu
    _touch_future([lib, *built])
    assert not _up_to_date(out)
    plan = _make_n(out)
    assert "-c main.cu -o main.o" in plan and "-c sgd.cu -o sgd.o" in plan
    assert "-o sgd main.o sgd.o" in plan
    assert "> sgd.stamp" in plan
    emu = _make_n(out, "emulate", f"EMU_LIB={lib}")
    assert "-c main.cu -o emu/main.o" in emu and "-c sgd.cu -o emu/sgd.o" in emu
    assert "> sgd-emu.stamp" in emu


@pytest.mark.build
def test_a_re_emitted_cpu_tree_runs_only_after_make(tmp_path: Path) -> None:
    """The whole story on a real build: built and run, another schedule emitted, run.sh
    refuses, make (with the old binary's times in the future) rebuilds, and the new
    schedule runs."""
    need_mpicxx()
    out = tmp_path / "o"
    _emit(out, "cpu", "--build")
    assert sources_sum(out, _sources(out)) == (out / "sgd.stamp").read_text().strip()
    first = _run_sh(out, dict(os.environ), "--iters", "1")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["schedule"] == ""

    _emit(out, "cpu", "--schedule", "fused")
    _touch_future([out / "sgd", out / "main.o", out / "sgd.o"])
    stale = _run_sh(out, dict(os.environ), "--iters", "1")
    assert stale.returncode == STALE_EXIT, stale.stderr
    assert "run 'make' to rebuild it" in stale.stderr
    made = subprocess.run(["make", "-C", str(out)], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    again = _run_sh(out, dict(os.environ), "--iters", "1", "--check")
    assert again.returncode == 0, again.stderr
    line = json.loads(again.stdout)
    assert line["schedule"] == "fused" and line["check"] == "pass"


# --- a failed build shows the compiler's own lines ----------------------------------------------

GCC_OUTPUT = """\
sgd.cpp: In function 'void sch::run(State&)':
sgd.cpp:617:1: error: expected unqualified-id before 'this'
  617 | this is not C++;
      | ^~~~
sgd.cpp:620:3: warning: unused variable 'k' [-Wunused-variable]
make: *** [Makefile:30: sgd.o] Error 1
"""


def test_compiler_messages_are_the_error_lines_with_their_caret() -> None:
    assert compiler_messages(GCC_OUTPUT) == [
        "sgd.cpp:617:1: error: expected unqualified-id before 'this'",
        "  617 | this is not C++;",
        "      | ^~~~",
        "make: *** [Makefile:30: sgd.o] Error 1",
    ]


@pytest.mark.build
@pytest.mark.parametrize(
    ("said", "shown"),
    [
        # nvcc's own words carry no "error": only make's `Error 1` was shown
        (
            b"nvcc fatal   : Unsupported gpu architecture 'compute_99'\n",
            ["nvcc fatal   : Unsupported gpu architecture 'compute_99'"],
        ),
        # the linker: only collect2's summary was shown, not what is undefined
        (
            b"/usr/bin/ld: main.o: in function `main':\n"
            b"main.cpp:(.text+0x1d): undefined reference to `sch::create(int)'\n"
            b"collect2: error: ld returned 1 exit status\n",
            [
                "main.cpp:(.text+0x1d): undefined reference to `sch::create(int)'",
                "collect2: error: ld returned 1 exit status",
            ],
        ),
        # a compiler speaking another encoding: shown, not a crash (exit 70)
        (
            b"sgd.cpp:3:1: error: stray '\\377' in program \xff\xfe\n",
            ["sgd.cpp:3:1: error: stray '\\377' in program \ufffd\ufffd"],
        ),
        # words that read as no error at all: what the compiler said, not the commands
        (
            b"cc1plus: out of memory allocating 65536 bytes\n",
            ["cc1plus: out of memory allocating 65536 bytes"],
        ),
    ],
    ids=["nvcc-fatal", "linker", "encoding", "other"],
)
def test_a_failed_build_shows_the_compiler_s_own_lines(
    tmp_path: Path, monkeypatch, capsys, said: bytes, shown: list[str]
) -> None:  # type: ignore[no-untyped-def]
    need_tool(shutil.which("make"), "make", mpi=True)
    compiler = tmp_path / "bin" / "fake-mpicxx"
    (tmp_path / "said").write_bytes(said)
    _fake(compiler, f"#!/bin/sh\ncat '{tmp_path / 'said'}' >&2\nexit 1\n")
    monkeypatch.setenv("MPICXX", str(compiler))  # the Makefile's `MPICXX ?=` gives way
    out = tmp_path / "o"
    argv = ["emit", "sgd", "--target", "cpu", "-o", str(out), "-D", "N=64", "--ranks", "2"]
    assert main([*argv, "--build"]) == ExitCode.BUILD != ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert f"error: building the emitted code in {out} failed (make exit 2):" in err
    for line in shown:
        assert f"\n{line}\n" in err, err
    assert re.search(r"\nmake: \*\*\* \[Makefile:\d+: \S+\.o\] Error 1\n", err), err
    assert f"hint: run `make -C {out}` to see the full output" in err
    assert "Traceback" not in err


# --- apply --explain ----------------------------------------------------------------------------


def test_explain_gives_the_chunk_count_applying_gives(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """moe_layer: every legal overlap `--explain y` offers has the chunk count that
    applying the step without `chunks=` records."""
    assert main(["apply", "moe_layer", "--explain", "y", "--json"]) == 0
    offered = [e["step"] for e in json.loads(capsys.readouterr().out) if e["ok"]]
    overlaps = [s for s in offered if s.startswith("overlap(")]
    assert overlaps
    for step in overlaps:
        m = re.fullmatch(r"(overlap\(.*), chunks=(\d+)\)", step)
        assert m is not None, step
        sched = tmp_path / "s.sched"
        assert main(["apply", "moe_layer", m.group(1) + ")", "-o", str(sched), "--force"]) == 0
        capsys.readouterr()
        (applied,) = load_sched(sched)
        assert str(applied) == step


def _explained(capsys, *argv: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    assert main(["apply", *argv, "--json"]) == 0
    return {e["step"]: e["reason"] or "" for e in json.loads(capsys.readouterr().out)}


def test_explain_says_half_of_a_split_allreduce_only_of_one(capsys) -> None:  # type: ignore[no-untyped-def]
    # zero3_layer's allgather of the weight is the program's own, no half of anything
    reason = _explained(capsys, "zero3_layer", "--explain", "wg")["split(wg)"]
    assert "half" not in reason and "split in two" not in reason
    assert "split applies to an allreduce" in reason
    # after split(sum), both halves say so, naming each other
    for stage in ("sum", "sum_rs"):
        why = _explained(capsys, "megatron_mlp", "split(sum)", "--explain", stage)
        assert (
            "'sum_rs' (reducescatter) and 'sum' (allgather) already are an allreduce "
            in (why[f"split({stage})"])
        )
    # an allgather of computed values (after reorder) is no half either
    why = _explained(capsys, "megatron_mlp", "split(sum); reorder(sum)", "--explain", "out")
    assert "split in two" not in why["split(out)"]


# --- .sched headers -----------------------------------------------------------------------------


def test_sched_file_is_what_the_docs_show(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    doc = (ROOT / "docs" / "schedules.md").read_text()
    m = re.search(r"<!-- saved: (\w+): (.*?) -->\n\s*```sched\n(.*?)```", doc, re.S)
    assert m is not None
    sample, steps, block = m.groups()
    shown = "".join(line.strip() + "\n" for line in block.splitlines() if line.strip())
    out = tmp_path / "rs.sched"
    assert main(["apply", sample, *steps.split("; "), "-o", str(out)]) == 0
    capsys.readouterr()
    saved = out.read_text()
    assert saved == shown
    # the prose: two header lines (version, step count), then apply's one comment line
    assert "starts with two header\n  lines: the format version, and the number of steps" in doc
    lines = saved.splitlines()
    assert lines[0] == SCHED_HEADER
    assert lines[1] == f"# steps: {len(steps.split('; '))}"
    assert lines[2] == f"# program {sample}, written by cocoviz apply"
    assert not any(ln.startswith("#") for ln in lines[3:])


# --- a name a step makes, named before that step ------------------------------------------------


def _refused(program: str, steps: str, capsys) -> str:  # type: ignore[no-untyped-def]
    assert main(["apply", program, steps]) == ExitCode.SCHEDULE
    return capsys.readouterr().err


def test_a_split_half_named_before_the_split_says_what_makes_it(capsys) -> None:  # type: ignore[no-untyped-def]
    err = _refused("megatron_mlp", "fuse(sum_rs, out)", capsys)
    assert err == (
        "<step 1>:1:6: error: fuse: no stage named 'sum_rs' yet: split(sum) makes it, and "
        "has not been applied\n"
        "   1 | fuse(sum_rs, out)\n"
        "     |      ^^^^^^\n"
        "hint: apply split(sum) first: split(sum); fuse(sum_rs, out)\n"
    )
    assert "did you mean" not in err


def test_a_moved_value_named_before_its_reorder_says_which_steps_make_it(capsys) -> None:  # type: ignore[no-untyped-def]
    err = _refused("megatron_mlp", "fuse(out_s, out)", capsys)
    assert "no stage named 'out_s' yet: split(sum); reorder(sum) make it" in err
    assert "hint: apply split(sum); reorder(sum) first" in err
    err = _refused("megatron_mlp", "split(sum); overlap(sum_rs, out_s)", capsys)
    assert "<step 1>:1:29: error: overlap: no stage named 'out_s' yet: reorder(sum) makes it" in err
    assert "\n     | " + " " * 28 + "^^^^^\n" in err


TAKEN = """\
program taken
ranks 4
dim N = 64
input g : f32[N] local
input w : f32[N] replicated
g1_rs = g * 2.0
g1 = allreduce(+, g)
w1 = update(w, w - 0.1 * g1)
output w1, g1_rs
"""


def test_a_made_name_with_fresh_s_suffix_is_found_by_applying(capsys) -> None:  # type: ignore[no-untyped-def]
    """`g1_rs` is taken, so split(g1) makes `g1_rs_2`: that name is traced to split(g1);
    `g1_rs_3`, which no step makes, gets the ordinary hint."""
    program = load_program(TAKEN, "taken.coco")
    session = Session(program)
    with pytest.raises(ScheduleError) as err:
        session.apply_or_raise("fuse(g1_rs_2, w1)")
    assert "no stage named 'g1_rs_2' yet: split(g1) makes it" in err.value.message
    assert err.value.hint == "apply split(g1) first: split(g1); fuse(g1_rs_2, w1)"
    assert err.value.span is not None and err.value.span.col == 6
    session.apply_or_raise("split(g1)")
    assert "g1_rs_2" in [s.name for s in session.program.stages]
    with pytest.raises(ScheduleError) as err:
        Session(program).apply_or_raise("fuse(g1_rs_3, w1)")
    assert err.value.message == "fuse: no stage named 'g1_rs_3'"


def test_explain_on_a_name_a_step_makes(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["apply", "megatron_mlp", "--explain", "sum_rs"]) == ExitCode.SCHEDULE
    err = capsys.readouterr().err
    assert "no stage named 'sum_rs' yet: split(sum) makes it" in err
    assert "did you mean" not in err


@pytest.mark.build
def test_a_program_named_force_gets_a_stem_of_its_own(tmp_path: Path) -> None:
    """FORCE is the Makefile's target that rebuilds a stale binary: a program of that
    name is built as FORCE_prog, and `make -n` still plans its build."""
    need_tool(shutil.which("make"), "make", mpi=True)
    src = tmp_path / "FORCE.coco"
    src.write_text(
        (ROOT / "samples" / "sgd.coco").read_text().replace("program sgd", "program FORCE")
    )
    out = tmp_path / "o"
    argv = ["emit", str(src), "--target", "cpu", "-o", str(out), "-D", "N=64", "--ranks", "2"]
    assert main(argv) == 0
    assert (out / "FORCE_prog.cpp").exists()
    assert "-o FORCE_prog main.o FORCE_prog.o" in _make_n(out)


@pytest.mark.parametrize("sample", samples.names())
def test_every_name_a_schedule_step_makes_is_traced_to_that_step(sample: str) -> None:
    """The rule of cocoviz/ir/transforms/step.py (names steps make) holds for every stage a step makes —
    each step of the samples' schedule blocks, and every split of an allreduce and reorder
    across a gather of the program as written and after splitting all its allreduces:
    asked before the step, it names steps that make it, the last of the step's kind."""
    program = load_file(samples.path(sample))
    traced: set[str] = set()

    def check(p: Program, step: str) -> Program | None:
        try:
            after = Session.from_steps(p, [step]).program
        except ScheduleError:
            return None
        before = {s.name for s in p.stages}
        for name in [s.name for s in after.stages if s.name not in before]:
            made = made_by(p, name)
            assert made is not None, (sample, step, name)
            assert str(made[-1]).split("(")[0] == step.split("(")[0], (made, step)
            traced.add(name)
        return after

    for block in program.schedules:
        p: Program | None = unscheduled(program)
        for step in block.steps:
            assert p is not None
            p = check(p, str(step))
    written = unscheduled(program)
    split = written
    for s in written.stages:
        if s.expr.op is Op.ALLREDUCE:
            split = check(split, f"split({s.name})") or split
    for p in (written, split):
        for s in p.stages:
            if s.expr.op in (Op.ALLGATHER, Op.ALLTOALL):
                check(p, f"reorder({s.name})")
    if sample == "megatron_mlp":
        assert {"sum_rs", "out_s"} <= traced
