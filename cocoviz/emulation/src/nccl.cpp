// nccl.cpp — cocoviz emulation of NCCL (include/nccl.h, include/nccl_device.h) on MPI.
//
// Every communicator is an MPI communicator private to the emulation (split from a dup of
// MPI_COMM_WORLD). A collective runs when it is called (inside ncclGroupStart/End: at
// ncclGroupEnd) as one cocoviz_emu::Op on its stream: the ranks first exchange what each
// called (kind, count, datatype, op, root, call site), then their contributions together
// with their vector clocks; each rank reduces in rank order in the compute type (f16/bf16
// in f32, rounded once as the reference does; COCOVIZ_EMU_HALF_SUM=1 rounds every step as
// NCCL's kernels do; integers wrap) and joins every peer's clock.
// Send/recv carry the sender's clock to the receiver (large payloads through a file, so a
// sender that goes on computing never stalls its receiver). Windows are files that every LSA
// peer maps (core's shared_alloc/shared_map); LSA barriers are counters and clocks in
// such files. Every wait polls through cocoviz_emu::wait_until (the watchdog).
//
// Rules (each ends the job with a message naming the call, its stage and file:line):
//   communicator     — a comm is used only by its members and destroyed once; every
//                      MPI_COMM_WORLD rank calls ncclCommInitRank together, and the
//                      ranks of one id agree on nranks and hold distinct ranks 0..nranks-1
//   collective mismatch — the ranks of a comm call the same collective (or split, window
//                      or device-communicator call) with the same count, datatype,
//                      reduction op and root
//   in-place rule    — send and receive ranges overlap only at NCCL's in-place position
//   out of bounds / use after free — buffers lie inside live device allocations of the
//                      sizes the call implies (core's check_range)
//   send/recv mismatch — a send and its receive agree on count and datatype
//   window           — window memory comes from ncclMemAlloc of this rank and is not
//                      freed while registered; symmetric windows have one size on every
//                      rank; peer pointers stay inside the LSA team and the window
//   LSA barrier      — a live device communicator and an index < lsaBarrierCount; one
//                      grid on every LSA peer
//   multimem barrier — a kernel that issues multimem operations synchronises through the
//                      multimem form only, and fences (fence.proxy.alias) a block's unicast
//                      accesses of peers' windows before its multimem arrive
//   device communicator — no two kernels whose barriers use one device communicator run
//                      unordered (stream order or an event between them)
// Argument errors the real NCCL returns (NULL pointers, bad enums, bad ranks, unsupported
// options) return its error code; ncclGetLastError explains.
#include <mpi.h>
#include <nccl.h>
#include <nccl_device.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

namespace emu = ::cocoviz_emu;

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 0;
  std::vector<int> world;  // world rank of each member
  bool destroyed = false;
  int64_t windows = 0, devs = 0;  // windows / device communicators made so far
  std::string name;  // "comm 0x.. (rank r of n)"
  std::string destroyed_at;
  std::string uid;   // the same on every member: its world ranks and which such comm it is
};

struct ncclWindow_vidmem {
  ncclComm* comm = nullptr;
  int64_t seq = 0;  // registration order on the comm
  bool live = true;
  int lsa_rank = 0, lsa_size = 1;
  std::vector<char*> base;     // per LSA peer: the local address of its window
  std::vector<size_t> size;    // per LSA peer: its window's bytes
  std::vector<std::string> mapped;  // peer files this window holds a mapping of
  const void* user = nullptr;  // this rank's buffer
  std::string where;           // registration site
  char* mc = nullptr;          // multimem range (no access), made by ncclGetLsaMultimemPointer
  size_t mc_bytes = 0;
};

namespace cocoviz_emu {
struct NcclDevState {
  ncclComm* comm = nullptr;
  int64_t seq = 0;  // creation order on the comm
  bool live = true;
  int lsa_rank = 0, lsa_size = 1, barriers = 0;
  bool multimem = false;           // created with lsaMultimem
  size_t stride = 0;               // bytes per barrier slot in a rank's barrier file
  char* mine = nullptr;            // this rank's barrier file (shared_alloc)
  std::vector<char*> peer;         // per LSA peer: its barrier file, mapped
  std::vector<uint32_t> arrived;   // per barrier: rounds this rank arrived at
  std::vector<uint32_t> waited;    // per barrier: rounds this rank completed
  std::vector<std::string> mapped; // peer files mapped for it
  // the last kernel that ran its barriers (one kernel at a time per device communicator)
  uint64_t last_kernel = 0;        // its Op::serial
  uint64_t last_epoch = 0;         // its epoch on its stream
  std::string last_text;           // the kernel and where it opened its barrier
};
}  // namespace cocoviz_emu

namespace {

// ================================================================ bookkeeping

std::string g_last_error;
std::vector<std::unique_ptr<ncclComm>> g_comms;  // every comm ever made (never freed)
std::vector<std::unique_ptr<ncclWindow_vidmem>> g_windows;
std::unordered_set<const ncclWindow_vidmem*> g_live_windows;
std::vector<std::unique_ptr<emu::NcclDevState>> g_devs;
MPI_Comm g_world = MPI_COMM_NULL;  // the emulation's private dup of MPI_COMM_WORLD
int g_group_depth = 0;

struct Mapping {
  void* base;
  int refs;
};
std::map<std::string, Mapping> g_maps;  // peer files mapped here, by path
std::unordered_set<std::string> g_unlinked;  // own files already unlinked

ncclResult_t error(ncclResult_t code, const std::string& why) {
  g_last_error = why + " (at " + emu::site_text(emu::site()) + ")";
  return code;
}

std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

std::string where(const emu::Site& s) {
  std::string out = s.file.empty() ? std::string("(no call site)") : s.file + ":" + std::to_string(s.line);
  if (!s.stage.empty()) out += ", stage '" + s.stage + "'";
  return out;
}

// Runs a queued call under the call site it was made at.
class SiteScope {
 public:
  explicit SiteScope(const emu::Site& s) : saved_(emu::site()) { set(s); }
  ~SiteScope() { set(saved_); }
  SiteScope(const SiteScope&) = delete;
  SiteScope& operator=(const SiteScope&) = delete;

 private:
  static void set(const emu::Site& s) {
    emu::set_site(s.stage.c_str(), s.file.c_str(), s.line, s.call.c_str());
  }
  emu::Site saved_;
};

bool mpi_up() {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  return up && !down;
}

// A comm handle of a call: nullptr for NULL (the caller returns ncclInvalidArgument);
// fails for anything that is not a live communicator of this rank.
ncclComm* live_comm(ncclComm_t c, const char* fn) {
  if (c == nullptr) return nullptr;
  for (const auto& x : g_comms) {
    if (x.get() != c) continue;
    if (x->destroyed) {
      emu::fail("communicator", std::string(fn) + " was given " + x->name + ", destroyed by " +
                                    x->destroyed_at,
                {"communicators are used only by their members and destroyed once"});
    }
    return x.get();
  }
  emu::fail("communicator", std::string(fn) + " was given " + hex(c) +
                                ", which is not a communicator of this rank",
            {"communicators are used only by their members and destroyed once"});
}

// --------------------------------------------------------------- datatypes

size_t elem_size(int t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

std::string type_name(int t) {
  static const char* n[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                            "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                            "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return t >= 0 && t < 12 ? n[t] : "datatype " + std::to_string(t);
}

std::string op_name(int o) {
  static const char* n[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
  return o >= 0 && o < 5 ? n[o] : "op " + std::to_string(o);
}

ncclResult_t check_type(int t, const char* fn) {
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2) {
    return error(ncclInvalidArgument, std::string(fn) + ": " + type_name(t) + " is not supported by the cocoviz emulation");
  }
  if (elem_size(t) == 0) return error(ncclInvalidArgument, std::string(fn) + ": invalid datatype " + std::to_string(t));
  return ncclSuccess;
}

// f16 / bf16 <-> f32, rounding to nearest even (NaN stays NaN).
float bits_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float m = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -m : m;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return 0x7fff;  // NaN: CUDA's canonical one
  if (x == 0x7f800000u) return sign | 0x7c00;
  if (x >= 0x477ff000u) return sign | 0x7c00;  // rounds to infinity
  if (x < 0x38800000u) {                         // below 2^-14: subnormal (exact scaling)
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(bits_float(x), 24)));
  }
  uint32_t h = ((((x >> 23) - 112) << 10) | ((x & 0x7fffffu) >> 13));
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN: CUDA's canonical one
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Reduces n elements of P contributions (src[r], in rank order) into out.
template <class T>
T combine_int(int op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ncclProd: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));  // sum, avg
  }
}

template <class C>
C combine_float(int op, C a, C b) {
  switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return (a > b || a != a) ? a : b;  // NaN propagates, as in the reference
    case ncclMin: return (a < b || a != a) ? a : b;
    default: return a + b;  // sum, avg
  }
}

template <class T>
void reduce_int(void* out, const std::vector<const char*>& src, size_t n, int op) {
  const int P = static_cast<int>(src.size());
  for (size_t i = 0; i < n; ++i) {
    T acc;
    std::memcpy(&acc, src[0] + i * sizeof(T), sizeof(T));
    for (int r = 1; r < P; ++r) {
      T v;
      std::memcpy(&v, src[static_cast<size_t>(r)] + i * sizeof(T), sizeof(T));
      acc = combine_int<T>(op, acc, v);
    }
    if (op == ncclAvg) {  // truncating division of the (wrapped) sum
      acc = std::is_signed<T>::value ? static_cast<T>(static_cast<int64_t>(acc) / P)
                                     : static_cast<T>(static_cast<uint64_t>(acc) / static_cast<uint64_t>(P));
    }
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &acc, sizeof(T));
  }
}

