// emu_capture.cu — stream capture and CUDA graphs in cocoviz's emulation
// (tests/test_emulate_graphs.py builds it with `make emulate`'s flags and runs it on 2 ranks).
//   ./emu_capture rules     every capture rule below; prints "ok <rule>" for each
//   ./emu_capture hazard    a graph whose fork reads what its other branch writes, unordered
//   ./emu_capture mismatch  a captured allreduce whose count differs between the ranks
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kN = 64;
int g_rank = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what);
    std::exit(1);
  }
}

void expect_err(cudaError_t got, cudaError_t want, const char* what) {
  if (got != want) {
    std::fprintf(stderr, "rank %d: FAILED: %s: got %s, want %s\n", g_rank, what, cudaGetErrorName(got),
                 cudaGetErrorName(want));
    std::exit(1);
  }
}

__global__ void add_one(float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    COCOVIZ_ST(x, i) = COCOVIZ_LD(x, i) + 1.0f;
  }
}

__global__ void copy(float* dst, const float* src, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    COCOVIZ_ST(dst, i) = COCOVIZ_LD(src, i);
  }
}

std::vector<float> read(const float* x) {
  std::vector<float> h(kN);
  expect(cudaMemcpy(h.data(), x, sizeof(float) * kN, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy");
  return h;
}

void fill(float* x, float v) {
  std::vector<float> h(kN, v);
  expect(cudaMemcpy(x, h.data(), sizeof(float) * kN, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy");
}

struct World {
  ncclComm_t comm = nullptr;
  int size = 1;
  cudaStream_t s = nullptr, s2 = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  float* x = nullptr;
};

// A capture ended after a refused call: the error, then no graph, and the stream is usable.
void expect_invalidated(World& w, const char* what) {
  cudaGraph_t g = reinterpret_cast<cudaGraph_t>(&w);
  expect_err(cudaStreamEndCapture(w.s, &g), cudaErrorStreamCaptureInvalidated, what);
  expect(g == nullptr, "no graph from an invalidated capture");
  cudaStreamCaptureStatus st;
  expect(cudaStreamIsCapturing(w.s, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone, "capture ended");
  expect(cudaMemsetAsync(w.x, 0, sizeof(float) * kN, w.s) == cudaSuccess, "the stream runs again");
  expect(cudaStreamSynchronize(w.s) == cudaSuccess, "sync");
  std::printf("ok %s\n", what);
}

void rules(World& w) {
  // the recorded iteration: a kernel, a fork to s2 with an allreduce there, a join, a kernel
  fill(w.x, static_cast<float>(g_rank + 1));
  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  COCOVIZ_LAUNCH(add_one, 1, 32, 0, w.s)(w.x, kN);
  expect(cudaGetLastError() == cudaSuccess, "captured launch");
  expect(cudaEventRecord(w.fork, w.s) == cudaSuccess, "record fork");
  expect(cudaStreamWaitEvent(w.s2, w.fork, 0) == cudaSuccess, "s2 joins");
  cudaStreamCaptureStatus st;
  expect(cudaStreamIsCapturing(w.s2, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive, "s2 captures");
  expect(ncclAllReduce(w.x, w.x, kN, ncclFloat, ncclSum, w.comm, w.s2) == ncclSuccess, "captured allreduce");
  expect(cudaEventRecord(w.join, w.s2) == cudaSuccess, "record join");
  expect(cudaStreamWaitEvent(w.s, w.join, 0) == cudaSuccess, "join");
  COCOVIZ_LAUNCH(add_one, 2, 32, 0, w.s)(w.x, kN);
  cudaGraph_t graph = nullptr;
  expect(cudaStreamEndCapture(w.s, &graph) == cudaSuccess && graph != nullptr, "end");
  expect(read(w.x)[0] == static_cast<float>(g_rank + 1), "nothing ran during the capture");
  cudaGraphExec_t exec = nullptr;
  expect(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority) == cudaSuccess, "instantiate");
  expect(cudaGraphDestroy(graph) == cudaSuccess, "graph destroyed, its instance stays");
  const float sum0 = static_cast<float>(w.size * (w.size + 3) / 2);  // sum over ranks of rank + 2
  for (int it = 0; it < 2; ++it) expect(cudaGraphLaunch(exec, w.s) == cudaSuccess, "launch");
  expect(cudaStreamSynchronize(w.s) == cudaSuccess, "sync");
  const float once = sum0 + 1.0f, twice = (once + 1.0f) * static_cast<float>(w.size) + 1.0f;
  const std::vector<float> h = read(w.x);
  expect(h[0] == twice && h[kN - 1] == twice, "two launches ran the iteration twice");
  expect(cudaGraphExecDestroy(exec) == cudaSuccess, "exec destroyed");
  expect_err(cudaGraphLaunch(exec, w.s), cudaErrorInvalidResourceHandle, "launch of a destroyed graph");
  std::printf("ok replay\n");

  void* p = nullptr;
  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect_err(cudaMalloc(&p, 256), cudaErrorStreamCaptureUnsupported, "cudaMalloc during capture");
  expect_invalidated(w, "cudaMalloc");

  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin");
  COCOVIZ_LAUNCH(add_one, 1, 32, 0, w.s)(w.x, kN);
  expect_err(cudaStreamSynchronize(w.s), cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize during capture");
  COCOVIZ_LAUNCH(add_one, 1, 32, 0, w.s)(w.x, kN);
  expect_err(cudaGetLastError(), cudaErrorStreamCaptureInvalidated, "a launch into an invalidated capture");
  expect_invalidated(w, "cudaStreamSynchronize");

  std::vector<float> host(kN);
  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect_err(cudaMemcpy(host.data(), w.x, sizeof(float) * kN, cudaMemcpyDeviceToHost),
             cudaErrorStreamCaptureUnsupported, "cudaMemcpy during capture");
  expect_invalidated(w, "cudaMemcpy");

  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect_err(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize during capture");
  expect_invalidated(w, "cudaDeviceSynchronize");

  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect(cudaEventRecord(w.fork, w.s) == cudaSuccess, "record");
  expect_err(cudaEventSynchronize(w.fork), cudaErrorCapturedEvent, "cudaEventSynchronize of a captured event");
  cudaGraph_t g = nullptr;
  expect(cudaStreamEndCapture(w.s, &g) == cudaSuccess, "end");
  expect(cudaGraphDestroy(g) == cudaSuccess, "destroy");
  std::printf("ok cudaEventSynchronize\n");

  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect(cudaEventRecord(w.fork, w.s) == cudaSuccess, "record fork");
  expect(cudaStreamWaitEvent(w.s2, w.fork, 0) == cudaSuccess, "s2 joins");
  COCOVIZ_LAUNCH(add_one, 1, 32, 0, w.s2)(w.x, kN);
  expect_err(cudaStreamEndCapture(w.s, &g), cudaErrorStreamCaptureUnjoined, "a fork not joined back");
  expect(g == nullptr, "no graph");
  expect(cudaStreamIsCapturing(w.s2, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone, "s2 left the capture");
  std::printf("ok unjoined\n");

  expect(cudaEventRecord(w.join, w.s2) == cudaSuccess, "record outside capture");
  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect_err(cudaStreamWaitEvent(w.s, w.join, 0), cudaErrorStreamCaptureIsolation,
             "a capturing stream waits on an event recorded outside the capture");
  expect_invalidated(w, "isolation");

  // the legacy stream waits for blocking streams, so not while one of them captures
  cudaStream_t blocking = nullptr;
  expect(cudaStreamCreate(&blocking) == cudaSuccess, "stream");
  expect(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect_err(cudaMemsetAsync(w.x, 0, 4, nullptr), cudaErrorStreamCaptureImplicit, "the legacy stream during capture");
  expect_err(cudaStreamEndCapture(blocking, &g), cudaErrorStreamCaptureInvalidated, "legacy stream");
  expect(cudaStreamDestroy(blocking) == cudaSuccess, "stream");
  std::printf("ok legacy stream\n");

  expect_err(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported,
             "capture of the legacy stream");
  expect_err(cudaStreamEndCapture(w.s, &g), cudaErrorIllegalState, "end of a stream that does not capture");

  void* win_mem = nullptr;
  expect(ncclMemAlloc(&win_mem, 4096) == ncclSuccess, "ncclMemAlloc");
  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  ncclWindow_t win = nullptr;
  expect(ncclCommWindowRegister(w.comm, win_mem, 4096, &win, NCCL_WIN_COLL_SYMMETRIC) == ncclInvalidUsage,
         "ncclCommWindowRegister during capture");
  void* more = nullptr;
  expect(ncclMemAlloc(&more, 4096) == ncclInvalidUsage, "ncclMemAlloc during capture");
  expect_invalidated(w, "ncclCommWindowRegister");
  expect(ncclMemFree(win_mem) == ncclSuccess, "ncclMemFree");

  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeRelaxed) == cudaSuccess, "begin");
  expect(cudaMalloc(&p, 256) == cudaSuccess, "cudaMalloc in relaxed mode");
  expect(cudaStreamEndCapture(w.s, &g) == cudaSuccess && g != nullptr, "relaxed capture ends");
  expect(cudaGraphDestroy(g) == cudaSuccess && cudaFree(p) == cudaSuccess, "cleanup");
  std::printf("ok relaxed\n");
}

// s2 writes y while s reads it: both are in the graph, and nothing orders them.
// Ends w.s's capture, says "captured" (a problem found later is the launch's), launches
// the graph and waits for it.
void end_capture_and_launch(World& w) {
  cudaGraph_t g = nullptr;
  expect(cudaStreamEndCapture(w.s, &g) == cudaSuccess, "end");
  cudaGraphExec_t exec = nullptr;
  expect(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess, "instantiate");
  std::printf("captured\n");
  std::fflush(stdout);
  expect(cudaGraphLaunch(exec, w.s) == cudaSuccess, "launch");
  expect(cudaStreamSynchronize(w.s) == cudaSuccess, "sync");
}

void hazard(World& w) {
  float* y = nullptr;
  expect(cudaMalloc(&y, sizeof(float) * kN) == cudaSuccess, "cudaMalloc");
  fill(w.x, 1.0f);  // what the copy reads (an unwritten x is the emulation's initcheck report)
  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect(cudaEventRecord(w.fork, w.s) == cudaSuccess, "record fork");
  expect(cudaStreamWaitEvent(w.s2, w.fork, 0) == cudaSuccess, "fork");
  COCOVIZ_LAUNCH(copy, 1, 32, 0, w.s2)(y, w.x, kN);
  expect(cudaEventRecord(w.join, w.s2) == cudaSuccess, "record join");
  COCOVIZ_LAUNCH(add_one, 1, 32, 0, w.s)(y, kN);  // before the join: unordered with the copy
  expect(cudaStreamWaitEvent(w.s, w.join, 0) == cudaSuccess, "join");
  end_capture_and_launch(w);
}

void mismatch(World& w) {
  expect(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
  expect(ncclAllReduce(w.x, w.x, kN - g_rank, ncclFloat, ncclSum, w.comm, w.s) == ncclSuccess, "captured");
  end_capture_and_launch(w);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  World w;
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  ncclUniqueId id;
  if (g_rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  expect(ncclCommInitRank(&w.comm, w.size, id, g_rank) == ncclSuccess, "ncclCommInitRank");
  expect(cudaStreamCreateWithFlags(&w.s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  expect(cudaStreamCreateWithFlags(&w.s2, cudaStreamNonBlocking) == cudaSuccess, "stream");
  expect(cudaEventCreateWithFlags(&w.fork, cudaEventDisableTiming) == cudaSuccess, "event");
  expect(cudaEventCreateWithFlags(&w.join, cudaEventDisableTiming) == cudaSuccess, "event");
  expect(cudaMalloc(&w.x, sizeof(float) * kN) == cudaSuccess, "cudaMalloc");
  const char* what = argc > 1 ? argv[1] : "rules";
  if (std::strcmp(what, "hazard") == 0) {
    hazard(w);
  } else if (std::strcmp(what, "mismatch") == 0) {
    mismatch(w);
  } else {
    rules(w);
  }
  expect(cudaDeviceSynchronize() == cudaSuccess, "sync");
  expect(ncclCommDestroy(w.comm) == ncclSuccess, "ncclCommDestroy");
  MPI_Finalize();
  return 0;
}
