"""verify_programs: hand-written scheduled forms of the samples agree with the originals;
wrong schedules are caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cocoviz.errors import UsageError
from cocoviz.exec.reference import run_reference
from cocoviz.exec.verify import compare_chunked, verify_programs
from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.ir.nodes import Program

SAMPLES = Path(__file__).resolve().parents[1] / "cocoviz" / "samples"

MLP_HEAD = """program megatron_mlp
ranks 16
dim B = 8, S = 1024, H = 3072

input w : f16[H, H]    sliced(0)
input b : f16[H]       replicated
input x : f16[B, S, H] sliced(2)
input r : f16[B, S, H] replicated
"""

# MM-RS-C-AG: split(sum); reorder(sum)
MLP_RS_C_AG = (
    MLP_HEAD
    + """
layer = matmul(x, w)
sum_rs = reducescatter(+, layer)
out_s = dropout(sum_rs + b, 0.1, id=out) + slice(r)
out = allgather(out_s)
output out
"""
)

# ol(MM, fuse(RS-C-AG))
MLP_FUSED = (
    MLP_HEAD
    + """
overlapped chunks=2 {
  layer = matmul(x, w)
  fused {
    sum_rs = reducescatter(+, layer)
    out_s = dropout(sum_rs + b, 0.1, id=out) + slice(r)
    out = allgather(out_s)
  }
}
output out
"""
)

SGD_HEAD = """program sgd
ranks 16
dim N = 1048576
param lr: f32 = 0.01, mu: f32 = 0.9

input g : f32[N] local
input w : f32[N] replicated
"""

# RS-C-AG: split(g1); reorder(g1); asslice(m); dce()
SGD_RS_C_AG = (
    SGD_HEAD
    + """input m : f32[N] sliced
g1_rs = reducescatter(+, g)
m1 = update(m, mu * m + g1_rs)
w1_s = update(w, slice(w) - lr * m1)
w1 = allgather(w1_s)
output w1
"""
)

SGD_FUSED = (
    SGD_HEAD
    + """input m : f32[N] sliced
fused {
  g1_rs = reducescatter(+, g)
  m1 = update(m, mu * m + g1_rs)
  w1_s = update(w, slice(w) - lr * m1)
  w1 = allgather(w1_s)
}
output w1
"""
)

# LAMB RS-C-AG: the norms become partial sums of squares combined across ranks.
LAMB_RS_C_AG = """program lamb
ranks 16
dim N = 1048576
param lr: f32 = 0.001, beta1: f32 = 0.9, beta2: f32 = 0.999, eps: f32 = 1e-6, wd: f32 = 0.01

input g : f32[N] local
input w : f32[N] replicated
input m : f32[N] sliced
input v : f32[N] sliced