// f16/bf16 combine in f32 and round once, as the reference does (docs/semantics-notes.md);
// COCOVIZ_EMU_HALF_SUM=1 rounds after every pairwise step instead, as NCCL's ring kernels
// do on a GPU (its order differs again: rank order here).
bool half_steps() {
  static const bool on = [] {
    const char* v = std::getenv("COCOVIZ_EMU_HALF_SUM");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// S: storage type, C: arithmetic type; `each` rounds every step back to S, else once.
template <class S, class C, class Load, class Store>
void reduce_float(void* out, const std::vector<const char*>& src, size_t n, int op, Load load,
                  Store store, bool each) {
  const int P = static_cast<int>(src.size());
  for (size_t i = 0; i < n; ++i) {
    S s;
    std::memcpy(&s, src[0] + i * sizeof(S), sizeof(S));
    C acc = load(s);
    for (int r = 1; r < P; ++r) {
      S v;
      std::memcpy(&v, src[static_cast<size_t>(r)] + i * sizeof(S), sizeof(S));
      acc = combine_float<C>(op, acc, load(v));
      if (each) acc = load(store(acc));
    }
    if (op == ncclAvg) acc = (each ? load(store(acc)) : acc) / static_cast<C>(P);
    s = store(acc);
    std::memcpy(static_cast<char*>(out) + i * sizeof(S), &s, sizeof(S));
  }
}

void reduce(void* out, const std::vector<const char*>& src, size_t n, int type, int op) {
  auto same_f = [](float x) { return x; };
  auto same_d = [](double x) { return x; };
  switch (type) {
    case ncclInt8: return reduce_int<int8_t>(out, src, n, op);
    case ncclUint8: return reduce_int<uint8_t>(out, src, n, op);
    case ncclInt32: return reduce_int<int32_t>(out, src, n, op);
    case ncclUint32: return reduce_int<uint32_t>(out, src, n, op);
    case ncclInt64: return reduce_int<int64_t>(out, src, n, op);
    case ncclUint64: return reduce_int<uint64_t>(out, src, n, op);
    case ncclFloat16: return reduce_float<uint16_t, float>(out, src, n, op, half_to_float, float_to_half, half_steps());
    case ncclBfloat16: return reduce_float<uint16_t, float>(out, src, n, op, bf16_to_float, float_to_bf16, half_steps());
    case ncclFloat32: return reduce_float<float, float>(out, src, n, op, same_f, same_f, false);
    case ncclFloat64: return reduce_float<double, double>(out, src, n, op, same_d, same_d, false);
    default: emu::fail("emulation", "reduce: unexpected datatype " + std::to_string(type));
  }
}

// ----------------------------------------------------------- vector clocks on the wire

size_t vc_bytes() {
  return (static_cast<size_t>(emu::world_size()) * emu::kAgentsPerRank * 4 + 15) / 16 * 16;
}

void put_vc(char* dst, const emu::VC& v) {
  std::memset(dst, 0, vc_bytes());
  std::memcpy(dst, v.c.data(), std::min(vc_bytes(), v.c.size() * 4));
}

emu::VC get_vc(const char* src) {
  emu::VC v;
  std::memcpy(v.c.data(), src, std::min(vc_bytes(), v.c.size() * 4));
  return v;
}

// ------------------------------------------------------------------- MPI waits

int mpi_count(size_t bytes, const std::string& what) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    emu::fail("emulation", what + ": " + std::to_string(bytes) +
                               " bytes per rank in one message exceed the emulation's 2 GiB limit");
  }
  return static_cast<int>(bytes);
}

void progress_all();  // pending sends and posted receives

// The world ranks of a comm's members (the emulation's world dup: every rank).
std::vector<int> members(const ncclComm* c) {
  if (c != nullptr) return c->world;
  std::vector<int> all(static_cast<size_t>(emu::world_size()));
  for (int r = 0; r < emu::world_size(); ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

// Waits for MPI requests of an operation over every member of `c` (nullptr: the world dup):
// the deadlock detector's key makes members in the same wait on `c` not wait for each other.
void mpi_wait(MPI_Request* reqs, int n, const std::string& pending, const ncclComm* c) {
  emu::wait_until(
      [&] {
        int done = 0;
        MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        return done != 0;
      },
      pending, progress_all, members(c), "comm " + (c != nullptr ? c->uid : std::string("world")));
}

MPI_Comm emu_world() {
  if (g_world == MPI_COMM_NULL) {
    MPI_Request r;
    MPI_Comm_idup(MPI_COMM_WORLD, &g_world, &r);
    mpi_wait(&r, 1, "ncclCommInitRank: every MPI_COMM_WORLD rank must call it (emulation)", nullptr);
  }
  return g_world;
}

// ================================================================ call agreement

enum Kind : int32_t {
  kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce,
  kSplit, kWindowRegister, kWindowDeregister, kDevCommCreate, kDevCommDestroy, kAlltoAll
};
const char* kind_name(int k) {
  static const char* n[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                            "ncclBroadcast", "ncclReduce", "ncclCommSplit",
                            "ncclCommWindowRegister", "ncclCommWindowDeregister",
                            "ncclDevCommCreate", "ncclDevCommDestroy", "ncclAlltoAll"};
  return k >= 0 && k <= kAlltoAll ? n[k] : "?";
}

// What a rank called, exchanged before a collective call touches anything.
struct Call {
  int32_t kind = 0, type = -1, op = -1, root = -1;
  uint64_t count = 0;    // elements; lsaBarrierCount for ncclDevCommCreate
  int64_t object = -1;   // which window / device communicator of the comm (creation order)
  int64_t a = 0, b = 0;  // not compared: ncclCommSplit's color and key
  int32_t line = 0;
  char file[100] = {};
  char stage[60] = {};
};

void copy_str(char* dst, size_t n, const std::string& s) {
  std::memset(dst, 0, n);
  std::memcpy(dst, s.data(), std::min(n - 1, s.size()));
}

Call make_call(int kind) {
  Call c;
  c.kind = kind;
  c.line = emu::site().line;
  copy_str(c.file, sizeof c.file, emu::site().file);
  copy_str(c.stage, sizeof c.stage, emu::site().stage);
  return c;
}

std::string call_text(const Call& c) {
  std::string s = kind_name(c.kind);
  if (c.kind <= kReduce) {
    s += " " + std::to_string(c.count) + " x " + type_name(c.type);
    if (c.kind != kAllGather && c.kind != kBroadcast) s += ", " + op_name(c.op);
    if (c.kind == kBroadcast || c.kind == kReduce) s += ", root " + std::to_string(c.root);
  } else if (c.kind == kSplit) {
    s += " color " + std::to_string(c.a) + ", key " + std::to_string(c.b);
  } else {
    s += std::string(c.kind <= kWindowDeregister ? " window #" : " device communicator #") + std::to_string(c.object);
    if (c.kind == kDevCommCreate) s += ", lsaBarrierCount " + std::to_string(c.count);
  }
  s += " at " + std::string(c.file) + ":" + std::to_string(c.line);
  if (c.stage[0] != '\0') s += ", stage '" + std::string(c.stage) + "'";
  return s;
}

std::vector<std::string> every_call(const ncclComm& comm, const std::vector<Call>& all) {
  std::vector<std::string> d;
  for (int r = 0; r < comm.size; ++r) {
    d.push_back("rank " + std::to_string(r) + " (world rank " + std::to_string(comm.world[static_cast<size_t>(r)]) +
                "): " + call_text(all[static_cast<size_t>(r)]));
  }
  return d;
}

// Exchanges `mine` over the comm; fails unless every rank made the same kind of call with
// the same count, datatype, op and root.
std::vector<Call> agree(const ncclComm& comm, const Call& mine, const std::string& pending) {
  std::vector<Call> all(static_cast<size_t>(comm.size));
  MPI_Request r;
  MPI_Iallgather(&mine, sizeof(Call), MPI_BYTE, all.data(), sizeof(Call), MPI_BYTE, comm.mpi, &r);
  mpi_wait(&r, 1, pending + ": waiting for every rank of the communicator to make the same call", &comm);
  for (const Call& c : all) {
    const char* what = c.kind != mine.kind ? "the call"
                       : c.count != mine.count ? (mine.kind == kDevCommCreate ? "lsaBarrierCount" : "the count")
                       : c.type != mine.type ? "the datatype"
                       : c.op != mine.op ? "the reduction op"
                       : c.root != mine.root ? "the root"
                       : c.object != mine.object ? "which window or device communicator they mean (create and "
                                                   "release them in the same order on every rank)"
                                                 : nullptr;
    if (what != nullptr) {
      emu::fail("collective mismatch",
                std::string("the ranks of ") + comm.name + " differ in " + what + " at " + kind_name(mine.kind) +
                    ": every rank of a communicator must make the same calls, in the same order",
                every_call(comm, all));
    }
  }
  return all;
}

// ============================================================ point to point
//
// A send is one message: its descriptor and clock, then the data inline (small) or the
// name of a file holding it (large: the receiver reads and removes it, so a sender that
// goes on computing never holds up the transfer). It is sent synchronously-non-blocking
// (MPI_Issend), so the sender knows when it was received; the receiver matches messages
// per (comm, peer) in posting order with MPI_Improbe.

constexpr int kTagP2P = 7301;
constexpr size_t kInline = 4096;

struct P2PDesc {
  int32_t type, line;
  uint64_t count;
  char file[100], stage[60];
  char path[200];  // data file, "" when the data follows inline
};

struct PendingSend {
  ncclComm* comm;
  int peer_world = -1;  // the receiver's world rank
  std::string text;
  std::vector<char> msg;
  MPI_Request req;
};
std::vector<std::unique_ptr<PendingSend>> g_sends;

struct PendingRecv {
  ncclComm* comm;
  int peer;
  void* buff;
  size_t count;
  int type;
  emu::Stream* stream;
  emu::Site site;
  std::string text;
  std::vector<char> msg;
  MPI_Request req = MPI_REQUEST_NULL;
  bool matched = false, done = false;
};
std::vector<PendingRecv*> g_recvs;  // posted, not yet finished (owned by their caller)

std::string p2p_text(const char* fn, const char* dir, int peer, size_t count, int type, const ncclComm& c,
                     const emu::Site& s) {
  return std::string(fn) + " " + dir + " rank " + std::to_string(peer) + " (" + std::to_string(count) + " x " +
         type_name(type) + ") on " + c.name + " at " + where(s);
}

std::string data_dir() {
  for (const char* v : {"COCOVIZ_EMU_DIR", "TMPDIR"}) {
    const char* d = std::getenv(v);
    if (d != nullptr && d[0] != '\0') return d;
  }
  return "/tmp";
}

std::string write_data_file(const void* data, size_t n) {
  static unsigned counter = 0;
  const std::string path = data_dir() + "/cocoviz-emu-p2p-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) emu::fail("emulation", "ncclSend: cannot create " + path + ": " + std::strerror(errno));
  for (size_t done = 0; done < n;) {
    const ssize_t k = ::write(fd, static_cast<const char*>(data) + done, n - done);
    if (k <= 0) emu::fail("emulation", "ncclSend: cannot write " + path + ": " + std::strerror(errno));
    done += static_cast<size_t>(k);
  }
  ::close(fd);
  return path;
}

void read_data_file(const std::string& path, void* data, size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) emu::fail("emulation", "ncclRecv: cannot open the sender's data " + path + ": " + std::strerror(errno));
  for (size_t done = 0; done < n;) {
    const ssize_t k = ::read(fd, static_cast<char*>(data) + done, n - done);
    if (k <= 0) emu::fail("emulation", "ncclRecv: cannot read the sender's data " + path);
    done += static_cast<size_t>(k);
  }
  ::close(fd);
  ::unlink(path.c_str());
}

// The status board's list of this rank's sends not yet received (the deadlock report).
void publish_sends() {
  std::string text;
  for (const auto& s : g_sends) {
    if (text.size() > 1200) {
      text += "; ...";
      break;
    }
    text += (text.empty() ? "" : "; ") + s->text;
  }
  emu::set_posted_sends(text);
}

void progress_sends() {
  bool changed = false;
  for (size_t i = 0; i < g_sends.size();) {
    int done = 0;
    MPI_Test(&g_sends[i]->req, &done, MPI_STATUS_IGNORE);
    if (done) {
      g_sends.erase(g_sends.begin() + static_cast<long>(i));
      changed = true;
    } else {
      ++i;
    }
  }
  if (changed) publish_sends();
}

// Matches arrived messages to posted receives, in posting order per (comm, peer).
void progress_recvs() {
  std::vector<std::pair<ncclComm*, int>> blocked;
  for (PendingRecv* r : g_recvs) {
    if (r->matched) continue;
    const auto key = std::make_pair(r->comm, r->peer);
    if (std::find(blocked.begin(), blocked.end(), key) != blocked.end()) continue;
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_Improbe(r->peer, kTagP2P, r->comm->mpi, &flag, &m, &st);
    if (!flag) {
      blocked.push_back(key);
      continue;
    }
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    r->msg.resize(static_cast<size_t>(n));
    MPI_Imrecv(r->msg.data(), n, MPI_BYTE, &m, &r->req);
    r->matched = true;
  }
}

void progress_all() {
  progress_sends();
  progress_recvs();
}

// True once the receive's message is here; checks that it is what the receive expects.
bool recv_done(PendingRecv* r) {
  if (r->done) return true;
  int flag = 0;
  if (!r->matched || (MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE), !flag)) return false;
  r->done = true;
  P2PDesc d;
  std::memcpy(&d, r->msg.data(), sizeof d);
  if (d.count != r->count || d.type != r->type) {
    const std::string sender = std::to_string(d.count) + " x " + type_name(d.type) + " at " + d.file + ":" +
                               std::to_string(d.line) + (d.stage[0] ? ", stage '" + std::string(d.stage) + "'" : "");
    SiteScope scope(r->site);
    emu::fail("send/recv mismatch",
              "on " + r->comm->name + ", rank " + std::to_string(r->peer) + " sends " + sender +
                  ", but this rank receives " + std::to_string(r->count) + " x " + type_name(r->type) + " at " +
                  where(r->site),
              {"ncclSend and its ncclRecv must have the same count and datatype"});
  }
  return true;
}

