// emu_cross_comm.cu — NCCL operations on two communicators and two streams at once, for the
// emulation's adversarial order (tests/test_emulate_order.py builds it with `make
// emulate`'s flags and runs it on 4 ranks under COCOVIZ_EMU_ORDER=adversarial).
//   ./emu_cross_comm pipeline   the overlapped pipeline's pattern on 2 stages x 2 tp ranks:
//                               stage 0 reduce-scatters chunk k on its tp communicator
//                               (stream A) and sends it to stage 1 on the world
//                               communicator (stream B, after an event); stage 1 receives
//                               (B) and all-gathers (A, after an event). Every rank issues
//                               its NCCL calls in one order, so it is deadlock-free exactly
//                               when NCCL starts them in that order
//                               (NCCL_LAUNCH_ORDER_IMPLICIT=1); prints "ok pipeline".
//   ./emu_cross_comm opposite   two all-reduces on two communicators of all 4 ranks, on two
//                               streams, issued in opposite orders by even and odd ranks: a
//                               deadlock whatever the launch order.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kChunks = 4;
constexpr int kN = 16;  // elements per rank and chunk after the reduce-scatter
int g_rank = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what);
    std::exit(1);
  }
}

void nccl_ok(ncclResult_t r, const char* what) { expect(r == ncclSuccess, what); }
void cuda_ok(cudaError_t e, const char* what) { expect(e == cudaSuccess, what); }

__global__ void scale(float* x, float by, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    COCOVIZ_ST(x, i) = COCOVIZ_LD(x, i) * by;
  }
}

float* device(size_t n, float v) {
  void* p = nullptr;
  cuda_ok(cudaMalloc(&p, sizeof(float) * n), "cudaMalloc");
  std::vector<float> h(n, v);
  cuda_ok(cudaMemcpy(p, h.data(), sizeof(float) * n, cudaMemcpyHostToDevice), "cudaMemcpy");
  return static_cast<float*>(p);
}

std::vector<float> host(const float* p, size_t n) {
  std::vector<float> h(n);
  cuda_ok(cudaMemcpy(h.data(), p, sizeof(float) * n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

// Stage s = rank / 2, tp index t = rank % 2. Stage 0: x (2 * kN per chunk, all ones times
// (t + 1)) reduce-scatters to 3 per element, is sent to the same tp rank of stage 1, which
// doubles it (a kernel) and all-gathers it: 6 everywhere.
void pipeline(ncclComm_t world, ncclComm_t group, int rank) {
  const int stage = rank / 2, t = rank % 2;
  cudaStream_t a, b;
  cuda_ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream");
  std::vector<cudaEvent_t> ev(kChunks);
  for (auto& e : ev) cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  float* x = device(2 * kN * kChunks, static_cast<float>(t + 1));
  float* shard = device(kN * kChunks, 0);
  float* out = device(2 * kN * kChunks, 0);
  for (int k = 0; k < kChunks; ++k) {
    if (stage == 0) {
      nccl_ok(ncclReduceScatter(x + 2 * kN * k, shard + kN * k, kN, ncclFloat32, ncclSum, group, a), "rs");
      cuda_ok(cudaEventRecord(ev[k], a), "record");
      cuda_ok(cudaStreamWaitEvent(b, ev[k], 0), "wait");
      nccl_ok(ncclSend(shard + kN * k, kN, ncclFloat32, rank + 2, world, b), "send");
    } else {
      nccl_ok(ncclRecv(shard + kN * k, kN, ncclFloat32, rank - 2, world, b), "recv");
      COCOVIZ_LAUNCH(scale, 1, 32, 0, b)(shard + kN * k, 2.0f, kN);
      cuda_ok(cudaEventRecord(ev[k], b), "record");
      cuda_ok(cudaStreamWaitEvent(a, ev[k], 0), "wait");
      nccl_ok(ncclAllGather(shard + kN * k, out + 2 * kN * k, kN, ncclFloat32, group, a), "ag");
    }
  }
  cuda_ok(cudaDeviceSynchronize(), "sync");
  if (stage == 1) {
    for (float v : host(out, 2 * kN * kChunks)) expect(v == 6.0f, "gathered value");
  }
  std::printf("ok pipeline\n");
  std::fflush(stdout);
}

void opposite(ncclComm_t one, ncclComm_t two, int rank) {
  cudaStream_t a, b;
  cuda_ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream");
  float* x = device(kN, 1);
  float* y = device(kN, 1);
  if (rank % 2 == 0) {
    nccl_ok(ncclAllReduce(x, x, kN, ncclFloat32, ncclSum, one, a), "allreduce one");
    nccl_ok(ncclAllReduce(y, y, kN, ncclFloat32, ncclSum, two, b), "allreduce two");
  } else {
    nccl_ok(ncclAllReduce(y, y, kN, ncclFloat32, ncclSum, two, b), "allreduce two");
    nccl_ok(ncclAllReduce(x, x, kN, ncclFloat32, ncclSum, one, a), "allreduce one");
  }
  cuda_ok(cudaDeviceSynchronize(), "sync");
  std::printf("ok opposite\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  expect(argc == 2 && size == 4, "usage: mpiexec -n 4 emu_cross_comm pipeline|opposite");
  ncclUniqueId id;
  if (g_rank == 0) nccl_ok(ncclGetUniqueId(&id), "id");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t world = nullptr, other = nullptr;
  nccl_ok(ncclCommInitRank(&world, size, id, g_rank), "init");
  if (std::strcmp(argv[1], "pipeline") == 0) {
    nccl_ok(ncclCommSplit(world, g_rank / 2, g_rank % 2, &other, nullptr), "split");
    pipeline(world, other, g_rank);
  } else {
    expect(std::strcmp(argv[1], "opposite") == 0, "mode: pipeline or opposite");
    nccl_ok(ncclCommSplit(world, 0, g_rank, &other, nullptr), "split");
    opposite(world, other, g_rank);
  }
  nccl_ok(ncclCommDestroy(other), "destroy");
  nccl_ok(ncclCommDestroy(world), "destroy");
  MPI_Finalize();
  return 0;
}
