"""What the tests of the language's data-movement, reduction and constant operations share
(tests/test_lang_*.py): checking a program text for its diagnostic, reference runs on given
inputs, and one program through every executor and both code targets."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import numpy as np

from cocoviz import numerics as nx
from cocoviz.cli import main
from cocoviz.ir.lower import RanksOverride, load_file
from cocoviz.ir.types import TensorType

PROGRAMS = Path(__file__).resolve().parent / "programs"


def check_text(tmp_path: Path, text: str) -> tuple[int, str]:
    """`cocoviz check` of `text` written to prog.coco: (exit code, stderr)."""
    src = tmp_path / "prog.coco"
    src.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", str(src)])
    return rc, err.getvalue()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def reference_dump(
    tmp_path: Path, src: Path, inputs: dict[str, np.ndarray], *extra: str
) -> dict[str, np.ndarray]:
    """`cocoviz run SRC --inputs … --dump …` (the numpy reference) on `inputs`; the dumped
    arrays by name."""
    ind, dump = tmp_path / "inputs", tmp_path / "dump"
    ind.mkdir(exist_ok=True)
    for name, a in inputs.items():
        np.save(ind / f"{name}.npy", a)
    rc, _, err = run_cli("run", str(src), "--inputs", str(ind), "--dump", str(dump), *extra)
    assert rc == 0, err
    return {p.stem: np.load(p) for p in dump.glob("*.npy")}


def mpi_matches_reference(src: Path, schedule: str | None, ranks: int, tmp_path: Path) -> None:
    """`cocoviz run --mpi --dump`: exit 0, its check against the reference passes, and every
    dumped array equals the reference of the unscheduled program."""
    from cocoviz.exec.dumps import dumped_values
    from cocoviz.exec.reference import run_reference

    dump = tmp_path / f"mpi{ranks}"
    argv = ["run", str(src), "--mpi", "--ranks", str(ranks), "--dump", str(dump), "--json"]
    if schedule:
        argv += ["--schedule", schedule]
    rc, out, err = run_cli(*argv)
    assert rc == 0, err
    report = json.loads(out)
    assert report["ok"] and report["check"], report
    original = load_file(src, None, RanksOverride.parse(str(ranks)))
    ref = run_reference(original)
    stage_of = {d.name: d.stage for d in dumped_values(original)}
    for row in report["check"]:
        name, dtype = row["name"], row["dtype"]
        got = nx.load_npy(dump / f"{name}.npy", dtype)
        c = nx.compare(got, ref.global_value(stage_of[name]), dtype)
        assert c.ok, (name, c)


def emitted_check(
    src: Path, schedule: str | None, target: str, collectives: str, tmp_path: Path, cache: Path
) -> None:
    """Emit SRC (with its schedule) for `target`, build it (the CUDA target in the
    emulation, through the emulation tests' shared `cache`), run it with --check and
    --dump for one iteration, and compare every dumped output with the numpy reference."""
    from emit_support import (
        build_emulated,
        compare_dumps,
        diagnostics,
        make,
        need_mpicxx,
        text_programs,
        write,
    )

    from cocoviz.emit.emitter import emit

    need_mpicxx()
    program, ref = text_programs(src.read_text(), schedule)
    files = emit(
        program,
        ref,
        target=target,  # type: ignore[arg-type]
        collectives=collectives,  # type: ignore[arg-type]
        schedule_name=schedule,
    ).files
    if target == "cuda":
        tree = build_emulated(files, cache)
        cmd = [str(tree / "run.sh"), "--emulate"]
        dump = tmp_path / "dump"
    else:
        tree = tmp_path / "cpu"
        write(tree, files)
        res = make(tree)
        assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stdout + res.stderr
        assert not diagnostics(res), "\n".join(diagnostics(res))
        cmd = [str(tree / "run.sh")]
        dump = tree / "dump"
    cmd += ["--check", "--iters", "1", "--warmup", "0", "--dump", str(dump)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass", run.stderr
    assert "cocoviz emulation" not in run.stderr, run.stderr
    compare_dumps(program, dump)


def shape_text(ty: TensorType) -> str:
    """A type's shape as written (`[B, H]`), for comparing inferred types in tests."""
    return "[" + ", ".join(s.text for s in ty.shape) + "]"
