// cocoviz_emu/core.h — the core of cocoviz's CPU emulation of emitted CUDA/NCCL programs.
//
// The emitted .cu sources compile unchanged with the host C++ compiler against the headers
// of this folder (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, cublas_v2.h, nccl.h,
// nccl_device.h), which forward to this core. Each MPI rank is one process with one
// emulated GPU. docs/codegen.md ("Emulation") is the user-facing description.
//
// Execution model. Every operation a program puts on a stream (kernel, copy, memset,
// GEMM, collective) runs when it is enqueued, in host program order: that order always
// respects stream order and every recorded event. What the host order hides — two
// streams that the program did not order — the happens-before checker finds instead:
//
//   Agents. On each rank: the host, the legacy default stream and each created stream,
//   and for every stream the blocks of its kernels (block b as CTA slot b % kCtaSlots), which
//   run concurrently on a GPU: a kernel forks one clock per block from its stream's and
//   joins them back when it ends, so an LSA barrier of block b publishes what block b did,
//   not what the blocks before it did. Global agent id = rank * kAgentsPerRank + local id.
//   Every agent has a vector clock (VC) over all global agents.
//   An operation's VC is its stream's VC joined with the host's VC at enqueue time
//   (and with the legacy stream's, or every blocking stream's, by CUDA's legacy-stream
//   rules); event records copy a stream's VC, cudaStreamWaitEvent joins it, host
//   synchronization joins stream VCs into the host's. Collectives, send/recv and LSA
//   barriers join the VCs of the ranks that take part.
//
//   Shadow memory. Every device allocation has one shadow cell per 2-byte granule: the
//   epoch (agent, clock) of its last write and an antichain of up to kReads read epochs
//   since. Each access by an operation is checked against its cell: a write must be
//   ordered after the last write and after every recorded read, a read after the last
//   write. A conflicting pair that is not ordered is reported (both sites, the buffer,
//   the byte range) and the run ends. So a missing cudaStreamWaitEvent, event record or
//   LSA barrier is found whatever order the operations happened to run in.
//
//   Initcheck. A read of a granule that no operation ever wrote (no kernel store, copy,
//   memset, NCCL or cuBLAS write since the allocation) ends the run ("uninitialized read",
//   as compute-sanitizer's initcheck): the reading call or kernel line, the buffer and the
//   unwritten byte range. COCOVIZ_EMU_INITCHECK=0 turns it off.
//
//   Racecheck. Inside a kernel, the threads of one block between two of its barriers are
//   concurrent: two of them touching one granule of device memory or of the block's
//   __shared__ (static) data, at least one writing, with no __syncthreads() between them,
//   end the run ("intra-block race") naming both threads and both source lines. Atomics are
//   exempt. COCOVIZ_EMU_RACECHECK=0 turns it off.
//
// Windows (ncclMemAlloc + ncclCommWindowRegister) live in files mapped by every rank of
// the communicator; their shadow cells live in the same mapping, under a lock, so peer
// accesses through ncclGetLsaPointer are checked like local ones.
//
// Stream capture (CUDA graphs). While a stream captures, an operation enqueued on it is
// checked as at enqueue and recorded, with its call site, instead of run; a launch of the
// instantiated graph runs the recorded operations again (cross-rank matching of NCCL calls
// included), in capture order, on the streams they were captured on, ordered after what
// came before the launch on the launch stream and before what comes after it. Calls CUDA
// refuses during capture return its error and invalidate the capture.
//
// Adversarial order (COCOVIZ_EMU_ORDER=adversarial, COCOVIZ_EMU_SEED=n): operations on
// non-blocking streams are deferred and run, one at a time, in a seeded random order that
// respects only stream order, event records and waits, and — when NCCL_LAUNCH_ORDER_IMPLICIT
// is nonzero — NCCL's implicit launch order (NCCL operations in host issue order); a send
// then blocks until its receive is posted, as NCCL's send kernel may. The queue drains
// when the host synchronizes or blocks. A cross-communicator deadlock that some legal
// GPU order reaches ends in the watchdog's report. src/core.cpp, "deferred execution".
//
// Every blocking wait (collective, send/recv, barrier) polls with a watchdog: after
// COCOVIZ_EMU_TIMEOUT seconds (default 60) it prints every rank's pending operation (from
// the status files in $COCOVIZ_EMU_DIR, which run.sh --emulate creates) and aborts. Before
// that, a deadlock detector reads the same status boards: once every rank has been blocked
// (in such a wait, in a blocking MPI call, or exited) for COCOVIZ_EMU_DEADLOCK_S seconds
// (default 0.5) with no rank able to progress, it reports who waits for whom and aborts.
#ifndef COCOVIZ_EMU_CORE_H_
#define COCOVIZ_EMU_CORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cocoviz_emu {

