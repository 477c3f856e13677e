// cocoviz_runtime.h — numeric runtime shared by cocoviz's emitted C++ and CUDA code.
//
// Copied verbatim next to the emitted sources; not a template. It implements the rules
// of cocoviz/numerics.py (docs/semantics-notes.md) so that emitted programs, the numpy reference
// and the MPI executor agree bit for bit:
//
//   mix(z)    splitmix64 finalizer (uint64, wrapping)
//   key       = mix(seed ^ fnv1a64(utf8(id)));   u(i) = mix(key ^ i), i the global flat index
//   inputs    floats ((u >> 54) + 1) / 1024, integers u mod 16
//   dropout   keep iff (u >> 32) >= floor(p * 2^32); kept x * float(1 / (1 - p)) in f32
//             (f64 for f64; integers: f64 then truncation)
//   f16/bf16  stored as uint16_t bit patterns, round-to-nearest-even conversions that are
//             exact for subnormals, infinities and NaN; f64 -> f16 rounds directly,
//             f64 -> bf16 goes through f32 (as numerics.to_dtype does)
//   compare   |a - b| <= atol + rtol * |b|, NaN positions must match, integers exact
//   .npy      writer and reader; f16 as '<f2', bf16 as float32 '<f4'
//
// Core functions are marked COCOVIZ_HD, which is __host__ __device__ under nvcc, so
// cocoviz_runtime.cuh reuses them on the device. Include <mpi.h> before this header to
// get the MPI helpers (datatypes, f16/bf16 reduction ops, CHECK_MPI).
#ifndef COCOVIZ_RUNTIME_H_
#define COCOVIZ_RUNTIME_H_

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define COCOVIZ_F16C 1  // f16_widen / f16_narrow may use the F16C instructions
#include <immintrin.h>
#endif

// COCOVIZ_LD(p, i) / COCOVIZ_ST(p, i): element i of an array read / written by generated
// loops and kernels. Plain (p)[i]; the CUDA emulation build defines them first to check
// every access (docs/codegen.md, "Emulation").
#ifndef COCOVIZ_LD
#define COCOVIZ_LD(p, i) ((p)[i])
#define COCOVIZ_ST(p, i) ((p)[i])
#endif

#if defined(__CUDACC__)
#define COCOVIZ_HD __host__ __device__ inline
#else
#define COCOVIZ_HD inline
#endif

// COCOVIZ_VECTOR_CLONES: the CPU target's loops that vectorize (elementwise kernels, GEMMs,
// conversions, cross-rank combines) are compiled for AVX-512 and AVX2 besides the
// baseline, and the loader picks the widest the machine has (GCC's target_clones, an
// ifunc; the OpenMP body of the function is cloned with it). The same operations in wider
// lanes: no FMA contraction (-ffp-contract=off in the Makefile), no reassociation, so the
// bits do not depend on which clone runs.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__x86_64__) && \
    defined(__gnu_linux__)
#define COCOVIZ_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define COCOVIZ_VECTOR_CLONES
#endif

#if defined(_OPENMP)
#define COCOVIZ_OMP_PARALLEL_FOR _Pragma("omp parallel for schedule(static)")
#else
#define COCOVIZ_OMP_PARALLEL_FOR
#endif

