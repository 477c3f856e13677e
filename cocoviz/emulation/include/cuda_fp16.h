// cuda_fp16.h — cocoviz emulation: CUDA's half-precision type on the host. Not NVIDIA's
// header and needs no CUDA toolkit.
//
// Emulated: __half (2 bytes, trivially copyable, standard layout; default construction leaves
// it uninitialized, as in CUDA) and __half_raw; the conversions __float2half(_rn),
// __double2half, __half2float and __half_as_ushort / __ushort_as_half; construction from and
// conversion to float, construction from double and integers; the arithmetic (+ - * /,
// compound, unary, ++/--) and comparison operators on two __half. Conversions to __half
// round to nearest even, bit for bit like CUDA (subnormals exact, overflow to ±inf, a NaN
// becomes the canonical 0x7fff); __half2float of a NaN gives the canonical float NaN
// 0x7fffffff, as CUDA's host code does. Arithmetic rounds the exact float result once,
// which equals the correctly rounded half result (float carries more than 2 * 11 + 2 bits),
// and a NaN result is 0x7fff (negation included), as in CUDA's host code; CUDA's device
// __hdiv is an approximation with a fix-up and may differ in rare last bits.
// Checked bit for bit against NVIDIA's host implementation (every float, every half).
// Not emulated: __half2, the other rounding modes and the math intrinsics (hsqrt, __hfma...),
// conversions to integer types other than through float, and mixed __half/float operators
// (ambiguous in CUDA too).
#ifndef COCOVIZ_EMU_CUDA_FP16_H_
#define COCOVIZ_EMU_CUDA_FP16_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cocoviz_emu {
namespace fp {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> binary16, round to nearest even.
inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fffu;                                 // NaN
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  uint32_t mant, rem, half;                                            // result, dropped bits
  if (u >= 0x38800000u) {                                              // normal half
    mant = (u - 0x38000000u) >> 13;
    rem = u & 0x1fffu;
    half = 0x1000u;
  } else if (u < 0x33000000u) {  // below half the smallest subnormal (2^-25): zero
    return static_cast<uint16_t>(sign);
  } else {  // subnormal half: value = m * 2^(e-150), result unit 2^-24
    const uint32_t shift = 126u - (u >> 23);  // 14..24
    const uint32_t m = (u & 0x7fffffu) | 0x800000u;
    mant = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  }
  if (rem > half || (rem == half && (mant & 1u))) ++mant;  // may carry into the exponent
  return static_cast<uint16_t>(sign | mant);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(m ? 0x7fffffffu : (sign | 0x7f800000u));
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_float(sign);
  int exp = 113;  // subnormal: normalize m * 2^-24
  while (!(m & 0x400u)) {
    m <<= 1;
    --exp;
  }
  return bits_float(sign | (static_cast<uint32_t>(exp) << 23) | ((m & 0x3ffu) << 13));
}

// double -> float rounded to odd: a later rounding to nearest even of the result to 2 or more
// bits fewer (bf16, half) equals the direct rounding of the double.
inline float double_to_float_odd(double d) {
  const float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;  // NaN, or exact
  uint32_t u = float_bits(f);
  if (static_cast<double>(f) > d ? d > 0 : d < 0) --u;  // rounded away from zero: truncate
  return bits_float(u | 1u);
}

// double -> binary16 in one rounding to nearest even.
inline uint16_t double_to_half_bits(double d) { return float_to_half_bits(double_to_float_odd(d)); }

// integer -> double rounded to odd at 53 bits (exact below 2^53).
template <class I>
inline double integer_to_double_odd(I v) {
  const bool neg = std::is_signed<I>::value && v < 0;
  uint64_t a = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  int shift = 0;
  while ((a >> shift) >= (uint64_t{1} << 53)) ++shift;
  if (shift > 0) {
    const bool sticky = (a & ((uint64_t{1} << shift) - 1u)) != 0;
    a = ((a >> shift) | (sticky ? 1u : 0u)) << shift;
  }
  const double d = static_cast<double>(a);  // exact: at most 53 significant bits
  return neg ? -d : d;
}

}  // namespace fp
}  // namespace cocoviz_emu