// A send: reads the buffer now (the copy travels), publishes the sender's clock.
PendingSend* post_send(const void* buff, size_t count, int type, int peer, ncclComm* comm, emu::Stream* stream,
                       const emu::Site& site) {
  SiteScope scope(site);
  const size_t bytes = count * elem_size(type), vb = vc_bytes();
  auto s = std::make_unique<PendingSend>();
  s->comm = comm;
  s->peer_world = comm->world[static_cast<size_t>(peer)];
  s->text = p2p_text("ncclSend", "to", peer, count, type, *comm, site);
  emu::Op op(stream, "ncclSend to rank " + std::to_string(peer) + " on " + comm->name);
  P2PDesc d{};
  d.type = type;
  d.line = site.line;
  d.count = count;
  copy_str(d.file, sizeof d.file, site.file);
  copy_str(d.stage, sizeof d.stage, site.stage);
  const bool inline_data = bytes <= kInline;
  if (bytes > 0) {
    emu::check_range(buff, bytes, "ncclSend sendbuff (" + std::to_string(count) + " x " + type_name(type) + ")");
    emu::access(buff, bytes, false);
    if (!inline_data) copy_str(d.path, sizeof d.path, write_data_file(buff, bytes));
  }
  s->msg.resize(sizeof d + vb + (inline_data ? bytes : 0));
  std::memcpy(s->msg.data(), &d, sizeof d);
  put_vc(s->msg.data() + sizeof d, op.release());
  if (inline_data && bytes > 0) std::memcpy(s->msg.data() + sizeof d + vb, buff, bytes);
  MPI_Issend(s->msg.data(), mpi_count(s->msg.size(), s->text), MPI_BYTE, peer, kTagP2P, comm->mpi, &s->req);
  g_sends.push_back(std::move(s));
  publish_sends();
  return g_sends.back().get();
}

// Deferring (COCOVIZ_EMU_ORDER=adversarial): a send holds its stream until the receiver has
// posted the receive, as NCCL's send kernel may ("blocking for the GPU"), so an order in
// which the receiver never gets there is a deadlock the watchdog reports.
void wait_sends_received(const std::vector<PendingSend*>& sends) {
  for (PendingSend* p : sends) {
    const auto pending = [p] {
      return std::any_of(g_sends.begin(), g_sends.end(), [p](const std::unique_ptr<PendingSend>& x) { return x.get() == p; });
    };
    // progress made while waiting for an earlier send (or a receive of the same group)
    // may have completed and freed this one: its text is gone with it
    if (!pending()) continue;
    const auto posted = [pending] {
      progress_all();
      return !pending();
    };
    emu::wait_until(posted, p->text + ": waiting for the receiver to post its ncclRecv", progress_all, {p->peer_world});
  }
}

void post_recv(PendingRecv* r) {
  SiteScope scope(r->site);
  const size_t bytes = r->count * elem_size(r->type);
  if (bytes > 0) {
    emu::check_range(r->buff, bytes, "ncclRecv recvbuff (" + std::to_string(r->count) + " x " + type_name(r->type) + ")");
  }
  r->text = p2p_text("ncclRecv", "from", r->peer, r->count, r->type, *r->comm, r->site);
  g_recvs.push_back(r);
}

// Waits for posted receives, then writes each (one operation per receive, in order).
void finish_recvs(const std::vector<PendingRecv*>& rs) {
  for (PendingRecv* r : rs) {
    emu::wait_until([r] { progress_all(); return recv_done(r); }, r->text, progress_all,
                    {r->comm->world[static_cast<size_t>(r->peer)]});
  }
  for (PendingRecv* r : rs) {
    g_recvs.erase(std::find(g_recvs.begin(), g_recvs.end(), r));
    SiteScope scope(r->site);
    emu::Op op(r->stream, "ncclRecv from rank " + std::to_string(r->peer) + " on " + r->comm->name);
    op.acquire(get_vc(r->msg.data() + sizeof(P2PDesc)));
    const size_t bytes = r->count * elem_size(r->type);
    if (bytes == 0) continue;
    emu::access(r->buff, bytes, true);
    P2PDesc d;
    std::memcpy(&d, r->msg.data(), sizeof d);
    if (d.path[0] != '\0') {
      read_data_file(d.path, r->buff, bytes);
    } else {
      std::memcpy(r->buff, r->msg.data() + sizeof d + vc_bytes(), bytes);
    }
  }
}

// ================================================================== collectives

struct Task {
  int kind;  // Kind (collectives) or kSend / kRecv
  const void* send;
  void* recv;
  size_t count;
  int type, op, root;  // root: the peer for send/recv
  ncclComm* comm;
  emu::Stream* stream;
  emu::Site site;
};
constexpr int kSend = 100, kRecv = 101;
std::vector<Task> g_queue;  // calls inside ncclGroupStart/End

std::string range_text(const void* p, size_t n) {
  return "[" + hex(p) + ", " + hex(static_cast<const char*>(p) + n) + ") (" + std::to_string(n) + " bytes)";
}