constexpr int kStreamSlots = 10;  // host, legacy stream, up to 8 created streams
constexpr int kCtaSlots = 32;     // per stream: the blocks of its kernels (block b: b % 32)
constexpr int kAgentsPerRank = kStreamSlots * (1 + kCtaSlots);
constexpr int kReads = 4;          // read epochs kept per shadow cell (an antichain)
constexpr size_t kGranule = 2;     // bytes per shadow cell

// ------------------------------------------------------------------ process

int world_rank();  // MPI_COMM_WORLD rank (0 before MPI_Init)
int world_size();  // MPI_COMM_WORLD size (1 before MPI_Init)

// The call site of the API call or launch being executed: set by the CHECK_* macros of
// cocoviz_runtime.cuh (stage, file, line, call text) and by COCOVIZ_LAUNCH.
struct Site {
  std::string stage;
  std::string file;
  int line = 0;
  std::string call;
};
void set_site(const char* stage, const char* file, int line, const char* call);
const Site& site();
std::string site_text(const Site& s);  // "stage 'S': CALL at FILE:LINE"

// Ends the whole job: prints "cocoviz emulation: [rank R] RULE: MESSAGE", the current
// site and `detail` lines, then MPI_Abort (exit code 3). Every rule violation, hazard
// and misuse the emulation finds ends here.
[[noreturn]] void fail(const std::string& rule, const std::string& message,
                       const std::vector<std::string>& detail = {});

// A note on stderr, once per distinct text ("cocoviz emulation: [rank R] note: ...").
void note(const std::string& text);

// A knob that may differ between ranks: the environment variable `name` holds one value
// ("132") or one per rank ("132,114,132,114": rank r takes entry r mod the count). False
// when it is unset or empty; fail()s on anything but integers.
bool env_per_rank(const char* name, long* value);

// ------------------------------------------------------------- vector clocks

struct VC {
  std::vector<uint32_t> c;  // world_size() * kAgentsPerRank entries
  VC();
  void join(const VC& o);
  bool covers(uint64_t epoch) const;  // the access with this epoch happened before
};

// An epoch packs a global agent id (high 32 bits) and that agent's clock (low 32 bits).
inline uint64_t make_epoch(int agent, uint32_t clock) {
  return (static_cast<uint64_t>(agent) << 32) | clock;
}
inline int epoch_agent(uint64_t e) { return static_cast<int>(e >> 32); }
inline uint32_t epoch_clock(uint64_t e) { return static_cast<uint32_t>(e); }

// ------------------------------------------------------------------- memory

struct Cell {
  uint64_t w;           // epoch of the last write (0: none)
  uint64_t r[kReads];   // epochs of reads since (0: empty slot)
};

// A process-shared spin lock (lives in shared mappings too).
struct SpinLock {
  std::atomic<int> v{0};
  void lock();
  void unlock();
};

enum class MemKind { device, symmetric, peer };

// Racecheck (intra-block) state of one 2-byte granule: who of the running block touched it
// since the block's last barrier (src/core.cpp, "racecheck").
struct RaceCell;

struct Alloc {
  uintptr_t base = 0;
  size_t size = 0;
  MemKind kind = MemKind::device;
  int owner = 0;            // world rank whose memory this is
  bool freed = false;
  std::string label;        // the allocation's call site (site_text at allocation)
  std::string freed_at;     // site_text at free
  Cell* cells = nullptr;    // size / kGranule (+1) cells
  SpinLock* lock = nullptr; // non-null for shared (window) memory
  std::string path;         // backing file of shared memory
  RaceCell* race = nullptr; // per granule, this process's racecheck state (made on first use)
};

// Device memory (cudaMalloc): 256-byte aligned, filled with a garbage pattern (0xA5), never
// handed out again after a free (so a use after free is reported as such).
void* device_alloc(size_t bytes);
// Frees memory from device_alloc or shared_alloc; returns false (and touches nothing) if
// `p` is not the base of a live allocation of that kind.
bool device_free(void* p);