namespace cocoviz {

enum class DType : int { f16, bf16, f32, f64, i32, i64 };

// ------------------------------------------------------------------ bit casts

COCOVIZ_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

COCOVIZ_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

COCOVIZ_HD uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

COCOVIZ_HD double bits_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// ------------------------------------------------------------------ generator

COCOVIZ_HD constexpr uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// FNV-1a over the bytes of a NUL-terminated UTF-8 string.
COCOVIZ_HD constexpr uint64_t fnv1a64(const char* s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (; *s != '\0'; ++s) {
    h ^= static_cast<uint64_t>(static_cast<unsigned char>(*s));
    h *= 0x100000001B3ull;
  }
  return h;
}

COCOVIZ_HD constexpr uint64_t key_for(const char* id, uint64_t seed) {
  return mix(seed ^ fnv1a64(id));
}

COCOVIZ_HD constexpr uint64_t uniform_bits(uint64_t key, uint64_t i) { return mix(key ^ i); }

// Float inputs: k / 1024 for k in 1..1024, exact in f32 (and f16).
COCOVIZ_HD float input_float(uint64_t u) {
  return static_cast<float>(static_cast<uint32_t>(u >> 54) + 1u) * (1.0f / 1024.0f);
}

COCOVIZ_HD int64_t input_int(uint64_t u) { return static_cast<int64_t>(u & 15u); }

// ------------------------------------------------------------- lanes

// The 8 lanes of a CPU kernel's accumulation (lane l took elements l, l+8, …) combined
// pairwise, in one order whichever vector clone ran them (docs/codegen.md, "Fast loops
// (CPU)"): the sum, and the maximum (std::max: a NaN in the second argument is dropped).
template <typename T>
inline T lanes_sum(const T (&s)[8]) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <typename T>
inline T lanes_max(const T (&s)[8]) {
  return std::max(std::max(std::max(s[0], s[1]), std::max(s[2], s[3])),
                  std::max(std::max(s[4], s[5]), std::max(s[6], s[7])));
}

// ------------------------------------------------------------- f16 and bf16

// IEEE binary16 from binary64, rounding to nearest even. A float converts exactly to
// double, so this is also the correctly rounded float -> half conversion. NaN keeps its
// sign and the top 10 payload bits (a zero payload becomes 1), as numpy does.
COCOVIZ_HD uint16_t f16_from_double(double d) {
  const uint64_t b = double_bits(d);
  const uint16_t sign = static_cast<uint16_t>((b >> 48) & 0x8000u);
  const uint64_t exp = (b >> 52) & 0x7FFu;
  const uint64_t sig = b & 0xFFFFFFFFFFFFFull;
  if (exp == 0x7FFu) {
    if (sig == 0) return static_cast<uint16_t>(sign | 0x7C00u);
    uint16_t r = static_cast<uint16_t>(0x7C00u | (sig >> 42));
    if (r == 0x7C00u) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  const int e = static_cast<int>(exp) - 1023;
  if (e >= 16) return static_cast<uint16_t>(sign | 0x7C00u);
  if (e >= -14) {
    // Normal range; a carry out of the mantissa correctly bumps the exponent (to inf).
    uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | static_cast<uint32_t>(sig >> 42);
    const uint64_t rem = sig & ((1ull << 42) - 1);
    const uint64_t half = 1ull << 41;
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (e < -25) return sign;  // below half the smallest subnormal (and double subnormals)
  // Subnormal: value / 2^-24 = M * 2^(e - 28) with M the 53-bit significand.
  const uint64_t m = sig | (1ull << 52);
  const int shift = 28 - e;  // 43..53
  uint64_t q = m >> shift;
  const uint64_t rem = m & ((1ull << shift) - 1);
  const uint64_t half = 1ull << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal
  return static_cast<uint16_t>(sign | q);
}

// binary32 -> binary16, nearest even, bit for bit what f16_from_double gives for a float
// converted to double (NaN included; checked over all 2^32 floats when it was written).
// No branches, so that loops over it vectorize: every case is computed and one selected.
// Finite values below 2^-14 go through one float addition that rounds them onto the
// subnormal grid (default rounding mode, no flush-to-zero: the emitted builds keep both);
// the others round the bit pattern (Fabian Giesen's float_to_half_fast3_rtne).
COCOVIZ_HD uint16_t f16_from_float(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // NaN: quiet, with the top 10 payload bits (a signaling NaN is quieted, as the float ->
  // double conversion in f16_from_double does on the CPU)
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
  // normal range: add the rounding bias (half an ulp minus one, plus the odd bit) and cut
  const uint32_t normal = (a + 0xC8000FFFu + ((a >> 13) & 1u)) >> 13;  // -(112 << 23) + 0xFFF
  // below 2^-14: the float addition of 0.5 puts the value's half-precision subnormal
  // mantissa (rounded to nearest even) in the low bits
  const uint32_t sub = float_bits(bits_float(a) + 0.5f) - 0x3F000000u;
  // Selected by masks, not `?:`, which the compiler may turn back into branches around
  // the float operation (and then not vectorize, since that operation may trap).
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < 0x38800000u);
  // (overflow from 65536 on; 65520..65536 carry into the infinity pattern via `normal`)
  const uint32_t is_inf = 0u - static_cast<uint32_t>(a >= 0x47800000u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(a > 0x7F800000u);
  uint32_t h = (sub & is_sub) | (normal & ~is_sub);
  h = (0x7C00u & is_inf) | (h & ~is_inf);
  h = (nan & is_nan) | (h & ~is_nan);
  return static_cast<uint16_t>(sign | h);
}

// Exact binary16 -> binary32. NaN payload bits move to the top of the f32 payload.
// Without branches (every case computed, one selected by masks), so loops over it
// vectorize; subnormals are scaled exactly by one float subtraction.
COCOVIZ_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7FFFu) << 13;  // exponent and mantissa
  const uint32_t exp = em & 0x0F800000u;
  const uint32_t normal = em + (112u << 23);                      // rebias 15 -> 127
  const uint32_t special = em + (224u << 23);                     // infinities and NaN
  const uint32_t sub = float_bits(bits_float(normal + (1u << 23)) - bits_float(113u << 23));
  const uint32_t is_special = 0u - static_cast<uint32_t>(exp == 0x0F800000u);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(exp == 0);
  const uint32_t r = (special & is_special) | (sub & is_sub) | (normal & ~(is_special | is_sub));
  return bits_float(sign | r);
}

// bfloat16 from binary32, nearest even on the top 16 bits. NaN keeps its sign and top
// payload bits and gets the quiet bit, so it stays NaN.
COCOVIZ_HD uint16_t bf16_from_float(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t nan = (u >> 16) | 0x0040u;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

COCOVIZ_HD uint16_t bf16_from_double(double d) {
  return bf16_from_float(static_cast<float>(d));
}

COCOVIZ_HD float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Arrays of f16 <-> f32 on the host, the same bits as the element functions above: with
// the F16C instructions where the CPU has them (eight conversions per instruction; chosen
// at run time, so the binary runs anywhere), else the branch-free loops. The instructions
// round to nearest even and quiet a signaling NaN both ways; f16_to_float keeps a
// signaling half NaN signaling, so the widening clears the quiet bit F16C set on those.
#if defined(COCOVIZ_F16C)

__attribute__((target("avx,f16c"))) inline void f16_widen_f16c(float* dst, const uint16_t* src,
                                                               int64_t n) {
  int64_t i = 0;
  const __m128i exp = _mm_set1_epi16(0x7C00), quiet = _mm_set1_epi16(0x0200);
  const __m128i payload = _mm_set1_epi16(0x03FF), zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    // signaling NaN halves: exponent all ones, quiet bit clear, payload not zero
    const __m128i is_nan = _mm_andnot_si128(
        _mm_cmpeq_epi16(_mm_and_si128(h, payload), zero),
        _mm_cmpeq_epi16(_mm_and_si128(h, exp), exp));
    const __m128i snan = _mm_andnot_si128(_mm_cmpeq_epi16(_mm_and_si128(h, quiet), quiet), is_nan);
    // the f32 quiet bit (bit 22) in the lanes of signaling NaNs, to clear
    const __m128i bit22 = _mm_set1_epi32(0x00400000);
    const __m128i lo = _mm_and_si128(_mm_unpacklo_epi16(snan, snan), bit22);
    const __m128i hi = _mm_and_si128(_mm_unpackhi_epi16(snan, snan), bit22);
    const __m256 clear = _mm256_castsi256_ps(_mm256_set_m128i(hi, lo));
    _mm256_storeu_ps(dst + i, _mm256_andnot_ps(clear, _mm256_cvtph_ps(h)));
  }
  for (; i < n; ++i) dst[i] = f16_to_float(src[i]);
}

__attribute__((target("avx,f16c"))) inline void f16_narrow_f16c(uint16_t* dst, const float* src,
                                                                int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f16_from_float(src[i]);
}

inline bool cpu_has_f16c() {
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has;
}
#endif

inline void f16_widen(float* dst, const uint16_t* src, int64_t n) {
#if defined(COCOVIZ_F16C)
  if (cpu_has_f16c()) return f16_widen_f16c(dst, src, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
}

inline void f16_narrow(uint16_t* dst, const float* src, int64_t n) {
#if defined(COCOVIZ_F16C)
  if (cpu_has_f16c()) return f16_narrow_f16c(dst, src, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_from_float(src[i]);
}

// ------------------------------------------------------------ dtype traits

struct Tolerance {
  double rtol;
  double atol;
};

// Storage/compute types and conversions of each dtype on the CPU target. For the CUDA
// storage types (__half, __nv_bfloat16) see cocoviz_runtime.cuh; the bit patterns agree.
template <DType D>
struct Dt;

template <>
struct Dt<DType::f16> {
  using storage = uint16_t;
  using compute = float;
  static constexpr const char* name = "f16";
  static constexpr const char* npy_descr = "<f2";
  static constexpr bool is_float = true;
  static constexpr Tolerance tolerance{5e-3, 1e-3};
  static COCOVIZ_HD compute load(storage s) { return f16_to_float(s); }
  static COCOVIZ_HD storage store(float c) { return f16_from_float(c); }
  static COCOVIZ_HD storage store_double(double c) { return f16_from_double(c); }
};

template <>
struct Dt<DType::bf16> {
  using storage = uint16_t;
  using compute = float;
  static constexpr const char* name = "bf16";
  static constexpr const char* npy_descr = "<f4";  // written as float32
  static constexpr bool is_float = true;
  static constexpr Tolerance tolerance{2e-2, 1e-2};
  static COCOVIZ_HD compute load(storage s) { return bf16_to_float(s); }
  static COCOVIZ_HD storage store(float c) { return bf16_from_float(c); }
  static COCOVIZ_HD storage store_double(double c) { return bf16_from_double(c); }
};

template <>
struct Dt<DType::f32> {
  using storage = float;
  using compute = float;
  static constexpr const char* name = "f32";
  static constexpr const char* npy_descr = "<f4";
  static constexpr bool is_float = true;
  static constexpr Tolerance tolerance{1e-5, 1e-6};
  static COCOVIZ_HD compute load(storage s) { return s; }
  static COCOVIZ_HD storage store(float c) { return c; }
  static COCOVIZ_HD storage store_double(double c) { return static_cast<float>(c); }
};

template <>
struct Dt<DType::f64> {
  using storage = double;
  using compute = double;
  static constexpr const char* name = "f64";
  static constexpr const char* npy_descr = "<f8";
  static constexpr bool is_float = true;
  static constexpr Tolerance tolerance{1e-10, 1e-12};
  static COCOVIZ_HD compute load(storage s) { return s; }
  static COCOVIZ_HD storage store(double c) { return c; }
  static COCOVIZ_HD storage store_double(double c) { return c; }
};

template <>
struct Dt<DType::i32> {
  using storage = int32_t;
  using compute = int64_t;
  static constexpr const char* name = "i32";
  static constexpr const char* npy_descr = "<i4";
  static constexpr bool is_float = false;
  static constexpr Tolerance tolerance{0.0, 0.0};
  static COCOVIZ_HD compute load(storage s) { return s; }
  static COCOVIZ_HD storage store(int64_t c) { return static_cast<int32_t>(c); }
  static COCOVIZ_HD storage store_double(double c) { return static_cast<int32_t>(c); }
};

template <>
struct Dt<DType::i64> {
  using storage = int64_t;
  using compute = int64_t;
  static constexpr const char* name = "i64";
  static constexpr const char* npy_descr = "<i8";
  static constexpr bool is_float = false;
  static constexpr Tolerance tolerance{0.0, 0.0};
  static COCOVIZ_HD compute load(storage s) { return s; }
  static COCOVIZ_HD storage store(int64_t c) { return c; }
  static COCOVIZ_HD storage store_double(double c) { return static_cast<int64_t>(c); }
};

// ----------------------------------------------------------------- inputs

// Input element with global flat index i of the stream `key` (= key_for(name, seed)).
template <DType D>
COCOVIZ_HD typename Dt<D>::storage input_element(uint64_t key, uint64_t i) {
  const uint64_t u = uniform_bits(key, i);
  if constexpr (Dt<D>::is_float) {
    return Dt<D>::store_double(static_cast<double>(input_float(u)));
  } else {
    return Dt<D>::store(input_int(u));
  }
}

// Fills dst[0, count) with the input elements of global indices [start, start + count).
template <DType D>
inline void fill_input(typename Dt<D>::storage* dst, const char* id, uint64_t seed,
                       uint64_t start, uint64_t count) {
  const uint64_t key = key_for(id, seed);
  const int64_t n = static_cast<int64_t>(count);
  COCOVIZ_OMP_PARALLEL_FOR
  for (int64_t j = 0; j < n; ++j) {
    dst[j] = input_element<D>(key, start + static_cast<uint64_t>(j));
  }
}

// ------------------------------------------------------- --check's inputs
//
// --check draws its own inputs, made to expose mistakes rather than to match the
// reference (docs/codegen.md, inputs and dumps): a stream per input and per round,
// key = mix(key_for(id, seed) ^ mix(round)), u(i) = mix(key ^ i); floats are
// +-((u >> 54) + 1) / 1024 * 2^(((u >> 51) & 7) - 3) (magnitudes 2^-13 .. 16, exact in
// f16 and f32; the sign is bit 50 of u unless the input reaches sqrt, rsqrt, log or pow),
// integers ((u & 15) - 8) << ((u >> 56) & 7) (u & 15 shifted alike where unsigned).

COCOVIZ_HD constexpr uint64_t check_key(uint64_t input_key, uint64_t round) {
  return mix(input_key ^ mix(round));
}

COCOVIZ_HD double check_float(uint64_t u, bool nonnegative) {
  const double k = static_cast<double>((u >> 54) + 1) / 1024.0;
  const int e = static_cast<int>((u >> 51) & 7u) - 3;
  const double m = e >= 0 ? k * static_cast<double>(1u << e) : k / static_cast<double>(1u << -e);
  return (!nonnegative && ((u >> 50) & 1u)) ? -m : m;
}

COCOVIZ_HD int64_t check_int(uint64_t u, bool nonnegative) {
  const int64_t base = static_cast<int64_t>(u & 15u) - (nonnegative ? 0 : 8);
  return base * (int64_t{1} << ((u >> 56) & 7u));
}

template <DType D>
COCOVIZ_HD typename Dt<D>::storage check_element(uint64_t key, uint64_t i, bool nonnegative) {
  const uint64_t u = uniform_bits(key, i);
  if constexpr (Dt<D>::is_float) {
    return Dt<D>::store_double(check_float(u, nonnegative));
  } else {
    return Dt<D>::store(check_int(u, nonnegative));
  }
}

// Element j of a rank's part of a value laid out as `outer` runs of `run` elements, run o
// starting at global flat index base + o * row (a block-sliced value: base = tp * run; any
// other: one run, base = its first global index).
COCOVIZ_HD uint64_t run_index(int64_t j, int64_t run, int64_t row, int64_t base) {
  return static_cast<uint64_t>(base + (j / run) * row + j % run);
}

template <DType D>
inline void fill_check(typename Dt<D>::storage* dst, uint64_t key, int64_t outer, int64_t run,
                       int64_t row, int64_t base, bool nonnegative) {
  const int64_t n = outer * run;
  COCOVIZ_OMP_PARALLEL_FOR
  for (int64_t j = 0; j < n; ++j) dst[j] = check_element<D>(key, run_index(j, run, row, base), nonnegative);
}

// Copies a rank's part (the runs above) out of a global array.
template <class T>
inline void copy_runs(T* dst, const T* global, int64_t outer, int64_t run, int64_t row, int64_t base) {
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + o * run, global + base + o * row, sizeof(T) * static_cast<size_t>(run));
  }
}

// ---------------------------------------------------------------- dropout

// floor(p * 2^32); p in [0, 1), so the product is exact and below 2^32.
COCOVIZ_HD uint32_t dropout_threshold(double p) {
  return static_cast<uint32_t>(floor(p * 4294967296.0));
}

COCOVIZ_HD bool dropout_keep(uint64_t key, uint64_t i, uint32_t threshold) {
  return (uniform_bits(key, i) >> 32) >= threshold;
}

// v where keep, else zero (+0.0 for floats), selected by a mask rather than `?:`: the
// compiler may turn `keep ? v : 0` into a branch around v's computation (a float operation,
// which may trap) and then not vectorize the loop (as f16_from_float's selects above).
template <class T>
COCOVIZ_HD T keep_or_zero(bool keep, T v) {
  if constexpr (std::is_same<T, float>::value) {
    return bits_float(float_bits(v) & (0u - static_cast<uint32_t>(keep)));
  } else if constexpr (std::is_same<T, double>::value) {
    return bits_double(double_bits(v) & (0ull - static_cast<uint64_t>(keep)));
  } else {
    return v & (T(0) - static_cast<T>(keep));
  }
}

// The factor applied to kept elements: f32 for f16/bf16/f32, f64 for f64 and integers.
template <DType D>
using dropout_scale_t =
    typename std::conditional<D == DType::f16 || D == DType::bf16 || D == DType::f32, float,
                              double>::type;

// 1 / (1 - p) evaluated in f64, rounded once to f32 where the scale is f32. Emitted code
// computes it once on the host and passes it to kernels.
template <DType D>
COCOVIZ_HD dropout_scale_t<D> dropout_scale(double p) {
  return static_cast<dropout_scale_t<D>>(1.0 / (1.0 - p));
}

// The dropout of one stored element: x * scale when kept, else 0, in x's dtype.
template <DType D>
COCOVIZ_HD typename Dt<D>::storage dropout_value(typename Dt<D>::storage x, bool keep,
                                                 dropout_scale_t<D> scale) {
  if constexpr (Dt<D>::is_float) {
    return Dt<D>::store(keep ? Dt<D>::load(x) * scale : dropout_scale_t<D>(0));
  } else {
    return keep ? Dt<D>::store_double(static_cast<double>(x) * scale)
                : typename Dt<D>::storage(0);
  }
}

// ---------------------------------------------------------------- compare

struct CompareResult {
  bool ok = true;
  double max_abs = 0.0;
  double max_rel = 0.0;
  uint64_t n_bad = 0;
  uint64_t nan_mismatch = 0;
  int64_t first_bad = -1;
};

inline void compare_step(CompareResult& r, uint64_t i, double a, double b, Tolerance tol) {
  const bool an = std::isnan(a), bn = std::isnan(b);
  bool bad = false;
  if (an || bn) {
    if (an != bn) {
      bad = true;
      ++r.nan_mismatch;
    }
  } else if (a != b) {
    // Unequal values agree only if both are finite and within tolerance.
    const double diff = std::fabs(a - b);
    const double babs = std::fabs(b);
    const bool finite = std::isfinite(a) && std::isfinite(b);
    if (!finite || !(diff <= tol.atol + tol.rtol * babs)) bad = true;
    if (diff > r.max_abs) r.max_abs = diff;
    const double rel = std::isinf(diff) ? diff : diff / babs;  // inf where b is 0
    if (rel > r.max_rel) r.max_rel = rel;
  }
  if (bad) {
    if (r.n_bad == 0) r.first_bad = static_cast<int64_t>(i);
    ++r.n_bad;
    r.ok = false;
  }
}

// Compares n stored elements of `actual` against `expected` with D's tolerance.
template <DType D>
inline CompareResult compare(const typename Dt<D>::storage* actual,
                             const typename Dt<D>::storage* expected, uint64_t n) {
  CompareResult r;
  for (uint64_t i = 0; i < n; ++i) {
    if constexpr (Dt<D>::is_float) {
      compare_step(r, i, static_cast<double>(Dt<D>::load(actual[i])),
                   static_cast<double>(Dt<D>::load(expected[i])), Dt<D>::tolerance);
    } else {
      const int64_t a = actual[i], b = expected[i];
      if (a != b) {
        const double diff = std::fabs(static_cast<double>(a) - static_cast<double>(b));
        if (diff > r.max_abs) r.max_abs = diff;
        const double rel = diff / std::fabs(static_cast<double>(b));
        if (rel > r.max_rel) r.max_rel = rel;
        if (r.n_bad == 0) r.first_bad = static_cast<int64_t>(i);
        ++r.n_bad;
        r.ok = false;
      }
    }
  }
  return r;
}

// Compares like compare<D>, with the tolerance of a value that depends on a sum whose order
// may differ (docs/codegen.md, "Inputs, dumps and check-tree"): an element agrees when
// |a - b| <= atol + rtol * M, M the largest finite |expected| of the whole array — a sum's
// rounding error is as large as its largest terms, not as its (perhaps cancelled) result.
// Integers compare exactly as in compare<D>.
template <DType D>
inline CompareResult compare_normwise(const typename Dt<D>::storage* actual,
                                      const typename Dt<D>::storage* expected, uint64_t n) {
  if constexpr (!Dt<D>::is_float) {
    return compare<D>(actual, expected, n);
  } else {
    double m = 0.0;
    for (uint64_t i = 0; i < n; ++i) {
      const double b = std::fabs(static_cast<double>(Dt<D>::load(expected[i])));
      if (std::isfinite(b) && b > m) m = b;
    }
    const Tolerance tol{0.0, Dt<D>::tolerance.atol + Dt<D>::tolerance.rtol * m};  // {rtol, atol}
    CompareResult r;
    for (uint64_t i = 0; i < n; ++i) {
      compare_step(r, i, static_cast<double>(Dt<D>::load(actual[i])),
                   static_cast<double>(Dt<D>::load(expected[i])), tol);
    }
    return r;
  }
}

// -------------------------------------------------------------------- npy

struct NpyArray {
  std::string descr;
  std::vector<uint64_t> shape;
  std::vector<unsigned char> data;
  uint64_t trailing = 0;  // bytes after the data the header promises

