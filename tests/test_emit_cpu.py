"""The CPU target for real: every sample × canonical schedule is emitted at small sizes,
built with the mpich wheel's mpicxx (warning-free under -Wall), run under
`mpiexec -n 4` (2×2 for the pipeline) with --check, and its --dump outputs are compared
with the numpy reference within the dtype tolerance; `cocoviz check-tree` then runs each
tree on inputs of its own against the reference (bit for bit where exact)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from emit_support import (
    AVG_PROGRAM,
    cases,
    check_tree_report,
    compare_dumps,
    diagnostics,
    emit_files,
    emit_text,
    make,
    need_mpicxx,
    scheduled,
    text_programs,
    write,
)

from cocoviz.ir.nodes import Program


@pytest.mark.parametrize(("name", "schedule"), cases())
def test_cpu_builds_runs_checks_and_matches_reference(
    name: str, schedule: str, tmp_path: Path
) -> None:
    need_mpicxx()
    program, _ = scheduled(name, schedule)
    _build_run_and_compare(emit_files(name, schedule, "cpu"), program, tmp_path)


@pytest.mark.parametrize("schedule", [None, "split", "chunked", "fused"])
def test_cpu_avg_matches_reference(schedule: str | None, tmp_path: Path) -> None:
    """`avg` of i32 truncates toward zero after an exact (int64) sum, also when the i32
    sum would overflow and for negative values; f16 `avg` does not overflow in the sum."""
    need_mpicxx()
    program, _ = text_programs(AVG_PROGRAM, schedule)
    files = emit_text(AVG_PROGRAM, schedule, "cpu")
    assert "_widen" in files["avg_int.cpp"] and "_avg" in files["avg_int.cpp"]
    _build_run_and_compare(files, program, tmp_path)


def _build_run_and_compare(files: dict[str, str], program: Program, tmp_path: Path) -> None:
    """Build warning-free, run under mpiexec with --check and --dump, and compare every
    dumped output with the numpy reference."""
    write(tmp_path, files)
    res = make(tmp_path)
    assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stderr
    assert not diagnostics(res), "\n".join(diagnostics(res))
    dump = tmp_path / "dump"
    run = subprocess.run(
        [str(tmp_path / "run.sh"), "--check", "--iters", "1", "--warmup", "0", "--dump", str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["check"] == "pass"
    assert result["program"] == program.name
    compare_dumps(program, dump)
    # and from outside: signed inputs of varied magnitude, every dumped value against the
    # reference, bit for bit where exact (cocoviz check-tree, docs/codegen.md)
    check_tree_report(tmp_path)


def _kernel_text(src: str, cname: str) -> str:
    start = src.index(f"void {cname}(")
    return src[start : src.index("\n}\n", start)]


def test_scalar_subexpressions_are_hoisted_and_the_result_unchanged(tmp_path: Path) -> None:
    """adam's bias corrections ``1 - pow(beta1, t)`` read only params and literals: both
    targets compute them once per launch, before the element loop, from the same plan;
    the CPU program built from it, run with params other than the defaults, still
    matches the numpy reference run with those params."""
    from cocoviz import numerics as nm
    from cocoviz.emit import plan as pl
    from cocoviz.exec.reference import run_reference

    need_mpicxx()
    program, _ = scheduled("adam", "fused")
    cpu = emit_files("adam", "fused", "cpu")
    cuda = emit_files("adam", "fused", "cuda")
    for src, pow_ in ((cpu["adam.cpp"], "std::pow("), (cuda["adam.cu"], "powf(")):
        body = _kernel_text(src, "k_sch_gf")
        loop = body.index("for (int64_t i")
        assert body.count(pow_) == 2 and body.rindex(pow_) < loop, body
        assert "P.prm_" not in body[loop:], body  # params are read into locals once
    # the plan-level split: pure statements of params/literals only, in SSA order
    pre, rest = pl.hoist(
        (
            pl.Stmt(kind="param", dst="a", buffer="prm_t"),
            pl.Stmt(kind="load", dst="x", buffer="buf", a="i"),
            pl.Stmt(kind="load_scalar", dst="s", buffer="sc"),
            pl.Stmt(kind="load_scalar", dst="u", buffer="out"),
            pl.Stmt(kind="binary", dst="b", a="a", b="s", op="mul"),
            pl.Stmt(kind="binary", dst="c", a="b", b="x", op="mul"),
            pl.Stmt(kind="store", buffer="out", a="i", b="c"),
        )
    )
    assert [s.dst for s in pre] == ["a", "s", "b"]
    assert [s.dst for s in rest] == ["x", "u", "c", ""]

    write(tmp_path, cpu)
    res = make(tmp_path)
    assert res.returncode == 0 and not diagnostics(res), "\n".join(diagnostics(res))
    dump = tmp_path / "dump"
    params = {"t": 3.0, "beta1": 0.8, "lr": 0.01}
    argv = [a for k, v in params.items() for a in ("--param", f"{k}={v}")]
    run = subprocess.run(
        [str(tmp_path / "run.sh"), "--check", "--iters", "1", "--warmup", "0",
         "--dump", str(dump), *argv],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["check"] == "pass"
    ref = run_reference(program, 0, params=params)
    got = nm.load_npy(dump / "w1.npy", "f32")
    cmp = nm.compare(got, ref.global_value("w1"), "f32")
    assert cmp.ok, cmp.describe()
    default = run_reference(program, 0).global_value("w1")
    assert not nm.compare(got, default, "f32").ok  # the params did reach the kernel


@pytest.mark.parametrize(
    ("name", "schedule"),
    [("adam", "fused"), ("lamb", "ar_c"), ("sgd", "ar_c"), ("megatron_mlp", "fused")],
)
def test_cpu_collectives_same_bits_shared_or_through_mpi(
    name: str, schedule: str, tmp_path: Path
) -> None:
    """The node-shared collectives (peers' buffers read in MPI shared-memory windows) and
    the ones through MPI (all-to-all + the same combine in rank order) give the same bits:
    f16 reduce-scatter/allgather (adam), f32 allreduce and the batched norms (lamb, sgd),
    an allgather with a permute (megatron_mlp)."""
    import os

    need_mpicxx()
    write(tmp_path, emit_files(name, schedule, "cpu"))
    res = make(tmp_path)
    assert res.returncode == 0, "\n".join(diagnostics(res)) or res.stderr
    dumps = {}
    for shared in ("1", "0"):
        dump = tmp_path / f"dump{shared}"
        run = subprocess.run(
            [str(tmp_path / "run.sh"), "--iters", "1", "--warmup", "0", "--dump", str(dump)],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "COCOVIZ_CPU_SHARED": shared},
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout.strip().splitlines()[-1])["node_shared"] is (shared == "1")
        dumps[shared] = {p.name: p.read_bytes() for p in sorted(dump.iterdir())}
    assert dumps["1"] and dumps["1"] == dumps["0"]


GEMM_ORDER_PROGRAM = """program gemm_order
ranks 2
dim M = 6, K = 300, N = 520
input a : f32[M, K] local
input b : f32[K, N] local
c = matmul(a, b)
output c
"""


def test_cpu_gemm_adds_each_elements_products_in_contraction_order(tmp_path: Path) -> None:
    """The CPU GEMM computes C's rows in tiles of accumulators with the contraction outside
    the column loop (docs/codegen.md, "The CPU target's GEMM"), yet every element is the
    f32 sum of its products in the order q = 0, 1, …, K−1: bit for bit the dot product per
    element, over full tiles and the last partial one (520 = 2 · 256 + 8 columns)."""
    import numpy as np

    from cocoviz import numerics as nm
    from cocoviz.exec.reference import run_reference

    need_mpicxx()
    program, _ = text_programs(GEMM_ORDER_PROGRAM, None)
    files = emit_text(GEMM_ORDER_PROGRAM, None, "cpu")
    assert "for (int64_t c0 = 0; c0 < 520; c0 += 256)" in files["gemm_order.cpp"]
    write(tmp_path, files)
    res = make(tmp_path)
    assert res.returncode == 0 and not diagnostics(res), "\n".join(diagnostics(res))
    dump = tmp_path / "dump"
    run = subprocess.run(
        [str(tmp_path / "run.sh"), "--iters", "1", "--warmup", "0", "--dump", str(dump)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ref = run_reference(program, 0)
    a = np.asarray(ref.global_value("a"), dtype=np.float32)
    b = np.asarray(ref.global_value("b"), dtype=np.float32)
    assert a.shape == (2, 6, 300) and b.shape == (2, 300, 520)  # each rank's own
    want = np.zeros((2, 6, 520), dtype=np.float32)
    for q in range(300):  # one rounding per product and per addition, in order
        want = want + a[:, :, q : q + 1] * b[:, q : q + 1, :]
    got = nm.load_npy(dump / "c.npy", "f32")
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # and a sum in another order differs somewhere: the test can tell the orders apart
    assert not np.array_equal(got, (a[:, :, ::-1] @ b[:, ::-1, :]).astype(np.float32))


VECTOR_PROGRAM = """program vec_loops
ranks 2
dim N = 4096, M = 16, K = 64
input x : f16[N] local
input a : bf16[M, K] local
input b : bf16[K, K] local
input bias : bf16[K] replicated
input g : bf16[K] replicated
y = dropout(x * 2, 0.1) + x
c = matmul(a, b)
z = a + bias
n = layernorm(z, g, bias)
s = softmax(z)
output y
output c
output z
output n
output s
"""


def _vectorized_lines(directory: Path, files: dict[str, str], source: str) -> set[int]:
    """Build the emitted tree with the Makefile's own flags and GCC's vectorizer report:
    the lines of ``source`` whose loops GCC vectorized."""
    write(directory, files)
    flags = "-std=c++17 -O2 -fno-math-errno -ffp-contract=off -Wall -fopenmp"
    assert f"CXXFLAGS ?= {flags}\n" in files["Makefile"]
    res = make(directory, f"CXXFLAGS={flags} -fopt-info-vec-optimized")
    assert res.returncode == 0, res.stdout + res.stderr
    return {
        int(ln.split(":")[1])
        for ln in (res.stdout + res.stderr).splitlines()
        if ln.startswith(f"{source}:") and "loop vectorized" in ln
    }


def test_cpu_dropout_kernel_and_gemm_columns_vectorize(tmp_path: Path) -> None:
    """GCC reports the loops the docs say vectorize as vectorized (docs/codegen.md, "Fast
    loops (CPU)"): an f16 kernel with dropout (its keep selected by a mask, not `?:`, which
    became a branch around the f16 rounding: "control flow in loop"), the column loops
    of a GEMM that writes bf16 (the dot product per element before did not vectorize) and
    a bias add's row (one loop over i read the bias at i % K: a gather of 16-bit values,
    "not suitable for gather load"), and the row kernels' statistics (8 lanes, not one
    sum in order: "reduction: unsafe fp math optimization") and output loops."""
    need_mpicxx()
    files = emit_text(VECTOR_PROGRAM, None, "cpu")
    src = files["vec_loops.cpp"]
    vectorized = _vectorized_lines(tmp_path, files, "vec_loops.cpp")
    lines = src.splitlines()

    def loops_in(cname: str, head: str) -> list[int]:
        start = next(n for n, ln in enumerate(lines) if f"void {cname}(" in ln)
        end = next(n for n in range(start, len(lines)) if lines[n] == "}")
        return [n + 1 for n in range(start, end) if lines[n].lstrip().startswith(head)]

    kernel = loops_in("k_sch_y", "for (int64_t i = 0;")
    assert len(kernel) == 1 and "dropout_keep" in src
    # GCC names an OpenMP loop by the line of its first statement
    assert {kernel[0], kernel[0] + 1} & vectorized, (kernel, sorted(vectorized))
    columns = loops_in("mm_sch_c", "for (int64_t j = 0; j < w; ++j) acc[j] +=")
    assert len(columns) == 1 and columns[0] in vectorized, (columns, sorted(vectorized))
    row = loops_in("k_sch_z", "for (int64_t i1 = 0; i1 < 64; ++i1)")
    assert len(row) == 1 and {row[0], row[0] + 1} & vectorized, (row, sorted(vectorized))
    # layernorm: both statistics' lanes and the output loop (gamma and beta read at j);
    # softmax: the maximum's lanes and the output loop (the exp loop calls libm)
    lanes = loops_in("r_sch_n", "for (int64_t lane = 0; lane < 8; ++lane)")
    out = loops_in("r_sch_n", "for (int64_t j = 0; j < 64; ++j)")
    assert len(lanes) == 2 and all({n, n + 1} & vectorized for n in lanes), lanes
    assert len(out) == 1 and {out[0], out[0] + 1} & vectorized, (out, sorted(vectorized))
    lanes = loops_in("r_sch_s", "for (int64_t lane = 0; lane < 8; ++lane)")
    out = loops_in("r_sch_s", "for (int64_t j = 0; j < 64; ++j)")
    assert len(lanes) == 2 and {lanes[0], lanes[0] + 1} & vectorized, lanes
    assert len(out) == 1 and {out[0], out[0] + 1} & vectorized, (out, sorted(vectorized))


REDUCTION_ORDER_PROGRAM = """program red_order
ranks 2
dim N = 8221
input x : f32[N] local
s = sum(x)
n = norm(x)
a = amax(x)
output s
output n
output a
schedule f {
  fuse(s, n, a)
}
"""


def test_cpu_reduction_kernel_adds_in_its_lanes_order_16_elements_at_a_time(
    tmp_path: Path,
) -> None:
    """A kernel with sum/norm/amax partials computes its elements 16 at a time and adds
    their terms to its 8 lanes in the documented order (docs/codegen.md, "Fast loops
    (CPU)"): blocks of 4096, lane l takes elements l, l+8, … in double, the lanes added
    pairwise, the blocks in order. 8221 = 2 · 4096 + 29 elements cover full blocks and a
    last one run by the 16-element loop, the 8-element loop and the tail. The inputs pair
    ±2^50…2^61 in one lane with small values between them, which the lane's sum drops:
    the bits tell the lane order from a sequential sum and from another assignment of
    elements to lanes. GCC reports the 16-element loop vectorized."""
    from collections.abc import Callable

    import numpy as np

    from cocoviz import numerics as nm

    need_mpicxx()
    files = emit_text(REDUCTION_ORDER_PROGRAM, "f", "cpu")
    src = files["red_order.cpp"]
    vectorized = _vectorized_lines(tmp_path, files, "red_order.cpp")
    lines = src.splitlines()
    start = next(n for n, ln in enumerate(lines) if "void k_sch_s(" in ln)
    sixteen = [
        n + 1
        for n in range(start, len(lines))
        if lines[n].lstrip().startswith("for (int64_t lane = 0; lane < 16; ++lane)")
    ][:1]
    assert sixteen and {sixteen[0], sixteen[0] + 1} & vectorized, (sixteen, sorted(vectorized))

    n_el = 8221
    rng = np.random.default_rng(7)
    x = (rng.uniform(-1.0, 1.0, (2, n_el)) * 64).astype(np.float32)
    for r in range(2):
        used: set[int] = set()
        for lo, count in ((0, 4096), (4096, 4096), (8192, n_el - 8192)):
            for _ in range(12 if count > 100 else 3):
                o1 = int(rng.integers(0, count - 8))
                o2 = o1 + 8 * int(rng.integers(1, (count - o1 - 1) // 8 + 1))
                if o2 >= count or {lo + o1, lo + o2} & used:
                    continue
                used |= {lo + o1, lo + o2}
                big = np.float32(2.0 ** int(rng.integers(50, 62)))
                x[r, lo + o1], x[r, lo + o2] = big, -big
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "x.npy", x)
    dump = tmp_path / "dump"
    run = subprocess.run(
        [str(tmp_path / "run.sh"), "--check", "--iters", "1", "--warmup", "0",
         "--inputs", str(tmp_path / "in"), "--dump", str(dump)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["check"] == "pass"

    def total(values: list[float], lane_of: Callable[[int], int]) -> float:
        acc = 0.0
        for lo in range(0, len(values), 4096):
            s = [0.0] * 8
            for o, v in enumerate(values[lo : lo + 4096]):
                s[lane_of(o)] += v
            acc += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
        return acc

    got = {k: nm.load_npy(dump / f"{k}.npy", "f32").reshape(2) for k in ("s", "n", "a")}
    for r in range(2):
        row = x[r].astype(np.float64).tolist()
        want = np.float32(total(row, lambda o: o % 8))
        assert got["s"][r].view(np.uint32) == want.view(np.uint32), (r, got["s"][r], want)
        squares = np.float32(total([v * v for v in row], lambda o: o % 8))
        assert got["n"][r].view(np.uint32) == np.sqrt(squares).view(np.uint32)
        assert got["a"][r] == np.abs(x[r]).max()
    # the inputs tell the orders apart: a sequential sum, and 16 elements over 8 lanes
    # two by two, give other bits
    for other in (lambda o: 0, lambda o: (o % 16) // 2):
        assert any(
            np.float32(total(x[r].astype(np.float64).tolist(), other)) != got["s"][r]
            for r in range(2)
        )


STMT = {"kind": "", "dst": "", "a": "", "b": "", "c": ""}
"""A kernel statement's fields that `split_rows` reads."""


@pytest.mark.parametrize(
    ("space", "operand"),
    [((4, 6, 16), (16,)), ((4, 6, 16), (6, 16)), ((4, 6, 16), (4, 1, 16)), ((3, 8), (3, 8)),
     ((2, 3, 8), (2, 1, 1)), ((5, 8), (1, 8))],
)  # fmt: skip
def test_split_rows_reads_every_broadcast_element_where_the_one_loop_did(
    space: tuple[int, ...], operand: tuple[int, ...]
) -> None:
    """`split_rows` rewrites a broadcast index ``Σ ((i / rs) % rd)·os`` in terms of the row
    ``i0`` and the element ``i1`` of ``i = i0·n + i1``; for every element the rewritten
    index is the original one (or the kernel keeps its one loop)."""
    from cocoviz.emit.render import MIN_ROW, split_rows

    strides = [1] * len(space)
    for d in range(len(space) - 2, -1, -1):
        strides[d] = strides[d + 1] * space[d + 1]
    off = len(space) - len(operand)
    terms, os_ = [], 1
    for d in range(len(operand) - 1, -1, -1):  # as cocoviz.emit.body's element_index
        if operand[d] != 1:
            terms.append((strides[d + off], space[d + off], os_))
        os_ *= operand[d]
    count = strides[0] * space[0]
    bcast = {**STMT, "kind": "index_bcast", "a": "i", "dst": "v1", "terms": terms}
    store = {**STMT, "kind": "store", "a": "i", "b": "v1"}
    split = split_rows([bcast, store], count)
    if operand[-1] == 1 or space[-1] < MIN_ROW:
        assert split is None
        return
    assert split is not None
    n, body = split
    assert n == space[-1] and body[1] == store and body[0]["kind"] == "index_rows"
    expr = body[0]["expr"].replace("/", "//")
    for i in range(count):
        want = sum(((i // rs) % rd) * o for rs, rd, o in terms)
        assert eval(expr, {"i0": i // n, "i1": i % n}) == want, (i, expr)


@pytest.mark.parametrize(
    ("space", "operand", "off"),
    [((4, 6, 16), (16,), (64, 128, 32)), ((4, 6, 16), (6, 16), (96, 0, 16)),
     ((2, 3, 8), (2, 1, 8), (48, 96, 0)), ((4, 16), (16,), (8, 0, 0)),
     ((4, 16), (16,), (0, 0, 3))],
)  # fmt: skip
def test_split_rows_reads_a_chunk_offset_broadcast_where_the_one_loop_did(
    space: tuple[int, ...], operand: tuple[int, ...], off: tuple[int, int, int]
) -> None:
    """A broadcast of ``a = i + n1·tp + n2·k + n3`` (a chunk's or a rank's element) splits
    when the row length divides n1, n2 and n3, and reads, for every element, rank and
    chunk, what the one loop read; otherwise the kernel keeps its one loop."""
    from cocoviz.emit.render import split_rows

    strides = [1] * len(space)
    for d in range(len(space) - 2, -1, -1):
        strides[d] = strides[d + 1] * space[d + 1]
    lead = len(space) - len(operand)
    terms, os_ = [], 1
    for d in range(len(operand) - 1, -1, -1):
        if operand[d] != 1:
            terms.append((strides[d + lead], space[d + lead], os_))
        os_ *= operand[d]
    n1, n2, n3 = off
    count = strides[0] * space[0] // 2  # a chunk: half of the elements
    shift = {**STMT, "kind": "index_affine", "a": "i", "dst": "v0", "n1": n1, "n2": n2, "n3": n3}
    bcast = {**STMT, "kind": "index_bcast", "a": "v0", "dst": "v1", "terms": terms}
    store = {**STMT, "kind": "store", "a": "v0", "b": "v1"}
    split = split_rows([shift, bcast, store], count)
    n = space[-1]
    if any(c % n for c in off):
        assert split is None
        return
    assert split is not None and split[0] == n and split[1][0] == shift
    # an offset index only the broadcast read is dropped with the read's rewrite
    alone = split_rows([shift, bcast, {**store, "a": "i"}], count)
    assert alone is not None and [s["kind"] for s in alone[1]] == ["index_rows", "store"]
    expr = split[1][1]["expr"].replace("/", "//")
    for tp in range(2):
        for k in range(2):
            for i in range(count):
                a = i + n1 * tp + n2 * k + n3
                want = sum(((a // rs) % rd) * o for rs, rd, o in terms)
                got = eval(expr, {"i0": i // n, "i1": i % n, "tp": tp, "k": k})
                assert got == want, (i, tp, k, expr)