// Memory that peers can map (ncclMemAlloc): data and shadow cells in one file under
// $COCOVIZ_EMU_DIR (or $TMPDIR), mapped MAP_SHARED. `path_out` names the file for peers.
void* shared_alloc(size_t bytes, std::string* path_out);
bool shared_free(void* p);
// Maps a peer's shared allocation (a window registration): registered as MemKind::peer,
// owned by `owner`. Returns the local address of its base.
void* shared_map(const std::string& path, size_t bytes, int owner);
void shared_unmap(void* local_base);
// Removes the backing file once every peer has mapped it (the mapping stays valid).
void shared_unlink(const std::string& path);

// The live or freed allocation containing [p, p + n) (nullptr if none).
const Alloc* find_alloc(const void* p);

// Checks that [p, p + n) lies inside one live allocation; otherwise fail() with `what`
// (e.g. "ncclAllGather recvbuff") and what is there instead.
const Alloc& check_range(const void* p, size_t n, const std::string& what);

// Records an access of the current operation to [p, p + n) (n may be 0) after checking its
// bounds and its ordering against earlier accesses. `what` names the access for messages
// (e.g. "kernel k_sch_gf store at prog.cu:123"; built lazily: only on failure).
// `multicast`: the access is one peer's part of a multimem operation (src/nccl.cpp); any
// other access of a peer's window memory goes through a unicast mapping, which the running
// block remembers until its next fence.proxy.alias (Op::unfenced).
void access(const void* p, size_t n, bool write, const char* what_file = nullptr,
            int what_line = 0, bool multicast = false);

// An atomic read-modify-write of [p, p + n) by a kernel thread: checked and recorded as a
// read by the happens-before check, and exempt from racecheck (atomics of one block's
// threads do not race with each other).
void access_atomic(const void* p, size_t n, const char* file = nullptr, int line = 0);

// Host-side check that `p` is not device memory (for cudaMemcpy directions).
bool is_device_pointer(const void* p);

// --------------------------------------------------------- streams and ops

struct Stream;   // cudaStream_t is Stream* (nullptr: the legacy default stream)
struct Event;    // cudaEvent_t is Event*

Stream* legacy_stream();
Stream* stream_create(bool nonblocking, int priority);
// Validates a user-supplied stream handle (nullptr → legacy); fail()s on a destroyed or
// unknown stream, naming `what`.
Stream* resolve_stream(void* handle, const char* what);
bool stream_destroy(Stream* s);
int stream_agent(const Stream* s);  // global agent id
const std::string& stream_name(const Stream* s);  // "stream #2 (non-blocking)"

// One operation on a stream, from construction to destruction. While it lives it is the
// current operation: access() checks against its VC. Constructing it joins the stream's
// VC with the host's (and the legacy rules); destroying it advances the stream's clock.
class Op {
 public:
  Op(Stream* s, std::string what);
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  VC& vc();                  // the current clock (the running block's inside a kernel)
  const VC& vc() const;
  uint64_t epoch() const;    // epoch of accesses made now
  // Publishing for a synchronization with peers: returns the VC to hand to them, then
  // advances the current clock so later accesses are not covered by it.
  VC release();
  void acquire(const VC& other);  // joins a peer's published VC
  const std::string& what() const;
  Stream* stream() const;
  // Kernels: block b runs as CTA slot b % kCtaSlots of the stream, with a clock forked
  // from the operation's at its start; end_blocks() joins every block's clock back.
  void begin_block(unsigned b);
  void end_blocks();
  // Kernel boundaries (what NCCL's symmetric kernels rely on when they open with a relaxed
  // arrive and end with a relaxed wait): the clock of what stream order put before the
  // kernel, which a relaxed arrive publishes; and a peer's clock that a relaxed wait saw,
  // which becomes the stream's when the kernel ends (not the running block's).
  const VC& launch_vc() const;
  void acquire_at_end(const VC& other);
  uint64_t serial() const { return serial_; }      // unique per operation of the process
  uint64_t start_epoch() const { return start_epoch_; }  // the stream's epoch of this operation
  // Proxies (CUDA programming guide, virtual aliasing): the running block's first access of
  // a peer's window through a unicast mapping since its last fence.proxy.alias ("" if none).
  void unicast_window_access(const char* file, int line);
  void fence_proxy_alias() { unfenced_.clear(); }
  const std::string& unfenced() const { return unfenced_; }