void run_collective(const Task& t) {
  SiteScope scope(t.site);
  const ncclComm& c = *t.comm;
  const size_t P = static_cast<size_t>(c.size), me = static_cast<size_t>(c.rank);
  const size_t es = elem_size(t.type), cb = t.count * es;
  const std::string name = kind_name(t.kind);
  const std::string text = name + " (" + std::to_string(t.count) + " x " + type_name(t.type) + ") on " + c.name;
  emu::Op op(t.stream, name + " on " + c.name);

  Call mine = make_call(t.kind);
  mine.count = t.count;
  mine.type = t.type;
  mine.op = (t.kind == kAllGather || t.kind == kBroadcast || t.kind == kAlltoAll) ? -1 : t.op;
  mine.root = (t.kind == kBroadcast || t.kind == kReduce) ? t.root : -1;
  agree(c, mine, text);

  // the ranges this rank reads and writes
  const bool is_root = static_cast<int>(me) == t.root;
  size_t sb = cb, rb = cb, in_place_off = 0;
  bool send_at_recv = true;  // the in-place address is recvbuff + offset (else sendbuff + offset)
  switch (t.kind) {
    case kReduceScatter: sb = P * cb; send_at_recv = false; in_place_off = me * cb; break;
    case kAllGather: rb = P * cb; in_place_off = me * cb; break;
    case kAlltoAll: sb = P * cb; rb = P * cb; break;  // count is per peer
    case kBroadcast: if (!is_root) sb = 0; break;
    case kReduce: if (!is_root) rb = 0; break;
    default: break;
  }
  const std::string sw = name + " sendbuff", rw = name + " recvbuff";
  if (sb > 0) emu::check_range(t.send, sb, sw);
  if (rb > 0) emu::check_range(t.recv, rb, rw);
  if (sb > 0 && rb > 0) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(t.send), r = reinterpret_cast<uintptr_t>(t.recv);
    const uintptr_t ip = send_at_recv ? r + in_place_off : s + in_place_off;
    const bool in_place = t.kind != kAlltoAll && (send_at_recv ? s == ip : r == ip);
    if (!in_place && s < r + rb && r < s + sb) {
      const std::string rule =
          t.kind == kAllGather ? "in place means sendbuff == recvbuff + rank * sendcount * elemsize"
          : t.kind == kReduceScatter ? "in place means recvbuff == sendbuff + rank * recvcount * elemsize"
          : t.kind == kAlltoAll      ? "ncclAlltoAll has no in-place form: sendbuff and recvbuff must not overlap"
                                     : "in place means sendbuff == recvbuff";
      emu::fail("in-place rule",
                name + " on " + c.name + " at " + where(t.site) +
                    ": the send and receive ranges overlap, but not at the in-place position",
                {"sendbuff " + range_text(t.send, sb), "recvbuff " + range_text(t.recv, rb),
                 rule + ": here " + std::string(send_at_recv ? "sendbuff" : "recvbuff") + " would have to be " +
                     hex(reinterpret_cast<const void*>(ip)) + " (rank " + std::to_string(me) + ")",
                 "NCCL computes garbage for any other overlap: use disjoint buffers or the in-place address"});
    }
  }

  // contributions and clocks: all-gathered (reduce-scatter: all-to-all of the blocks)
  if (sb > 0) emu::access(t.send, sb, false);
  const size_t vb = vc_bytes(), blk = (cb + 15) / 16 * 16, pk = vb + blk;
  const emu::VC released = op.release();
  const bool blocks = t.kind == kReduceScatter || t.kind == kAlltoAll;
  std::vector<char> out(P * pk), in(blocks ? P * pk : pk);
  MPI_Request req;
  if (blocks) {
    for (size_t j = 0; j < P; ++j) {
      put_vc(in.data() + j * pk, released);
      std::memcpy(in.data() + j * pk + vb, static_cast<const char*>(t.send) + j * cb, cb);
    }
    MPI_Ialltoall(in.data(), mpi_count(pk, text), MPI_BYTE, out.data(), static_cast<int>(pk), MPI_BYTE, c.mpi, &req);
  } else {
    put_vc(in.data(), released);
    if (sb > 0) std::memcpy(in.data() + vb, t.send, cb);
    MPI_Iallgather(in.data(), mpi_count(pk, text), MPI_BYTE, out.data(), static_cast<int>(pk), MPI_BYTE, c.mpi, &req);
  }
  mpi_wait(&req, 1, text + ": exchanging data", &c);
  std::vector<const char*> src(P);
  for (size_t r = 0; r < P; ++r) {
    op.acquire(get_vc(out.data() + r * pk));
    src[r] = out.data() + r * pk + vb;
  }
  if (rb == 0) return;
  emu::access(t.recv, rb, true);
  char* dst = static_cast<char*>(t.recv);
  switch (t.kind) {
    case kAllGather:
    case kAlltoAll:  // block r: what rank r sent here (its block `me`)
      for (size_t r = 0; r < P; ++r) std::memcpy(dst + r * cb, src[r], cb);
      break;
    case kBroadcast:
      std::memcpy(dst, src[static_cast<size_t>(t.root)], cb);
      break;
    default:
      reduce(dst, src, t.count, t.type, t.op);
  }
}

// Runs a batch of calls (one call, or a group): posts every send and receive, runs the
// collectives in order, then completes the receives.
void run_tasks(const std::vector<Task>& tasks) {
  std::vector<std::unique_ptr<PendingRecv>> recvs;
  std::vector<PendingSend*> sends;
  for (const Task& t : tasks) {
    if (t.kind == kSend) sends.push_back(post_send(t.send, t.count, t.type, t.root, t.comm, t.stream, t.site));
    if (t.kind == kRecv) {
      auto r = std::make_unique<PendingRecv>();
      r->comm = t.comm;
      r->peer = t.root;
      r->buff = t.recv;
      r->count = t.count;
      r->type = t.type;
      r->stream = t.stream;
      r->site = t.site;
      post_recv(r.get());
      recvs.push_back(std::move(r));
    }
  }
  for (const Task& t : tasks) {
    if (t.kind != kSend && t.kind != kRecv) run_collective(t);
  }
  std::vector<PendingRecv*> rs;
  for (auto& r : recvs) rs.push_back(r.get());
  finish_recvs(rs);
  if (emu::deferring()) wait_sends_received(sends);
}

// Runs a batch now, or records it into the capture its streams belong to: at every launch
// of the graph the batch runs again (its comms must still be live), matched with the
// other ranks as a direct call is.
ncclResult_t dispatch(std::vector<Task> tasks) {
  if (tasks.empty()) return ncclSuccess;
  std::vector<emu::Stream*> streams;
  for (const Task& t : tasks) {
    if (std::find(streams.begin(), streams.end(), t.stream) == streams.end()) streams.push_back(t.stream);
  }
  const int err = emu::enqueue_on(streams, [tasks] {
    for (const Task& t : tasks) live_comm(t.comm, kind_name(t.kind));
    run_tasks(tasks);
  }, /*nccl=*/true);
  if (err != 0) {
    return error(ncclInvalidUsage, std::string("NCCL call on a stream in an invalid capture state (") +
                                       cudaGetErrorName(static_cast<cudaError_t>(err)) + ")");
  }
  return ncclSuccess;
}

ncclResult_t submit(const Task& t) {
  if (g_group_depth > 0) {
    g_queue.push_back(t);
    return ncclSuccess;
  }
  return dispatch({t});
}

// NCCL's calls that allocate, register or create: not stream operations, so not capturable.
ncclResult_t refuse_in_capture(const char* fn) {
  if (!emu::refuse_unsafe(fn)) {
    emu::drain_pending();  // a host-side NCCL call: the device has run what was queued before it
    return ncclSuccess;
  }
  return error(ncclInvalidUsage, std::string(fn) + " while a stream captures: it is no stream operation, so a "
                                                   "CUDA graph cannot hold it (call it before the capture)");
}

// Argument checks shared by the collectives and send/recv (the real NCCL's error codes).
ncclResult_t make_task(Task* t, const char* fn, int kind, const void* send, void* recv, size_t count,
                       ncclDataType_t type, int op, int root, ncclComm_t comm, cudaStream_t stream) {
  progress_all();
  ncclComm* c = live_comm(comm, fn);
  if (c == nullptr) return error(ncclInvalidArgument, std::string(fn) + ": comm is NULL");
  if (ncclResult_t e = check_type(type, fn)) return e;
  const bool reduces = kind == kAllReduce || kind == kReduceScatter || kind == kReduce;
  if (reduces && (op < 0 || op >= ncclNumOps)) {
    return error(ncclInvalidArgument, std::string(fn) + ": invalid reduction op " + std::to_string(op));
  }
  const bool p2p = kind == kSend || kind == kRecv;
  if ((p2p || kind == kBroadcast || kind == kReduce) && (root < 0 || root >= c->size)) {
    return error(ncclInvalidArgument, std::string(fn) + ": " + (p2p ? "peer " : "root ") + std::to_string(root) +
                                          " is not a rank of a " + std::to_string(c->size) + "-rank communicator");
  }
  if (count > SIZE_MAX / elem_size(type) / static_cast<size_t>(c->size)) {
    return error(ncclInvalidArgument, std::string(fn) + ": count " + std::to_string(count) + " is too large");
  }
  const bool is_root = c->rank == root;
  const bool needs_send = kind != kRecv && !(kind == kBroadcast && !is_root);
  const bool needs_recv = kind != kSend && !(kind == kReduce && !is_root);
  if (count > 0 && needs_send && send == nullptr) return error(ncclInvalidArgument, std::string(fn) + ": sendbuff is NULL");
  if (count > 0 && needs_recv && recv == nullptr) return error(ncclInvalidArgument, std::string(fn) + ": recvbuff is NULL");
  *t = Task{kind, send, recv, count, type, op, root, c, emu::resolve_stream(stream, fn), emu::site()};
  return ncclSuccess;
}