g1_rs = reducescatter(+, g)
m1 = update(m, beta1 * m + (1 - beta1) * g1_rs)
v1 = update(v, beta2 * v + (1 - beta2) * g1_rs * g1_rs)
r  = m1 / (1 - beta1) / (sqrt(v1 / (1 - beta2)) + eps) + wd * slice(w)
rn = norm(r)
wn = norm(slice(w))
w1_s = update(w, slice(w) - lr * (wn / rn) * r)
w1 = allgather(w1_s)
output w1
"""

MLP_DIMS = {"B": 2, "S": 3, "H": 8}  # 48 elements: chunks of 24, 12 and 6 at 2, 4, 8 ranks
CHUNKABLE = {"B": 2, "S": 4, "H": 8}  # rows divisible by the canonical chunks=4
SGD_DIMS = {"N": 40}


def sample(name: str, ranks: int, defines: dict[str, int]) -> Program:
    return load_file(SAMPLES / f"{name}.coco", defines=defines, ranks=RanksOverride(n=ranks))


def scheduled(text: str, ranks: int, defines: dict[str, int]) -> Program:
    return load_program(text, "scheduled.coco", defines=defines, ranks=RanksOverride(n=ranks))


CASES = [
    ("megatron_mlp", MLP_RS_C_AG, MLP_DIMS),
    ("megatron_mlp", MLP_FUSED, MLP_DIMS),
    ("sgd", SGD_RS_C_AG, SGD_DIMS),
    ("sgd", SGD_FUSED, SGD_DIMS),
    ("lamb", LAMB_RS_C_AG, SGD_DIMS),
]


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize(
    ("name", "text", "dims"),
    CASES,
    ids=["mlp-rs-c-ag", "mlp-fused", "sgd-rs-c-ag", "sgd-fused", "lamb-rs-c-ag"],
)
def test_hand_written_schedules_verify(
    name: str, text: str, dims: dict[str, int], ranks: int
) -> None:
    original = sample(name, ranks, dims)
    report = verify_programs(original, scheduled(text, ranks, dims), seed=3)
    assert report.ok, report.format_report()
    kinds = {(r.name, r.kind) for r in report.rows}
    assert (original.outputs[0], "output") in kinds
    for t in original.updates():
        assert (t, "updated input") in kinds


def test_rs_c_ag_of_mlp_is_bit_identical() -> None:
    # Same matmul partials, reductions in rank order through one helper, global-index
    # bias and dropout: the scheduled form gives the very same bits.
    report = verify_programs(
        sample("megatron_mlp", 8, MLP_DIMS), scheduled(MLP_RS_C_AG, 8, MLP_DIMS)
    )
    (row,) = report.rows
    assert row.ok and row.max_abs == 0.0 and row.max_rel == 0.0


def test_all_names_compares_shared_intermediates() -> None:
    report = verify_programs(
        sample("megatron_mlp", 4, MLP_DIMS), scheduled(MLP_RS_C_AG, 4, MLP_DIMS), all_names=True
    )
    assert {r.name for r in report.rows} == {"out", "layer"}
    assert report.ok


def test_sgd_sliced_momentum_is_the_updated_input() -> None:
    original, sched = sample("sgd", 4, SGD_DIMS), scheduled(SGD_RS_C_AG, 4, SGD_DIMS)
    a, b = run_reference(original), run_reference(sched)
    np.testing.assert_array_equal(a.global_value("m"), b.global_value("m"))
    assert b.type_of("m").layout.is_sliced and a.type_of("m").layout.is_replicated
    assert b.storage("m", 3).shape == (10,)


WRONG = [
    # dropout with the id of another stage: a different mask
    (MLP_RS_C_AG.replace("id=out", "id=sum"), "out"),
    # the residual added twice
    (MLP_RS_C_AG.replace("+ slice(r)", "+ slice(r) + slice(r)"), "out"),
    # the momentum update forgets the decay
    (SGD_RS_C_AG.replace("mu * m + g1_rs", "m + g1_rs"), "m"),
]


@pytest.mark.parametrize(("text", "bad"), WRONG, ids=["dropout-id", "residual", "momentum"])
def test_wrong_schedules_are_caught(text: str, bad: str) -> None:
    name = "megatron_mlp" if "megatron" in text else "sgd"
    dims = MLP_DIMS if name == "megatron_mlp" else SGD_DIMS
    report = verify_programs(sample(name, 4, dims), scheduled(text, 4, dims))
    assert not report.ok
    rows = {r.name: r for r in report.rows}
    assert not rows[bad].ok
    assert rows[bad].n_bad > 0
    assert "first at" in rows[bad].note
    assert "MISMATCH" in report.format_report()


def test_missing_output_is_a_failed_row() -> None:
    text = MLP_RS_C_AG.replace("output out", "out2 = out * 1\noutput out2")
    report = verify_programs(sample("megatron_mlp", 2, MLP_DIMS), scheduled(text, 2, MLP_DIMS))
    (row,) = report.rows
    assert row.name == "out" and not row.ok
    assert row.note == "not an output of the scheduled program"


def test_format_report() -> None:
    report = verify_programs(sample("sgd", 2, SGD_DIMS), scheduled(SGD_RS_C_AG, 2, SGD_DIMS))
    text = report.format_report()
    lines = text.splitlines()
    assert lines[0] == "verify sgd against sgd (ranks 2, seed 0)"
    assert lines[1].split() == ["name", "kind", "dtype", "max", "abs", "max", "rel"]
    assert lines[2].split()[:3] == ["w1", "output", "f32"]
    assert any(ln.split()[:4] == ["m", "updated", "input", "f32"] for ln in lines)
    assert lines[-1] == "ok: 3 value(s) agree"


def test_tolerance_accepts_rounding_differences_and_nan_positions_must_match() -> None:
    a = np.array([1.0, 2.0, np.nan, 4.0], dtype=np.float16)
    b = a.copy()
    b[0] = np.float16(1.0009766)  # one f16 ulp
    assert compare_chunked(b, a, "f16").ok
    c = a.copy()
    c[2] = 3.0
    res = compare_chunked(c, a, "f16")
    assert not res.ok and res.nan_mismatch == 1 and res.first_bad == 2


def test_compare_chunks_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    import cocoviz.exec.verify as v

    monkeypatch.setattr(v, "_CHUNK", 3)
    a = np.arange(10, dtype=np.float32)
    b = a.copy()
    b[7] += 1
    b[8] += 2
    res = compare_chunked(b, a, "f32")
    assert (res.ok, res.n_bad, res.first_bad, res.max_abs) == (False, 2, 7, 2.0)


def test_verify_refuses_when_the_pair_exceeds_memory() -> None:
    with pytest.raises(UsageError, match="verifying 'megatron_mlp' in the reference needs about"):
        verify_programs(
            sample("megatron_mlp", 8, {"B": 8, "S": 1024, "H": 3072}),
            scheduled(MLP_RS_C_AG, 8, {"B": 8, "S": 1024, "H": 3072}),
            max_mem=2 << 30,
        )


def test_canonical_schedules_verify_when_sessions_exist() -> None:
    import cocoviz.schedule as session
    for name, dims in [("megatron_mlp", CHUNKABLE), ("sgd", SGD_DIMS), ("lamb", SGD_DIMS)]:
        for ranks in (2, 4):
            original = sample(name, ranks, dims)
            for block in original.schedules:
                after = session.apply_block(original, block)
                report = verify_programs(original, after)
                assert report.ok, f"{name} {block.name} at {ranks}:\n{report.format_report()}"
