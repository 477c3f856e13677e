// cocoviz_runtime.cuh — CUDA runtime for cocoviz's emitted CUDA/NCCL programs.
//
// Copied verbatim next to the emitted sources together with cocoviz_runtime.h, whose
// generator, dropout, conversion, compare and .npy functions it reuses: under nvcc they
// are __host__ __device__, so the device computes exactly what cocoviz/numerics.py
// and the CPU target compute. This header adds
//
//   CudaDt<D>              CUDA storage types (__half, __nv_bfloat16, ...), load/store,
//                          NCCL and cuBLAS datatypes; bit patterns equal Dt<D>'s, so host
//                          code may copy device arrays into Dt<D>::storage buffers
//   cuda_input_element<D>  the shared input generator on CUDA storage types
//   cuda_dropout_value<D>  dropout of one element (scale from dropout_scale<D>(p))
//   fill_input_kernel<D>   grid-stride input fill; fill_input_async<D> launches it
//   check_fill_kernel<D>   --check's inputs (check_element of cocoviz_runtime.h)
//   Pack<T, N>             N elements as one aligned access (load_pack, store_pack,
//                          pack_aligned): the vectorized path of elementwise kernels
//   CHECK_CUDA / CHECK_NCCL / CHECK_CUBLAS / CHECK_MPI / CHECK_LAUNCH
//                          CHECK_X("stage", call(...)) reports the call, file:line and
//                          stage, then aborts the MPI job
//
// f16/bf16 conversions use CUDA's round-to-nearest-even intrinsics: every non-NaN value
// matches cocoviz_runtime.h bit for bit; a NaN stays NaN (its payload may differ).
#ifndef COCOVIZ_RUNTIME_CUH_
#define COCOVIZ_RUNTIME_CUH_

#include <mpi.h>  // before cocoviz_runtime.h, which then enables its MPI helpers
#include <nccl.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "cocoviz_runtime.h"

// Kernel launches and kernels' element accesses go through these macros. Under nvcc they
// are the plain `kernel<<<...>>>` and `p[i]`; the emulation build (cocoviz/emulation, where
// the CUDA headers define COCOVIZ_EMULATION) runs launches on the host and checks every
// access against its bounds and the happens-before order of streams, events and barriers.
#ifdef COCOVIZ_EMULATION
#define COCOVIZ_SITE(stage, call) ::cocoviz_emu::set_site((stage), __FILE__, __LINE__, (call))
#else
#define COCOVIZ_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define COCOVIZ_SITE(stage, call) ((void)0)
#endif