struct __half_raw {
  unsigned short x;
};

struct alignas(2) __half {
 protected:
  unsigned short __x;

 public:
  __half() = default;
  constexpr __half(const __half_raw& r) : __x(r.x) {}
  operator __half_raw() const { return __half_raw{__x}; }
  __half(float f) : __x(::cocoviz_emu::fp::float_to_half_bits(f)) {}
  __half(double d) : __x(::cocoviz_emu::fp::double_to_half_bits(d)) {}
  template <class I, typename std::enable_if<std::is_integral<I>::value, int>::type = 0>
  __half(I v) : __half(::cocoviz_emu::fp::integer_to_double_odd(v)) {}
  operator float() const { return ::cocoviz_emu::fp::half_bits_to_float(__x); }
};

typedef __half half;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline unsigned short __half_as_ushort(__half h) { return static_cast<__half_raw>(h).x; }
inline __half __ushort_as_half(unsigned short u) { return __half_raw{u}; }

inline __half __hadd(__half a, __half b) { return __half(float(a) + float(b)); }
inline __half __hsub(__half a, __half b) { return __half(float(a) - float(b)); }
inline __half __hmul(__half a, __half b) { return __half(float(a) * float(b)); }
inline __half __hdiv(__half a, __half b) { return __half(float(a) / float(b)); }
inline __half __hneg(__half a) { return __half(-float(a)); }

// The operators of CUDA's 16-bit float types T (raw type R, bits of 1.0 ONE), in terms of
// T's __hadd, __hsub, __hmul, __hdiv, __hneg; cuda_bf16.h uses it too.
#define COCOVIZ_EMU_16BIT_OPERATORS(T, R, ONE)                                         \
  inline T operator+(const T& a, const T& b) { return __hadd(a, b); }                 \
  inline T operator-(const T& a, const T& b) { return __hsub(a, b); }                 \
  inline T operator*(const T& a, const T& b) { return __hmul(a, b); }                 \
  inline T operator/(const T& a, const T& b) { return __hdiv(a, b); }                 \
  inline T& operator+=(T& a, const T& b) { return a = a + b; }                        \
  inline T& operator-=(T& a, const T& b) { return a = a - b; }                        \
  inline T& operator*=(T& a, const T& b) { return a = a * b; }                        \
  inline T& operator/=(T& a, const T& b) { return a = a / b; }                        \
  inline T& operator++(T& a) { return a += R{ONE}; }                                  \
  inline T& operator--(T& a) { return a -= R{ONE}; }                                  \
  inline T operator++(T& a, int) {                                                    \
    const T old = a;                                                                  \
    ++a;                                                                              \
    return old;                                                                       \
  }                                                                                   \
  inline T operator--(T& a, int) {                                                    \
    const T old = a;                                                                  \
    --a;                                                                              \
    return old;                                                                       \
  }                                                                                   \
  inline T operator+(const T& a) { return a; }                                        \
  inline T operator-(const T& a) { return __hneg(a); }                                \
  inline bool operator==(const T& a, const T& b) { return float(a) == float(b); }     \
  inline bool operator!=(const T& a, const T& b) { return float(a) != float(b); }     \
  inline bool operator<(const T& a, const T& b) { return float(a) < float(b); }       \
  inline bool operator>(const T& a, const T& b) { return float(a) > float(b); }       \
  inline bool operator<=(const T& a, const T& b) { return float(a) <= float(b); }     \
  inline bool operator>=(const T& a, const T& b) { return float(a) >= float(b); }

COCOVIZ_EMU_16BIT_OPERATORS(__half, __half_raw, 0x3c00u)

#endif  // COCOVIZ_EMU_CUDA_FP16_H_
