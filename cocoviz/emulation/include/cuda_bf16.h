// cuda_bf16.h — cocoviz emulation: CUDA's bfloat16 type on the host. Not NVIDIA's header and
// needs no CUDA toolkit; like NVIDIA's, it includes cuda_fp16.h.
//
// Emulated: __nv_bfloat16 (2 bytes, trivially copyable, standard layout; default construction
// leaves it uninitialized, as in CUDA) and __nv_bfloat16_raw; the conversions
// __float2bfloat16(_rn), __double2bfloat16, __bfloat162float and __bfloat16_as_ushort /
// __ushort_as_bfloat16; construction from and conversion to float, construction from double
// and integers; the arithmetic (+ - * /, compound, unary, ++/--) and comparison operators on
// two __nv_bfloat16. Conversions to bf16 round to nearest even, bit for bit like CUDA
// (subnormals exact, overflow to ±inf, a NaN becomes the canonical 0x7fff; from double in
// one rounding, as CUDA does); __bfloat162float is exact and keeps NaN payloads. Arithmetic
// rounds the exact float result once, which equals the correctly rounded bf16 result; a NaN
// result is 0x7fff (negation included), as in CUDA's host code. Checked bit for bit against
// NVIDIA's host implementation (every float, every bf16).
// Not emulated: __nv_bfloat162, the other rounding modes, the math intrinsics, conversions
// between __half and __nv_bfloat16.
#ifndef COCOVIZ_EMU_CUDA_BF16_H_
#define COCOVIZ_EMU_CUDA_BF16_H_

#include <cstdint>
#include <type_traits>

#include "cuda_fp16.h"

namespace cocoviz_emu {
namespace fp {

// float -> bfloat16, round to nearest even.
inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN
  // Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry out of the
  // mantissa increments the exponent (up to inf), as it should.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// double -> bfloat16 in one rounding to nearest even.
inline uint16_t double_to_bf16_bits(double d) { return float_to_bf16_bits(double_to_float_odd(d)); }

inline float bf16_bits_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace fp
}  // namespace cocoviz_emu

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct alignas(2) __nv_bfloat16 {
 protected:
  unsigned short __x;

 public:
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
  __nv_bfloat16(float f) : __x(::cocoviz_emu::fp::float_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __x(::cocoviz_emu::fp::double_to_bf16_bits(d)) {}
  template <class I, typename std::enable_if<std::is_integral<I>::value, int>::type = 0>
  __nv_bfloat16(I v) : __nv_bfloat16(::cocoviz_emu::fp::integer_to_double_odd(v)) {}
  operator float() const { return ::cocoviz_emu::fp::bf16_bits_to_float(__x); }
};

typedef __nv_bfloat16 nv_bfloat16;

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) {
  return static_cast<__nv_bfloat16_raw>(b).x;
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }

inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __nv_bfloat16(float(a) + float(b));
}
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __nv_bfloat16(float(a) - float(b));
}
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __nv_bfloat16(float(a) * float(b));
}
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __nv_bfloat16(float(a) / float(b));
}
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return __nv_bfloat16(-float(a)); }

COCOVIZ_EMU_16BIT_OPERATORS(__nv_bfloat16, __nv_bfloat16_raw, 0x3f80u)

#endif  // COCOVIZ_EMU_CUDA_BF16_H_