  uint64_t numel() const {
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    return n;
  }
};

inline std::string npy_header(const char* descr, const std::vector<uint64_t>& shape) {
  std::string dict = "{'descr': '";
  dict += descr;
  dict += "', 'fortran_order': False, 'shape': (";
  for (size_t k = 0; k < shape.size(); ++k) {
    dict += std::to_string(shape[k]);
    if (shape.size() == 1 || k + 1 < shape.size()) dict += ",";
    if (k + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // Magic (6) + version (2) + length (2) + dict + padding + '\n' is a multiple of 64.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xFF);
  out += static_cast<char>((dict.size() >> 8) & 0xFF);
  return out + dict;
}

// Writes a C-order array of `itemsize`-byte little-endian elements.
inline void write_npy_raw(const std::string& path, const char* descr,
                          const std::vector<uint64_t>& shape, const void* data,
                          size_t itemsize) {
  uint64_t n = 1;
  for (uint64_t s : shape) n *= s;
  const std::string header = npy_header(descr, shape);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path + " for writing");
  const bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
                  (n == 0 || std::fwrite(data, itemsize, n, f) == n);
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("cannot write " + path);
}

// Writes stored values of dtype D; bf16 is widened to float32 ('<f4').
template <DType D>
inline void write_npy(const std::string& path, const std::vector<uint64_t>& shape,
                      const typename Dt<D>::storage* data) {
  if constexpr (D == DType::bf16) {
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    std::vector<float> wide(n);
    for (uint64_t i = 0; i < n; ++i) wide[i] = bf16_to_float(data[i]);
    write_npy_raw(path, "<f4", shape, wide.data(), sizeof(float));
  } else {
    write_npy_raw(path, Dt<D>::npy_descr, shape, data, sizeof(typename Dt<D>::storage));
  }
}

inline std::string npy_dict_value(const std::string& dict, const std::string& key,
                                  const std::string& path) {
  const std::string quoted = "'" + key + "':";
  const size_t at = dict.find(quoted);
  if (at == std::string::npos) throw std::runtime_error(path + ": npy header lacks " + key);
  size_t p = at + quoted.size();
  while (p < dict.size() && dict[p] == ' ') ++p;
  if (p < dict.size() && dict[p] == '\'') {
    const size_t end = dict.find('\'', p + 1);
    if (end == std::string::npos) throw std::runtime_error(path + ": bad npy header");
    return dict.substr(p + 1, end - p - 1);
  }
  if (p < dict.size() && dict[p] == '(') {
    const size_t end = dict.find(')', p);
    if (end == std::string::npos) throw std::runtime_error(path + ": bad npy header");
    return dict.substr(p + 1, end - p - 1);
  }
  const size_t end = dict.find_first_of(",}", p);
  return dict.substr(p, end - p);
}

inline NpyArray read_npy_raw(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  auto fail = [&](const std::string& why) {
    std::fclose(f);
    throw std::runtime_error(path + ": " + why);
  };
  unsigned char pre[10];
  if (std::fread(pre, 1, 10, f) != 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0) {
    fail("not a .npy file");
  }
  size_t hlen = static_cast<size_t>(pre[8]) | (static_cast<size_t>(pre[9]) << 8);
  if (pre[6] >= 2) {  // versions 2 and 3 have a 4-byte header length
    unsigned char more[2];
    if (std::fread(more, 1, 2, f) != 2) fail("truncated header");
    hlen |= (static_cast<size_t>(more[0]) << 16) | (static_cast<size_t>(more[1]) << 24);
  }
  std::string dict(hlen, '\0');
  if (std::fread(&dict[0], 1, hlen, f) != hlen) fail("truncated header");
  NpyArray a;
  a.descr = npy_dict_value(dict, "descr", path);
  if (npy_dict_value(dict, "fortran_order", path).find("False") == std::string::npos) {
    fail("Fortran-order arrays are not supported");
  }
  const std::string dims = npy_dict_value(dict, "shape", path);
  size_t p = 0;
  while (p < dims.size()) {
    while (p < dims.size() && (dims[p] == ' ' || dims[p] == ',')) ++p;
    if (p >= dims.size()) break;
    size_t used = 0;
    a.shape.push_back(std::stoull(dims.substr(p), &used));
    p += used;
  }
  size_t itemsize = 0;
  if (a.descr.size() >= 3 && (a.descr[0] == '<' || a.descr[0] == '|')) {
    itemsize = static_cast<size_t>(std::stoul(a.descr.substr(2)));
  } else {
    fail("unsupported dtype " + a.descr + " (expected little-endian)");
  }
  const size_t bytes = static_cast<size_t>(a.numel()) * itemsize;
  a.data.resize(bytes);
  if (bytes != 0 && std::fread(a.data.data(), 1, bytes, f) != bytes) fail("truncated data");
  unsigned char extra[4096];
  for (size_t got; (got = std::fread(extra, 1, sizeof extra, f)) > 0;) a.trailing += got;
  std::fclose(f);
  return a;
}

// Reads a .npy written for dtype D into stored values (bf16 from '<f4', rounded).
// Throws when the file's descr does not match D or its element count is not `numel`.
template <DType D>
inline std::vector<typename Dt<D>::storage> read_npy(const std::string& path, uint64_t numel) {
  const NpyArray a = read_npy_raw(path);
  if (a.descr != Dt<D>::npy_descr) {
    throw std::runtime_error(path + ": dtype " + a.descr + ", expected " + Dt<D>::npy_descr +
                             " for " + Dt<D>::name);
  }
  if (a.numel() != numel) {
    throw std::runtime_error(path + ": " + std::to_string(a.numel()) + " elements, expected " +
                             std::to_string(numel));
  }
  std::vector<typename Dt<D>::storage> out(numel);
  if constexpr (D == DType::bf16) {
    for (uint64_t i = 0; i < numel; ++i) {
      float v;
      std::memcpy(&v, a.data.data() + i * sizeof(float), sizeof v);
      out[i] = bf16_from_float(v);
    }
  } else if (numel != 0) {
    std::memcpy(out.data(), a.data.data(), a.data.size());
  }
  return out;
}

// Reads input `name` for --inputs (docs/codegen.md, inputs and dumps): DIR/<name>.npy must
// be a C-order .npy of D's dtype ('<f4' for bf16) and of exactly the global shape `shape`,
// holding exactly the bytes its header promises, as `cocoviz run --inputs` requires.
// Returns "" and fills `out` (D's storage), or returns the one-line reason it cannot.
template <DType D>
inline std::string read_input_npy(const std::string& path, const char* name,
                                  const std::vector<uint64_t>& shape, bool local,
                                  std::vector<typename Dt<D>::storage>& out) {
  auto dims = [](const std::vector<uint64_t>& v) {
    std::string t = "[";
    for (size_t k = 0; k < v.size(); ++k) t += (k ? ", " : "") + std::to_string(v[k]);
    return t + "]";
  };
  const std::string what = path + ": input '" + name + "' (" + Dt<D>::name + ", global shape " +
                           dims(shape) + (local ? ": [G, *shape], one row per rank for a local input" : "") + ")";
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return path + ": " + std::strerror(errno) + ": input '" + name +
           "' has no file (an emitted program reads every input from --inputs DIR)";
  }
  if (!S_ISREG(st.st_mode)) return path + ": not a regular file (a FIFO or a device would never end)";
  NpyArray a;
  try {
    a = read_npy_raw(path);
  } catch (const std::exception& e) {
    return std::string(e.what()) + " (write it with numpy.save)";
  } catch (...) {
    return path + ": not a readable .npy file (its header promises more data than fits in memory?)";
  }
  const char* want = Dt<D>::npy_descr;
  if (a.descr != want) {
    auto named = [](const std::string& d) {
      static const char* const known[][2] = {{"<f2", "float16"}, {"<f4", "float32"}, {"<f8", "float64"},
                                             {"<i4", "int32"}, {"<i8", "int64"}};
      for (const auto& k : known) {
        if (d == k[0]) return d + " (numpy " + k[1] + ")";
      }
      return d;
    };
    return what + ": expected dtype " + named(want) + (D == DType::bf16 ? ", bf16 stored as float32" : "") +
           ", found " + named(a.descr);
  }
  if (a.shape != shape) return what + ": expected shape " + dims(shape) + ", found " + dims(a.shape);
  if (a.trailing != 0) {
    return path + ": " + std::to_string(a.trailing) +
           " extra byte(s) follow the data its header promises (write it with numpy.save)";
  }
  const uint64_t n = a.numel();
  out.resize(static_cast<size_t>(n));
  if constexpr (D == DType::bf16) {
    for (uint64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, a.data.data() + i * sizeof(float), sizeof v);
      out[i] = bf16_from_float(v);
    }
  } else if (n != 0) {
    std::memcpy(out.data(), a.data.data(), a.data.size());
  }
  return "";
}

}  // namespace cocoviz