namespace cocoviz {

// ------------------------------------------------------------ dtype traits

template <DType D>
struct CudaDt;

template <>
struct CudaDt<DType::f16> {
  using storage = __half;
  using compute = float;
  static constexpr ncclDataType_t nccl = ncclFloat16;
  static constexpr cudaDataType_t cuda_type = CUDA_R_16F;
  static __host__ __device__ inline float load(__half s) { return __half2float(s); }
  static __host__ __device__ inline __half store(float c) { return __float2half_rn(c); }
};

template <>
struct CudaDt<DType::bf16> {
  using storage = __nv_bfloat16;
  using compute = float;
  static constexpr ncclDataType_t nccl = ncclBfloat16;
  static constexpr cudaDataType_t cuda_type = CUDA_R_16BF;
  static __host__ __device__ inline float load(__nv_bfloat16 s) { return __bfloat162float(s); }
  static __host__ __device__ inline __nv_bfloat16 store(float c) {
    return __float2bfloat16_rn(c);
  }
};

template <>
struct CudaDt<DType::f32> {
  using storage = float;
  using compute = float;
  static constexpr ncclDataType_t nccl = ncclFloat32;
  static constexpr cudaDataType_t cuda_type = CUDA_R_32F;
  static __host__ __device__ inline float load(float s) { return s; }
  static __host__ __device__ inline float store(float c) { return c; }
};

template <>
struct CudaDt<DType::f64> {
  using storage = double;
  using compute = double;
  static constexpr ncclDataType_t nccl = ncclFloat64;
  static constexpr cudaDataType_t cuda_type = CUDA_R_64F;
  static __host__ __device__ inline double load(double s) { return s; }
  static __host__ __device__ inline double store(double c) { return c; }
};

template <>
struct CudaDt<DType::i32> {
  using storage = int32_t;
  using compute = int64_t;
  static constexpr ncclDataType_t nccl = ncclInt32;
  static constexpr cudaDataType_t cuda_type = CUDA_R_32I;
  static __host__ __device__ inline int64_t load(int32_t s) { return s; }
  static __host__ __device__ inline int32_t store(int64_t c) { return static_cast<int32_t>(c); }
};

template <>
struct CudaDt<DType::i64> {
  using storage = int64_t;
  using compute = int64_t;
  static constexpr ncclDataType_t nccl = ncclInt64;
  static constexpr cudaDataType_t cuda_type = CUDA_R_64I;
  static __host__ __device__ inline int64_t load(int64_t s) { return s; }
  static __host__ __device__ inline int64_t store(int64_t c) { return c; }
};

static_assert(sizeof(__half) == sizeof(Dt<DType::f16>::storage), "f16 storage size");
static_assert(sizeof(__nv_bfloat16) == sizeof(Dt<DType::bf16>::storage), "bf16 storage size");

// --------------------------------------------------------------- generator

template <DType D>
__host__ __device__ inline typename CudaDt<D>::storage cuda_input_element(uint64_t key,
                                                                          uint64_t i) {
  const uint64_t u = uniform_bits(key, i);
  if constexpr (Dt<D>::is_float) {
    // k/1024 is exact in f32, so rounding it from f32 equals rounding it from f64.
    return CudaDt<D>::store(static_cast<typename CudaDt<D>::compute>(input_float(u)));
  } else {
    return CudaDt<D>::store(input_int(u));
  }
}

template <DType D>
__host__ __device__ inline typename CudaDt<D>::storage cuda_dropout_value(
    typename CudaDt<D>::storage x, bool keep, dropout_scale_t<D> scale) {
  if constexpr (Dt<D>::is_float) {
    return CudaDt<D>::store(keep ? CudaDt<D>::load(x) * scale : dropout_scale_t<D>(0));
  } else {
    return keep ? CudaDt<D>::store(static_cast<int64_t>(static_cast<double>(x) * scale))
                : typename CudaDt<D>::storage(0);
  }
}

// dst[j] = input element start + j, for j in [0, count).
template <DType D>
__global__ void fill_input_kernel(typename CudaDt<D>::storage* __restrict__ dst, uint64_t key,
                                  uint64_t start, uint64_t count) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t j = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < count;
       j += stride) {
    COCOVIZ_ST(dst, j) = cuda_input_element<D>(key, start + j);
  }
}

// --check's inputs (cocoviz_runtime.h, check_element): the runs of a rank's part, element j
// at global index run_index(j, run, row, base). Every value is exact in f32, so rounding it
// from f32 equals rounding it from f64.
template <DType D>
__global__ void check_fill_kernel(typename CudaDt<D>::storage* __restrict__ dst, uint64_t key,
                                  int64_t outer, int64_t run, int64_t row, int64_t base,
                                  bool nonnegative) {
  const int64_t n = outer * run;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    const uint64_t u = uniform_bits(key, run_index(j, run, row, base));
    if constexpr (Dt<D>::is_float) {
      COCOVIZ_ST(dst, j) = CudaDt<D>::store(static_cast<typename CudaDt<D>::compute>(check_float(u, nonnegative)));
    } else {
      COCOVIZ_ST(dst, j) = CudaDt<D>::store(check_int(u, nonnegative));
    }
  }
}

// ---------------------------------------------------------- packed access

// N consecutive elements moved as one access of up to 16 bytes (wider packs become
// several 16-byte accesses). A pointer qualifies when pack_aligned<N>(p); vectorized
// kernels check every packed pointer once and fall back to element-wise loops otherwise.
// Building with -DCOCOVIZ_SCALAR_ONLY (e.g. NVCC_APPEND_FLAGS=-DCOCOVIZ_SCALAR_ONLY make)
// makes every pointer fail the check, so the element-wise path runs everywhere.
template <class T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Pack {
  T v[N];
};

template <int N, class T>
__device__ inline bool pack_aligned(const T* p) {
#ifdef COCOVIZ_SCALAR_ONLY
  (void)p;
  return false;
#else
  return reinterpret_cast<uintptr_t>(p) % alignof(Pack<T, N>) == 0;
#endif
}

