// cuda.cpp — cocoviz emulation of the CUDA runtime API calls that emitted programs make.
// Argument checks follow the runtime: an invalid pointer, size, direction or handle returns
// the runtime's error code (the program's CHECK_CUDA then reports the call and aborts);
// the emulation adds a note saying what was wrong. See include/cocoviz_emu/core.h.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace emu = ::cocoviz_emu;

namespace {

int g_device = 0;

int device_count() {
  const char* v = std::getenv("COCOVIZ_EMU_DEVICES");
  const int n = v != nullptr ? std::atoi(v) : 1;
  return n > 0 ? n : 1;
}

cudaError_t invalid(cudaError_t code, const std::string& why) {
  emu::note(why + " (at " + emu::site_text(emu::site()) + ")");
  return code;
}

// Checks a device range for an API call; returns false (with a note) where the runtime
// would return cudaErrorInvalidValue, fails loudly for a range that only partly fits.
bool device_range(const void* p, size_t n, const char* what) {
  const emu::Alloc* a = emu::find_alloc(p);
  if (a == nullptr) return false;
  emu::check_range(p, n, what);
  return true;
}

}  // namespace

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() { return static_cast<cudaError_t>(emu::take_last_error()); }

cudaError_t cudaPeekAtLastError() {
  const int e = emu::take_last_error();
  emu::set_last_error(e);
  return static_cast<cudaError_t>(e);
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return invalid(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): the emulation has " + std::to_string(device_count()) + " device(s) per rank");
  g_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = g_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  emu::host_sync_device();
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return cudaErrorInvalidValue;
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  const char* v = std::getenv("COCOVIZ_EMU_SM_COUNT");
  const int n = v != nullptr ? std::atoi(v) : 0;
  *value = n > 0 ? n : 132;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  if (bytes > (size_t{1} << 40)) return invalid(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes: more than the emulation allows (1 TiB)");
  *p = emu::device_alloc(bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  emu::host_sync_device();  // cudaFree synchronizes the device
  if (!emu::device_free(p)) {
    const emu::Alloc* a = emu::find_alloc(p);
    if (a != nullptr && a->freed) return invalid(cudaErrorInvalidValue, "cudaFree of memory already freed by " + a->freed_at);
    if (a != nullptr && a->kind != emu::MemKind::device) return invalid(cudaErrorInvalidValue, "cudaFree of memory from ncclMemAlloc (free it with ncclMemFree)");
    return invalid(cudaErrorInvalidValue, "cudaFree of a pointer that is not the start of a cudaMalloc allocation");
  }
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (!emu::stream_valid(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaMemsetAsync on a destroyed or unknown stream");
  if (bytes == 0) return cudaSuccess;
  if (!device_range(p, bytes, "cudaMemset")) return invalid(cudaErrorInvalidValue, "cudaMemset of memory that is not device memory");
  emu::Op op(emu::resolve_stream(s, "cudaMemsetAsync"), "cudaMemset of " + std::to_string(bytes) + " bytes");
  emu::access(p, bytes, true);
  std::memset(p, value, bytes);
  return cudaSuccess;
}

// cudaMemset is asynchronous on the legacy default stream: not ordered with work on
// non-blocking streams.
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes, nullptr); }

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (!emu::stream_valid(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync on a destroyed or unknown stream");
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  const bool dd = emu::is_device_pointer(dst), sd = emu::is_device_pointer(src);
  const bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyDefault && (dd != want_dd || sd != want_sd)) {
    static const char* names[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
    return invalid(cudaErrorInvalidValue, std::string("cudaMemcpy") + names[kind] + " with a " + (dd ? "device" : "host") + " destination and a " + (sd ? "device" : "host") + " source");
  }
  emu::Op op(emu::resolve_stream(s, "cudaMemcpyAsync"), "cudaMemcpy of " + std::to_string(bytes) + " bytes");
  if (sd) emu::access(src, bytes, false);
  if (dd) emu::access(dst, bytes, true);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

// cudaMemcpy: on the legacy default stream, and the host waits for it.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  emu::host_sync_stream(emu::legacy_stream());
  return e;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority) {
  if (s == nullptr || (flags & ~1u) != 0) return cudaErrorInvalidValue;
  *s = emu::stream_create((flags & cudaStreamNonBlocking) != 0, priority);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) { return cudaStreamCreateWithPriority(s, flags, 0); }
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithPriority(s, 0, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr || !emu::stream_destroy(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the legacy stream, or of a destroyed or unknown stream");
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!emu::stream_valid(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize of a destroyed or unknown stream");
  emu::host_sync_stream(emu::resolve_stream(s, "cudaStreamSynchronize"));
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  if (!emu::stream_valid(s) || !emu::event_valid(e)) return invalid(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent with a destroyed or unknown stream or event");
  if (flags != 0 && flags != 1) return cudaErrorInvalidValue;
  emu::stream_wait_event(emu::resolve_stream(s, "cudaStreamWaitEvent"), e);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr || (flags & ~7u) != 0) return cudaErrorInvalidValue;
  *e = emu::event_create((flags & cudaEventDisableTiming) == 0);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!emu::event_valid(e) || !emu::event_destroy(e)) return invalid(cudaErrorInvalidResourceHandle, "cudaEventDestroy of a destroyed or unknown event");
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!emu::event_valid(e) || !emu::stream_valid(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaEventRecord with a destroyed or unknown event or stream");
  emu::event_record(e, emu::resolve_stream(s, "cudaEventRecord"));
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!emu::event_valid(e)) return invalid(cudaErrorInvalidResourceHandle, "cudaEventSynchronize of a destroyed or unknown event");
  emu::host_sync_event(e);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!emu::event_valid(e)) return cudaErrorInvalidResourceHandle;
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return cudaErrorInvalidValue;
  if (!emu::event_valid(start) || !emu::event_valid(end)) return cudaErrorInvalidResourceHandle;
  if (!emu::event_timing(start) || !emu::event_timing(end)) return invalid(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event created with cudaEventDisableTiming");
  if (!emu::event_recorded(start) || !emu::event_recorded(end)) return invalid(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event that was never recorded");
  *ms = static_cast<float>(emu::event_time_ms(end) - emu::event_time_ms(start));
  return cudaSuccess;
}