ncclResult_t collective(const char* fn, int kind, const void* send, void* recv, size_t count,
                        ncclDataType_t type, int op, int root, ncclComm_t comm, cudaStream_t stream) {
  Task t;
  if (ncclResult_t e = make_task(&t, fn, kind, send, recv, count, type, op, root, comm, stream)) return e;
  return submit(t);
}

// ============================================================ communicators

ncclComm* new_comm(MPI_Comm mpi) {
  auto c = std::make_unique<ncclComm>();
  c->mpi = mpi;
  MPI_Comm_rank(mpi, &c->rank);
  MPI_Comm_size(mpi, &c->size);
  const int w = emu::world_rank();
  c->world.resize(static_cast<size_t>(c->size));
  MPI_Allgather(&w, 1, MPI_INT, c->world.data(), 1, MPI_INT, mpi);  // every member is here
  c->name = "comm " + hex(c.get()) + " (rank " + std::to_string(c->rank) + " of " + std::to_string(c->size) + ")";
  // members create their comms over one member set in one order (each creation waits for
  // all of them), so "world ranks #k" names one communicator on every member
  std::string ranks;
  for (int w2 : c->world) ranks += (ranks.empty() ? "" : ",") + std::to_string(w2);
  int same = 0;
  for (const auto& o : g_comms) same += o->world == c->world ? 1 : 0;
  c->uid = "{" + ranks + "}#" + std::to_string(same);
  g_comms.push_back(std::move(c));
  return g_comms.back().get();
}

// Waits until every send this rank posted on `c` has been received.
void drain_sends(const ncclComm* c, const char* fn) {
  auto first_pending = [c]() -> PendingSend* {
    for (const auto& s : g_sends) {
      if (s->comm == c) return s.get();
    }
    return nullptr;
  };
  for (PendingSend* p = first_pending(); p != nullptr; p = first_pending()) {
    emu::wait_until(
        [&first_pending, p] {
          progress_sends();
          return first_pending() != p;
        },
        std::string(fn) + ": waiting for the receiver of " + p->text, progress_all, {p->peer_world});
  }
}

// The LSA team of a comm rank: COCOVIZ_EMU_LSA_SIZE consecutive ranks (default: all).
void lsa_team(const ncclComm& c, int* lsa_rank, int* lsa_size, int* first) {
  const char* v = std::getenv("COCOVIZ_EMU_LSA_SIZE");
  int n = v != nullptr ? std::atoi(v) : 0;
  if (n <= 0 || n > c.size) n = c.size;
  *first = c.rank / n * n;
  *lsa_rank = c.rank - *first;
  *lsa_size = std::min(n, c.size - *first);
}

// ================================================================ shared files

// Every rank of the LSA team maps every peer's file (its own stays as is), then the owners
// unlink their files once every peer has mapped them. Returns per LSA peer the local
// address of (file base + offset).
struct Share {
  char path[256];
  uint64_t offset, alloc_bytes, bytes;
  int32_t flags, unlinked;
};

std::vector<char*> map_team(const ncclComm& c, const Share& mine, char* own, int first, int lsa_size,
                            const std::string& what, std::vector<Share>* all_out,
                            std::vector<std::string>* mapped) {
  std::vector<Share> all(static_cast<size_t>(c.size));
  MPI_Request r;
  MPI_Iallgather(&mine, sizeof(Share), MPI_BYTE, all.data(), sizeof(Share), MPI_BYTE, c.mpi, &r);
  mpi_wait(&r, 1, what + ": exchanging window files", &c);
  std::vector<char*> base(static_cast<size_t>(lsa_size));
  for (int p = 0; p < lsa_size; ++p) {
    const int cr = first + p;
    const Share& s = all[static_cast<size_t>(cr)];
    if (cr == c.rank || s.path[0] == '\0') {  // own memory, or nothing to share
      base[static_cast<size_t>(p)] = cr == c.rank ? own : nullptr;
      continue;
    }
    auto it = g_maps.find(s.path);
    if (it == g_maps.end()) {
      if (s.unlinked) {
        emu::fail("window", what + ": rank " + std::to_string(cr) + "'s ncclMemAlloc memory was registered and "
                  "deregistered on every window before; the emulation cannot map it again",
                  {"keep one window on it registered, or register fresh ncclMemAlloc memory"});
      }
      void* m = emu::shared_map(s.path, s.alloc_bytes, c.world[static_cast<size_t>(cr)]);
      it = g_maps.emplace(s.path, Mapping{m, 0}).first;
    }
    ++it->second.refs;
    mapped->push_back(s.path);
    base[static_cast<size_t>(p)] = static_cast<char*>(it->second.base) + s.offset;
  }
  MPI_Request b;
  MPI_Ibarrier(c.mpi, &b);
  mpi_wait(&b, 1, what + ": waiting for every rank to map the window files", &c);
  if (mine.path[0] != '\0' && g_unlinked.insert(mine.path).second) emu::shared_unlink(mine.path);
  if (all_out != nullptr) *all_out = std::move(all);
  return base;
}

void unmap_all(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    auto it = g_maps.find(p);
    if (it == g_maps.end()) continue;
    if (--it->second.refs == 0) {
      emu::shared_unmap(it->second.base);
      g_maps.erase(it);
    }
  }
}

bool multimem_supported() {
  long v = 1;
  emu::env_per_rank("COCOVIZ_EMU_MULTIMEM", &v);
  return v != 0;
}

// COCOVIZ_EMU_DEVICE_API=0: NCCL without symmetric memory (comm->symmetricSupport false).
bool device_api_supported() {
  long v = 1;
  emu::env_per_rank("COCOVIZ_EMU_DEVICE_API", &v);
  return v != 0;
}

void collective_barrier(const ncclComm& c, const std::string& what) {
  MPI_Request b;
  MPI_Ibarrier(c.mpi, &b);
  mpi_wait(&b, 1, what + ": waiting for every rank of " + c.name, &c);
}

ncclWindow_vidmem* live_window(ncclWindow_t w, const char* fn) {
  if (g_live_windows.count(w) != 0) return w;
  for (const auto& x : g_windows) {
    if (x.get() == w) {
      emu::fail("window", std::string(fn) + " was given a window deregistered already (registered at " + x->where + ")");
    }
  }
  emu::fail("window", std::string(fn) + " was given " + hex(w) + ", which is not a registered window");
}

void release_window(ncclWindow_vidmem* w) {
  unmap_all(w->mapped);
  if (w->mc != nullptr) munmap(w->mc, w->mc_bytes);
  w->mc = nullptr;
  w->live = false;
  g_live_windows.erase(w);
}

void release_dev(emu::NcclDevState* d) {
  unmap_all(d->mapped);
  if (d->mine != nullptr) emu::shared_free(d->mine);
  d->live = false;
}

}  // namespace

