"""cocoviz.numerics: the generator, dropout, rounding, dtype table and compare."""

from __future__ import annotations

import enum
from pathlib import Path

import numpy as np
import pytest

from cocoviz import numerics as nm
from cocoviz.ir.types import DType

FLOATS = ("f16", "bf16", "f32", "f64")
INTS = ("i32", "i64")


# -------------------------------------------------------------------- generator


def test_mix_matches_splitmix64_reference_stream() -> None:
    # splitmix64 seeded with 1234567: output k is mix(seed + k·golden) (published vectors).
    golden = 0x9E3779B97F4A7C15
    want = [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    states = [(1234567 + k * golden) % 2**64 for k in range(5)]
    assert [nm.mix_scalar(s) for s in states] == want
    assert nm.mix(np.array(states, dtype=np.uint64)).tolist() == want
    assert nm.mix_scalar(0) == 0xE220A8397B1DCDAF


def test_mix_vector_and_scalar_agree_with_wraparound() -> None:
    z = np.random.default_rng(0).integers(0, 2**64, size=1000, dtype=np.uint64)
    z[:3] = [0, 2**64 - 1, 2**64 - 0x9E3779B97F4A7C15]
    got = nm.mix(z)
    assert got.dtype == np.uint64
    assert got.tolist() == [nm.mix_scalar(int(v)) for v in z]
    assert np.array_equal(z[:3], np.array([0, 2**64 - 1, 2**64 - 0x9E3779B97F4A7C15], np.uint64))


def test_fnv1a64_vectors() -> None:
    assert nm.fnv1a64("") == 0xCBF29CE484222325
    assert nm.fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert nm.fnv1a64("foobar") == 0x85944171F73967E8
    assert nm.fnv1a64("é") == nm.fnv1a64("\u00e9") != nm.fnv1a64("e")


def test_key_and_uniform_bits() -> None:
    assert nm.key_for("x", 0) == nm.mix_scalar(0 ^ nm.fnv1a64("x"))
    assert nm.key_for("x", 5) == nm.mix_scalar(5 ^ nm.fnv1a64("x"))
    u = nm.uniform_bits("x", 0, 0, 3)
    assert [hex(int(v)) for v in u] == [
        "0x5b8fbfe061ff4b3c",
        "0x5e4c24e5c73ad24c",
        "0x5f75ff23eaa7ef6e",
    ]
    key = nm.key_for("x", 0)
    assert int(nm.uniform_bits("x", 0, 2**64 - 1, 1)[0]) == nm.mix_scalar(key ^ (2**64 - 1))
    with pytest.raises(ValueError, match="seed"):
        nm.key_for("x", -1)
    with pytest.raises(ValueError, match="outside"):
        nm.uniform_bits("x", 0, 2**64 - 1, 2)


def test_generated_values_pinned() -> None:
    assert np.array_equal(nm.generate_input("x", "f32", 4, 0), np.array([367, 378, 382, 50]) / 1024)
    assert nm.generate_input("x", "i64", 4, 0).tolist() == [12, 12, 14, 10]


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_inputs_are_k_over_1024(dtype: str) -> None:
    x = nm.generate_input("w", dtype, 5000, 3)
    assert x.dtype == nm.storage_dtype(dtype) and x.shape == (5000,)
    assert np.all(x > 0) and np.all(x <= 1)
    u = nm.uniform_bits("w", 3, 0, 5000)
    exact = ((u >> np.uint64(54)) + np.uint64(1)).astype(np.float64) / 1024
    if dtype == "bf16":
        assert np.array_equal(x, nm.round_bf16(exact.astype(np.float32)))
    else:
        # Exact in f16 (and wider): k/1024 with k <= 1024 needs 11 significant bits.
        assert np.array_equal(x.astype(np.float64), exact)


@pytest.mark.parametrize("dtype", INTS)
def test_integer_inputs_are_u_mod_16(dtype: str) -> None:
    x = nm.generate_input("idx", dtype, 4096, 0)
    assert x.dtype == nm.storage_dtype(dtype)
    u = nm.uniform_bits("idx", 0, 0, 4096)
    assert np.array_equal(x, (u % np.uint64(16)).astype(x.dtype))
    assert set(np.unique(x).tolist()) == set(range(16))


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_rank_slices_assemble_the_global_value(dtype: str) -> None:
    numel, g = 96, 4
    full = nm.generate_input("x", dtype, numel, 11)
    parts = [nm.generate_input("x", dtype, numel, 11, r * numel // g, numel // g) for r in range(g)]
    assert np.array_equal(np.concatenate(parts), full)
    # A sliced(d) rank holds strided global indices: generate exactly those.
    idx = np.arange(numel).reshape(4, 6, 4)[:, :, 1:3]
    assert np.array_equal(nm.generate_input_at("x", dtype, 11, idx), full[idx])


def test_chunking_does_not_change_values(monkeypatch: pytest.MonkeyPatch) -> None:
    want = nm.generate_input("x", "f16", 1000, 1, 5, 990)
    keep = nm.dropout_keep("t#0", 1, 0.3, 5, 990)
    monkeypatch.setattr(nm, "_CHUNK", 7)
    assert np.array_equal(nm.generate_input("x", "f16", 1000, 1, 5, 990), want)
    assert np.array_equal(nm.dropout_keep("t#0", 1, 0.3, 5, 990), keep)


def test_generate_input_bounds() -> None:
    assert nm.generate_input("x", "f32", 10, 0, 10).shape == (0,)
    with pytest.raises(ValueError, match="outside its 10 elements"):
        nm.generate_input("x", "f32", 10, 0, 8, 3)
    with pytest.raises(ValueError, match="unknown dtype 'f8'"):
        nm.generate_input("x", "f8", 10, 0)
    with pytest.raises(ValueError, match="non-negative"):
        nm.generate_input_at("x", "f32", 0, np.array([-1]))


# ---------------------------------------------------------------------- dropout


def test_dropout_threshold_and_keep_rule() -> None:
    assert nm.dropout_threshold(0.0) == 0
    assert nm.dropout_threshold(0.5) == 2**31
    assert nm.dropout_threshold(0.1) == 429496729
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            nm.dropout_threshold(bad)
    u = nm.uniform_bits("out#0", 0, 100, 50)
    want = (u >> np.uint64(32)) >= np.uint64(nm.dropout_threshold(0.3))
    assert np.array_equal(nm.dropout_keep("out#0", 0, 0.3, 100, 50), want)
    assert nm.dropout_keep("out#0", 0, 0.0, 0, 1000).all()


def test_dropout_keeps_about_1_minus_p() -> None:
    keep = nm.dropout_keep("out#0", 0, 0.1, 0, 200_000)
    assert abs(keep.mean() - 0.9) < 0.005
    # Different ids and seeds give different masks; slices agree with the whole.
    assert not np.array_equal(keep[:1000], nm.dropout_keep("out#1", 0, 0.1, 0, 1000))
    assert not np.array_equal(keep[:1000], nm.dropout_keep("out#0", 1, 0.1, 0, 1000))
    assert np.array_equal(keep[500:700], nm.dropout_keep("out#0", 0, 0.1, 500, 200))
    idx = np.array([[3, 1], [4, 1_000]])
    assert np.array_equal(nm.dropout_keep_at("out#0", 0, 0.1, idx), keep[idx])


def test_dropout_scale() -> None:
    assert nm.dropout_scale(0.1, "f16") == float(np.float32(1 / 0.9))
    assert nm.dropout_scale(0.1, "bf16") == float(np.float32(1 / 0.9))
    assert nm.dropout_scale(0.1, "f64") == 1 / 0.9
    assert nm.dropout_scale(0.1, "i32") == 1 / 0.9
    assert nm.dropout_scale(0.0, "f32") == 1.0


@pytest.mark.parametrize("dtype", ("f16", "bf16", "f32"))
def test_dropout_apply_rounds_once_from_f32(dtype: str) -> None:
    x = nm.generate_input("x", dtype, 2048, 0)
    mask = nm.dropout_keep("y#0", 0, 0.1, 0, 2048)
    y = nm.dropout_apply(x, mask, 0.1, dtype)
    assert y.dtype == x.dtype
    assert np.all(y[~mask] == 0)
    kept = x.astype(np.float32) * np.float32(1 / 0.9)
    assert np.array_equal(y[mask], nm.to_dtype(kept, dtype)[mask])


def test_dropout_apply_f64_and_ints() -> None:
    x = nm.generate_input("x", "f64", 64, 0)
    mask = np.arange(64) % 3 != 0
    y = nm.dropout_apply(x, mask, 0.25, "f64")
    assert np.array_equal(y, np.where(mask, x * (1 / 0.75), 0.0))
    xi = np.array([15, 7, -7, 3], dtype=np.int32)
    yi = nm.dropout_apply(xi, np.array([True, True, True, False]), 0.5, "i32")
    assert yi.dtype == np.int32 and yi.tolist() == [30, 14, -14, 0]
    yt = nm.dropout_apply(np.array([5], np.int64), np.array([True]), 0.4, "i64")
    assert yt.tolist() == [8]  # 5 / 0.6 = 8.33, truncated


# --------------------------------------------------------------------- rounding


def test_round_bf16_nearest_even_and_specials() -> None:
    one = 1.0
    vals = np.array(
        [
            one + 2**-8,  # tie between 1 and 1 + 2^-7: even is 1
            one + 3 * 2**-8,  # tie: even is 1 + 2^-6
            one + 2**-8 + 2**-20,  # above the tie
            -(one + 2**-8 + 2**-20),
            3.3895313892515355e38,  # largest bf16
            3.4e38,  # rounds past it to inf
            1e-40,  # f32 subnormal
            -0.0,
            np.inf,
        ],
        dtype=np.float32,
    )
    r = nm.round_bf16(vals)
    assert r.dtype == np.float32
    assert r[:4].tolist() == [1.0, 1.015625, 1.0078125, -1.0078125]
    assert r[4] == vals[4] and np.isposinf(r[5])
    assert vals.view(np.uint32)[6] == 0x000116C2 and r.view(np.uint32)[6] == 0x00010000
    assert np.signbit(r[7]) and np.isposinf(r[8])
    assert np.all((r.view(np.uint32) & np.uint32(0xFFFF)) == 0)
    assert np.array_equal(nm.round_bf16(r), r)  # idempotent
    nans = np.array([0x7F800001, 0xFF800001, 0x7FC00000], dtype=np.uint32).view(np.float32)
    rn = nm.round_bf16(nans)
    assert np.isnan(rn).all() and rn.view(np.uint32).tolist() == [
        0x7FC00000,
        0xFFC00000,
        0x7FC00000,
    ]


def test_to_dtype_conventions() -> None:
    # f16 rounds directly from f64 (no double rounding through f32).
    x = np.array([1 + 2**-11 + 2**-40])
    assert nm.to_dtype(x, "f16")[0] == np.float16(1 + 2**-10)
    # bf16 goes through f32: the f32 rounding lands on a tie, which rounds to even.
    y = np.array([1 + 2**-8 + 2**-30])
    assert nm.to_dtype(y, "bf16")[0] == 1.0
    assert nm.to_dtype(np.array([2.9, -2.9, 1e10]), "i32").tolist()[:2] == [2, -2]
    assert nm.to_dtype(np.array([2**31 + 5]), "i32").tolist() == [-(2**31) + 5]
    assert nm.to_compute(np.array([1.5], np.float16), "f16").dtype == np.float32
    assert nm.to_compute(np.array([1], np.int32), "i32").dtype == np.int64


# ----------------------------------------------------------------- dtype table


class _DType(enum.Enum):
    F16 = "f16"
    BF16 = "bf16"


def test_dtype_table() -> None:
    assert tuple(nm.DTYPES) == ("f16", "bf16", "f32", "f64", "i32", "i64")
    bf16 = nm.dtype_info(_DType.BF16)
    assert bf16.storage == np.float32 and bf16.itemsize == 2
    assert (bf16.cpu_ctype, bf16.cuda_ctype, bf16.nccl) == (
        "uint16_t",
        "__nv_bfloat16",
        "ncclBfloat16",
    )
    assert bf16.npy_descr == "<f4" and bf16.runtime_enum == "cocoviz::DType::bf16"
    f16 = nm.dtype_info("f16")
    assert (f16.cpu_ctype, f16.cuda_ctype, f16.nccl, f16.mpi) == (
        "uint16_t",
        "__half",
        "ncclFloat16",
        "MPI_UINT16_T",
    )
    assert nm.dtype_info(f16) is f16
    assert [nm.DTYPES[d].compute for d in nm.DTYPES] == [
        np.float32,
        np.float32,
        np.float32,
        np.float64,
        np.int64,
        np.int64,
    ]
    assert [nm.DTYPES[d].nccl for d in ("f32", "f64", "i32", "i64")] == [
        "ncclFloat32",
        "ncclFloat64",
        "ncclInt32",
        "ncclInt64",
    ]
    assert nm.DTYPES["i64"].mpi == "MPI_INT64_T" and nm.DTYPES["f64"].mpi == "MPI_DOUBLE"
    with pytest.raises(ValueError, match="expected one of: f16 bf16 f32 f64 i32 i64"):
        nm.dtype_info("float")


def test_compute_dtype_is_the_table_s_compute_type() -> None:
    # One rule for the executors (numpy types) and the emitters (DSL dtypes).
    want = {"f16": "f32", "bf16": "f32", "f32": "f32", "f64": "f64", "i32": "i64", "i64": "i64"}
    for dt in DType:
        got = nm.compute_dtype(dt)
        assert got is DType(want[dt.value])
        assert nm.storage_dtype(got) == nm.dtype_info(dt).compute
    assert nm.compute_dtype("bf16") is DType.F32


def test_tolerances_follow_the_design() -> None:
    assert nm.tolerance("f64") == nm.Tolerance(rtol=1e-10, atol=1e-12)
    assert nm.tolerance("f32") == nm.Tolerance(rtol=1e-5, atol=1e-6)
    assert nm.tolerance("f16") == nm.Tolerance(rtol=5e-3, atol=1e-3)
    assert nm.tolerance("bf16") == nm.Tolerance(rtol=2e-2, atol=1e-2)
    assert nm.tolerance("i32") == nm.Tolerance(0.0, 0.0)


# ---------------------------------------------------------------------- compare


def test_compare_within_and_outside_tolerance() -> None:
    b = np.array([1.0, 100.0, 0.0], dtype=np.float32)
    ok = nm.compare(b * np.float32(1 + 5e-6), b, "f32")
    assert ok.ok and ok.n_bad == 0 and ok.first_bad is None and ok.max_rel < 1e-5
    bad = nm.compare(np.array([1.0, 100.1, 2e-6], np.float32), b, "f32")
    assert not bad.ok and bad.n_bad == 2 and bad.first_bad == 1
    assert bad.max_rel == np.inf  # 2e-6 against 0
    assert "2 element(s) differ (first at flat index 1" in bad.describe()


def test_compare_nan_and_inf_rules() -> None:
    nan, inf = np.nan, np.inf
    r = nm.compare(np.array([nan, inf, -inf]), np.array([nan, inf, -inf]), "f64")
    assert r.ok and r.max_abs == 0.0
    r = nm.compare(np.array([nan, 1.0, 1.0]), np.array([1.0, nan, 1.0]), "f64")
    assert not r.ok and r.nan_mismatch == 2 and r.n_bad == 2 and r.first_bad == 0
    r = nm.compare(np.array([inf, 1.0]), np.array([1e300, -inf]), "f64")
    assert r.n_bad == 2 and r.max_abs == inf and r.max_rel == inf


def test_compare_integers_exact_and_shapes() -> None:
    r = nm.compare(np.array([2**62, 3]), np.array([2**62 + 1, 3]), "i64")
    assert not r.ok and r.n_bad == 1
    assert nm.compare(np.array([1, 2], np.int32), np.array([1, 2], np.int32), "i32").ok
    assert nm.compare(np.zeros((0, 3)), np.zeros((0, 3)), "f32").ok
    with pytest.raises(ValueError, match=r"shapes \(2,\) and \(3,\)"):
        nm.compare(np.zeros(2), np.zeros(3), "f32")


def test_compare_half_precisions() -> None:
    b = nm.generate_input("x", "f16", 512, 0)
    a = (b.astype(np.float32) * np.float32(1.002)).astype(np.float16)
    assert nm.compare(a, b, "f16").ok
    assert not nm.compare(a, b, "f32").ok
    bb = nm.generate_input("x", "bf16", 512, 0)
    assert nm.compare(nm.round_bf16(bb * np.float32(1.015)), bb, "bf16").ok


# -------------------------------------------------------------------------- npy


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_npy_round_trip(dtype: str, tmp_path: Path) -> None:
    x = nm.generate_input("x", dtype, 24, 0).reshape(2, 3, 4)
    path = tmp_path / "x.npy"
    nm.save_npy(path, x, dtype)
    raw = np.load(path)
    assert raw.dtype.str == nm.dtype_info(dtype).npy_descr
    back = nm.load_npy(path, dtype)
    assert back.dtype == nm.storage_dtype(dtype) and np.array_equal(back, x)


def test_bf16_npy_is_float32(tmp_path: Path) -> None:
    path = tmp_path / "b.npy"
    nm.save_npy_bf16(path, np.array([1.0 + 2**-8, 3.0], dtype=np.float64))
    raw = np.load(path)
    assert raw.dtype == np.float32 and raw.tolist() == [1.0, 3.0]
    np.save(path, np.array([1 + 3 * 2**-8], dtype=np.float64))
    assert nm.load_npy(path, "bf16").tolist() == [1.015625]