// ------------------------------------------------------- failures and MPI
//
// check_failed prints "cocoviz: [rank R] stage 'S': API call CALL failed at FILE:LINE:
// DETAIL" and ends the job (MPI_Abort when MPI is up, so no rank waits on a dead peer).
#if defined(MPI_VERSION)

namespace cocoviz {

[[noreturn]] inline void check_failed(const char* api, const char* call, const char* detail,
                                      const char* stage, const char* file, int line) {
  int up = 0, down = 0, rank = -1;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "cocoviz: [rank %d] stage '%s': %s call %s failed at %s:%d: %s\n", rank,
               stage, api, call, file, line, detail);
  std::fflush(stderr);
  if (up && !down) {
    // let mpiexec forward this report before the abort ends every rank: a launcher that
    // is told to abort stops forwarding, and a peer failing at the same moment (every
    // rank makes the same call) would otherwise cut every report off
    const timespec drain{0, 200000000};
    nanosleep(&drain, nullptr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::exit(1);
}

template <DType D>
inline MPI_Datatype mpi_datatype() {
  if constexpr (D == DType::f16 || D == DType::bf16) {
    return MPI_UINT16_T;  // with the user ops of mpi_op
  } else if constexpr (D == DType::f32) {
    return MPI_FLOAT;
  } else if constexpr (D == DType::f64) {
    return MPI_DOUBLE;
  } else if constexpr (D == DType::i32) {
    return MPI_INT32_T;
  } else {
    return MPI_INT64_T;
  }
}

enum class ReduceOp : int { sum, prod, max, min };

// Pairwise reduction of f16/bf16 bit patterns, computed in f32 and rounded per step.
template <DType D, ReduceOp Op>
inline void half_reduce_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = Dt<D>::load(a[i]), y = Dt<D>::load(b[i]);
    float r;
    if constexpr (Op == ReduceOp::sum) r = x + y;
    if constexpr (Op == ReduceOp::prod) r = x * y;
    if constexpr (Op == ReduceOp::max) r = (x > y || std::isnan(x)) ? x : y;
    if constexpr (Op == ReduceOp::min) r = (x < y || std::isnan(x)) ? x : y;
    b[i] = Dt<D>::store(r);
  }
}