// =================================================================== host API

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "operation timed out";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return error(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return error(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  static uint64_t counter = 0;
  std::random_device rd;
  const uint64_t words[4] = {
      (static_cast<uint64_t>(rd()) << 32) ^ rd(), static_cast<uint64_t>(::getpid()),
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()), ++counter};
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, words, sizeof words);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  if (ncclResult_t e = refuse_in_capture("ncclCommInitRank")) return e;
  if (comm == nullptr) return error(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  if (!mpi_up()) return error(ncclInvalidUsage, "ncclCommInitRank: the emulation needs MPI_Init first");
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return error(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of nranks " +
                                          std::to_string(nranks) + " is out of range");
  }
  struct Entry {
    ncclUniqueId id;
    int32_t nranks, rank;
  } mine{commId, nranks, rank};
  const int W = emu::world_size();
  std::vector<Entry> all(static_cast<size_t>(W));
  MPI_Request r;
  MPI_Iallgather(&mine, sizeof(Entry), MPI_BYTE, all.data(), sizeof(Entry), MPI_BYTE, emu_world(), &r);
  mpi_wait(&r, 1, "ncclCommInitRank: every MPI_COMM_WORLD rank must call it at the same point (emulation)", nullptr);
  int color = -1;
  std::vector<int> members;
  for (int w = 0; w < W; ++w) {
    if (std::memcmp(&all[static_cast<size_t>(w)].id, &commId, sizeof commId) != 0) continue;
    if (color < 0) color = w;
    members.push_back(w);
  }
  std::vector<int> seen(static_cast<size_t>(nranks), -1);
  std::vector<std::string> detail;
  bool ok = static_cast<int>(members.size()) == nranks;
  for (int w : members) {
    const Entry& e = all[static_cast<size_t>(w)];
    detail.push_back("world rank " + std::to_string(w) + ": nranks " + std::to_string(e.nranks) + ", rank " +
                     std::to_string(e.rank));
    if (e.nranks != nranks || e.rank < 0 || e.rank >= nranks || seen[static_cast<size_t>(e.rank)] >= 0) {
      ok = false;
    } else {
      seen[static_cast<size_t>(e.rank)] = w;
    }
  }
  if (!ok) {
    emu::fail("communicator",
              "ncclCommInitRank: the " + std::to_string(members.size()) + " ranks that passed this unique id " +
                  "must agree on nranks (" + std::to_string(nranks) + " here) and hold the ranks 0.." +
                  std::to_string(nranks - 1) + " once each",
              detail);
  }
  MPI_Comm mpi;
  MPI_Comm_split(emu_world(), color, rank, &mpi);  // every world rank has arrived
  *comm = new_comm(mpi);
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (ncclResult_t e = refuse_in_capture("ncclCommSplit")) return e;
  progress_all();
  ncclComm* c = live_comm(comm, "ncclCommSplit");
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommSplit: comm is NULL");
  if (newcomm == nullptr) return error(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (config != nullptr) return error(ncclInvalidArgument, "ncclCommSplit: the emulation takes no config (pass NULL)");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return error(ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) + " is negative (not NCCL_SPLIT_NOCOLOR)");
  }
  Call mine = make_call(kSplit);
  mine.a = color;
  mine.b = key;
  agree(*c, mine, std::string("ncclCommSplit on ") + c->name);
  MPI_Comm mpi;
  MPI_Comm_split(c->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &mpi);
  *newcomm = mpi == MPI_COMM_NULL ? nullptr : new_comm(mpi);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  progress_all();
  ncclComm* c = live_comm(comm, "ncclCommFinalize");
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  emu::drain_pending();
  drain_sends(c, "ncclCommFinalize");
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  if (ncclResult_t e = refuse_in_capture("ncclCommDestroy")) return e;
  progress_all();
  ncclComm* c = live_comm(comm, "ncclCommDestroy");
  drain_sends(c, "ncclCommDestroy");
  for (const auto& w : g_windows) {
    if (w->comm == c && w->live) release_window(w.get());
  }
  for (const auto& d : g_devs) {
    if (d->comm == c && d->live) release_dev(d.get());
  }
  MPI_Comm_free(&c->mpi);
  c->destroyed = true;
  c->destroyed_at = emu::site_text(emu::site());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  ncclComm* c = live_comm(comm, "ncclCommCount");
  if (c == nullptr || count == nullptr) return error(ncclInvalidArgument, "ncclCommCount: NULL argument");
  *count = c->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  ncclComm* c = live_comm(comm, "ncclCommUserRank");
  if (c == nullptr || rank == nullptr) return error(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  ncclComm* c = live_comm(comm, "ncclCommCuDevice");
  if (c == nullptr || device == nullptr) return error(ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
  if (cudaGetDevice(device) != cudaSuccess) return error(ncclUnhandledCudaError, "ncclCommCuDevice: cudaGetDevice failed");
  return ncclSuccess;
}

// ------------------------------------------------------------------ collectives

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllReduce", kAllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclReduceScatter", kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm,
                    stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", kAllGather, sendbuff, recvbuff, sendcount, datatype, -1, -1, comm, stream);
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAlltoAll", kAlltoAll, sendbuff, recvbuff, count, datatype, -1, -1, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclBroadcast", kBroadcast, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return collective("ncclBcast", kBroadcast, buff, buff, count, datatype, -1, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclReduce", kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return collective("ncclSend", kSend, sendbuff, nullptr, count, datatype, -1, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return collective("ncclRecv", kRecv, nullptr, recvbuff, count, datatype, -1, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<Task> tasks;
  tasks.swap(g_queue);
  return dispatch(std::move(tasks));
}

// ------------------------------------------------------------ memory and windows

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ncclResult_t e = refuse_in_capture("ncclMemAlloc")) return e;
  if (ptr == nullptr) return error(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  if (size == 0) return error(ncclInvalidArgument, "ncclMemAlloc: size is 0");
  *ptr = emu::shared_alloc(size, nullptr);
  if (*ptr == nullptr) return error(ncclSystemError, "ncclMemAlloc: cannot create the memory file (COCOVIZ_EMU_DIR or TMPDIR)");
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  if (ncclResult_t e = refuse_in_capture("ncclMemFree")) return e;
  for (const ncclWindow_vidmem* w : g_live_windows) {
    const emu::Alloc* a = emu::find_alloc(w->user);
    if (a != nullptr && a->base == reinterpret_cast<uintptr_t>(ptr)) {
      emu::fail("window", "ncclMemFree of memory still registered in a window (registered at " + w->where + ")",
                {"call ncclCommWindowDeregister on every rank first"});
    }
  }
  if (!emu::shared_free(ptr)) {
    return error(ncclInvalidArgument, "ncclMemFree: " + hex(ptr) + " is not memory from ncclMemAlloc, or was freed already");
  }
  return ncclSuccess;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  if (ncclResult_t e = refuse_in_capture("ncclCommWindowRegister")) return e;
  progress_all();
  ncclComm* c = live_comm(comm, "ncclCommWindowRegister");
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommWindowRegister: comm is NULL");
  if (win == nullptr || buff == nullptr || size == 0) {
    return error(ncclInvalidArgument, "ncclCommWindowRegister: NULL window, NULL buffer or size 0");
  }
  const emu::Alloc* a = emu::find_alloc(buff);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buff);
  if (a == nullptr || a->kind != emu::MemKind::symmetric || a->freed || a->owner != emu::world_rank() ||
      p + size > a->base + a->size) {
    emu::fail("window", "ncclCommWindowRegister: window memory must come from ncclMemAlloc of this rank",
              {"window " + range_text(buff, size) + " on " + c->name,
               a == nullptr ? std::string("it lies in no device allocation")
                            : "it lies in a " + std::to_string(a->size) + "-byte " +
                                  (a->kind == emu::MemKind::device ? "cudaMalloc allocation"
                                   : a->kind == emu::MemKind::peer ? "peer mapping"
                                   : a->freed                      ? "freed ncclMemAlloc allocation"
                                                                   : "ncclMemAlloc allocation") +
                                  " made by " + a->label});
  }
  *win = nullptr;
  // NCCL without symmetric memory: success and no window (src/dev_runtime.cc)
  if (!device_api_supported()) return ncclSuccess;
  Call mine = make_call(kWindowRegister);
  mine.object = c->windows;
  const std::string what = std::string("ncclCommWindowRegister on ") + c->name;
  const std::vector<Call> calls = agree(*c, mine, what);
  Share s{};
  if (a->path.size() >= sizeof s.path) emu::fail("emulation", "window file path too long: " + a->path);
  copy_str(s.path, sizeof s.path, a->path);
  s.offset = p - a->base;
  s.alloc_bytes = a->size;
  s.bytes = size;
  s.flags = winFlags;
  s.unlinked = g_unlinked.count(a->path) ? 1 : 0;
  auto w = std::make_unique<ncclWindow_vidmem>();
  int first = 0;
  lsa_team(*c, &w->lsa_rank, &w->lsa_size, &first);
  std::vector<Share> all;
  w->base = map_team(*c, s, static_cast<char*>(buff), first, w->lsa_size, what, &all, &w->mapped);
  std::vector<std::string> detail;
  bool same = true;
  for (int r = 0; r < c->size; ++r) {
    const Share& x = all[static_cast<size_t>(r)];
    same = same && x.bytes == s.bytes && x.flags == s.flags;
    detail.push_back("rank " + std::to_string(r) + ": " + std::to_string(x.bytes) + " bytes, flags " +
                     std::to_string(x.flags) + ", " + call_text(calls[static_cast<size_t>(r)]));
  }
  if (!same && (winFlags & NCCL_WIN_COLL_SYMMETRIC)) {
    emu::fail("window", what + ": a symmetric window has the same size and flags on every rank", detail);
  }
  for (int q = 0; q < w->lsa_size; ++q) w->size.push_back(all[static_cast<size_t>(first + q)].bytes);
  w->comm = c;
  w->seq = c->windows++;
  w->user = buff;
  w->where = emu::site_text(emu::site());
  *win = w.get();
  g_live_windows.insert(w.get());
  g_windows.push_back(std::move(w));
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (ncclResult_t e = refuse_in_capture("ncclCommWindowDeregister")) return e;
  progress_all();
  ncclComm* c = live_comm(comm, "ncclCommWindowDeregister");
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommWindowDeregister: comm is NULL");
  if (win == nullptr) return error(ncclInvalidArgument, "ncclCommWindowDeregister: win is NULL");
  ncclWindow_vidmem* w = live_window(win, "ncclCommWindowDeregister");
  if (w->comm != c) emu::fail("window", "ncclCommWindowDeregister: the window belongs to " + w->comm->name + ", not " + c->name);
  const std::string what = std::string("ncclCommWindowDeregister on ") + c->name;
  Call mine = make_call(kWindowDeregister);
  mine.object = w->seq;
  agree(*c, mine, what);
  release_window(w);
  collective_barrier(*c, what);  // no rank unmaps while a peer still registers
  return ncclSuccess;
}

