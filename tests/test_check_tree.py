"""`cocoviz check-tree`, emitted programs' `--inputs` and `--dump`, and the one naming of
dumped values (docs/codegen.md, "Inputs, dumps and check-tree"; issue 33 items 1-2,
issue 29 item 6).

- An emitted tree run with `--inputs D --dump E` equals `cocoviz run --inputs D --dump R`:
  bit for bit for a program of exact operations (tests/programs/exact_ops.coco, the i32
  values of the avg program), within the dtype tolerance where a sum's order differs, on
  the CPU target and the CUDA emulation. Every sample x schedule on the CPU target goes
  through check-tree in tests/test_emit_cpu.py (the same builds).
- `run --dump`, `verify` and a tree's `--dump` name every value alike.
- A bad `--inputs` file (shape, dtype, missing, truncated, trailing bytes) is refused
  with one line naming the file, what was expected and what was found, exit 2.
- check-tree finds a one-ulp change in an exact value and says where; its own user
  errors are one message and an exit code.
- The generator of `--check` (C++) draws what check-tree draws in round 1, and new values
  every later round.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import emulation_cache
from emit_support import (
    AVG_PROGRAM,
    build_emulated,
    check_tree_report,
    diagnostics,
    emit_text,
    make,
    need_mpicxx,
    source_key,
    write,
)

from cocoviz import numerics as nx
from cocoviz.cli import main
from cocoviz.cli.check_tree import compare_dumps, draw_inputs
from cocoviz.exec.dumps import dumped_values, inexact_reason
from cocoviz.exec.verify import verify_programs
from cocoviz.ir.lower import load_program
from cocoviz.ir.nodes import unscheduled
from cocoviz.schedule import apply_block, find_block

PROGRAMS = Path(__file__).parent / "programs"
EXACT = (PROGRAMS / "exact_ops.coco").read_text()


def _built(cache: Path, text: str, schedule: str | None, target: str) -> Path:
    """An emitted tree of `text`, built once per source for every xdist worker (make on
    the CPU target; the emulation build, tests/emit_support.py's, for CUDA)."""
    import fcntl

    need_mpicxx()
    files = emit_text(text, schedule, target)
    if target == "cuda":
        return build_emulated(files, cache)
    key = source_key(files, (".cpp", ".h", "run.sh", "Makefile"))
    d = cache / f"cpu-{key}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"cpu-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / ".built").exists():
            write(d, files)
            res = make(d)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            assert not diagnostics(res), "\n".join(diagnostics(res))
            (d / ".built").write_text("")
    return d


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return emulation_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def exact_cpu(cache: Path) -> Path:
    return _built(cache, EXACT, "fused", "cpu")


@pytest.fixture(scope="module")
def exact_cuda(cache: Path) -> Path:
    return _built(cache, EXACT, "fused", "cuda")


@pytest.fixture(scope="module")
def avg_cpu(cache: Path) -> Path:
    return _built(cache, AVG_PROGRAM, "chunked", "cpu")


@pytest.fixture(scope="module")
def avg_cuda(cache: Path) -> Path:
    return _built(cache, AVG_PROGRAM, "split", "cuda")