// The bits of one element (for assembling 32-bit words of a pack). Compiled by nvcc and by
// the emulation alike: the emulation's store_pack stores the words pack_part assembles, so
// the bit assembly behind the GPU's st.global.v4 is checked without a GPU (docs/codegen.md,
// "Every path exercised"); only the asm statement itself is nvcc's alone.
__device__ inline uint32_t elem_bits(__half a) { return __half_as_ushort(a); }
__device__ inline uint32_t elem_bits(__nv_bfloat16 a) { return __bfloat16_as_ushort(a); }
__device__ inline uint32_t elem_bits(int32_t a) { return static_cast<uint32_t>(a); }
__device__ inline uint64_t elem_bits(int64_t a) { return static_cast<uint64_t>(a); }
#ifdef COCOVIZ_EMULATION
__device__ inline uint32_t elem_bits(float a) {
  uint32_t u;
  std::memcpy(&u, &a, sizeof u);
  return u;
}
__device__ inline uint64_t elem_bits(double a) {
  uint64_t u;
  std::memcpy(&u, &a, sizeof u);
  return u;
}
#else
__device__ inline uint32_t elem_bits(float a) { return __float_as_uint(a); }
__device__ inline uint64_t elem_bits(double a) { return static_cast<uint64_t>(__double_as_longlong(a)); }
#endif

// Four 32-bit words: one 16-byte part of a pack, the operands of one st.global.v4.b32.
struct PackWords {
  uint32_t x, y, z, w;
};

// Part c (16 bytes) of a pack as four 32-bit words built from the elements' bits: stored
// as one st.v4 (a copy of the struct would be split per element). Elements are 2, 4 or 8
// bytes (packs of 1-byte elements are at most 8 bytes, never split into parts).
template <int N, class T>
__device__ inline PackWords pack_part(const Pack<T, N>& x, int c) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "16-byte parts of 2-, 4- or 8-byte elements");
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (sizeof(T) == 2) {
      w[q] = elem_bits(x.v[c * E + 2 * q]) | (elem_bits(x.v[c * E + 2 * q + 1]) << 16);
    } else if constexpr (sizeof(T) == 4) {
      w[q] = elem_bits(x.v[c * E + q]);
    } else {
      const uint64_t b = elem_bits(x.v[c * E + q / 2]);
      w[q] = static_cast<uint32_t>(q % 2 == 0 ? b : b >> 32);
    }
  }
  return PackWords{w[0], w[1], w[2], w[3]};
}

// Whole 16-byte parts move as uint4 / st.global.v4, so every part is one 128-bit load or
// store whatever the element type (a copy of the struct would be split per element, and
// the compiler does not always prove a peer pointer's alignment).
template <int N, class T>
__device__ inline Pack<T, N> load_pack(const T* p) {
#ifdef COCOVIZ_EMULATION
  ::cocoviz_emu::access(p, sizeof(Pack<T, N>), false);
  return *reinterpret_cast<const Pack<T, N>*>(p);
#else
  if constexpr (sizeof(Pack<T, N>) % 16 == 0) {
    Pack<T, N> x;
    const uint4* src = reinterpret_cast<const uint4*>(p);
    uint4* dst = reinterpret_cast<uint4*>(&x);
#pragma unroll
    for (int c = 0; c < static_cast<int>(sizeof x / 16); ++c) dst[c] = src[c];
    return x;
  } else {
    return *reinterpret_cast<const Pack<T, N>*>(p);
  }
#endif
}

template <int N, class T>
__device__ inline void store_pack(T* p, const Pack<T, N>& x) {
#ifdef COCOVIZ_EMULATION
  ::cocoviz_emu::access(p, sizeof(Pack<T, N>), true);
  if constexpr (sizeof(Pack<T, N>) % 16 == 0) {
    // the words the GPU's st.global.v4 below stores, as the GPU path assembles them
    for (int c = 0; c < static_cast<int>(sizeof x / 16); ++c) {
      const PackWords w = pack_part<N>(x, c);
      std::memcpy(static_cast<void*>(p + c * (16 / sizeof(T))), &w, sizeof w);  // the bytes, whatever T is
    }
  } else {
    *reinterpret_cast<Pack<T, N>*>(p) = x;
  }
#else
  if constexpr (sizeof(Pack<T, N>) % 16 == 0) {
    // one st.global.v4 per part: device memory, local or a peer's (LSA) window
#pragma unroll
    for (int c = 0; c < static_cast<int>(sizeof x / 16); ++c) {
      const PackWords w = pack_part<N>(x, c);
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                   :
                   : "l"(__cvta_generic_to_global(p + c * (16 / sizeof(T)))), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                   : "memory");
    }
  } else {
    *reinterpret_cast<Pack<T, N>*>(p) = x;
  }