// ============================================================== device API

ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props) {
  ncclComm* c = live_comm(comm, "ncclCommQueryProperties");
  if (c == nullptr || props == nullptr) return error(ncclInvalidArgument, "ncclCommQueryProperties: NULL argument");
  props->rank = c->rank;
  props->nRanks = c->size;
  props->cudaDev = 0;
  props->nvmlDev = 0;
  props->deviceApiSupport = device_api_supported();
  props->multimemSupport = multimem_supported();
  return ncclSuccess;
}

ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs, ncclDevComm_t* out) {
  if (ncclResult_t e = refuse_in_capture("ncclDevCommCreate")) return e;
  progress_all();
  ncclComm* c = live_comm(comm, "ncclDevCommCreate");
  if (c == nullptr || reqs == nullptr || out == nullptr) return error(ncclInvalidArgument, "ncclDevCommCreate: NULL argument");
  if (!device_api_supported()) {
    return error(ncclInvalidUsage, "ncclDevCommCreate: the communicator does not support symmetric memory "
                                   "(COCOVIZ_EMU_DEVICE_API=0; ncclCommQueryProperties says so)");
  }
  if (reqs->lsaBarrierCount < 0) return error(ncclInvalidArgument, "ncclDevCommCreate: negative lsaBarrierCount");
  if (reqs->lsaMultimem && !multimem_supported()) {
    return error(ncclInvalidArgument, "ncclDevCommCreate: lsaMultimem requested but multimem is not supported "
                                      "(COCOVIZ_EMU_MULTIMEM=0; ncclCommQueryProperties says so)");
  }
  if (reqs->resourceRequirementsList != nullptr || reqs->teamRequirementsList != nullptr ||
      reqs->barrierCount != 0 || reqs->railGinBarrierCount != 0 || reqs->lsaLLA2ABlockCount != 0 ||
      reqs->lsaLLA2ASlotCount != 0 || reqs->ginForceEnable || reqs->ginSignalCount != 0 || reqs->ginCounterCount != 0) {
    return error(ncclInvalidArgument,
                 "ncclDevCommCreate: the cocoviz emulation provides LSA barriers and LSA multimem only (no resource or "
                 "team lists, world/rail/GIN barriers, LL all-to-all, GIN signals or counters)");
  }
  const std::string what = std::string("ncclDevCommCreate on ") + c->name;
  Call mine = make_call(kDevCommCreate);
  mine.count = static_cast<uint64_t>(reqs->lsaBarrierCount);
  mine.object = c->devs;
  agree(*c, mine, what);
  auto d = std::make_unique<emu::NcclDevState>();
  int first = 0;
  lsa_team(*c, &d->lsa_rank, &d->lsa_size, &first);
  d->comm = c;
  d->seq = c->devs++;
  d->barriers = reqs->lsaBarrierCount;
  d->multimem = reqs->lsaMultimem;
  d->stride = 64 + 2 * vc_bytes();
  d->arrived.assign(static_cast<size_t>(d->barriers), 0);
  d->waited.assign(static_cast<size_t>(d->barriers), 0);
  Share s{};
  if (d->barriers > 0) {
    std::string path;
    d->mine = static_cast<char*>(emu::shared_alloc(d->stride * static_cast<size_t>(d->barriers), &path));
    if (d->mine == nullptr) emu::fail("emulation", what + ": cannot create the LSA barrier file");
    std::memset(d->mine, 0, d->stride * static_cast<size_t>(d->barriers));
    copy_str(s.path, sizeof s.path, path);
    s.alloc_bytes = d->stride * static_cast<size_t>(d->barriers);
  }
  d->peer = map_team(*c, s, d->mine, first, d->lsa_size, what, nullptr, &d->mapped);
  ncclDevComm dc{};
  dc.magic = NCCL_API_MAGIC;
  dc.version = NCCL_VERSION_CODE;
  dc.rank = c->rank;
  dc.nRanks = c->size;
  dc.lsaRank = d->lsa_rank;
  dc.lsaSize = d->lsa_size;
  dc.lsaBarrierCount = d->barriers;
  dc.emu = d.get();
  *out = dc;
  g_devs.push_back(std::move(d));
  return ncclSuccess;
}

ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm) {
  progress_all();
  ncclComm* c = live_comm(comm, "ncclDevCommDestroy");
  if (c == nullptr || devComm == nullptr) return error(ncclInvalidArgument, "ncclDevCommDestroy: NULL argument");
  emu::NcclDevState* d = nullptr;
  for (const auto& x : g_devs) d = x.get() == devComm->emu ? x.get() : d;
  if (d == nullptr) emu::fail("device communicator", "ncclDevCommDestroy was given a device communicator not made by ncclDevCommCreate");
  if (!d->live) emu::fail("device communicator", "ncclDevCommDestroy: the device communicator was destroyed already");
  if (d->comm != c) emu::fail("device communicator", "ncclDevCommDestroy: the device communicator belongs to " + d->comm->name + ", not " + c->name);
  const std::string what = std::string("ncclDevCommDestroy on ") + c->name;
  Call mine = make_call(kDevCommDestroy);
  mine.object = d->seq;
  agree(*c, mine, what);
  release_dev(d);
  collective_barrier(*c, what);
  return ncclSuccess;
}

ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void** outPtr) {
  if (window == nullptr || outPtr == nullptr) return error(ncclInvalidArgument, "ncclGetLsaDevicePointer: NULL argument");
  const ncclWindow_vidmem* w = live_window(window, "ncclGetLsaDevicePointer");
  if (lsaRank < 0 || lsaRank >= w->lsa_size || offset >= w->size[static_cast<size_t>(lsaRank)]) {
    return error(ncclInvalidArgument, "ncclGetLsaDevicePointer: LSA rank " + std::to_string(lsaRank) + " / offset " +
                                          std::to_string(offset) + " outside the window");
  }
  *outPtr = w->base[static_cast<size_t>(lsaRank)] + offset;
  return ncclSuccess;
}

void* ncclGetLsaPointer(ncclWindow_t win, size_t offset, int peer) {
  const ncclWindow_vidmem* w = live_window(win, "ncclGetLsaPointer");
  if (peer < 0 || peer >= w->lsa_size) {
    emu::fail("window", "ncclGetLsaPointer(win, " + std::to_string(offset) + ", " + std::to_string(peer) +
                            "): peer " + std::to_string(peer) + " is outside the LSA team (lsaSize " +
                            std::to_string(w->lsa_size) + ")",
              {"window registered at " + w->where});
  }
  const size_t n = w->size[static_cast<size_t>(peer)];
  if (offset >= n) {
    emu::fail("window", "ncclGetLsaPointer(win, " + std::to_string(offset) + ", " + std::to_string(peer) +
                            "): offset " + std::to_string(offset) + " is outside the peer's " + std::to_string(n) +
                            "-byte window",
              {"window registered at " + w->where});
  }
  return w->base[static_cast<size_t>(peer)] + offset;
}

void* ncclGetLocalPointer(ncclWindow_t win, size_t offset) {
  const ncclWindow_vidmem* w = live_window(win, "ncclGetLocalPointer");
  return ncclGetLsaPointer(win, offset, w->lsa_rank);
}

void* ncclGetLsaMultimemPointer(ncclWindow_t win, size_t offset, ncclDevComm const& comm) {
  ncclWindow_vidmem* w = live_window(win, "ncclGetLsaMultimemPointer");
  emu::NcclDevState* d = nullptr;
  for (const auto& x : g_devs) d = x.get() == comm.emu ? x.get() : d;
  if (d == nullptr || !d->live) {
    emu::fail("multimem", "ncclGetLsaMultimemPointer with a device communicator not made by ncclDevCommCreate or destroyed");
  }
  if (!d->multimem) {
    emu::fail("multimem", "ncclGetLsaMultimemPointer: the device communicator was created without lsaMultimem",
              {"set ncclDevCommRequirements.lsaMultimem where ncclCommQueryProperties reports multimemSupport"});
  }
  if (d->comm != w->comm) {
    emu::fail("multimem", "ncclGetLsaMultimemPointer: the window belongs to " + w->comm->name +
                              ", the device communicator to " + d->comm->name);
  }
  const size_t n = w->size[static_cast<size_t>(w->lsa_rank)];
  if (offset >= n) {
    emu::fail("multimem", "ncclGetLsaMultimemPointer(win, " + std::to_string(offset) + "): outside the " +
                              std::to_string(n) + "-byte window", {"window registered at " + w->where});
  }
  if (w->mc == nullptr) {
    void* m = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) emu::fail("emulation", "cannot reserve a multimem address range");
    w->mc = static_cast<char*>(m);
    w->mc_bytes = n;
  }
  return w->mc + offset;
}

