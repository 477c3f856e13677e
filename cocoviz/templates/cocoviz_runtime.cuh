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

template <int N, class T>
__device__ inline Pack<T, N> load_pack(const T* p) {
#ifdef COCOVIZ_EMULATION
  ::cocoviz_emu::access(p, sizeof(Pack<T, N>), false);
#endif
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <int N, class T>
__device__ inline void store_pack(T* p, const Pack<T, N>& x) {
#ifdef COCOVIZ_EMULATION
  ::cocoviz_emu::access(p, sizeof(Pack<T, N>), true);
#endif
  *reinterpret_cast<Pack<T, N>*>(p) = x;
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
