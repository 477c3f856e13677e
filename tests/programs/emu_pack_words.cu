// The 32-bit words pack_part assembles for one 16-byte part of a pack (the operands of the
// GPU's st.global.v4.b32 in store_pack, cocoviz/templates/cocoviz_runtime.cuh) are the
// part's bytes, for every element size a pack is split into parts for: 2 (f16, bf16),
// 4 (f32, i32) and 8 (f64, i64) bytes, one part and several. Built against the emulation
// headers (tests/test_emulate_paths.py); the emulation's store_pack stores these words.
#include <cstdio>
#include <cstring>

#include "cocoviz_runtime.cuh"

namespace {

int failures = 0;

template <int N, class T>
void check(const char* what, const cocoviz::Pack<T, N>& x) {
  static_assert(sizeof(x) % 16 == 0, "whole 16-byte parts");
  for (int c = 0; c < static_cast<int>(sizeof x / 16); ++c) {
    const cocoviz::PackWords w = cocoviz::pack_part<N>(x, c);
    if (std::memcmp(&w, reinterpret_cast<const char*>(&x) + 16 * c, 16) != 0) {
      std::printf("%s: part %d differs from the pack's bytes\n", what, c);
      ++failures;
    }
  }
}

}  // namespace

int main() {
  cocoviz::Pack<__half, 8> h;
  cocoviz::Pack<__nv_bfloat16, 8> b;
  cocoviz::Pack<float, 4> f4;
  cocoviz::Pack<float, 8> f8;
  cocoviz::Pack<int32_t, 8> i8;
  cocoviz::Pack<double, 2> d2;
  cocoviz::Pack<double, 4> d4;
  cocoviz::Pack<int64_t, 2> l2;
  for (int j = 0; j < 8; ++j) {
    h.v[j] = __float2half(0.75f * static_cast<float>(j) - 2.5f);
    b.v[j] = __float2bfloat16(-3.0f * static_cast<float>(j) + 1.125f);
    f8.v[j] = 1.0e-3f * static_cast<float>(j * j) - 7.0f;
    i8.v[j] = -123457 * (j + 1);
  }
  for (int j = 0; j < 4; ++j) {
    f4.v[j] = -0.1f * static_cast<float>(j + 3);
    d4.v[j] = 1.0e100 * (j - 1.5);
  }
  for (int j = 0; j < 2; ++j) {
    d2.v[j] = -1.0 / 3.0 * (j + 1);
    l2.v[j] = -0x123456789abcdefLL * (j + 2);
  }
  check("f16 x 8", h);
  check("bf16 x 8", b);
  check("f32 x 4", f4);
  check("f32 x 8", f8);
  check("i32 x 8", i8);
  check("f64 x 2", d2);
  check("f64 x 4", d4);
  check("i64 x 2", l2);
  if (failures == 0) std::printf("pack words: ok\n");
  return failures == 0 ? 0 : 1;
}