 private:
  Stream* s_;
  std::string what_;
  VC* cur_;                  // the stream's VC, or the running block's
  int cur_agent_;
  VC start_;                 // the stream's VC when the operation started
  std::vector<VC> cta_;      // per CTA slot: its forked VC (empty until used)
  VC at_end_;                // joined into the stream's VC when the kernel ends
  bool have_at_end_ = false;
  uint64_t serial_ = 0;
  uint64_t start_epoch_ = 0;
  std::string unfenced_;
};
Op* current_op();  // nullptr outside an operation

// Host synchronization: the host's VC joins the stream's (cudaStreamSynchronize) or
// every stream's (cudaDeviceSynchronize).
void host_sync_stream(Stream* s);
void host_sync_device();
const VC& host_vc();

Event* event_create(bool timing);
Event* resolve_event(void* handle, const char* what);
bool event_destroy(Event* e);
// Copies the stream's VC and the time (recorded instead while `s` captures). Returns 0 or
// a capture error (below).
int event_record(Event* e, Stream* s);
// Joins the event's VC into the stream's. An event recorded in a capture makes `s` join
// that capture. Returns 0 or a capture error.
int stream_wait_event(Stream* s, Event* e);
void host_sync_event(Event* e);
bool event_captured(const Event* e);  // last recorded in a capture that is still going on
bool event_recorded(const Event* e);
bool event_timing(const Event* e);
bool stream_valid(const void* handle);  // nullptr (legacy) or a live stream
bool event_valid(const void* handle);   // a live event
double event_time_ms(const Event* e);

// --------------------------------------------------------------- waiting

// Status shown by the watchdog for this rank ("ncclAllReduce on comm 0x.., count 256 at
// prog.cu:88"); empty when the rank runs host code.
void set_pending(const std::string& what);

// Polls `ready()` until it returns true; every poll also runs `progress()` if given. After
// COCOVIZ_EMU_TIMEOUT seconds, prints every rank's pending operation and aborts.
// `peers`: the world ranks the wait needs something from (empty: any); `key`: ranks waiting
// with one key wait for each other (one communicator's collective), not for one another.
// When every rank is blocked (waiting, in a blocking MPI call, or exited) and stays so, the
// deadlock detector reports the wait-for cycle after COCOVIZ_EMU_DEADLOCK_S (0.5) seconds.
void wait_until(const std::function<bool()>& ready, const std::string& pending,
                const std::function<void()>& progress = {}, const std::vector<int>& peers = {},
                const std::string& key = "");

// This rank's sends that are posted and not yet received ("" when none): shown by the
// deadlock report, where a send to the wrong peer explains a receive that never completes.
void set_posted_sends(const std::string& text);

// Around a blocking MPI call of the program (src/mpi_wrap.cpp): the status board shows the
// rank blocked in `call` (a static string) until it returns.
void mpi_blocking_enter(const char* call);
void mpi_blocking_leave();

// ----------------------------------------------------------- kernel launch

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// Runs `body` as a kernel: one call per thread of every block, blocks one after another,
// a block's threads as fibers (so __syncthreads and CTA-wide barriers work). Checks the
// launch configuration like the CUDA runtime; a bad one sets the last error
// (cudaErrorInvalidConfiguration) and runs nothing.
void launch_kernel(const char* name, const char* file, int line, Dim3 grid, Dim3 block,
                   size_t smem, void* stream, const std::function<void()>& body);

// __syncthreads() of the current block. `at_release`, when given, runs once when every
// thread of the block has arrived, before any leaves (a CTA-wide cross-rank barrier
// runs its inter-rank part there).
void block_barrier(const std::function<void()>& at_release = {});
bool in_kernel();
// Block and thread index of the running fiber (the kernel-language builtins read these).
struct ThreadPos {
  Dim3 thread, block, block_dim, grid_dim;
};
extern ThreadPos g_pos;

