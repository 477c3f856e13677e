// nccl_device.h — cocoviz emulation: the subset of NCCL's device API (2.28+) that emitted
// nccl-device programs use: device communicators with LSA barriers, and peer pointers
// into registered windows. Kernels run on the host (cuda_runtime.h), so the "device"
// functions are host functions. What is checked (src/nccl.cpp):
//   - ncclGetLsaPointer: a registered, live window; 0 <= peer < lsaSize; offset inside
//     that peer's window. Loads and stores through the pointer are checked by the core
//     against the peer's shadow memory (data races between ranks are reported).
//   - ncclLsaBarrierSession: a live device communicator, index < lsaBarrierCount, every
//     thread of the block takes part (it is a CTA-wide barrier), the same grid on every LSA
//     peer (block b waits for block b of each); a release order publishes this rank's
//     clock, an acquire order joins the LSA peers' clocks. A relaxed arrive publishes what
//     stream order put before the kernel, and a relaxed wait's peers' clocks join the
//     stream's when the kernel ends: kernel boundaries, which NCCL's own symmetric kernels
//     rely on (they open with a relaxed arrive and end with a relaxed wait); inside the
//     kernel a relaxed barrier orders execution only, as on the GPU.
//   - the multimem form (multimem = true, NCCL's NVLS kernels): a device communicator made
//     with lsaMultimem. A kernel that issues multimem operations synchronises through it
//     only: a unicast-form session in such a kernel is reported (its arrive is a fence and
//     unicast stores, which do not order multicast accesses), and so is a block's unicast
//     access of a peer's window not followed by fence.proxy.alias before a multimem arrive.
//   - one kernel at a time per device communicator: a kernel whose barriers run while an
//     earlier kernel on the same device communicator is not ordered before it (stream
//     order or an event) is reported (the barrier counters would be shared).
//   - multimem (ncclGetLsaMultimemPointer, multimem_ld_reduce_add, multimem_st): a device
//     communicator made with lsaMultimem, a live window of its communicator, 16-byte
//     aligned accesses inside every peer's window; each peer's bytes are checked and
//     recorded like a load (ld_reduce) or store (st) of that peer's memory.
// COCOVIZ_EMU_LSA_SIZE=n limits an LSA team to n consecutive ranks (default: all).
// COCOVIZ_EMU_DEVICE_API=0 (one value, or one per rank): no device API, as NCCL without
// symmetric memory — ncclCommQueryProperties says so, ncclCommWindowRegister returns
// ncclSuccess and a NULL window, ncclDevCommCreate fails with ncclInvalidUsage.
#ifndef COCOVIZ_EMU_NCCL_DEVICE_H_
#define COCOVIZ_EMU_NCCL_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cuda_runtime.h"
#include "nccl.h"

// libcu++'s cuda::memory_order (an alias of the standard one), unless a header defined it.
#ifndef COCOVIZ_EMU_CUDA_MEMORY_ORDER
#define COCOVIZ_EMU_CUDA_MEMORY_ORDER 1
namespace cuda {
using std::memory_order;
using std::memory_order_acq_rel;
using std::memory_order_acquire;
using std::memory_order_consume;
using std::memory_order_relaxed;
using std::memory_order_release;
using std::memory_order_seq_cst;
}  // namespace cuda
#endif

struct ncclTeamTagWorld {};
struct ncclTeamTagLsa {};
struct ncclTeamTagRail {};

// The threads of one CTA (block) acting together.
struct ncclCoopCta {
  int thread_rank() const {
    return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  }
  int size() const { return static_cast<int>(blockDim.x * blockDim.y * blockDim.z); }
  int num_threads() const { return size(); }
  void sync() { __syncthreads(); }
};

namespace cocoviz_emu {
struct NcclDevState;  // a device communicator's emulation state (src/nccl.cpp)
}

struct ncclDevComm {
  unsigned int magic;
  unsigned int version;
  int rank, nRanks;      // in the communicator
  int lsaRank, lsaSize;  // in this rank's LSA team (ranks whose memory it can load/store)
  int lsaBarrierCount;
  cocoviz_emu::NcclDevState* emu;  // emulation only: not in NVIDIA's struct
};
typedef struct ncclDevComm ncclDevComm_t;

// Requirements of a device communicator. The emulation provides LSA barriers only: the
// other counts must stay 0 and the lists NULL (ncclDevCommCreate says which is not).
typedef struct ncclDevCommRequirements {
  size_t size;
  unsigned int magic;
  unsigned int version;
  struct ncclDevResourceRequirements* resourceRequirementsList;
  struct ncclTeamRequirements* teamRequirementsList;
  bool lsaMultimem;
  int barrierCount;
  int lsaBarrierCount;
  int railGinBarrierCount;
  int lsaLLA2ABlockCount, lsaLLA2ASlotCount;
  bool ginForceEnable;
  int ginContextCount;
  int ginSignalCount;
  int ginCounterCount;
} ncclDevCommRequirements_t;

