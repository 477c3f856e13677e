// cuda.cpp — cocoviz emulation of the CUDA runtime API calls that emitted programs make.
// Argument checks follow the runtime: an invalid pointer, size, direction or handle returns
// the runtime's error code (the program's CHECK_CUDA then reports the call and aborts);
// the emulation adds a note saying what was wrong. See include/cocoviz_emu/core.h.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

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
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
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
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
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
  if (emu::refuse_unsafe("cudaDeviceSynchronize")) return cudaErrorStreamCaptureUnsupported;
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
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: {
      long n = 132;  // an H100/H200
      if (emu::env_per_rank("COCOVIZ_EMU_SM_COUNT", &n) && n < 1) {
        emu::fail("emulation", "COCOVIZ_EMU_SM_COUNT: this rank's SM count " + std::to_string(n) + " is below 1");
      }
      *value = static_cast<int>(n);
      return cudaSuccess;
    }
    case cudaDevAttrComputeCapabilityMajor:  // an H100/H200: 9.0
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  if (emu::refuse_unsafe("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  if (bytes > (size_t{1} << 40)) return invalid(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes: more than the emulation allows (1 TiB)");
  *p = emu::device_alloc(bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  if (emu::refuse_unsafe("cudaFree")) return cudaErrorStreamCaptureUnsupported;
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
  emu::Stream* st = emu::resolve_stream(s, "cudaMemsetAsync");
  return static_cast<cudaError_t>(emu::enqueue(st, [st, p, value, bytes] {
    emu::Op op(st, "cudaMemset of " + std::to_string(bytes) + " bytes");
    emu::access(p, bytes, true);
    std::memset(p, value, bytes);
  }));
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
  emu::Stream* st = emu::resolve_stream(s, "cudaMemcpyAsync");
  if (!sd && emu::deferring() && emu::capture_status(st) == 0) {
    // deferred: the host's bytes as they are now (CUDA stages pageable memory at the call)
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    return static_cast<cudaError_t>(emu::enqueue(st, [st, dst, staged, bytes, dd] {
      emu::Op op(st, "cudaMemcpy of " + std::to_string(bytes) + " bytes");
      if (dd) emu::access(dst, bytes, true);
      std::memmove(dst, staged->data(), bytes);
    }));
  }
  return static_cast<cudaError_t>(emu::enqueue(st, [st, dst, src, bytes, sd, dd] {
    emu::Op op(st, "cudaMemcpy of " + std::to_string(bytes) + " bytes");
    if (sd) emu::access(src, bytes, false);
    if (dd) emu::access(dst, bytes, true);
    std::memmove(dst, src, bytes);
  }));
}

// cudaMemcpy: on the legacy default stream, and the host waits for it.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (emu::refuse_unsafe("cudaMemcpy (synchronous)")) return cudaErrorStreamCaptureUnsupported;
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
  emu::Stream* st = emu::resolve_stream(s, "cudaStreamSynchronize");
  if (emu::refuse_on_capturing(st, "cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
  if (st == emu::legacy_stream() && emu::refuse_unsafe("cudaStreamSynchronize of the legacy stream")) {
    return cudaErrorStreamCaptureImplicit;
  }
  emu::host_sync_stream(st);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  if (!emu::stream_valid(s) || !emu::event_valid(e)) return invalid(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent with a destroyed or unknown stream or event");
  if (flags != 0 && flags != 1) return cudaErrorInvalidValue;
  return static_cast<cudaError_t>(emu::stream_wait_event(emu::resolve_stream(s, "cudaStreamWaitEvent"), e));
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
  return static_cast<cudaError_t>(emu::event_record(e, emu::resolve_stream(s, "cudaEventRecord")));
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!emu::event_valid(e)) return invalid(cudaErrorInvalidResourceHandle, "cudaEventSynchronize of a destroyed or unknown event");
  if (emu::event_captured(e)) return invalid(cudaErrorCapturedEvent, "cudaEventSynchronize of an event recorded in an ongoing stream capture");
  emu::host_sync_event(e);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!emu::event_valid(e)) return cudaErrorInvalidResourceHandle;
  if (emu::event_captured(e)) return invalid(cudaErrorCapturedEvent, "cudaEventQuery of an event recorded in an ongoing stream capture");
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

// ------------------------------------------------------------ stream capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (!emu::stream_valid(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture of a destroyed or unknown stream");
  if (s == nullptr) return invalid(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture of the legacy default stream");
  const char* v = std::getenv("COCOVIZ_EMU_CAPTURE");
  if (v != nullptr && std::strcmp(v, "0") == 0) {
    return invalid(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture refused: COCOVIZ_EMU_CAPTURE=0");
  }
  const int e = emu::capture_begin(s, static_cast<int>(mode));
  if (e == cudaErrorIllegalState) return invalid(cudaErrorIllegalState, "cudaStreamBeginCapture of a stream that already captures");
  return static_cast<cudaError_t>(e);
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (graph == nullptr) return cudaErrorInvalidValue;
  *graph = nullptr;
  if (!emu::stream_valid(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture of a destroyed or unknown stream");
  if (s == nullptr) return cudaErrorIllegalState;
  const int e = emu::capture_end(s, graph);
  if (e == cudaErrorIllegalState) return invalid(cudaErrorIllegalState, "cudaStreamEndCapture of a stream that does not capture");
  return static_cast<cudaError_t>(e);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return cudaErrorInvalidValue;
  if (!emu::stream_valid(s)) return cudaErrorInvalidResourceHandle;
  *status = s == nullptr ? cudaStreamCaptureStatusNone : static_cast<cudaStreamCaptureStatus>(emu::capture_status(s));
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (exec == nullptr) return cudaErrorInvalidValue;
  if (!emu::graph_valid(graph)) return invalid(cudaErrorInvalidValue, "cudaGraphInstantiate of a destroyed or unknown graph");
  if ((flags & ~static_cast<unsigned long long>(15)) != 0) return invalid(cudaErrorInvalidValue, "cudaGraphInstantiate: unknown flags " + std::to_string(flags));
  *exec = emu::graph_instantiate(graph);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!emu::graph_exec_valid(exec)) return invalid(cudaErrorInvalidResourceHandle, "cudaGraphLaunch of a destroyed or unknown executable graph");
  if (!emu::stream_valid(s)) return invalid(cudaErrorInvalidResourceHandle, "cudaGraphLaunch on a destroyed or unknown stream");
  return static_cast<cudaError_t>(emu::graph_launch(exec, emu::resolve_stream(s, "cudaGraphLaunch")));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (!emu::graph_exec_valid(exec) || !emu::graph_exec_destroy(exec)) return invalid(cudaErrorInvalidValue, "cudaGraphExecDestroy of a destroyed or unknown executable graph");
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (!emu::graph_valid(graph) || !emu::graph_destroy(graph)) return invalid(cudaErrorInvalidValue, "cudaGraphDestroy of a destroyed or unknown graph");
  return cudaSuccess;
}