namespace cocoviz_emu {

namespace {
// What the running kernel did with the device API: where it opened a unicast-form LSA
// barrier session and where it issued its first multimem operation.
struct KernelUse {
  uint64_t kernel = 0;  // Op::serial of the kernel
  std::string unicast_barrier;
  std::string multimem_op;
};

KernelUse& kernel_use() {
  static KernelUse u;
  const Op* op = current_op();
  if (op != nullptr && u.kernel != op->serial()) u = KernelUse{op->serial(), "", ""};
  return u;
}

std::string file_line(const char* file, int line) {
  return file != nullptr ? std::string(file) + ":" + std::to_string(line) : site_text(site());
}

[[noreturn]] void unicast_barrier_in_multimem_kernel(const KernelUse& u) {
  fail("multimem barrier",
       "a kernel that issues multimem operations synchronises with its peers through the unicast LSA "
       "barrier",
       {"barrier session opened at " + u.unicast_barrier + " without multimem = true",
        "multimem operation at " + u.multimem_op,
        "open the session with multimem = true (ncclLsaBarrierSession(..., blockIdx.x, true)), as every NVLS "
        "kernel of NCCL does (src/device/symmetric/): its arrive is a multimem.red.release through the "
        "multicast object, which orders this kernel's multimem accesses; the unicast arrive (a fence and "
        "stores to each peer) does not: accesses through another mapping of the memory are not ordered "
        "with it (CUDA programming guide, virtual aliasing)"});
}

// A multimem operation of the running kernel at `file`:`line`.
void multimem_operation(const char* file, int line) {
  if (!in_kernel()) fail("multimem", "a multimem operation outside a kernel");
  KernelUse& u = kernel_use();
  if (u.multimem_op.empty()) u.multimem_op = file_line(file, line);
  if (!u.unicast_barrier.empty()) unicast_barrier_in_multimem_kernel(u);
}

// The live window whose multimem range holds [mc, mc + bytes), with the offset in it.
ncclWindow_vidmem* multimem_window(const void* mc, size_t bytes, const char* op, size_t* offset) {
  const char* p = static_cast<const char*>(mc);
  for (const auto& x : g_windows) {
    ncclWindow_vidmem* w = x.get();
    if (w->live && w->mc != nullptr && p >= w->mc && p < w->mc + w->mc_bytes) {
      *offset = static_cast<size_t>(p - w->mc);
      if (*offset % 16 != 0 || bytes % 16 != 0) {
        fail("multimem", std::string(op) + " of " + std::to_string(bytes) + " bytes at window offset " +
                             std::to_string(*offset) + ": multimem accesses are 16-byte aligned vectors");
      }
      for (int q = 0; q < w->lsa_size; ++q) {
        if (*offset + bytes > w->size[static_cast<size_t>(q)]) {
          fail("multimem", std::string(op) + ": bytes [" + std::to_string(*offset) + ", " +
                               std::to_string(*offset + bytes) + ") outside LSA rank " + std::to_string(q) +
                               "'s " + std::to_string(w->size[static_cast<size_t>(q)]) + "-byte window",
               {"window registered at " + w->where});
        }
      }
      return w;
    }
  }
  fail("multimem", std::string(op) + " at " + hex(mc) + ", which is not an address from ncclGetLsaMultimemPointer "
                   "of a registered window");
}
}  // namespace

void multimem_ld_reduce_add(const void* mc, size_t bytes, int kind, void* out, const char* file, int line) {
  multimem_operation(file, line);
  size_t off = 0;
  ncclWindow_vidmem* w = multimem_window(mc, bytes, "multimem.ld_reduce", &off);
  const size_t n = kind == 0 ? bytes / 4 : bytes / 2;
  std::vector<float> acc(n, 0.0f);
  for (int q = 0; q < w->lsa_size; ++q) {
    const char* src = w->base[static_cast<size_t>(q)] + off;
    access(src, bytes, false, file, line, true);
    for (size_t j = 0; j < n; ++j) {
      float v = 0.0f;
      if (kind == 0) {
        std::memcpy(&v, src + 4 * j, 4);
      } else {
        uint16_t h = 0;
        std::memcpy(&h, src + 2 * j, 2);
        v = kind == 1 ? half_to_float(h) : bf16_to_float(h);
      }
      acc[j] = q == 0 ? v : acc[j] + v;
    }
  }
  char* dst = static_cast<char*>(out);
  for (size_t j = 0; j < n; ++j) {
    if (kind == 0) {
      std::memcpy(dst + 4 * j, &acc[j], 4);
    } else {
      const uint16_t h = kind == 1 ? float_to_half(acc[j]) : float_to_bf16(acc[j]);
      std::memcpy(dst + 2 * j, &h, 2);
    }
  }
}

void multimem_st(void* mc, const void* src, size_t bytes, const char* file, int line) {
  multimem_operation(file, line);
  size_t off = 0;
  ncclWindow_vidmem* w = multimem_window(mc, bytes, "multimem.st", &off);
  for (int q = 0; q < w->lsa_size; ++q) {
    char* dst = w->base[static_cast<size_t>(q)] + off;
    access(dst, bytes, true, file, line, true);
    std::memcpy(dst, src, bytes);
  }
}

NcclDevState* nccl_lsa_barrier_open(const ncclDevComm& comm, uint32_t index, bool multimem, const char* file,
                                    int line) {
  NcclDevState* d = nullptr;
  for (const auto& x : g_devs) d = x.get() == comm.emu ? x.get() : d;
  if (d == nullptr) fail("LSA barrier", "ncclLsaBarrierSession on a device communicator not made by ncclDevCommCreate");
  if (!d->live) fail("LSA barrier", "ncclLsaBarrierSession on a device communicator destroyed by ncclDevCommDestroy");
  if (!in_kernel()) fail("LSA barrier", "ncclLsaBarrierSession outside a kernel");
  const std::string where = file_line(file, line);
  if (multimem && !d->multimem) {
    fail("multimem barrier", "ncclLsaBarrierSession(..., multimem = true) at " + where +
                                 " on a device communicator created without lsaMultimem",
         {"set ncclDevCommRequirements.lsaMultimem where ncclCommQueryProperties reports multimemSupport"});
  }
  if (index >= static_cast<uint32_t>(d->barriers)) {
    fail("LSA barrier", "ncclLsaBarrierSession index " + std::to_string(index) + " at " + where +
                            " but the device communicator has " + std::to_string(d->barriers) +
                            " LSA barriers (ncclDevCommRequirements.lsaBarrierCount)",
         {"use one barrier index per CTA, below lsaBarrierCount"});
  }
  KernelUse& u = kernel_use();
  if (!multimem) {
    if (u.unicast_barrier.empty()) u.unicast_barrier = where;
    if (!u.multimem_op.empty()) unicast_barrier_in_multimem_kernel(u);
  }
  // one kernel at a time: the barriers' state (an epoch per barrier index in device memory)
  // is the device communicator's, shared by every kernel that uses it
  const Op* op = current_op();
  if (op->serial() != d->last_kernel) {
    const std::string text = op->what() + " on " + stream_name(op->stream()) + " (" + site_text(site()) +
                             ", barrier at " + where + ")";
    if (d->last_kernel != 0 && !op->vc().covers(d->last_epoch)) {
      fail("device communicator",
           "two kernels on one device communicator may run at the same time: " + text + " and " + d->last_text,
           {"nothing orders them (no stream order or event between them), and both use the device "
            "communicator's LSA barriers, whose state is one counter per barrier index: run every kernel of a "
            "device communicator on one stream, or order them with an event"});
    }
    d->last_kernel = op->serial();
    d->last_epoch = op->start_epoch();
    d->last_text = text;
  }
  return d;
}

namespace {
uint32_t* counter(char* file, size_t stride, uint32_t index) {
  return reinterpret_cast<uint32_t*>(file + stride * index);
}
char* vc_slot(char* file, size_t stride, uint32_t index, uint32_t round) {
  return file + stride * index + 64 + (round & 1u) * vc_bytes();
}
// The blocks of the kernel that arrived at `round` (one slot per round parity: a peer may
// arrive at the next round before this rank has read the slot of this one).
uint32_t* grid_slot(char* file, size_t stride, uint32_t index, uint32_t round) {
  return reinterpret_cast<uint32_t*>(file + stride * index + 8 + 4 * (round & 1u));
}
uint32_t blocks() { return g_pos.grid_dim.x * g_pos.grid_dim.y * g_pos.grid_dim.z; }
}  // namespace

void nccl_lsa_barrier_arrive(NcclDevState* d, uint32_t index, bool release, bool multimem) {
  Op* op = current_op();
  if (op == nullptr) fail("LSA barrier", "LSA barrier outside a kernel");
  if (multimem && release && !op->unfenced().empty()) {
    fail("multimem barrier",
         "block " + std::to_string(g_pos.block.x) + " accessed a peer's window through its unicast mapping (at " +
             op->unfenced() + ") and then releases it through the multimem barrier " + std::to_string(index) +
             " with no fence.proxy.alias between them",
         {"the multimem arrive goes through the multicast mapping; accesses through another mapping of the "
          "memory are ordered with it only by a proxy fence (CUDA programming guide, virtual aliasing): "
          "fence.proxy.alias after the unicast accesses"});
  }
  uint32_t& round = d->arrived[index];
  if (round != d->waited[index]) fail("LSA barrier", "LSA barrier " + std::to_string(index) + ": arrive twice without wait");
  ++round;
  // a relaxed arrive publishes what came before the kernel (the kernel boundary), no more
  put_vc(vc_slot(d->mine, d->stride, index, round), release ? op->release() : op->launch_vc());
  __atomic_store_n(grid_slot(d->mine, d->stride, index, round), blocks(), __ATOMIC_RELAXED);
  __atomic_store_n(counter(d->mine, d->stride, index), round, __ATOMIC_RELEASE);
}

void nccl_lsa_barrier_wait(NcclDevState* d, uint32_t index, bool acquire) {
  Op* op = current_op();
  if (op == nullptr) fail("LSA barrier", "LSA barrier outside a kernel");
  const uint32_t round = d->arrived[index];
  if (round == d->waited[index]) fail("LSA barrier", "LSA barrier " + std::to_string(index) + ": wait without arrive");
  auto all_here = [d, index, round] {
    for (char* p : d->peer) {
      if (__atomic_load_n(counter(p, d->stride, index), __ATOMIC_ACQUIRE) < round) return false;
    }
    return true;
  };
  std::string missing;
  std::vector<int> missing_world;  // for the deadlock detector
  for (size_t q = 0; q < d->peer.size(); ++q) {
    if (__atomic_load_n(counter(d->peer[q], d->stride, index), __ATOMIC_ACQUIRE) < round) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      missing_world.push_back(d->comm->world[static_cast<size_t>(d->comm->rank - d->lsa_rank) + q]);
    }
  }
  wait_until(all_here,
             "LSA barrier " + std::to_string(index) + " (round " + std::to_string(round) + ") of the device "
             "communicator on " + d->comm->name + ": waiting for LSA ranks " + missing +
             " (each must run the same kernels and barriers)",
             progress_all, missing_world);
  for (size_t q = 0; q < d->peer.size(); ++q) {
    const uint32_t theirs = __atomic_load_n(grid_slot(d->peer[q], d->stride, index, round), __ATOMIC_RELAXED);
    if (theirs != blocks()) {
      fail("LSA barrier",
           "LSA barrier " + std::to_string(index) + " (round " + std::to_string(round) + "): this rank's kernel runs " +
               std::to_string(blocks()) + " blocks, LSA rank " + std::to_string(q) + "'s " + std::to_string(theirs),
           {"block b of the kernel waits at barrier b for block b of every peer, so the blocks past the smaller "
            "grid wait for ever on a GPU: launch one grid on every rank (agree on it, e.g. the smallest SM "
            "count over the ranks, before ncclDevCommCreate)"});
    }
  }
  for (char* p : d->peer) {
    const VC theirs = get_vc(vc_slot(p, d->stride, index, round));
    if (acquire) {
      op->acquire(theirs);
    } else {
      op->acquire_at_end(theirs);  // the kernel boundary orders what the relaxed wait saw
    }
  }
  d->waited[index] = round;
}

}  // namespace cocoviz_emu
