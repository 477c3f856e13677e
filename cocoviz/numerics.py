"""The numeric facts every executor and emitter shares (docs/semantics-notes.md).

This module is the single Python definition of the dtype table (storage, compute type,
C/CUDA/NCCL/MPI spellings, tolerances), the generator, dropout, dtype rounding and
comparison rules. It sits just above the IR (docs/architecture.md, layers): the numpy
reference, the mpi4py executor and the code emitters import it; the C++ runtime
(`cocoviz/templates/cocoviz_runtime.h`) and the CUDA runtime
(`cocoviz/templates/cocoviz_runtime.cuh`) implement the same rules, and
`tests/test_runtime_headers.py` checks that they agree bit for bit.

Generator::

    mix(z):  z += 0x9E3779B97F4A7C15
             z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
             z = (z ^ z>>27) * 0x94D049BB133111EB
             return z ^ z>>31                      (uint64, wrapping)
    key   = mix(seed ^ fnv1a64(utf8(id)))
    u(i)  = mix(key ^ i)                           (i: uint64 global flat index)

Inputs: floats are ``((u >> 54) + 1) / 1024`` (k/1024 for k in 1..1024: exact in f16 and
f32; bf16 rounds it to nearest even), integers are ``u mod 16``.

Dropout (tag ``<stage>#<k>``): element i is kept iff ``(u(i) >> 32) >= floor(p · 2^32)``.
A kept element is ``x · s`` where ``s = float32(1 / (1 − p))`` (the quotient evaluated in
f64 and rounded once to f32), multiplied in f32 and rounded to x's dtype; for f64 data
``s`` and the product stay in f64; for integer data the product is taken in f64 and
truncated toward zero. A dropped element is 0.

Rounding conventions:

- f16 is numpy ``float16``; conversions from f32 *and* from f64 round directly to nearest
  even (numpy's rule; no double rounding through f32).
- bf16 is stored in numpy as ``float32`` holding bf16-representable values. Rounding is to
  nearest even on the top 16 bits of the f32 pattern; NaN stays NaN (quiet bit set, sign
  and top payload bits kept). A value in f64 is first rounded to f32, then to bf16.
- integers from floats truncate toward zero (C's conversion rule).

``.npy`` convention: f16 arrays are written as ``<f2``; **bf16 arrays are written as
float32 (``<f4``)** holding the bf16 values, since ``.npy`` has no bf16 type. `save_npy`
and `load_npy` apply it; reading a bf16 array rounds the stored float32 values to bf16.

Tolerances (``|a − b| ≤ atol + rtol·|b|``, NaN positions must match), given as rtol/atol:
f64 1e-10/1e-12, f32 1e-5/1e-6, f16 5e-3/1e-3, bf16 2e-2/1e-2, integers exact.
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from cocoviz.ir.types import DType

__all__ = [
    "DTYPES",
    "CompareResult",
    "DTypeInfo",
    "Tolerance",
    "compare",
    "compute_dtype",
    "dropout_apply",
    "dropout_keep",
    "dropout_keep_at",
    "dropout_scale",
    "dropout_threshold",
    "dtype_info",
    "fnv1a64",
    "generate_input",
    "generate_input_at",
    "key_for",
    "load_npy",
    "mix",
    "mix_scalar",
    "round_bf16",
    "save_npy",
    "save_npy_bf16",
    "storage_dtype",
    "to_compute",
    "to_dtype",
    "tolerance",
    "uniform_bits",
    "uniform_bits_at",
]

U64Array: TypeAlias = npt.NDArray[np.uint64]
DTypeLike: TypeAlias = "str | enum.Enum | DTypeInfo"
"""A dtype spelling (``"f16"``), an enum whose ``.value`` is the spelling, or a DTypeInfo."""

MASK64: Final = (1 << 64) - 1
_GOLDEN: Final = 0x9E3779B97F4A7C15
_MUL1: Final = 0xBF58476D1CE4E5B9
_MUL2: Final = 0x94D049BB133111EB
_FNV_OFFSET: Final = 0xCBF29CE484222325
_FNV_PRIME: Final = 0x100000001B3

# Elements generated per numpy pass; bounds the temporaries of a large generate.
_CHUNK: Final = 1 << 22


# --------------------------------------------------------------------------- dtypes


@dataclass(frozen=True)
class Tolerance:
    """Comparison tolerance: ``|a − b| ≤ atol + rtol·|b|`` (both 0 means exact)."""

    rtol: float
    atol: float


@dataclass(frozen=True)
class DTypeInfo:
    """Everything the executors and emitters spell differently for one DSL dtype."""

    name: str
    """DSL spelling: ``f16 bf16 f32 f64 i32 i64``."""
    storage: np.dtype[Any]
    """numpy dtype holding values (bf16: float32 holding bf16-rounded values)."""
    compute: np.dtype[Any]
    """numpy dtype arithmetic runs in (f32 for f16/bf16/f32, f64, int64 for integers)."""
    compute_name: str
    """DSL spelling of the dtype arithmetic runs in (``f32``, ``f64`` or ``i64``)."""
    is_float: bool
    itemsize: int
    """Bytes per element in C/CUDA storage (2 for bf16, unlike its numpy storage)."""
    cpu_ctype: str
    """C++ storage type on the CPU target (f16/bf16 are uint16_t bit patterns)."""
    cpu_compute_ctype: str
    cuda_ctype: str
    """CUDA storage type (``__half``, ``__nv_bfloat16``, ...)."""
    cuda_compute_ctype: str
    runtime_enum: str
    """The `cocoviz::DType` enumerator of the C++/CUDA runtime headers."""
    nccl: str
    """NCCL datatype enum."""
    mpi: str
    """MPI datatype used for transport (f16/bf16 travel as MPI_UINT16_T with user ops)."""
    cuda_datatype: str
    """cudaDataType_t for cuBLAS (integers have no GEMM support and map to *_32I/*_64I)."""
    npy_descr: str
    """``.npy`` descr written by `save_npy` and by the runtime's npy writer."""
    tolerance: Tolerance


_TOLERANCES: Final[dict[DType, Tolerance]] = {
    DType.F16: Tolerance(5e-3, 1e-3),
    DType.BF16: Tolerance(2e-2, 1e-2),
    DType.F32: Tolerance(1e-5, 1e-6),
    DType.F64: Tolerance(1e-10, 1e-12),
    DType.I32: Tolerance(0.0, 0.0),
    DType.I64: Tolerance(0.0, 0.0),
}
"""Per dtype (atol, rtol) of a comparison (docs/semantics-notes.md, tolerances); the
only facts here that `DType.facts` does not hold."""


def _info(dt: DType) -> DTypeInfo:
    f = dt.facts
    return DTypeInfo(
        name=dt.value,
        storage=np.dtype(f.numpy),
        compute=np.dtype(DType(f.compute).facts.numpy),
        compute_name=f.compute,
        is_float=f.is_float,
        itemsize=f.itemsize,
        cpu_ctype=f.cpu_ctype,
        cpu_compute_ctype=f.cpu_compute_ctype,
        cuda_ctype=f.cuda_ctype,
        cuda_compute_ctype=f.cuda_compute_ctype,
        runtime_enum=f"cocoviz::DType::{dt.value}",
        nccl=f.nccl,
        mpi=f.mpi,
        cuda_datatype=f.cuda_datatype,
        npy_descr=f.npy_descr,
        tolerance=_TOLERANCES[dt],
    )


DTYPES: Final = MappingProxyType({dt.value: _info(dt) for dt in DType})
"""The dtype table, keyed by DSL spelling."""


def dtype_info(dtype: DTypeLike) -> DTypeInfo:
    """The table row for `dtype` (a spelling, an enum whose value is one, or a row)."""
    if isinstance(dtype, DTypeInfo):
        return dtype
    name = dtype.value if isinstance(dtype, enum.Enum) else dtype
    try:
        return DTYPES[name]
    except KeyError:
        known = " ".join(DTYPES)
        raise ValueError(f"unknown dtype {name!r} (expected one of: {known})") from None


def compute_dtype(dtype: DTypeLike) -> DType:
    """The DSL dtype arithmetic on `dtype` runs in: f32 for f16/bf16/f32, f64 for f64,
    i64 for integers (docs/semantics-notes.md); ``dtype_info(dtype).compute`` is its
    numpy type."""
    return DType(dtype_info(dtype).compute_name)


def storage_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    """numpy dtype that holds values of `dtype` (float32 for bf16)."""
    return dtype_info(dtype).storage


def tolerance(dtype: DTypeLike) -> Tolerance:
    """The §2.5 comparison tolerance of `dtype`."""
    return dtype_info(dtype).tolerance


# ----------------------------------------------------------------------- rounding


def round_bf16(x: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Round float32 values to bf16 (nearest even on the top 16 bits), as float32.

    NaN stays NaN: its sign and top 7 payload bits are kept and the quiet bit is set.
    Finite values past the bf16 range become infinities, as in round-to-nearest.
    """
    f = np.array(x, dtype=np.float32, copy=True)
    bits = f.view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    with np.errstate(over="ignore"):
        bias = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
        rounded = (bits + bias) & np.uint32(0xFFFF0000)
    bits[...] = np.where(nan, quiet, rounded)
    return f


def to_dtype(x: npt.ArrayLike, dtype: DTypeLike) -> npt.NDArray[Any]:
    """Convert values to `dtype`'s numpy storage with cocoviz's rounding rules.

    f16 rounds directly from the source precision; bf16 goes through f32 (see module
    docstring); integer targets truncate floats toward zero and wrap integers.
    """
    info = dtype_info(dtype)
    a = np.asarray(x)
    if info.name == "bf16":
        with np.errstate(over="ignore", invalid="ignore"):
            return round_bf16(a.astype(np.float32))
    if info.is_float:
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(info.storage, copy=False)  # no copy when already stored so
    if a.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.trunc(a).astype(info.storage)
    return a.astype(info.storage)


def to_compute(x: npt.ArrayLike, dtype: DTypeLike) -> npt.NDArray[Any]:
    """Widen stored values of `dtype` to its compute dtype (exact)."""
    return np.asarray(x).astype(dtype_info(dtype).compute)


# ---------------------------------------------------------------------- generator


def mix_scalar(z: int) -> int:
    """The splitmix64 finalizer on one Python int, wrapping at 2^64."""
    z = (z + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & MASK64
    return z ^ (z >> 31)


def mix(z: npt.ArrayLike) -> U64Array:
    """The splitmix64 finalizer, elementwise over uint64 values, wrapping at 2^64."""
    a = np.array(z, dtype=np.uint64, copy=True)
    with np.errstate(over="ignore"):
        a += np.uint64(_GOLDEN)
        a ^= a >> np.uint64(30)
        a *= np.uint64(_MUL1)
        a ^= a >> np.uint64(27)
        a *= np.uint64(_MUL2)
        a ^= a >> np.uint64(31)
    return a


def fnv1a64(s: str) -> int:
    """64-bit FNV-1a of the UTF-8 bytes of `s`."""
    h = _FNV_OFFSET
    for byte in s.encode("utf-8"):
        h = ((h ^ byte) * _FNV_PRIME) & MASK64
    return h


def _check_u64(value: int, what: str) -> int:
    if not 0 <= value <= MASK64:
        raise ValueError(f"{what} must be in [0, 2^64), got {value}")
    return value


def key_for(id: str, seed: int) -> int:
    """The stream key of identifier `id`: ``mix(seed ^ fnv1a64(utf8(id)))``."""
    return mix_scalar(_check_u64(seed, "seed") ^ fnv1a64(id))


def _index_range(start: int, count: int) -> U64Array:
    if start < 0 or count < 0 or start + count > MASK64 + 1:
        raise ValueError(f"index range [{start}, {start + count}) is outside [0, 2^64)")
    return np.arange(count, dtype=np.uint64) + np.uint64(start)


def uniform_bits_at(id: str, seed: int, index: npt.ArrayLike) -> U64Array:
    """u(i) = mix(key ^ i) for each global flat index in `index` (any shape)."""
    key = np.uint64(key_for(id, seed))
    idx = np.asarray(index)
    if idx.dtype.kind not in "ui":
        raise TypeError(f"indices must be integers, got {idx.dtype}")
    if idx.dtype.kind == "i" and idx.size and int(idx.min()) < 0:
        raise ValueError("indices must be non-negative")
    flat = idx.astype(np.uint64).reshape(-1)
    out = np.empty(flat.shape, dtype=np.uint64)
    for lo in range(0, flat.size, _CHUNK):
        out[lo : lo + _CHUNK] = mix(flat[lo : lo + _CHUNK] ^ key)
    return out.reshape(idx.shape)


def uniform_bits(id: str, seed: int, start: int, count: int) -> U64Array:
    """u(i) for i in [start, start + count)."""
    return uniform_bits_at(id, seed, _index_range(start, count))


def _input_from_bits(u: U64Array, info: DTypeInfo) -> npt.NDArray[Any]:
    if info.is_float:
        k = (u >> np.uint64(54)) + np.uint64(1)
        return to_dtype(k.astype(np.float64) / 1024.0, info)
    return (u & np.uint64(15)).astype(info.storage)


def generate_input_at(
    name: str, dtype: DTypeLike, seed: int, index: npt.ArrayLike
) -> npt.NDArray[Any]:
    """Input values of `name` at the given global flat indices (any shape)."""
    info = dtype_info(dtype)
    idx = np.asarray(index)
    out = np.empty(idx.shape, dtype=info.storage)
    flat_idx = idx.reshape(-1)
    flat_out = out.reshape(-1)
    for lo in range(0, flat_idx.size, _CHUNK):
        u = uniform_bits_at(name, seed, flat_idx[lo : lo + _CHUNK])
        flat_out[lo : lo + _CHUNK] = _input_from_bits(u, info)
    return out


def generate_input(
    name: str,
    dtype: DTypeLike,
    global_numel: int,
    seed: int,
    start: int = 0,
    count: int | None = None,
) -> npt.NDArray[Any]:
    """The 1-D run [start, start + count) of input `name`'s global flat values.

    `global_numel` is the element count of the global value (for a local input, of
    ``[G, *shape]``); `count` defaults to the rest of it. A rank generates only its part.
    """
    if count is None:
        count = global_numel - start
    if start < 0 or count < 0 or start + count > global_numel:
        raise ValueError(
            f"slice [{start}, {start + count}) of input {name!r} is outside its "
            f"{global_numel} elements"
        )
    info = dtype_info(dtype)
    out = np.empty(count, dtype=info.storage)
    for lo in range(0, count, _CHUNK):
        n = min(_CHUNK, count - lo)
        out[lo : lo + n] = _input_from_bits(uniform_bits(name, seed, start + lo, n), info)
    return out


# ------------------------------------------------------------------------ dropout


def dropout_threshold(p: float) -> int:
    """``floor(p · 2^32)``: an element is kept iff ``u >> 32`` is at least this."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return math.floor(p * 4294967296.0)


def dropout_scale(p: float, dtype: DTypeLike) -> float:
    """The factor applied to kept elements: 1/(1−p) as f32, or as f64 for f64/integers."""
    dropout_threshold(p)
    info = dtype_info(dtype)
    s = 1.0 / (1.0 - p)
    return float(np.float32(s)) if info.compute == np.float32 else s


def dropout_keep_at(tag: str, seed: int, p: float, index: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Keep mask of dropout occurrence `tag` at the given global flat indices."""
    threshold = np.uint64(dropout_threshold(p))
    return (uniform_bits_at(tag, seed, index) >> np.uint64(32)) >= threshold


def dropout_keep(tag: str, seed: int, p: float, start: int, count: int) -> npt.NDArray[np.bool_]:
    """Keep mask of dropout occurrence `tag` for global indices [start, start + count)."""
    return dropout_keep_at(tag, seed, p, _index_range(start, count))


def dropout_apply(
    x: npt.ArrayLike, mask: npt.ArrayLike, p: float, dtype: DTypeLike
) -> npt.NDArray[Any]:
    """``where(mask, x · scale, 0)`` in `dtype`'s storage (see module docstring)."""
    info = dtype_info(dtype)
    scale = dropout_scale(p, info)
    keep = np.asarray(mask, dtype=bool)
    if info.is_float:
        xc = np.asarray(x).astype(info.compute)
        kept = xc * info.compute.type(scale)
        return to_dtype(np.where(keep, kept, info.compute.type(0)), info)
    kept_f = np.asarray(x).astype(np.float64) * scale
    return to_dtype(np.where(keep, kept_f, 0.0), info)


# ------------------------------------------------------------------------ compare


@dataclass(frozen=True)
class CompareResult:
    """Outcome of `compare`: whether all elements agree and how far apart they are."""

    ok: bool
    max_abs: float
    """Largest |a − b| over positions where neither is NaN (equal infinities give 0)."""
    max_rel: float
    """Largest |a − b| / |b| there (inf where b is 0 or the difference is infinite)."""
    n_bad: int
    """Positions outside tolerance, NaN mismatches included."""
    nan_mismatch: int
    """Positions where exactly one side is NaN."""
    first_bad: int | None = None
    """Flat index of the first bad position, if any."""

    def describe(self) -> str:
        """One line for diagnostics."""
        if self.ok:
            return f"ok (max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g})"
        return (
            f"{self.n_bad} element(s) differ (first at flat index {self.first_bad}; "
            f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, "
            f"{self.nan_mismatch} NaN mismatch(es))"
        )


def compare(a: npt.ArrayLike, b: npt.ArrayLike, dtype: DTypeLike) -> CompareResult:
    """Compare `a` (actual) against `b` (expected) with `dtype`'s tolerance.

    Element i agrees iff both are NaN, or they are equal (so same-signed infinities
    agree), or both are finite and ``|a − b| ≤ atol + rtol·|b|``. Integers must match
    exactly. Relative differences are infinite where b is 0 or an infinity differs.
    """
    info = dtype_info(dtype)
    aa, bb = np.asarray(a), np.asarray(b)
    if aa.shape != bb.shape:
        raise ValueError(f"cannot compare arrays of shapes {aa.shape} and {bb.shape}")
    if not info.is_float:
        ai, bi = aa.astype(np.int64).reshape(-1), bb.astype(np.int64).reshape(-1)
        bad = ai != bi
        with np.errstate(over="ignore"):
            diff = np.abs(ai.astype(np.float64) - bi.astype(np.float64))
        return _result(bad, diff, np.abs(bi.astype(np.float64)), 0)
    af = aa.astype(np.float64).reshape(-1)
    bf = bb.astype(np.float64).reshape(-1)
    a_nan, b_nan = np.isnan(af), np.isnan(bf)
    both = ~(a_nan | b_nan)
    with np.errstate(invalid="ignore", over="ignore"):
        equal = af == bf
        diff = np.where(equal | ~both, 0.0, np.abs(af - bf))
        babs = np.abs(bf)
        finite = np.isfinite(af) & np.isfinite(bf)
        close = equal | (finite & (diff <= info.tolerance.atol + info.tolerance.rtol * babs))
    nan_bad = a_nan != b_nan
    bad = nan_bad | (both & ~close)
    return _result(bad, diff, np.where(both, babs, 1.0), int(np.count_nonzero(nan_bad)))


def _result(
    bad: npt.NDArray[np.bool_],
    diff: npt.NDArray[np.float64],
    babs: npt.NDArray[np.float64],
    nan_mismatch: int,
) -> CompareResult:
    n_bad = int(np.count_nonzero(bad))
    if diff.size == 0:
        return CompareResult(True, 0.0, 0.0, 0, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0.0, 0.0, np.where(np.isinf(diff), np.inf, diff / babs))
    return CompareResult(
        ok=n_bad == 0,
        max_abs=float(np.max(diff)),
        max_rel=float(np.max(rel)),
        n_bad=n_bad,
        nan_mismatch=nan_mismatch,
        first_bad=int(np.argmax(bad)) if n_bad else None,
    )


# ---------------------------------------------------------------------------- npy


def save_npy(path: str | os.PathLike[str], x: npt.ArrayLike, dtype: DTypeLike) -> None:
    """Write `x` as `dtype` to a ``.npy`` file (bf16 as float32, see `save_npy_bf16`)."""
    info = dtype_info(dtype)
    np.save(path, to_dtype(x, info), allow_pickle=False)


def save_npy_bf16(path: str | os.PathLike[str], x: npt.ArrayLike) -> None:
    """Write a bf16 array: ``.npy`` has no bf16, so it is stored as ``<f4`` float32.

    The values are first rounded to bf16, so reading the file back (with `load_npy` or
    the C++ runtime's reader) and rounding again is the identity.
    """
    save_npy(path, x, "bf16")


def load_npy(path: str | os.PathLike[str], dtype: DTypeLike) -> npt.NDArray[Any]:
    """Read a ``.npy`` file as `dtype`'s numpy storage, applying cocoviz's rounding."""
    info = dtype_info(dtype)
    a = np.load(path, allow_pickle=False)
    if a.dtype == info.storage and info.name != "bf16":
        return a
    return to_dtype(a, info)