#endif
}

// N-element packs of every peer's window: all of `peer[s] + offset` aligned to the pack.
template <int N, int G, class T>
__device__ inline bool peers_aligned(T* const (&peer)[G], int64_t offset) {
  bool ok = true;
#pragma unroll
  for (int s = 0; s < G; ++s) ok = ok && pack_aligned<N>(peer[s] + offset);
  return ok;
}

// ------------------------------------------------------- multimem (NVLS)

// The emulation reports a multimem operation with its caller's file:line (GCC's builtins as
// default arguments give the call site); under nvcc the helpers take no such arguments.
#ifdef COCOVIZ_EMULATION
#define COCOVIZ_CALLER , const char *caller_file = __builtin_FILE(), int caller_line = __builtin_LINE()
#define COCOVIZ_CALLER_ARGS , caller_file, caller_line
#else
#define COCOVIZ_CALLER
#define COCOVIZ_CALLER_ARGS
#endif

// fence.proxy.alias: orders this thread's earlier accesses through one mapping of memory
// with its later accesses through another (CUDA programming guide, virtual aliasing; PTX
// ISA 7.5, sm_70). The multimem kernels issue it after reaching peers' windows through
// their unicast mappings, before the multimem barrier's arrive goes through the multicast
// one.
__device__ inline void fence_proxy_alias() {
#ifdef COCOVIZ_EMULATION
  ::cocoviz_emu::fence_proxy_alias();
#else
  asm volatile("fence.proxy.alias;" ::: "memory");
#endif
}

// multimem.ld_reduce.add: the sum over every LSA peer of the pack at a multimem address
// (ncclGetLsaMultimemPointer), reduced by the NVSwitch: f32 in f32, f16/bf16 accumulated in
// f32 (.acc::f32) and rounded once. multimem.st: one store that reaches every peer's window.
// Both move 16 bytes per instruction; a wider pack is several. sm_90 and later only: the
// host runs the multimem variants only where NCCL reports multimem support.
template <class T>
struct MultimemAdd;
template <>
struct MultimemAdd<float> {
  static constexpr int kind = 0;
};
template <>
struct MultimemAdd<__half> {
  static constexpr int kind = 1;
};
template <>
struct MultimemAdd<__nv_bfloat16> {
  static constexpr int kind = 2;
};

template <int N, class T>
__device__ inline Pack<T, N> multimem_ld_reduce_add(const T* mc COCOVIZ_CALLER) {
  static_assert(sizeof(Pack<T, N>) % 16 == 0, "multimem accesses move 16 bytes");
  Pack<T, N> r;
#ifdef COCOVIZ_EMULATION
  ::cocoviz_emu::multimem_ld_reduce_add(mc, sizeof r, MultimemAdd<T>::kind, &r COCOVIZ_CALLER_ARGS);
#else
  uint32_t* out = reinterpret_cast<uint32_t*>(&r);
#pragma unroll
  for (int c = 0; c < static_cast<int>(sizeof r / 16); ++c) {
    const char* a = reinterpret_cast<const char*>(mc) + 16 * c;
    uint32_t* o = out + 4 * c;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (MultimemAdd<T>::kind == 0) {
      float* f = reinterpret_cast<float*>(o);
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
                   : "l"(__cvta_generic_to_global(a))
                   : "memory");
    } else if constexpr (MultimemAdd<T>::kind == 1) {
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2 {%0, %1, %2, %3}, [%4];"
                   : "=r"(o[0]), "=r"(o[1]), "=r"(o[2]), "=r"(o[3])
                   : "l"(__cvta_generic_to_global(a))
                   : "memory");
    } else {
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2 {%0, %1, %2, %3}, [%4];"
                   : "=r"(o[0]), "=r"(o[1]), "=r"(o[2]), "=r"(o[3])
                   : "l"(__cvta_generic_to_global(a))
                   : "memory");
    }
#else
    (void)a;
    (void)o;
    __trap();