def _tree_run(tree: Path, *args: str, emulate: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [str(tree / "run.sh"), *(["--emulate"] if emulate else [])]
    argv += ["--iters", "0", "--warmup", "0", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def _write_inputs(d: Path, program_text: str, seed: int = 7) -> None:
    p = load_program(program_text, "<test>", None, None)
    d.mkdir(parents=True, exist_ok=True)
    for name, a in draw_inputs(p, seed).items():
        nx.save_npy(d / f"{name}.npy", a, p.input(name).ty.dtype.value)


def _run_dump(text: str, schedule: str | None, inputs: Path, dump: Path, tmp: Path) -> None:
    src = tmp / "prog.coco"
    src.write_text(text)
    argv = ["run", str(src), "--inputs", str(inputs), "--dump", str(dump)]
    argv += ["--schedule", schedule] if schedule else []
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0


# ------------------------------------------------- run --inputs vs the tree's --inputs


@pytest.mark.build
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_tree_dump_equals_run_dump_bit_for_bit(
    target: str, exact_cpu: Path, exact_cuda: Path, tmp_path: Path
) -> None:
    """`cocoviz run --inputs D --dump R` and the tree's `--inputs D --dump E` agree bit for
    bit on a program whose every operation is exact, and name the same files."""
    tree = exact_cpu if target == "cpu" else exact_cuda
    inputs, r, e = tmp_path / "in", tmp_path / "r", tmp_path / "e"
    _write_inputs(inputs, EXACT)
    _run_dump(EXACT, "fused", inputs, r, tmp_path)
    res = _tree_run(tree, "--inputs", str(inputs), "--dump", str(e), emulate=target == "cuda")
    assert res.returncode == 0, res.stdout + res.stderr
    names = sorted(f.name for f in r.glob("*.npy"))
    assert (
        names == sorted(f.name for f in e.glob("*.npy")) == ["kd.npy", "m.npy", "w.npy", "w1.npy"]
    )
    p = unscheduled(load_program(EXACT, "<test>", None, None))
    ref = {
        d.name: nx.load_npy(r / f"{d.name}.npy", p.type_of(d.stage).dtype.value)
        for d in dumped_values(p)
    }
    rows = compare_dumps(p, e, ref)
    assert [r_.rule for r_ in rows] == ["exact"] * 4
    assert all(r_.ok for r_ in rows), rows
    # the values are not trivial: signed, and the update moved the state
    w0 = np.load(inputs / "w.npy")
    assert (ref["w"] < 0).any() and (ref["w"] > 0).any() and not np.array_equal(ref["w"], w0)


@pytest.mark.build
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_avg_program_exact_where_integer(
    target: str, avg_cpu: Path, avg_cuda: Path, tmp_path: Path
) -> None:
    """The avg program (i32 sums that overflow i32, f16 sums that overflow f16): check-tree
    holds its integer values to bit-exactness and the f16/f32 averages to the dtype
    tolerance, and the tree's own --check passes on the drawn inputs."""
    report = check_tree_report(avg_cpu if target == "cpu" else avg_cuda)
    rules = {v["name"]: v["rule"] for v in report["values"]}  # type: ignore[union-attr]
    assert rules == {
        "y": "exact", "yb": "exact", "ysg": "exact", "r": "exact", "w1": "exact",
        "w": "exact", "hy": "tolerance", "hsg": "tolerance", "fy": "tolerance",
    }  # fmt: skip


@pytest.mark.build
def test_check_tree_exact_program_both_targets(exact_cpu: Path, exact_cuda: Path) -> None:
    for tree in (exact_cpu, exact_cuda):
        report = check_tree_report(tree, seed=3)
        assert {v["rule"] for v in report["values"]} == {"exact"}  # type: ignore[union-attr]


# ------------------------------------------------------------- one naming of dumps


@pytest.mark.build
def test_run_verify_and_tree_name_dumps_alike(exact_cpu: Path, tmp_path: Path) -> None:
    """run --dump, verify and the tree's --dump name every output by its stage and every
    updated input by the input (m.npy, not m1.npy)."""
    r, e = tmp_path / "r", tmp_path / "e"
    _run_dump(EXACT, "fused", _inputs_dir(tmp_path), r, tmp_path)
    res = _tree_run(exact_cpu, "--dump", str(e))
    assert res.returncode == 0, res.stderr
    p0 = load_program(EXACT, "<test>", None, None)
    report = verify_programs(unscheduled(p0), apply_block(p0, find_block(p0, "fused")))
    from_run = sorted(f.stem for f in r.glob("*.npy"))
    from_tree = sorted(f.stem for f in e.glob("*.npy"))
    from_verify = sorted(row.name for row in report.rows)
    assert from_run == from_tree == from_verify == ["kd", "m", "w", "w1"]
    # without --inputs the tree draws the shared generator's inputs, as run does: seed 0
    p = unscheduled(p0)
    from cocoviz.exec.reference import run_reference

    ref = run_reference(p, 0)
    for d in dumped_values(p):
        dt = p.type_of(d.stage).dtype.value
        got = nx.load_npy(e / f"{d.name}.npy", dt)
        assert np.array_equal(got, ref.global_value(d.stage)), d.name


def _inputs_dir(tmp: Path) -> Path:
    d = tmp / "in"
    _write_inputs(d, EXACT)
    return d


# --------------------------------------------------------------- bad --inputs files


def _bad(tmp: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    d = _inputs_dir(tmp)
    edit(d)
    return d


BAD_INPUTS = {
    "shape": (
        lambda d: np.save(d / "w.npy", np.zeros(90, np.float32)),
        ["w.npy", "input 'w'", "expected shape [180]", "found [90]"],
    ),
    "local shape": (
        lambda d: np.save(d / "g.npy", np.zeros(180, np.float16)),
        ["g.npy", "[G, *shape]", "expected shape [4, 180]", "found [180]"],
    ),
    "dtype": (
        lambda d: np.save(d / "m.npy", np.zeros(180, np.float64)),
        ["m.npy", "expected dtype <f4 (numpy float32)", "found <f8 (numpy float64)"],
    ),
    "bf16 as f16": (
        lambda d: np.save(d / "h.npy", np.zeros((4, 180), np.float16)),
        ["h.npy", "bf16 stored as float32", "found <f2"],
    ),
    "missing": (lambda d: (d / "k.npy").unlink(), ["k.npy", "input 'k' has no file"]),
    "truncated": (
        lambda d: (d / "w.npy").write_bytes((d / "w.npy").read_bytes()[:-8]),
        ["w.npy", "truncated"],
    ),
    "trailing bytes": (
        lambda d: (d / "w.npy").write_bytes((d / "w.npy").read_bytes() + b"\0" * 8),
        ["w.npy", "8 extra byte(s)"],
    ),
    "not npy": (lambda d: (d / "w.npy").write_text("hello"), ["w.npy", "not a .npy file"]),
}


@pytest.mark.build
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_are_refused_with_one_message(
    case: str, exact_cpu: Path, tmp_path: Path
) -> None:
    edit, expect = BAD_INPUTS[case]
    d = _bad(tmp_path, edit)
    res = _tree_run(exact_cpu, "--inputs", str(d), "--check", "--dump", str(tmp_path / "e"))
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr  # one rank says it, once
    for part in expect:
        assert part in lines[0], (part, lines[0])
    assert not (tmp_path / "e").exists()  # refused before anything ran


@pytest.mark.build
def test_bad_inputs_directory(exact_cpu: Path, tmp_path: Path) -> None:
    res = _tree_run(exact_cpu, "--inputs", str(tmp_path / "nowhere"))
    assert res.returncode == 2
    assert "no such directory" in res.stderr and res.stderr.count("\n") == 1


@pytest.mark.build
def test_bad_inputs_emulated(exact_cuda: Path, tmp_path: Path) -> None:
    d = _bad(tmp_path, BAD_INPUTS["shape"][0])
    res = _tree_run(exact_cuda, "--inputs", str(d), emulate=True)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "expected shape [180], found [90]" in res.stderr


# ------------------------------------------------------------- check-tree catches


@pytest.mark.build
def test_check_tree_reports_a_one_ulp_difference(exact_cpu: Path, tmp_path: Path) -> None:
    """A parameter off by one ulp — in the scheduled and the unscheduled program alike, a
    mistake the tree's own --check cannot see — is a mismatch of the exact values it
    reaches, naming the value, the first differing element and both numbers (the dtype
    tolerance would pass it)."""
    tree = tmp_path / "tree"
    shutil.copytree(exact_cpu, tree)
    src = tree / "exact_ops.cpp"
    text = src.read_text()
    assert text.count("= P.prm_mu;") == 2
    src.write_text(text.replace("= P.prm_mu;", "= P.prm_mu * 1.00000012f;"))
    res = make(tree)
    assert res.returncode == 0, res.stderr
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["check-tree", str(tree), "--no-build"])
    assert rc == 4
    text = out.getvalue()
    assert "MISMATCH" in text and "first at [" in text and "bits 0x" in text
    assert "max abs 0 " in text.split("\n  kd ")[1]  # an integer value it does not reach
    assert "exact" in text and "the tree exited" not in text


@pytest.mark.build
def test_a_value_nothing_wrote_reads_the_poison(exact_cpu: Path, tmp_path: Path) -> None:
    """The store of `kd` removed from both programs (a mistake their shared code would
    hide from the tree's --check): the output holds the poison the buffer was allocated
    with (-1 for integers, NaN bytes for floats, not zeros), and check-tree reports it."""
    tree = tmp_path / "tree"
    shutil.copytree(exact_cpu, tree)
    src = tree / "exact_ops.cpp"
    lines = src.read_text().split("\n")
    stores = [i for i, ln in enumerate(lines) if "COCOVIZ_ST(B.v_" in ln and "_kd, i)" in ln]
    assert len(stores) == 2
    src.write_text("\n".join(ln for i, ln in enumerate(lines) if i not in stores))
    assert make(tree).returncode == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check-tree", str(tree), "--no-build"]) == 4
    text = out.getvalue()
    kd = next(ln for ln in text.splitlines() if ln.strip().startswith("kd "))
    assert "MISMATCH" in kd and "tree -1," in kd
    assert "the tree exited" not in text  # its own --check saw the same -1 twice


@pytest.mark.build
def test_check_tree_user_errors(tmp_path: Path, exact_cpu: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["check-tree", str(tmp_path / "nowhere")]) == 1
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["check-tree", str(tmp_path / "empty")]) == 1
    assert "no manifest.json" in capsys.readouterr().err
    old = tmp_path / "old"
    shutil.copytree(exact_cpu, old)
    (old / "program.coco").unlink()
    assert main(["check-tree", str(old)]) == 1
    assert "program.coco" in capsys.readouterr().err
    unbuilt = tmp_path / "unbuilt"
    write(unbuilt, emit_text(EXACT, "fused", "cpu"))
    assert main(["check-tree", str(unbuilt), "--no-build"]) == 2
    err = capsys.readouterr().err
    assert "not built" in err and "Traceback" not in err


def test_check_tree_reads_a_crafted_manifest_with_bounds(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A tree's manifest.json that is a FIFO (nothing ever writes it), not JSON, or far
    larger than any manifest ends in one message, not a hang or a traceback."""
    import os

    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")
    assert main(["check-tree", str(fifo)]) == 1
    assert "not a regular file" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"tool": 1')
    assert main(["check-tree", str(bad)]) == 1
    assert "not readable as cocoviz's manifest" in capsys.readouterr().err
    huge = tmp_path / "huge"
    huge.mkdir()
    (huge / "manifest.json").write_text(" " * (2 << 20))
    assert main(["check-tree", str(huge)]) == 1
    err = capsys.readouterr().err
    assert "manifest" in err and "Traceback" not in err


@pytest.mark.build
def test_emit_build_check(tmp_path: Path) -> None:
    """`cocoviz emit --build --check` runs check-tree on what it built."""
    need_mpicxx()
    src = tmp_path / "exact_ops.coco"
    src.write_text(EXACT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(
            ["emit", str(src), "--target", "cpu", "-o", str(tmp_path / "t"), "--build", "--check"]
        )
    assert rc == 0
    assert "ok: every value agrees" in out.getvalue()


# ------------------------------------------------------------ the check generator


PROBE = r"""
#include "cocoviz_runtime.h"
#include <cstdio>
using namespace cocoviz;
int main() {
  const uint64_t seed = 11;
  for (uint64_t round = 1; round <= 2; ++round) {
    const uint64_t key = check_key(key_for("x", seed), round);
    for (uint64_t i = 0; i < 64; ++i) std::printf("%a ", check_float(uniform_bits(key, i), false));
    std::printf("\n");
    for (uint64_t i = 0; i < 64; ++i) std::printf("%lld ", static_cast<long long>(check_int(uniform_bits(key, i), false)));
    std::printf("\n");
  }
  const uint64_t key = check_key(key_for("v", seed), 1);
  for (uint64_t i = 0; i < 64; ++i) std::printf("%a ", check_float(uniform_bits(key, i), true));
  std::printf("\n");
}
"""


@pytest.mark.build
def test_check_generator_matches_check_tree_and_changes_every_round(tmp_path: Path) -> None:
    from cocoviz.emit.toolchain import find_toolchain

    need_mpicxx()
    tc = find_toolchain()
    assert tc.mpi is not None
    (tmp_path / "probe.cpp").write_text(PROBE)
    templates = Path(nx.__file__).resolve().parent / "templates"
    exe = tmp_path / "probe"
    subprocess.run(
        [str(tc.mpi.mpicxx), "-std=c++17", "-O1", f"-I{templates}", str(tmp_path / "probe.cpp"), "-o", str(exe)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    lines = subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    f1 = np.array([float.fromhex(t) for t in lines[0].split()])
    i1 = np.array([int(t) for t in lines[1].split()])
    f2 = np.array([float.fromhex(t) for t in lines[2].split()])
    unsigned = np.array([float.fromhex(t) for t in lines[4].split()])
    prog = load_program(
        "program p\nranks 1\ninput x : f64[64] replicated\ninput k : i64[64] replicated\n"
        "input v : f64[64] replicated\ny = x + cast(f64, k) + sqrt(v)\noutput y\n",
        "<test>", None, None,
    )  # fmt: skip
    drawn = draw_inputs(prog, 11)
    assert np.array_equal(drawn["x"], f1)
    assert np.array_equal(drawn["v"], unsigned) and (unsigned > 0).all()
    assert (f1 < 0).any() and (f1 > 0).any() and np.abs(f1).max() / np.abs(f1).min() > 64
    assert (i1 < 0).any() and not np.array_equal(f1, f2)
    k = load_program(
        "program p\nranks 1\ninput x : i64[64] replicated\ny = x * 2\noutput y\n", "<t>", None, None
    )
    assert np.array_equal(draw_inputs(k, 11)["x"], i1)


# ------------------------------------------------------------------ pure Python


UNCHECKED = re.compile(
    r"^(?!.*CHECK_(?:CUDA|MPI)\().*\b(cudaStreamDestroy|cudaEventDestroy|MPI_Init|MPI_Finalize)\("
)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_teardown_calls_are_checked(target: str) -> None:
    """Issue 33 item 7: cudaStreamDestroy, cudaEventDestroy, MPI_Init and MPI_Finalize are
    checked like every other call (docs/codegen.md), also in a tree with overlapped groups
    (their events) and p2p streams."""
    from emit_support import emit_files

    for name, schedule in (
        ("megatron_mlp", "fused"),
        ("pipeline_stage", "fused"),
        ("moe_layer", "overlapped"),
    ):
        files = emit_files(name, schedule, target)
        calls = 0
        for fname, text in files.items():
            if not fname.endswith((".cu", ".cpp")):
                continue
            for ln in text.splitlines():
                if ln.lstrip().startswith("//"):
                    continue
                assert not UNCHECKED.search(ln), f"{name}/{fname}: {ln.strip()}"
                calls += len(
                    re.findall(
                        r"\b(?:cudaStreamDestroy|cudaEventDestroy|MPI_Init|MPI_Finalize)\(", ln
                    )
                )
        assert calls >= (6 if target == "cuda" else 3), (name, calls)


def test_exactness_rules() -> None:
    p = load_program(
        "program p\nranks 2\ninput a : f32[8] local\ninput b : f32[8, 8] replicated\n"
        "input i : i32[8] local\n"
        "s = allreduce(+, a)\nmx = allreduce(max, a)\nmm = matmul(b, b)\n"
        "e = exp(mx)\nq = sqrt(abs(mx)) / 3\nis = allreduce(+, i)\n"
        "output s, mx, mm, e, q, is\n",
        "<test>", None, None,
    )  # fmt: skip
    assert inexact_reason(p, "mx") is None and inexact_reason(p, "q") is None
    assert inexact_reason(p, "is") is None
    assert "sums across ranks" in (inexact_reason(p, "s") or "")
    assert "matmul" in (inexact_reason(p, "mm") or "")
    assert "exp" in (inexact_reason(p, "e") or "")


def test_drawn_inputs_are_deterministic_signed_and_varied() -> None:
    p = load_program(EXACT, "<test>", None, None)
    a, b, c = draw_inputs(p, 0), draw_inputs(p, 0), draw_inputs(p, 1)
    for name in a:
        assert np.array_equal(a[name], b[name]) and not np.array_equal(a[name], c[name])
    g = a["g"].astype(np.float64)
    assert g.shape == (4, 180) and a["g"].dtype == np.float16
    assert (g < 0).mean() > 0.3 and (g > 0).mean() > 0.3
    assert np.abs(g).min() < 2**-9 and np.abs(g).max() > 4
    assert a["h"].dtype == np.float32  # bf16 held as float32
    assert a["k"].dtype == np.int32 and (a["k"] < 0).any()


def test_dump_names() -> None:
    p = load_program(EXACT, "<test>", None, None)
    assert [(d.name, d.stage, d.kind) for d in dumped_values(p)] == [
        ("w1", "w1", "output"),
        ("kd", "kd", "output"),
        ("w", "w1", "updated input"),
        ("m", "m1", "updated input"),
    ]


@pytest.mark.build
def test_json_report_shape(exact_cpu: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check-tree", str(exact_cpu), "--no-build", "--json"]) == 0
    data = json.loads(out.getvalue())
    assert data["ok"] and data["target"] == "cpu" and len(data["values"]) == 4