// The MPI_Op for Op on dtype D: built-in for f32/f64/integers, user-defined (created on
// first use, after MPI_Init) for f16/bf16. `avg` is `sum` followed by a division by the
// group size, which the caller applies.
template <DType D>
inline MPI_Op mpi_op(ReduceOp op) {
  if constexpr (D == DType::f16 || D == DType::bf16) {
    static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
    const int k = static_cast<int>(op);
    if (ops[k] == MPI_OP_NULL) {
      MPI_User_function* fns[4] = {
          &half_reduce_fn<D, ReduceOp::sum>, &half_reduce_fn<D, ReduceOp::prod>,
          &half_reduce_fn<D, ReduceOp::max>, &half_reduce_fn<D, ReduceOp::min>};
      if (MPI_Op_create(fns[k], 1, &ops[k]) != MPI_SUCCESS) {
        check_failed("MPI", "MPI_Op_create", "cannot create a half-precision op", "runtime",
                     __FILE__, __LINE__);
      }
    }
    return ops[k];
  } else {
    switch (op) {
      case ReduceOp::sum: return MPI_SUM;
      case ReduceOp::prod: return MPI_PROD;
      case ReduceOp::max: return MPI_MAX;
      case ReduceOp::min: return MPI_MIN;
    }
    return MPI_OP_NULL;
  }
}

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace cocoviz

// CHECK_MPI("stage", MPI_Allreduce(...)): report the call, file:line and stage on failure.
#define CHECK_MPI(stage, ...)                                                              \
  do {                                                                                     \
    const int cocoviz_rc_ = (__VA_ARGS__);                                                 \
    if (cocoviz_rc_ != MPI_SUCCESS) {                                                      \
      ::cocoviz::check_failed("MPI", #__VA_ARGS__,                                         \
                              ::cocoviz::mpi_error_string(cocoviz_rc_).c_str(), (stage),   \
                              __FILE__, __LINE__);                                         \
    }                                                                                      \
  } while (0)

#else  // no MPI

namespace cocoviz {
[[noreturn]] inline void check_failed(const char* api, const char* call, const char* detail,
                                      const char* stage, const char* file, int line) {
  std::fprintf(stderr, "cocoviz: stage '%s': %s call %s failed at %s:%d: %s\n", stage, api,
               call, file, line, detail);
  std::fflush(stderr);
  std::exit(1);
}
}  // namespace cocoviz

#endif  // MPI_VERSION

#endif  // COCOVIZ_RUNTIME_H_