#endif
  }
#endif
  return r;
}

template <int N, class T>
__device__ inline void multimem_st(T* mc, const Pack<T, N>& x COCOVIZ_CALLER) {
  static_assert(sizeof(Pack<T, N>) % 16 == 0, "multimem accesses move 16 bytes");
#ifdef COCOVIZ_EMULATION
  ::cocoviz_emu::multimem_st(mc, &x, sizeof x COCOVIZ_CALLER_ARGS);
#else
  const uint32_t* in = reinterpret_cast<const uint32_t*>(&x);
#pragma unroll
  for (int c = 0; c < static_cast<int>(sizeof x / 16); ++c) {
    char* a = reinterpret_cast<char*>(mc) + 16 * c;
    const float* v = reinterpret_cast<const float*>(in + 4 * c);  // bits move unchanged
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(__cvta_generic_to_global(a)), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
                 : "memory");
#else
    (void)a;
    (void)v;
    __trap();
#endif
  }
#endif
}

// ------------------------------------------------------------- error checks

inline std::string nccl_error_detail(ncclResult_t r) {
  std::string detail = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') detail += std::string(" (") + last + ")";
  return detail;
}

}  // namespace cocoviz

// CHECK_CUDA("stage", cudaMemcpyAsync(...)) and friends: on failure, print the call, the
// file:line and the stage, then abort every rank.
#define CHECK_CUDA(stage, ...)                                                              \
  do {                                                                                      \
    COCOVIZ_SITE((stage), #__VA_ARGS__);                                                    \
    const cudaError_t cocoviz_err_ = (__VA_ARGS__);                                         \
    if (cocoviz_err_ != cudaSuccess) {                                                      \
      ::cocoviz::check_failed("CUDA", #__VA_ARGS__, cudaGetErrorString(cocoviz_err_),       \
                              (stage), __FILE__, __LINE__);                                 \
    }                                                                                       \
  } while (0)

#define CHECK_NCCL(stage, ...)                                                              \
  do {                                                                                      \
    COCOVIZ_SITE((stage), #__VA_ARGS__);                                                    \
    const ncclResult_t cocoviz_res_ = (__VA_ARGS__);                                        \
    if (cocoviz_res_ != ncclSuccess) {                                                      \
      ::cocoviz::check_failed("NCCL", #__VA_ARGS__,                                         \
                              ::cocoviz::nccl_error_detail(cocoviz_res_).c_str(), (stage),  \
                              __FILE__, __LINE__);                                          \
    }                                                                                       \
  } while (0)

#define CHECK_CUBLAS(stage, ...)                                                            \
  do {                                                                                      \
    COCOVIZ_SITE((stage), #__VA_ARGS__);                                                    \
    const cublasStatus_t cocoviz_st_ = (__VA_ARGS__);                                       \
    if (cocoviz_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
      ::cocoviz::check_failed("cuBLAS", #__VA_ARGS__, cublasGetStatusString(cocoviz_st_),   \
                              (stage), __FILE__, __LINE__);                                 \
    }                                                                                       \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no image for this GPU).
#define CHECK_LAUNCH(stage, kernel_name)                                                    \
  do {                                                                                      \
    const cudaError_t cocoviz_err_ = cudaGetLastError();                                    \
    if (cocoviz_err_ != cudaSuccess) {                                                      \
      ::cocoviz::check_failed("CUDA", (std::string("launch of ") + (kernel_name)).c_str(),  \
                              cudaGetErrorString(cocoviz_err_), (stage), __FILE__,          \
                              __LINE__);                                                    \
    }                                                                                       \
  } while (0)

namespace cocoviz {

// Launches fill_input_kernel<D> for input `id` on `stream` (host-side key computation).
template <DType D>
inline void fill_input_async(typename CudaDt<D>::storage* dst, const char* id, uint64_t seed,
                             uint64_t start, uint64_t count, cudaStream_t stream,
                             const char* stage) {
  if (count == 0) return;
  const uint64_t blocks = (count + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  COCOVIZ_LAUNCH(fill_input_kernel<D>, grid, 256, 0, stream)(dst, key_for(id, seed), start, count);
  CHECK_LAUNCH(stage, "fill_input_kernel");
}

}  // namespace cocoviz

#endif  // COCOVIZ_RUNTIME_CUH_