#define NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER                                              \
  {                                                                                         \
    sizeof(ncclDevCommRequirements_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, nullptr, nullptr, \
        false, 0, 0, 0, 0, 0, false, 4, 0, 0                                                \
  }

// What the communicator supports (ncclCommQueryProperties). The emulation reports the
// device API unless COCOVIZ_EMU_DEVICE_API=0, and multimem (NVLS) unless
// COCOVIZ_EMU_MULTIMEM=0 (each one value, or one per rank).
typedef struct ncclCommProperties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
  bool deviceApiSupport;
  bool multimemSupport;
} ncclCommProperties_t;

#define NCCL_COMM_PROPERTIES_INITIALIZER \
  { sizeof(ncclCommProperties_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, 0, 0, 0, 0, false, false }

ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);

// Collective over the communicator's ranks. lsaMultimem (where multimem is supported) makes
// ncclGetLsaMultimemPointer usable with the device communicator.
ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                               ncclDevComm_t* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm);

// Host-side query: the address of byte `offset` of LSA peer `lsaRank`'s part of `window`.
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                     void** outPtr);

// Device side: byte `offset` of LSA peer `peer`'s part of window `w` (this rank's own part
// for ncclGetLocalPointer).
void* ncclGetLsaPointer(ncclWindow_t w, size_t offset, int peer);
void* ncclGetLocalPointer(ncclWindow_t w, size_t offset);

// Device side: the multimem (NVLS multicast) address of byte `offset` of window `w` on the
// LSA team of a device communicator created with lsaMultimem. Plain loads and stores
// through it fault (the range is mapped without access); multimem_ld_reduce_add and
// multimem_st of cocoviz_emu (cocoviz_runtime.cuh's multimem helpers) act on every LSA
// peer's window at that offset.
void* ncclGetLsaMultimemPointer(ncclWindow_t w, size_t offset, ncclDevComm const& comm);

namespace cocoviz_emu {
// Validates a session's device communicator, barrier index and form (fails otherwise);
// `file`/`line`: where the kernel opens it.
NcclDevState* nccl_lsa_barrier_open(const ncclDevComm& comm, uint32_t index, bool multimem,
                                    const char* file, int line);
// Run once per block, while every thread of it waits (block_barrier's at_release).
void nccl_lsa_barrier_arrive(NcclDevState* s, uint32_t index, bool release, bool multimem);
void nccl_lsa_barrier_wait(NcclDevState* s, uint32_t index, bool acquire);

inline bool releases(std::memory_order o) {
  return o == std::memory_order_release || o == std::memory_order_acq_rel ||
         o == std::memory_order_seq_cst;
}
inline bool acquires(std::memory_order o) {
  return o == std::memory_order_acquire || o == std::memory_order_consume ||
         o == std::memory_order_acq_rel || o == std::memory_order_seq_cst;
}
}  // namespace cocoviz_emu

// A CTA's session on LSA barrier `index` of a device communicator: arrive, wait, or sync
// (both) with the same barrier of every LSA peer. Every thread of the block calls each.
template <typename Coop>
struct ncclLsaBarrierSession {
  static_assert(std::is_same<Coop, ncclCoopCta>::value,
                "the cocoviz emulation implements CTA-wide LSA barriers (ncclCoopCta) only");

  // (file, line: the caller's, for reports; NVIDIA's constructor has no such parameters)
  ncclLsaBarrierSession(Coop, ncclDevComm const& comm, ncclTeamTagLsa, uint32_t index,
                        bool multimem = false, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE())
      : s_(cocoviz_emu::nccl_lsa_barrier_open(comm, index, multimem, file, line)),
        index_(index),
        multimem_(multimem) {}
  ncclLsaBarrierSession(ncclLsaBarrierSession const&) = delete;
  ncclLsaBarrierSession& operator=(ncclLsaBarrierSession const&) = delete;

  void arrive(Coop, cuda::memory_order order) {
    cocoviz_emu::block_barrier([this, order] {
      cocoviz_emu::nccl_lsa_barrier_arrive(s_, index_, cocoviz_emu::releases(order), multimem_);
    });
  }
  void wait(Coop, cuda::memory_order order) {
    cocoviz_emu::block_barrier([this, order] {
      cocoviz_emu::nccl_lsa_barrier_wait(s_, index_, cocoviz_emu::acquires(order));
    });
  }
  void sync(Coop, cuda::memory_order order) {
    cocoviz_emu::block_barrier([this, order] {
      cocoviz_emu::nccl_lsa_barrier_arrive(s_, index_, cocoviz_emu::releases(order), multimem_);
      cocoviz_emu::nccl_lsa_barrier_wait(s_, index_, cocoviz_emu::acquires(order));
    });
  }

 private:
  cocoviz_emu::NcclDevState* s_;
  uint32_t index_;
  bool multimem_;
};

#endif  // COCOVIZ_EMU_NCCL_DEVICE_H_