// NVLS multimem operations on an address from ncclGetLsaMultimemPointer (src/nccl.cpp):
// ld_reduce sums `bytes` at that offset over every LSA peer's window into `out` (kind 0:
// f32 in f32; 1: f16 and 2: bf16 accumulated in f32 and rounded once, like .acc::f32);
// st writes `bytes` from `src` into every LSA peer's window.
// `file`/`line`: the kernel's call site (cocoviz_runtime.cuh passes it), for reports.
void multimem_ld_reduce_add(const void* mc, size_t bytes, int kind, void* out,
                            const char* file = nullptr, int line = 0);
void multimem_st(void* mc, const void* src, size_t bytes, const char* file = nullptr,
                 int line = 0);
// fence.proxy.alias of the running thread (its block's, in the emulation).
void fence_proxy_alias();

// ----------------------------------------------------------- stream capture

struct Graph;      // cudaGraph_t: the operations of one ended capture
struct GraphExec;  // cudaGraphExec_t: an instantiated graph

// Capture errors, as the runtime's cudaError_t values.
constexpr int kErrIllegalState = 401;            // cudaErrorIllegalState
constexpr int kErrCaptureUnsupported = 900;      // cudaErrorStreamCaptureUnsupported
constexpr int kErrCaptureInvalidated = 901;      // cudaErrorStreamCaptureInvalidated
constexpr int kErrCaptureMerge = 902;            // cudaErrorStreamCaptureMerge
constexpr int kErrCaptureUnmatched = 903;        // cudaErrorStreamCaptureUnmatched
constexpr int kErrCaptureUnjoined = 904;         // cudaErrorStreamCaptureUnjoined
constexpr int kErrCaptureIsolation = 905;        // cudaErrorStreamCaptureIsolation
constexpr int kErrCaptureImplicit = 906;         // cudaErrorStreamCaptureImplicit
constexpr int kErrCapturedEvent = 907;           // cudaErrorCapturedEvent

// Runs `work` (one stream operation, its arguments already checked) now, or records it
// into the capture `s` belongs to. Returns 0, or a capture error, and then neither runs
// nor records it: cudaErrorStreamCaptureInvalidated on a stream of an invalidated capture,
// cudaErrorStreamCaptureImplicit on the legacy stream while a blocking stream captures.
int enqueue(Stream* s, std::function<void()> work);
// The same for one operation over several streams (a group of NCCL calls): all of them
// capture in one capture, or none does (else cudaErrorStreamCaptureIsolation). `nccl`
// marks an operation of NCCL's host API (ordered by NCCL_LAUNCH_ORDER_IMPLICIT).
int enqueue_on(const std::vector<Stream*>& streams, std::function<void()> work, bool nccl = false);

// COCOVIZ_EMU_ORDER=adversarial: operations are deferred (above); drain_pending() runs every
// deferred operation now (a no-op otherwise, and while the queue already drains).
bool deferring();
void drain_pending();
uint64_t order_seed_value();  // COCOVIZ_EMU_SEED (default 1)

// cudaStreamBeginCapture (mode: 0 global, 1 thread-local, 2 relaxed), cudaStreamEndCapture
// (a graph, or an error: not the origin stream, a fork not joined back, an invalidated
// capture; the capture ends either way), cudaStreamIsCapturing (0 none, 1 active,
// 2 invalidated).
int capture_begin(Stream* s, int mode);
int capture_end(Stream* s, Graph** out);
int capture_status(const Stream* s);
// Refuses a call that CUDA does not allow during a capture in global or thread-local mode
// (cudaMalloc, cudaFree, a synchronous copy, device synchronization, NCCL's allocations,
// registrations and communicator calls): invalidates those captures, notes why and returns
// true; false when no such capture is going on.
bool refuse_unsafe(const std::string& call);
// Refuses a call on a capturing stream (cudaStreamSynchronize, cudaStreamQuery):
// invalidates its capture and returns true.
bool refuse_on_capturing(Stream* s, const std::string& call);

bool graph_valid(const void* handle);
bool graph_exec_valid(const void* handle);
bool graph_destroy(Graph* g);
bool graph_exec_destroy(GraphExec* x);
GraphExec* graph_instantiate(Graph* g);
// Enqueues one replay of the graph on `s` (recorded, if `s` captures). Returns 0 or a
// capture error.
int graph_launch(GraphExec* x, Stream* s);

// The sticky "last error" of the runtime API (cudaGetLastError), as an int.
void set_last_error(int code);
int take_last_error();

}  // namespace cocoviz_emu

#endif  // COCOVIZ_EMU_CORE_H_
