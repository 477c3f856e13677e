"""The C++ and CUDA runtime headers against cocoviz.numerics, bit for bit.

A probe program built with g++ from ``cocoviz_runtime.h`` runs a list of commands
(generator streams, dropout masks, conversions, compares, .npy files) once per module;
each test checks one part of its output against numerics.py. The CUDA header is compiled
and linked with nvcc for sm_80 and sm_90 (there is no GPU to run it).

Without g++ / nvcc / mpicxx these tests skip, unless ``COCOVIZ_REQUIRE_NVCC=1``, which
makes a missing tool a failure.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import struct
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import need_tool

from cocoviz import numerics as nm
from cocoviz.emit.toolchain import Toolchain, find_toolchain

TEMPLATES = Path(nm.__file__).resolve().parent / "templates"
DTYPES = ("f16", "bf16", "f32", "f64", "i32", "i64")


def need(found: object, what: str, mpi: bool = False) -> None:
    """Skip when a tool is missing; fail instead under COCOVIZ_REQUIRE_NVCC=1 (or, for
    MPI tools, COCOVIZ_REQUIRE_MPI=1): tests/conftest.py's need_tool."""
    need_tool(found, what, mpi=mpi)


def run(cmd: list[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def toolchain() -> Toolchain:
    return find_toolchain()


# ----------------------------------------------------------------------- the probe

PROBE_CPP = r"""
#include "cocoviz_runtime.h"

#include <fstream>
#include <iostream>
#include <sstream>

using namespace cocoviz;

static std::vector<unsigned char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)),
                                    std::istreambuf_iterator<char>());
}

static void dump(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

template <class T>
static std::vector<T> load(const std::string& path) {
  const std::vector<unsigned char> raw = slurp(path);
  std::vector<T> out(raw.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), raw.data(), out.size() * sizeof(T));
  return out;
}

static std::string unhex(const std::string& h) {
  if (h == "-") return "";
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    s += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return s;
}

template <DType D>
static void gen(const std::string& out, uint64_t seed, uint64_t start, uint64_t count,
                const std::string& id) {
  std::vector<typename Dt<D>::storage> v(count);
  fill_input<D>(v.data(), id.c_str(), seed, start, count);
  const uint64_t key = key_for(id.c_str(), seed);
  for (uint64_t j = 0; j < count; ++j) {
    const typename Dt<D>::storage e = input_element<D>(key, start + j);
    if (std::memcmp(&e, &v[j], sizeof e) != 0) throw std::runtime_error("element != fill");
  }
  dump(out, v.data(), v.size() * sizeof(v[0]));
}

template <DType D>
static void dapply(const std::string& out, double p, uint64_t seed, uint64_t count,
                   const std::string& xid, const std::string& tag) {
  std::vector<typename Dt<D>::storage> x(count), y(count);
  fill_input<D>(x.data(), xid.c_str(), seed, 0, count);
  const uint64_t key = key_for(tag.c_str(), seed);
  const uint32_t threshold = dropout_threshold(p);
  const dropout_scale_t<D> scale = dropout_scale<D>(p);
  for (uint64_t i = 0; i < count; ++i) {
    y[i] = dropout_value<D>(x[i], dropout_keep(key, i, threshold), scale);
  }
  dump(out, y.data(), y.size() * sizeof(y[0]));
}

template <DType D>
static void cmp(const std::string& out, const std::string& a, const std::string& b) {
  const auto va = load<typename Dt<D>::storage>(a);
  const auto vb = load<typename Dt<D>::storage>(b);
  const CompareResult r = compare<D>(va.data(), vb.data(), va.size());
  std::ofstream f(out);
  char line[256];
  std::snprintf(line, sizeof line, "%d %llu %llu %lld %a %a\n", r.ok ? 1 : 0,
                static_cast<unsigned long long>(r.n_bad),
                static_cast<unsigned long long>(r.nan_mismatch),
                static_cast<long long>(r.first_bad), r.max_abs, r.max_rel);
  f << line;
}

template <DType D>
static void npyw(const std::string& out, uint64_t seed, const std::string& id,
                 const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t s : shape) n *= s;
  std::vector<typename Dt<D>::storage> v(n);
  fill_input<D>(v.data(), id.c_str(), seed, 0, n);
  write_npy<D>(out, shape, v.data());
}

template <DType D>
static void npyrt(const std::string& out, const std::string& in) {
  const NpyArray raw = read_npy_raw(in);
  const auto v = read_npy<D>(in, raw.numel());
  write_npy<D>(out, raw.shape, v.data());
}

#define DISPATCH(dt, fn, ...)                                   \
  do {                                                          \
    if (dt == "f16") fn<DType::f16>(__VA_ARGS__);               \
    else if (dt == "bf16") fn<DType::bf16>(__VA_ARGS__);        \
    else if (dt == "f32") fn<DType::f32>(__VA_ARGS__);          \
    else if (dt == "f64") fn<DType::f64>(__VA_ARGS__);          \
    else if (dt == "i32") fn<DType::i32>(__VA_ARGS__);          \
    else if (dt == "i64") fn<DType::i64>(__VA_ARGS__);          \
    else throw std::runtime_error("bad dtype " + dt);           \
  } while (0)

static void conv(const std::string& out, const std::string& kind, const std::string& in) {
  if (kind == "f16_from_f32" || kind == "bf16_from_f32") {
    std::vector<uint16_t> r;
    for (uint32_t b : load<uint32_t>(in)) {
      const float f = bits_float(b);
      r.push_back(kind[0] == 'f' ? f16_from_float(f) : bf16_from_float(f));
    }
    dump(out, r.data(), r.size() * 2);
  } else if (kind == "f16_from_f64" || kind == "bf16_from_f64") {
    std::vector<uint16_t> r;
    for (double d : load<double>(in)) {
      r.push_back(kind[0] == 'f' ? Dt<DType::f16>::store_double(d)
                                 : Dt<DType::bf16>::store_double(d));
    }
    dump(out, r.data(), r.size() * 2);
  } else if (kind == "f16_to_f32" || kind == "bf16_to_f32") {
    std::vector<uint32_t> r;
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint16_t b = static_cast<uint16_t>(h);
      r.push_back(float_bits(kind[0] == 'f' ? f16_to_float(b) : bf16_to_float(b)));
    }
    dump(out, r.data(), r.size() * 4);
  } else {
    throw std::runtime_error("bad conversion " + kind);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::ifstream cmds(argv[1]);
  std::string line;
  while (std::getline(cmds, line)) {
    std::istringstream ss(line);
    std::string op, out;
    ss >> op >> out;
    if (op == "fnv") {
      std::string id;
      ss >> id;
      const uint64_t h[2] = {fnv1a64(unhex(id).c_str()), key_for(unhex(id).c_str(), 7)};
      dump(out, h, sizeof h);
    } else if (op == "mix") {
      std::string in;
      ss >> in;
      std::vector<uint64_t> v = load<uint64_t>(in);
      for (uint64_t& z : v) z = mix(z);
      dump(out, v.data(), v.size() * 8);
    } else if (op == "gen") {
      std::string dt, id;
      uint64_t seed, start, count;
      ss >> dt >> seed >> start >> count >> id;
      DISPATCH(dt, gen, out, seed, start, count, unhex(id));
    } else if (op == "keep") {
      std::string p, tag;
      uint64_t seed, start, count;
      ss >> p >> seed >> start >> count >> tag;
      const uint64_t key = key_for(unhex(tag).c_str(), seed);
      const uint32_t threshold = dropout_threshold(std::strtod(p.c_str(), nullptr));
      std::vector<uint8_t> m(count);
      for (uint64_t j = 0; j < count; ++j) m[j] = dropout_keep(key, start + j, threshold);
      dump(out, m.data(), m.size());
    } else if (op == "dapply") {
      std::string dt, p, xid, tag;
      uint64_t seed, count;
      ss >> dt >> p >> seed >> count >> xid >> tag;
      DISPATCH(dt, dapply, out, std::strtod(p.c_str(), nullptr), seed, count, unhex(xid),
               unhex(tag));
    } else if (op == "conv") {
      std::string kind, in;
      ss >> kind >> in;
      conv(out, kind, in);
    } else if (op == "cmp") {
      std::string dt, a, b;
      ss >> dt >> a >> b;
      DISPATCH(dt, cmp, out, a, b);
    } else if (op == "npyw") {
      std::string dt, id;
      uint64_t seed, d;
      std::vector<uint64_t> shape;
      ss >> dt >> seed >> id;
      while (ss >> d) shape.push_back(d);
      DISPATCH(dt, npyw, out, seed, unhex(id), shape);
    } else if (op == "npyrt") {
      std::string dt, in;
      ss >> dt >> in;
      DISPATCH(dt, npyrt, out, in);
    } else if (!op.empty()) {
      std::cerr << "unknown command " << op << "\n";
      return 1;
    }
  }
  return 0;
}
"""


def _hex(s: str) -> str:
    return s.encode().hex() or "-"


@dataclass
class Probe:
    """Collects commands for one probe run and names their output files.

    With `dry`, nothing is written: another pytest-xdist worker already ran the probe in
    the same directory, and the (deterministic) paths are only recomputed.
    """

    dir: Path
    lines: list[str]
    dry: bool = False
    counter: int = 0

    def add(self, op: str, *args: object) -> Path:
        self.counter += 1
        out = self.dir / f"out{self.counter}.bin"
        self.lines.append(" ".join([op, str(out), *map(str, args)]))
        return out

    def array(self, a: np.ndarray) -> Path:
        self.counter += 1
        path = self.dir / f"in{self.counter}.bin"
        if not self.dry:
            path.write_bytes(np.ascontiguousarray(a).tobytes())
        return path


IDS = ("x", "w", "megatron.weight", "wé#0", "", "out#1")
SEEDS = (0, 1, 12345, 2**64 - 1)
STARTS = ((0, 1000), (2**40 + 3, 257), (2**64 - 64, 64))
PS = (0.0, 0.1, 0.5, 1 / 3, 0.9, 0.999, 2.0**-32, 1 - 2.0**-30)


def _f32_patterns() -> np.ndarray:
    rng = np.random.default_rng(1)
    pats: list[int] = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x00000001]
    pats += [0x7F800001, 0x7FC00000, 0xFFC00001, 0x7F802000, 0x7FA00000, 0x7FFFFFFF]
    lows = (0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x7FFF, 0x8000, 0x8001, 0xFFFF)
    highs = (0, 1, 0x55, 0x7E, 0x7F)
    for sign in (0, 0x80000000):
        for exp in range(256):
            for hi in highs:
                for lo in lows:
                    pats.append(sign | (exp << 23) | (hi << 16) | lo)
                    pats.append(sign | (exp << 23) | (hi << 13) | (lo & 0x1FFF))
    structured = np.array(pats, dtype=np.uint32)
    uniform = rng.integers(0, 2**32, size=1 << 19, dtype=np.uint64).astype(np.uint32)
    # Dense around the f16 range, where subnormal and overflow rounding happen.
    exps = rng.integers(95, 146, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    mant = rng.integers(0, 1 << 23, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    signs = rng.integers(0, 2, size=1 << 18, dtype=np.uint64).astype(np.uint32) << np.uint32(31)
    near = signs | (exps << np.uint32(23)) | mant
    return np.concatenate([structured, uniform, near])


def _f64_patterns() -> np.ndarray:
    rng = np.random.default_rng(2)
    specials = [0, 1 << 63, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF0000000000001]
    specials += [0x7FF8000000000000, 0x0000000000000001, 0x7FEFFFFFFFFFFFFF]
    pats = []
    for exp in range(1023 - 30, 1023 + 18):
        for lo in (0, 1, (1 << 41) - 1, 1 << 41, (1 << 41) + 1, (1 << 42) - 1):
            for hi in (0, 1, 0x2AA, 0x3FF):
                pats.append((exp << 52) | (hi << 42) | lo)
        # Subnormal ties: exactly half a unit at every subnormal scale.
        for shift in range(30, 53):
            pats.append((exp << 52) | (1 << shift))
    base = np.array(specials + pats, dtype=np.uint64)
    exps = rng.integers(1023 - 30, 1023 + 18, size=1 << 18, dtype=np.uint64)
    mant = rng.integers(0, 1 << 52, size=1 << 18, dtype=np.uint64)
    near = (exps << np.uint64(52)) | mant
    neg = base | np.uint64(1 << 63)
    return np.concatenate([base, neg, near, rng.integers(0, 2**63, size=1 << 17, dtype=np.uint64)])


@dataclass
class ProbeRun:
    gen: dict[tuple[str, str, int, int, int], Path]
    keep: dict[tuple[float, int, int, int, str], Path]
    dapply: dict[tuple[str, float, int], Path]
    fnv: dict[str, Path]
    mix: tuple[np.ndarray, Path]
    conv: dict[str, tuple[np.ndarray | None, Path]]
    cmp: dict[str, tuple[str, np.ndarray, np.ndarray, Path]]
    npyw: dict[str, tuple[tuple[int, ...], Path]]
    npyrt: dict[str, tuple[np.ndarray, Path]]


def _compare_cases() -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    nan, inf = np.nan, np.inf
    cases: dict[str, tuple[str, list[float], list[float]]] = {
        "equal": ("f32", [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
        "within": ("f32", [1.0 + 5e-6, 1e-7], [1.0, 0.0]),
        "outside": ("f32", [1.0, 1.0 + 3e-5, 2.0], [1.0, 1.0, 2.1]),
        "nan_match": ("f64", [nan, 1.0, inf, -inf], [nan, 1.0, inf, -inf]),
        "nan_mismatch": ("f64", [nan, 1.0, 2.0], [1.0, nan, 2.0]),
        "inf_sign": ("f64", [inf, 1.0], [-inf, 1.0]),
        "inf_finite": ("f64", [1.0, inf, 2.0], [inf, 1e300, 2.0]),
        "zero_expected": ("f16", [0.0, 0.0009765625, 0.0], [0.0, 0.0, 0.001953125]),
        "half": ("f16", [1.0, 1.00390625, 100.0, 0.5], [1.0, 1.0, 100.5, 0.5]),
        "bf16": ("bf16", [1.0, 1.0078125, 256.0, nan], [1.015625, 1.0, 258.0, nan]),
        "ints": ("i32", [1, 2, 3, -4], [1, 2, 4, -4]),
        "int64": ("i64", [2**62, 5], [2**62 + 1, 5]),
        "empty": ("f32", [], []),
    }
    return {
        name: (dt, nm.to_dtype(np.array(a), dt), nm.to_dtype(np.array(b), dt))
        for name, (dt, a, b) in cases.items()
    }


def _c_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """numpy storage → the C runtime's storage (bf16 becomes its uint16 pattern)."""
    if dtype == "bf16":
        return (nm.round_bf16(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return x


def _from_c_storage(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32)
    return np.frombuffer(raw, dtype=nm.storage_dtype(dtype))


@contextmanager
def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A directory shared by all pytest-xdist workers of this session, held under a lock."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    d = root / name
    d.mkdir(exist_ok=True)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield d
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory, toolchain: Toolchain) -> Iterator[ProbeRun]:
    need(toolchain.cxx, "a C++ compiler (g++)")
    assert toolchain.cxx is not None
    with shared_dir(tmp_path_factory, "runtime-probe") as d:
        done = d / ".done"
        result = _build_and_run_probe(d, toolchain.cxx, dry=done.exists())
        done.touch()
    yield result


def _build_and_run_probe(d: Path, cxx: Path, dry: bool) -> ProbeRun:
    src = d / "probe.cpp"
    exe = d / "probe"
    if not dry:
        src.write_text(PROBE_CPP)
        run(
            [str(cxx), "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-fopenmp",
             f"-I{TEMPLATES}", str(src), "-o", str(exe)]
        )  # fmt: skip
    p = Probe(d, [], dry)
    gen = {}
    for dt in DTYPES:
        for i, ident in enumerate(IDS):
            seed = SEEDS[i % len(SEEDS)]
            for start, count in STARTS:
                gen[(dt, ident, seed, start, count)] = p.add(
                    "gen", dt, seed, start, count, _hex(ident)
                )
    keep = {}
    for pr in PS:
        for seed in (0, 99):
            for start, count in STARTS[:2]:
                keep[(pr, seed, start, count, "out#0")] = p.add(
                    "keep", pr.hex(), seed, start, count, _hex("out#0")
                )
    dapply = {}
    for dt in DTYPES:
        for pr in (0.0, 0.1, 1 / 3, 0.9):
            dapply[(dt, pr, 5)] = p.add("dapply", dt, pr.hex(), 5, 4096, _hex("x"), _hex("y#0"))
    fnv = {ident: p.add("fnv", _hex(ident)) for ident in IDS}
    zs = np.concatenate(
        [np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64),
         np.random.default_rng(3).integers(0, 2**64, size=4096, dtype=np.uint64, endpoint=False)]
    )  # fmt: skip
    mix = (zs, p.add("mix", p.array(zs)))
    f32 = _f32_patterns()
    f64 = _f64_patterns()
    f32_in, f64_in = p.array(f32), p.array(f64)
    conv: dict[str, tuple[np.ndarray | None, Path]] = {
        "f16_from_f32": (f32, p.add("conv", "f16_from_f32", f32_in)),
        "bf16_from_f32": (f32, p.add("conv", "bf16_from_f32", f32_in)),
        "f16_from_f64": (f64, p.add("conv", "f16_from_f64", f64_in)),
        "bf16_from_f64": (f64, p.add("conv", "bf16_from_f64", f64_in)),
        "f16_to_f32": (None, p.add("conv", "f16_to_f32", "-")),
        "bf16_to_f32": (None, p.add("conv", "bf16_to_f32", "-")),
    }
    cmp = {}
    for name, (dt, a, b) in _compare_cases().items():
        pa, pb = p.array(_c_storage(a, dt)), p.array(_c_storage(b, dt))
        cmp[name] = (dt, a, b, p.add("cmp", dt, pa, pb))
    shapes = {"f16": (3, 5), "bf16": (7,), "f32": (2, 3, 4), "f64": (), "i32": (0, 3), "i64": (65,)}
    npyw = {dt: (shape, p.add("npyw", dt, 3, _hex("x"), *shape)) for dt, shape in shapes.items()}
    npyrt = {}
    for dt in DTYPES:
        data = nm.generate_input("r", dt, 24, 8).reshape(2, 3, 4)
        src_npy = d / f"rt_{dt}.npy"
        if not dry:
            nm.save_npy(src_npy, data, dt)
        npyrt[dt] = (data, p.add("npyrt", dt, src_npy))
    if not dry:
        cmds = d / "commands.txt"
        cmds.write_text("\n".join(p.lines) + "\n")
        run([str(exe), str(cmds)], env={**os.environ, "OMP_NUM_THREADS": "2"})
    return ProbeRun(gen, keep, dapply, fnv, mix, conv, cmp, npyw, npyrt)


# --------------------------------------------------------------------------- tests


def test_mix_and_fnv_match(probe: ProbeRun) -> None:
    zs, out = probe.mix
    assert np.array_equal(np.frombuffer(out.read_bytes(), dtype=np.uint64), nm.mix(zs))
    for ident, path in probe.fnv.items():
        h, key = struct.unpack("<QQ", path.read_bytes())
        assert h == nm.fnv1a64(ident), ident
        assert key == nm.key_for(ident, 7), ident


@pytest.mark.parametrize("dtype", DTYPES)
def test_generator_matches(probe: ProbeRun, dtype: str) -> None:
    for (dt, ident, seed, start, count), path in probe.gen.items():
        if dt != dtype:
            continue
        got = _from_c_storage(path.read_bytes(), dt)
        want = nm.generate_input(ident, dt, 2**64, seed, start, count)
        assert got.shape == want.shape
        assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")), (
            ident,
            seed,
            start,
        )


def test_dropout_masks_match(probe: ProbeRun) -> None:
    for (p, seed, start, count, tag), path in probe.keep.items():
        got = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(bool)
        want = nm.dropout_keep(tag, seed, p, start, count)
        assert np.array_equal(got, want), (p, seed, start)
    # The threshold is exact at the extremes: p = 0 keeps everything.
    zero = probe.keep[(0.0, 0, 0, 1000, "out#0")]
    assert np.frombuffer(zero.read_bytes(), dtype=np.uint8).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_values_match(probe: ProbeRun, dtype: str) -> None:
    for (dt, p, seed), path in probe.dapply.items():
        if dt != dtype:
            continue
        x = nm.generate_input("x", dt, 4096, seed)
        mask = nm.dropout_keep("y#0", seed, p, 0, 4096)
        want = nm.dropout_apply(x, mask, p, dt)
        got = _from_c_storage(path.read_bytes(), dt)
        assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")), p


def _same_bits(got: np.ndarray, want: np.ndarray, is_nan: np.ndarray, sign_bit: int) -> None:
    """Bit-exact except NaN, which must be NaN with the same sign."""
    ok = ~is_nan
    bad = np.flatnonzero(ok & (got != want))
    assert bad.size == 0, [(hex(int(got[i])), hex(int(want[i]))) for i in bad[:10]]
    s = type(got.flat[0])(sign_bit) if got.size else 0
    assert np.array_equal(got[is_nan] & s, want[is_nan] & s)


def _half_nan(h: np.ndarray) -> np.ndarray:
    return ((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0)


def _bf16_nan(h: np.ndarray) -> np.ndarray:
    return ((h & 0x7F80) == 0x7F80) & ((h & 0x7F) != 0)


def test_half_conversions_match_numpy(probe: ProbeRun) -> None:
    src, out = probe.conv["f16_from_f32"]
    assert src is not None
    got = np.frombuffer(out.read_bytes(), dtype=np.uint16)
    with np.errstate(over="ignore"):
        want = src.view(np.float32).astype(np.float16).view(np.uint16)
    assert _half_nan(got).sum() == _half_nan(want).sum()
    _same_bits(got, want, _half_nan(want), 0x8000)

    src, out = probe.conv["f16_from_f64"]
    assert src is not None
    got = np.frombuffer(out.read_bytes(), dtype=np.uint16)
    with np.errstate(over="ignore"):
        want = src.view(np.float64).astype(np.float16).view(np.uint16)
    _same_bits(got, want, _half_nan(want), 0x8000)

    _, out = probe.conv["f16_to_f32"]
    got32 = np.frombuffer(out.read_bytes(), dtype=np.uint32)
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want32 = halves.view(np.float16).astype(np.float32).view(np.uint32)
    _same_bits(got32, want32, _half_nan(halves), 0x80000000)


def test_bf16_conversions_match_numerics(probe: ProbeRun) -> None:
    for kind, view in (("bf16_from_f32", np.float32), ("bf16_from_f64", np.float64)):
        src, out = probe.conv[kind]
        assert src is not None
        got = np.frombuffer(out.read_bytes(), dtype=np.uint16)
        want32 = nm.to_dtype(src.view(view), "bf16").view(np.uint32)
        assert np.all((want32 & np.uint32(0xFFFF)) == 0)
        want = (want32 >> np.uint32(16)).astype(np.uint16)
        # NaN handling is identical by construction in both, so compare NaNs exactly.
        assert np.array_equal(got, want), kind
    _, out = probe.conv["bf16_to_f32"]
    got32 = np.frombuffer(out.read_bytes(), dtype=np.uint32)
    assert np.array_equal(got32, np.arange(65536, dtype=np.uint32) << np.uint32(16))


def test_bf16_edge_cases_in_python() -> None:
    vals = np.array(
        [1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.4e38, -3.4e38, 1e-45, -0.0, np.inf],
        dtype=np.float32,
    )
    got = nm.round_bf16(vals)
    assert got[0] == 1.0 and got[1] == 1.015625
    assert np.isinf(got[2]) and got[2] > 0 and np.isinf(got[3]) and got[3] < 0
    assert got[4] == 0.0 and np.signbit(got[5]) and np.isinf(got[6])
    nan = np.array([0x7F800001, 0xFFC00000], dtype=np.uint32).view(np.float32)
    r = nm.round_bf16(nan)
    assert np.isnan(r).all() and np.signbit(r[1]) and not np.signbit(r[0])


@pytest.mark.parametrize(
    "name",
    ["equal", "within", "outside", "nan_match", "nan_mismatch", "inf_sign", "inf_finite",
     "zero_expected",
     "half", "bf16", "ints", "int64", "empty"],
)  # fmt: skip
def test_compare_matches(probe: ProbeRun, name: str) -> None:
    dt, a, b, out = probe.cmp[name]
    ok, n_bad, nan_mismatch, first_bad, max_abs, max_rel = out.read_text().split()
    want = nm.compare(a, b, dt)
    assert bool(int(ok)) == want.ok
    assert int(n_bad) == want.n_bad
    assert int(nan_mismatch) == want.nan_mismatch
    assert int(first_bad) == (want.first_bad if want.first_bad is not None else -1)
    assert float.fromhex(max_abs) == want.max_abs
    assert float.fromhex(max_rel) == want.max_rel


def test_compare_expectations() -> None:
    cases = _compare_cases()
    assert nm.compare(*cases["within"][1:], "f32").ok
    r = nm.compare(cases["outside"][1], cases["outside"][2], "f32")
    assert not r.ok and r.n_bad == 2 and r.first_bad == 1
    r = nm.compare(cases["nan_mismatch"][1], cases["nan_mismatch"][2], "f64")
    assert r.nan_mismatch == 2 and r.n_bad == 2 and "NaN" in r.describe()
    assert nm.compare(cases["nan_match"][1], cases["nan_match"][2], "f64").ok
    assert not nm.compare(cases["inf_sign"][1], cases["inf_sign"][2], "f64").ok
    r = nm.compare(cases["inf_finite"][1], cases["inf_finite"][2], "f64")
    assert r.n_bad == 2 and r.max_rel == np.inf
    r = nm.compare(cases["int64"][1], cases["int64"][2], "i64")
    assert not r.ok and r.first_bad == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_npy_writer_matches_numpy(probe: ProbeRun, dtype: str, tmp_path: Path) -> None:
    shape, out = probe.npyw[dtype]
    n = int(np.prod(shape))
    data = nm.generate_input("x", dtype, n, 3).reshape(shape)
    ref = tmp_path / "ref.npy"
    nm.save_npy(ref, data, dtype)
    assert out.read_bytes() == ref.read_bytes()
    loaded = nm.load_npy(out, dtype)
    assert loaded.dtype == nm.storage_dtype(dtype) and loaded.shape == shape
    assert np.array_equal(loaded, data)


@pytest.mark.parametrize("dtype", DTYPES)
def test_npy_reader_round_trips(probe: ProbeRun, dtype: str) -> None:
    data, out = probe.npyrt[dtype]
    back = np.load(out)
    assert back.shape == data.shape
    assert np.array_equal(back, data)
    assert back.dtype.str == nm.dtype_info(dtype).npy_descr


# ------------------------------------------------------------------ MPI helpers


MPI_PROBE_CPP = r"""
#include <mpi.h>
#include "cocoviz_runtime.h"

using namespace cocoviz;

int main(int argc, char** argv) {
  CHECK_MPI("init", MPI_Init(&argc, &argv));
  int rank = 0, size = 1;
  CHECK_MPI("init", MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  CHECK_MPI("init", MPI_Comm_size(MPI_COMM_WORLD, &size));
  // Small integers: exact in f16 and bf16 whatever the reduction order.
  uint16_t h[4], b[4], hr[4], br[4];
  for (int i = 0; i < 4; ++i) {
    h[i] = Dt<DType::f16>::store(static_cast<float>(rank + i));
    b[i] = Dt<DType::bf16>::store(static_cast<float>(rank * i));
  }
  CHECK_MPI("sum", MPI_Allreduce(h, hr, 4, mpi_datatype<DType::f16>(),
                                 mpi_op<DType::f16>(ReduceOp::sum), MPI_COMM_WORLD));
  CHECK_MPI("max", MPI_Allreduce(b, br, 4, mpi_datatype<DType::bf16>(),
                                 mpi_op<DType::bf16>(ReduceOp::max), MPI_COMM_WORLD));
  double f[2] = {1.5 * rank, 2.0}, fr[2];
  CHECK_MPI("f64", MPI_Allreduce(f, fr, 2, mpi_datatype<DType::f64>(),
                                 mpi_op<DType::f64>(ReduceOp::prod), MPI_COMM_WORLD));
  if (rank == 0) {
    for (int i = 0; i < 4; ++i) std::printf("%g ", Dt<DType::f16>::load(hr[i]));
    for (int i = 0; i < 4; ++i) std::printf("%g ", Dt<DType::bf16>::load(br[i]));
    std::printf("%g %g\n", fr[0], fr[1]);
  }
  CHECK_MPI("finalize", MPI_Finalize());
  return 0;
}
"""


def test_mpi_half_ops_run(toolchain: Toolchain, tmp_path: Path) -> None:
    need(toolchain.mpi, "MPI (mpicxx)", mpi=True)
    src = tmp_path / "mpi_probe.cpp"
    src.write_text(MPI_PROBE_CPP)
    exe = tmp_path / "mpi_probe"
    cmd = toolchain.mpicxx_command([src], exe)
    run([cmd[0], "-Wextra", "-Werror", f"-I{TEMPLATES}", *cmd[1:]])
    res = run(toolchain.mpiexec_command(3, [exe]), env={**os.environ, "OMP_NUM_THREADS": "1"})
    # f16 sum over ranks 0..2 of rank+i: 3 + 3i; bf16 max of rank*i: 2i; f64 prod.
    assert res.stdout.split() == ["3", "6", "9", "12", "0", "2", "4", "6", "0", "8"]


def test_header_compiles_without_openmp(toolchain: Toolchain, tmp_path: Path) -> None:
    need(toolchain.cxx, "a C++ compiler (g++)")
    src = tmp_path / "plain.cpp"
    src.write_text(
        '#include "cocoviz_runtime.h"\n'
        "int main() {\n"
        "  float v[4];\n"
        '  cocoviz::fill_input<cocoviz::DType::f32>(v, "x", 0, 0, 4);\n'
        '  static_assert(cocoviz::mix(0) == 0xE220A8397B1DCDAFull, "constexpr mix");\n'
        "  return v[0] > 0 ? 0 : 1;\n"
        "}\n"
    )
    run([str(toolchain.cxx), "-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic",
         f"-I{TEMPLATES}", str(src), "-o", str(tmp_path / "plain")])  # fmt: skip
    run([str(tmp_path / "plain")])


ARRAY_CONVERSIONS_CPP = r"""
#include "cocoviz_runtime.h"
#include <vector>
using namespace cocoviz;
// f16_widen / f16_narrow (F16C where the CPU has it) against the element functions: every
// half, and floats at every 2^k-th bit pattern plus the neighbourhoods of the f16 range's
// edges (subnormal ties, 65504..65536, infinities, signaling and quiet NaNs).
int main() {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  f16_widen(f.data(), h.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i)
    if (float_bits(f[i]) != float_bits(f16_to_float(h[i]))) { std::printf("widen %x\n", i); return 1; }
  std::vector<float> src;
  for (uint64_t u = 0; u < (1ull << 32); u += 997) src.push_back(bits_float(static_cast<uint32_t>(u)));
  const uint32_t edges[] = {0x33000000u, 0x33800000u, 0x387FC000u, 0x38800000u, 0x477FE000u,
                            0x477FF000u, 0x47800000u, 0x7F800000u, 0x7F800001u, 0x7FC00000u};
  for (uint32_t e : edges)
    for (uint32_t d = 0; d < 4096; ++d)
      for (uint32_t sign : {0u, 0x80000000u}) src.push_back(bits_float((e - 2048u + d) | sign));
  std::vector<uint16_t> out(src.size());
  f16_narrow(out.data(), src.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i)
    if (out[i] != f16_from_float(src[i])) { std::printf("narrow %08x\n", float_bits(src[i])); return 1; }
  std::printf("%d %zu\n", COCOVIZ_F16C_USED, src.size());
  return 0;
}
"""


def test_array_conversions_match_element_functions(toolchain: Toolchain, tmp_path: Path) -> None:
    need(toolchain.cxx, "a C++ compiler (g++)")
    src = tmp_path / "arrays.cpp"
    used = "cpu_has_f16c()" if platform.machine() in ("x86_64", "AMD64") else "0"
    src.write_text(ARRAY_CONVERSIONS_CPP.replace("COCOVIZ_F16C_USED", f"static_cast<int>({used})"))
    run([str(toolchain.cxx), "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror",
         f"-I{TEMPLATES}", str(src), "-o", str(tmp_path / "arrays")])  # fmt: skip
    res = run([str(tmp_path / "arrays")])
    f16c, n = res.stdout.split()
    assert int(n) > 4_000_000
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() == "x86_64" and cpuinfo.exists() and "f16c" in cpuinfo.read_text():
        assert f16c == "1"  # the instructions were what ran


# ------------------------------------------------------------------- CUDA header


CUDA_PROBE_CU = r"""
#include "cocoviz_runtime.cuh"

using namespace cocoviz;

template <DType D>
__global__ void dropout_kernel(typename CudaDt<D>::storage* y,
                               const typename CudaDt<D>::storage* x, uint64_t key,
                               uint32_t threshold, dropout_scale_t<D> scale, uint64_t n) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    y[i] = cuda_dropout_value<D>(x[i], dropout_keep(key, i, threshold), scale);
  }
}

template <DType D>
static void exercise(cudaStream_t stream, uint64_t n) {
  using S = typename CudaDt<D>::storage;
  S* x = nullptr;
  S* y = nullptr;
  CHECK_CUDA("alloc", cudaMalloc(&x, n * sizeof(S)));
  CHECK_CUDA("alloc", cudaMalloc(&y, n * sizeof(S)));
  fill_input_async<D>(x, "x", 0, 0, n, stream, "inputs");
  const double p = 0.1;
  dropout_kernel<D><<<64, 256, 0, stream>>>(y, x, key_for("out#0", 0), dropout_threshold(p),
                                            dropout_scale<D>(p), n);
  CHECK_LAUNCH("out", "dropout_kernel");
  std::vector<typename Dt<D>::storage> host(n), ref(n);
  CHECK_CUDA("dump", cudaMemcpyAsync(host.data(), y, n * sizeof(S), cudaMemcpyDeviceToHost,
                                     stream));
  CHECK_CUDA("dump", cudaStreamSynchronize(stream));
  const CompareResult r = compare<D>(host.data(), ref.data(), n);
  write_npy<D>("out.npy", {n}, host.data());
  CHECK_NCCL("allreduce", ncclAllReduce(y, y, n, CudaDt<D>::nccl, ncclSum, nullptr, stream));
  std::printf("%d\n", r.ok ? 1 : 0);
  CHECK_CUDA("free", cudaFree(x));
  CHECK_CUDA("free", cudaFree(y));
}

// Host-side run of the __host__ __device__ CUDA-typed functions (no GPU needed): prints
// the bit patterns of input x and its dropout, one element per line.
template <DType D>
static void host_check(uint64_t n) {
  using S = typename CudaDt<D>::storage;
  const uint64_t key = key_for("x", 5), dkey = key_for("y#0", 5);
  const uint32_t threshold = dropout_threshold(0.1);
  const dropout_scale_t<D> scale = dropout_scale<D>(0.1);
  for (uint64_t i = 0; i < n; ++i) {
    const S x = cuda_input_element<D>(key, i);
    const S y = cuda_dropout_value<D>(x, dropout_keep(dkey, i, threshold), scale);
    unsigned long long bx = 0, by = 0;
    std::memcpy(&bx, &x, sizeof x);
    std::memcpy(&by, &y, sizeof y);
    std::printf("%s %llx %llx\n", Dt<D>::name, bx, by);
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "host") == 0) {
    host_check<DType::f16>(512);
    host_check<DType::bf16>(512);
    host_check<DType::f32>(512);
    host_check<DType::f64>(512);
    host_check<DType::i32>(512);
    host_check<DType::i64>(512);
    return 0;
  }
  CHECK_MPI("init", MPI_Init(&argc, &argv));
  cudaStream_t stream;
  CHECK_CUDA("init", cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, 0));
  exercise<DType::f16>(stream, 1000);
  exercise<DType::bf16>(stream, 1000);
  exercise<DType::f32>(stream, 1000);
  exercise<DType::f64>(stream, 1000);
  exercise<DType::i32>(stream, 1000);
  exercise<DType::i64>(stream, 1000);
  cublasHandle_t handle;
  CHECK_CUBLAS("matmul", cublasCreate(&handle));
  CHECK_CUBLAS("matmul", cublasDestroy(handle));
  CHECK_MPI("finalize", MPI_Finalize());
  return 0;
}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_header_builds(toolchain: Toolchain, tmp_path: Path, arch: str) -> None:
    need(toolchain.cuda, "nvcc (the CUDA toolkit)")
    need(not toolchain.missing("cuda"), "NCCL, cuBLAS and MPI for nvcc")
    src = tmp_path / "probe.cu"
    src.write_text(CUDA_PROBE_CU)
    cmd = toolchain.nvcc_command([src], tmp_path / "probe", arch)
    # Warnings from the runtime header are errors: nvcc's own and the host compiler's.
    cmd[1:1] = ["-Werror", "all-warnings", "-Xcompiler", "-Wextra,-Werror", f"-I{TEMPLATES}"]
    res = run(cmd)
    assert "warning" not in res.stderr.lower(), res.stderr
    # No GPU needed: the CUDA-typed generator and dropout, run on the host, match numerics.
    lines = run([str(tmp_path / "probe"), "host"]).stdout.split("\n")
    got: dict[str, list[tuple[int, int]]] = {}
    for line in filter(None, lines):
        dt, bx, by = line.split()
        got.setdefault(dt, []).append((int(bx, 16), int(by, 16)))
    for dt in DTYPES:
        x = nm.generate_input("x", dt, 512, 5)
        y = nm.dropout_apply(x, nm.dropout_keep("y#0", 5, 0.1, 0, 512), 0.1, dt)
        cx, cy = _c_storage(x, dt), _c_storage(y, dt)
        bits = f"u{cx.itemsize}"
        want = list(zip(cx.view(bits).tolist(), cy.view(bits).tolist(), strict=True))
        assert got[dt] == want, dt


def test_need_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COCOVIZ_REQUIRE_MPI", raising=False)
    monkeypatch.setenv("COCOVIZ_REQUIRE_NVCC", "1")
    with pytest.raises(pytest.fail.Exception, match="COCOVIZ_REQUIRE_NVCC"):
        need(None, "nvcc")
    monkeypatch.delenv("COCOVIZ_REQUIRE_NVCC")
    monkeypatch.setenv("COCOVIZ_REQUIRE_MPI", "1")
    with pytest.raises(pytest.fail.Exception, match="COCOVIZ_REQUIRE_MPI"):
        need(None, "mpicxx", mpi=True)
    monkeypatch.delenv("COCOVIZ_REQUIRE_MPI")
    with pytest.raises(pytest.skip.Exception):
        need(shutil.which("definitely-not-a-compiler"), "nvcc")
