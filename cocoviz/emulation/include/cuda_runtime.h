// cuda_runtime.h — cocoviz emulation: the CUDA runtime API and kernel language that emitted
// programs use, on the host (cocoviz_emu/core.h explains the model). Not NVIDIA's header:
// only what cocoviz's generated code needs, with the runtime's argument checks.
#ifndef COCOVIZ_EMU_CUDA_RUNTIME_H_
#define COCOVIZ_EMU_CUDA_RUNTIME_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cocoviz_emu/core.h"

#define COCOVIZ_EMULATION 1

// ------------------------------------------------------------ kernel language
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// threadIdx.x etc. read the running fiber's position.
#define threadIdx (::cocoviz_emu::g_pos.thread)
#define blockIdx (::cocoviz_emu::g_pos.block)
#define blockDim (::cocoviz_emu::g_pos.block_dim)
#define gridDim (::cocoviz_emu::g_pos.grid_dim)

inline void __syncthreads() { ::cocoviz_emu::block_barrier(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}

// Atomics: a block's threads are fibers on one host thread, so a read-modify-write is
// atomic as it is. Atomics of concurrent blocks do not race with each other, so the
// happens-before check records one as a read: it is still ordered against plain writes
// before and after it (a later unordered plain read of its result is not reported); the
// intra-block racecheck leaves atomics out.
namespace cocoviz_emu {
template <class T, class F>
inline T atomic_rmw(T* p, F f) {
  access_atomic(p, sizeof(T));
  const T old = *p;
  *p = f(old);
  return old;
}
}  // namespace cocoviz_emu
template <class T>
inline T atomicAdd(T* p, T v) {
  return ::cocoviz_emu::atomic_rmw(p, [v](T o) { return o + v; });
}
template <class T>
inline T atomicMax(T* p, T v) {
  return ::cocoviz_emu::atomic_rmw(p, [v](T o) { return o > v ? o : v; });
}
template <class T>
inline T atomicMin(T* p, T v) {
  return ::cocoviz_emu::atomic_rmw(p, [v](T o) { return o < v ? o : v; });
}
template <class T>
inline T atomicExch(T* p, T v) {
  return ::cocoviz_emu::atomic_rmw(p, [v](T) { return v; });
}

// ------------------------------------------------------------------ types
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
};
typedef cudaError_t cudaError;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

typedef enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16BF = 14,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_64I = 24,
} cudaDataType;

typedef ::cocoviz_emu::Stream* cudaStream_t;
typedef ::cocoviz_emu::Event* cudaEvent_t;
typedef ::cocoviz_emu::Graph* cudaGraph_t;
typedef ::cocoviz_emu::GraphExec* cudaGraphExec_t;

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaGraphInstantiateFlags {
  cudaGraphInstantiateFlagAutoFreeOnLaunch = 1,
  cudaGraphInstantiateFlagUpload = 2,
  cudaGraphInstantiateFlagDeviceLaunch = 4,
  cudaGraphInstantiateFlagUseNodePriority = 8,
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaStreamLegacy (static_cast<cudaStream_t>(nullptr))

// ------------------------------------------------------------- runtime API
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest);
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};
// cudaDevAttrMultiProcessorCount: COCOVIZ_EMU_SM_COUNT (default 132, an H100/H200), one
// value or one per rank ("132,114": rank r takes entry r mod the count); the compute
// capability is 9.0 (an H100/H200).
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);

cudaError_t cudaMalloc(void** p, size_t bytes);
template <class T>
inline cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// Stream capture and graphs (CUDA 12+ signatures). While a stream captures, what is enqueued
// on it is recorded, not run; cudaGraphLaunch runs it again (cocoviz_emu/core.h).
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

// ------------------------------------------------------------ kernel launch
namespace cocoviz_emu {
inline Dim3 to_dim3(dim3 d) { return Dim3{d.x, d.y, d.z}; }
inline Dim3 to_dim3(long long n) {
  return Dim3{n < 0 ? 0u : (n > 0xffffffffLL ? 0xffffffffu : static_cast<unsigned>(n)), 1, 1};
}

template <class F>
struct Launch {
  const char* name;
  const char* file;
  int line;
  Dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  F fn;
  template <class... A>
  void operator()(A... args) const {
    F f = fn;
    launch_kernel(name, file, line, grid, block, smem, stream, [f, args...]() { f(args...); });
  }
};
template <class F, class G, class B>
inline Launch<F> make_launch(const char* name, const char* file, int line, F fn, G grid,
                             B block, size_t smem, cudaStream_t s) {
  return Launch<F>{name, file, line, to_dim3(grid), to_dim3(block), smem, s, fn};
}
inline Dim3 to_dim3(int n) { return to_dim3(static_cast<long long>(n)); }
inline Dim3 to_dim3(unsigned n) { return to_dim3(static_cast<long long>(n)); }
inline Dim3 to_dim3(long n) { return to_dim3(static_cast<long long>(n)); }
inline Dim3 to_dim3(unsigned long n) { return to_dim3(static_cast<long long>(n)); }
}  // namespace cocoviz_emu

// COCOVIZ_LAUNCH(kernel, grid, block, smem, stream)(args...): kernel<<<grid, block, smem,
// stream>>>(args...) under nvcc (cocoviz_runtime.cuh), an emulated launch here.
#define COCOVIZ_LAUNCH(kernel, grid, block, smem, stream) \
  ::cocoviz_emu::make_launch(#kernel, __FILE__, __LINE__, &kernel, (grid), (block), (smem), (stream))

// COCOVIZ_LD(p, i) / COCOVIZ_ST(p, i): element i of device array p, read / written by a
// kernel ((p)[i] under nvcc); here the access is checked and recorded first.
namespace cocoviz_emu {
template <class T>
inline T& at(T* p, int64_t i, bool write, const char* file, int line) {
  access(p + i, sizeof(T), write, file, line);
  return p[i];
}
template <class T>
inline const T& at(const T* p, int64_t i, bool write, const char* file, int line) {
  access(p + i, sizeof(T), write, file, line);
  return p[i];
}
}  // namespace cocoviz_emu
#define COCOVIZ_LD(p, i) (::cocoviz_emu::at((p), static_cast<int64_t>(i), false, __FILE__, __LINE__))
#define COCOVIZ_ST(p, i) (::cocoviz_emu::at((p), static_cast<int64_t>(i), true, __FILE__, __LINE__))

#endif  // COCOVIZ_EMU_CUDA_RUNTIME_H_
