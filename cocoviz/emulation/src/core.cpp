// core.cpp — cocoviz emulation core: processes, failures, vector clocks, device memory
// with shadow cells, streams and operations, events, watchdog waits, kernels on fibers.
// The model is described in include/cocoviz_emu/core.h and docs/codegen.md.
#undef _FORTIFY_SOURCE  // fibers switch stacks with _longjmp, which the fortified one forbids

#include "cocoviz_emu/core.h"

#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace cocoviz_emu {

// ================================================================== process

namespace {

bool mpi_up() {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  return up && !down;
}

std::string env_dir() {
  const char* d = std::getenv("COCOVIZ_EMU_DIR");
  if (d != nullptr && d[0] != '\0') return d;
  const char* t = std::getenv("TMPDIR");
  return (t != nullptr && t[0] != '\0') ? t : "/tmp";
}

double timeout_s() {
  static double t = [] {
    const char* v = std::getenv("COCOVIZ_EMU_TIMEOUT");
    double s = v != nullptr ? std::atof(v) : 0.0;
    return s > 0 ? s : 60.0;
  }();
  return t;
}

Site g_site;
std::set<std::string> g_notes;
std::vector<std::string> g_owned_files;  // shared files this rank created and not yet unlinked

std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

}  // namespace

int world_rank() {
  static int cached = -1;
  if (cached >= 0) return cached;
  if (!mpi_up()) return 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &cached);
  return cached;
}

int world_size() {
  static int cached = -1;
  if (cached >= 0) return cached;
  if (!mpi_up()) return 1;
  MPI_Comm_size(MPI_COMM_WORLD, &cached);
  return cached;
}

void set_site(const char* stage, const char* file, int line, const char* call) {
  g_site.stage = stage != nullptr ? stage : "";
  g_site.file = file != nullptr ? file : "";
  g_site.line = line;
  g_site.call = call != nullptr ? call : "";
}

const Site& site() { return g_site; }

std::string site_text(const Site& s) {
  if (s.file.empty()) return "(no call site recorded)";
  std::string call = s.call;
  if (call.size() > 160) call = call.substr(0, 157) + "...";
  std::string out;
  if (!s.stage.empty()) out += "stage '" + s.stage + "': ";
  out += call + " at " + s.file + ":" + std::to_string(s.line);
  return out;
}

void remove_owned_files() {
  for (const std::string& f : g_owned_files) ::unlink(f.c_str());
  g_owned_files.clear();
}

[[noreturn]] void fail(const std::string& rule, const std::string& message,
                       const std::vector<std::string>& detail) {
  std::ostringstream o;
  o << "cocoviz emulation: [rank " << world_rank() << "] " << rule << ": " << message << "\n";
  o << "  at " << site_text(g_site) << "\n";
  for (const std::string& d : detail) o << "  " << d << "\n";
  const std::string text = o.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  remove_owned_files();
  // let mpiexec forward this report before the abort kills every rank (a peer that fails
  // at the same moment must not cut it off)
  const timespec drain{0, 200000000};
  nanosleep(&drain, nullptr);
  if (mpi_up()) MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

void note(const std::string& text) {
  if (!g_notes.insert(text).second) return;
  std::fprintf(stderr, "cocoviz emulation: [rank %d] note: %s\n", world_rank(), text.c_str());
}

bool env_per_rank(const char* name, long* value) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return false;
  std::vector<long> values;
  const char* p = v;
  while (true) {
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(p, &end, 10);
    if (end == p || errno != 0) break;
    values.push_back(x);
    if (*end == '\0') {
      *value = values[static_cast<size_t>(world_rank()) % values.size()];
      return true;
    }
    if (*end != ',') break;
    p = end + 1;
  }
  fail("emulation", std::string(name) + "=" + v + ": expected an integer, or one per rank separated by commas");
}

// ============================================================= vector clocks

VC::VC() : c(static_cast<size_t>(world_size()) * kAgentsPerRank, 0u) {}

void VC::join(const VC& o) {
  if (o.c.size() > c.size()) c.resize(o.c.size(), 0u);
  for (size_t i = 0; i < o.c.size(); ++i) c[i] = std::max(c[i], o.c[i]);
}

bool VC::covers(uint64_t e) const {
  if (e == 0) return true;
  const size_t a = static_cast<size_t>(epoch_agent(e));
  return a < c.size() && epoch_clock(e) <= c[a];
}

void SpinLock::lock() {
  int spins = 0;
  int expected = 0;
  while (!v.compare_exchange_weak(expected, 1, std::memory_order_acquire)) {
    expected = 0;
    if (++spins > 64) sched_yield();
  }
}

void SpinLock::unlock() { v.store(0, std::memory_order_release); }

// ======================================================== streams and agents

struct Capture;

struct Stream {
  int local = 1;          // stream slot (0: host, 1: legacy)
  bool nonblocking = false;
  int priority = 0;
  bool destroyed = false;
  VC vc;
  std::string name;
  uint32_t cta_clock[kCtaSlots] = {};  // clocks of the CTA agents of this stream's kernels
  Capture* cap = nullptr;              // the capture this stream belongs to, if any
};

// Per stream of a capture: the index of the last node of each stream it is ordered after
// (itself included). A fork is joined back when the origin's frontier covers every stream's
// last node.
using Frontier = std::map<const Stream*, long>;

// The clock one cudaEventRecord published, for the waits enqueued after it (deferred
// execution, below: a later record of the same event may run before such a wait).
struct RecordSlot {
  VC vc;
  bool done = false;
  uint64_t op = 0;  // the deferred record that fills it
};

struct Event {
  bool timing = true;
  bool recorded = false;
  bool destroyed = false;
  VC vc;
  double t_ms = 0;
  Capture* cap = nullptr;  // recorded in this (ongoing) capture
  Frontier known;          // the recording stream's frontier in it
  std::shared_ptr<RecordSlot> last;  // the latest deferred record, while deferring
};

// One recorded operation: it runs again, at its call site, at every launch of the graph.
struct Node {
  Stream* stream;
  Site site;
  std::function<void()> work;
  std::vector<Stream*> streams;  // every stream of the operation (a group of NCCL calls: several)
  bool nccl = false;             // an operation of NCCL's host API (a kernel NCCL launches)
  int order = 0;                 // 1: an event record, 2: an event wait (of `event`)
  Event* event = nullptr;
};

struct Capture {
  Stream* origin = nullptr;
  int mode = 0;
  bool invalid = false;
  std::vector<Node> nodes;
  std::map<Stream*, Frontier> known;  // every stream that joined, with its frontier
  std::vector<Event*> events;         // recorded in it
};

struct Graph {
  std::shared_ptr<const std::vector<Node>> nodes;
  std::vector<Stream*> streams;  // the streams the operations were captured on
};

struct GraphExec {
  std::shared_ptr<const std::vector<Node>> nodes;
  std::vector<Stream*> streams;
};

// One operation enqueued while deferring: it runs later, when the rank drains its queue.
struct Deferred {
  uint64_t id = 0;
  std::vector<Stream*> streams;
  std::function<void()> work;
  Site site;
  std::vector<uint64_t> deps;  // operations that must have run first
};

namespace {

struct Device {
  VC host;
  Stream* legacy = nullptr;
  std::vector<std::unique_ptr<Stream>> streams;  // every stream ever created (never freed)
  std::unordered_set<const Stream*> live;
  std::vector<std::unique_ptr<Event>> events;
  std::unordered_set<const Event*> live_events;
  int next_local = 2;
  std::map<int, Stream*> slot_owner;  // the stream that holds (or last held) each slot
  Op* current = nullptr;
  // op descriptions by epoch, for race reports (bounded)
  std::unordered_map<uint64_t, std::string> op_names;
  std::vector<uint64_t> op_order;
  int last_error = 0;
  std::vector<std::unique_ptr<Capture>> captures;  // ongoing
  std::vector<std::unique_ptr<Graph>> graphs;      // never freed: destroyed ones are known
  std::unordered_set<const Graph*> live_graphs;
  std::vector<std::unique_ptr<GraphExec>> execs;
  std::unordered_set<const GraphExec*> live_execs;
  // deferred operations (COCOVIZ_EMU_ORDER=adversarial), in enqueue order
  std::vector<Deferred> deferred;
  std::unordered_set<uint64_t> deferred_ids;
  std::unordered_map<const Stream*, uint64_t> stream_last;  // the last deferred op of each stream
  uint64_t nccl_last = 0;                                   // the last deferred NCCL operation
  uint64_t next_id = 1;
  bool draining = false;
};

Device& dev() {
  static Device* d = [] {
    Device* x = new Device();
    x->host.c[static_cast<size_t>(world_rank()) * kAgentsPerRank] = 1;  // host: slot 0
    x->streams.push_back(std::make_unique<Stream>());
    x->legacy = x->streams.back().get();
    x->legacy->local = 1;
    x->legacy->name = "the legacy default stream";
    x->live.insert(x->legacy);
    return x;
  }();
  return *d;
}

int global_agent(int slot) { return world_rank() * kAgentsPerRank + slot * (1 + kCtaSlots); }

std::string agent_text(int agent) {
  const int rank = agent / kAgentsPerRank, local = agent % kAgentsPerRank;
  const int slot = local / (1 + kCtaSlots), cta = local % (1 + kCtaSlots) - 1;
  std::string what;
  if (rank == world_rank()) {
    if (slot == 0) what = "the host";
    else {
      for (auto& s : dev().streams) {
        if (s->local == slot) what = s->name;
      }
    }
  }
  if (what.empty()) what = slot == 0 ? "host" : (slot == 1 ? "legacy stream" : "stream #" + std::to_string(slot - 1));
  if (cta >= 0) what = "block " + std::to_string(cta) + (cta + kCtaSlots < 65536 ? " (mod " + std::to_string(kCtaSlots) + ")" : "") + " of a kernel on " + what;
  return what + " of rank " + std::to_string(rank);
}

std::string epoch_text(uint64_t e) {
  auto it = dev().op_names.find(e);
  std::string op = it != dev().op_names.end() ? it->second : "an operation";
  return op + " (" + agent_text(epoch_agent(e)) + ", clock " + std::to_string(epoch_clock(e)) + ")";
}

void remember_op(uint64_t e, const std::string& what) {
  Device& d = dev();
  if (d.op_names.emplace(e, what).second) d.op_order.push_back(e);
  if (d.op_order.size() > 200000) {
    for (size_t i = 0; i < 100000; ++i) d.op_names.erase(d.op_order[i]);
    d.op_order.erase(d.op_order.begin(), d.op_order.begin() + 100000);
  }
}

}  // namespace

Stream* legacy_stream() { return dev().legacy; }

Stream* stream_create(bool nonblocking, int priority) {
  Device& d = dev();
  auto s = std::make_unique<Stream>();
  // A slot whose stream was destroyed after the host synchronized with all its work is
  // free again: the new stream continues its clocks, so its epochs stay distinct and
  // everything the old one did is ordered before it (as on a GPU).
  int reuse = 0;
  if (d.next_local >= kStreamSlots) {
    for (const auto& [slot, old] : d.slot_owner) {
      const size_t a = static_cast<size_t>(stream_agent(old));
      if (old->destroyed && (a >= old->vc.c.size() || d.host.c[a] >= old->vc.c[a])) {
        reuse = slot;
        std::copy(std::begin(old->cta_clock), std::end(old->cta_clock), std::begin(s->cta_clock));
        break;
      }
    }
  }
  if (reuse != 0) {
    s->local = reuse;
  } else {
    if (d.next_local >= kStreamSlots) {
      note("more than " + std::to_string(kStreamSlots - 2) +
           " live streams: later streams share agents with earlier ones in the happens-before check");
      d.next_local = 2;
    }
    s->local = d.next_local++;
  }
  s->nonblocking = nonblocking;
  s->priority = priority;
  s->vc = d.host;
  s->name = "stream #" + std::to_string(s->local - 1) + (nonblocking ? " (non-blocking)" : "");
  Stream* raw = s.get();
  d.streams.push_back(std::move(s));
  d.live.insert(raw);
  d.slot_owner[raw->local] = raw;
  return raw;
}

bool stream_valid(const void* handle) {
  return handle == nullptr || dev().live.count(static_cast<const Stream*>(handle)) != 0;
}

Stream* resolve_stream(void* handle, const char* what) {
  if (handle == nullptr) return dev().legacy;
  Stream* s = static_cast<Stream*>(handle);
  if (dev().live.count(s) == 0) {
    bool was = false;
    for (auto& x : dev().streams) was = was || x.get() == s;
    fail("invalid stream", std::string(what) + " was given " +
                               (was ? "a destroyed stream " : "a handle that is not a stream ") +
                               hex(handle));
  }
  return s;
}

bool stream_destroy(Stream* s) {
  Device& d = dev();
  if (s == nullptr || s == d.legacy || d.live.count(s) == 0) return false;
  s->destroyed = true;
  d.live.erase(s);
  return true;
}

int stream_agent(const Stream* s) { return global_agent(s->local); }

const std::string& stream_name(const Stream* s) { return s->name; }

// ================================================================ operations

Op::Op(Stream* s, std::string what) : s_(s), what_(std::move(what)), cur_(&s->vc), cur_agent_(stream_agent(s)) {
  static uint64_t serials = 0;
  serial_ = ++serials;
  Device& d = dev();
  if (d.current != nullptr) {
    fail("emulation", "operation '" + what_ + "' started inside '" + d.current->what() + "'");
  }
  VC& v = s->vc;
  v.join(d.host);
  if (s == d.legacy) {
    for (auto& x : d.streams) {
      if (!x->nonblocking && x.get() != d.legacy && d.live.count(x.get())) v.join(x->vc);
    }
  } else if (!s->nonblocking) {
    v.join(d.legacy->vc);
  }
  const size_t me = static_cast<size_t>(cur_agent_);
  if (v.c.size() <= me) v.c.resize(me + 1, 0u);
  v.c[me] += 1;
  if (v.c[me] >= 0xfffffff0u) fail("emulation", "more than 4G operations on one stream");
  start_epoch_ = make_epoch(cur_agent_, v.c[me]);
  remember_op(start_epoch_, what_ + " at " + site_text(g_site));
  d.current = this;
}

Op::~Op() { dev().current = nullptr; }

VC& Op::vc() { return *cur_; }
const VC& Op::vc() const { return *cur_; }

uint64_t Op::epoch() const { return make_epoch(cur_agent_, cur_->c[static_cast<size_t>(cur_agent_)]); }

VC Op::release() {
  VC out = *cur_;
  const size_t me = static_cast<size_t>(cur_agent_);
  if (cur_ == &s_->vc) {
    cur_->c[me] += 1;
  } else {
    const int cta = cur_agent_ - stream_agent(s_) - 1;
    cur_->c[me] = ++s_->cta_clock[cta];
  }
  remember_op(epoch(), what_ + " at " + site_text(g_site));
  return out;
}

void Op::acquire(const VC& other) { cur_->join(other); }

const VC& Op::launch_vc() const { return cta_.empty() ? *cur_ : start_; }

void Op::acquire_at_end(const VC& other) {
  if (cta_.empty()) {  // not a kernel: the operation's own clock
    cur_->join(other);
    return;
  }
  if (!have_at_end_) at_end_ = other;
  else at_end_.join(other);
  have_at_end_ = true;
}

void Op::unicast_window_access(const char* file, int line) {
  if (!unfenced_.empty() || cta_.empty()) return;
  unfenced_ = file != nullptr ? std::string(file) + ":" + std::to_string(line) : what_;
}
const std::string& Op::what() const { return what_; }
Stream* Op::stream() const { return s_; }

void Op::begin_block(unsigned b) {
  const int cta = static_cast<int>(b % kCtaSlots);
  if (cta_.empty()) {
    start_ = s_->vc;
    cta_.resize(kCtaSlots);
  }
  cur_agent_ = stream_agent(s_) + 1 + cta;
  VC& v = cta_[static_cast<size_t>(cta)];
  if (v.c.empty() || b < static_cast<unsigned>(kCtaSlots)) {  // fork (later blocks of a slot continue it)
    v = start_;
    const size_t me = static_cast<size_t>(cur_agent_);
    if (v.c.size() <= me) v.c.resize(me + 1, 0u);
    v.c[me] = ++s_->cta_clock[cta];
    remember_op(make_epoch(cur_agent_, v.c[me]), "block " + std::to_string(b) + " of " + what_ + " at " + site_text(g_site));
  }
  cur_ = &v;
  unfenced_.clear();
}

void Op::end_blocks() {
  for (const VC& v : cta_) {
    if (!v.c.empty()) s_->vc.join(v);
  }
  if (have_at_end_) s_->vc.join(at_end_);
  have_at_end_ = false;
  cta_.clear();
  cur_ = &s_->vc;
  cur_agent_ = stream_agent(s_);
}

Op* current_op() { return dev().current; }

// ====================================================== deferred execution
//
// COCOVIZ_EMU_ORDER=adversarial: an operation enqueued on a non-blocking stream does not
// run at enqueue; it waits in the rank's queue until the host synchronizes (stream, event
// or device), blocks in a wait of its own (a host-side NCCL call) or makes an NCCL
// management call. Then the rank drains the queue one operation at a time, each picked at
// random (COCOVIZ_EMU_SEED) among those whose predecessors have run: the operation before
// it on each of its streams, the event record a cudaStreamWaitEvent waits for, and — with
// NCCL_LAUNCH_ORDER_IMPLICIT set to a nonzero value, as NCCL reads it — the NCCL
// operation enqueued before it on this rank (NCCL then starts its kernels in host issue
// order; the emulation runs each to its end before the next, NCCL's serial variant).
// Nothing else orders them. One operation runs at a time and a blocking one (a collective,
// a send, a receive) holds the rank until its peers come: a GPU too full for two kernels
// at once, the worst case of co-residency. A cycle of such waits across ranks is a
// deadlock, which the watchdog reports. Operations on the legacy stream or a blocking
// stream drain the queue first and run at once (the legacy stream's implicit
// synchronization stays exact). Checks made at enqueue (arguments, capture rules) stay
// at enqueue; the happens-before clocks are those of stream and event order, so hazards
// are found as before, whatever order the operations ran in.

namespace {

bool parse_order_mode() {
  const char* v = std::getenv("COCOVIZ_EMU_ORDER");
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "enqueue") == 0) return false;
  if (std::strcmp(v, "adversarial") == 0) return true;
  fail("usage", std::string("COCOVIZ_EMU_ORDER=") + v + " is not an order the emulation knows",
       {"use 'enqueue' (the default: every operation runs when it is enqueued) or 'adversarial' "
        "(operations on non-blocking streams run later, in a seeded random order that respects "
        "stream order, events and NCCL's implicit launch order when NCCL_LAUNCH_ORDER_IMPLICIT is set)"});
}

uint64_t order_seed() {
  static const uint64_t seed = [] {
    const char* v = std::getenv("COCOVIZ_EMU_SEED");
    if (v == nullptr || v[0] == '\0') return static_cast<uint64_t>(1);
    char* end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-') {
      fail("usage", std::string("COCOVIZ_EMU_SEED=") + v + " is not a seed", {"give a decimal integer 0 .. 2^64-1"});
    }
    return static_cast<uint64_t>(x);
  }();
  return seed;
}

std::mt19937_64& order_rng() {
  static std::mt19937_64 rng = [] {
    std::seed_seq seq{static_cast<uint32_t>(order_seed()), static_cast<uint32_t>(order_seed() >> 32),
                      static_cast<uint32_t>(world_rank())};
    return std::mt19937_64(seq);
  }();
  return rng;
}

bool implicit_launch_order() {
  static const bool on = [] {
    const char* v = std::getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    return v != nullptr && std::atoi(v) != 0;
  }();
  return on;
}

// Defers `work` (its streams' previous operations, `deps` and, for an NCCL operation under
// the implicit launch order, the previous NCCL operation run first); returns its id, or 0
// when it ran at once (a legacy or blocking stream, or enqueued while the queue drains).
uint64_t defer(const std::vector<Stream*>& streams, std::function<void()> work, bool nccl,
               const std::vector<uint64_t>& deps) {
  Device& d = dev();
  bool now = d.draining;
  for (Stream* s : streams) now = now || s == d.legacy || !s->nonblocking;
  if (now) {
    drain_pending();
    work();
    return 0;
  }
  Deferred op;
  op.id = d.next_id++;
  op.streams = streams;
  op.work = std::move(work);
  op.site = g_site;
  for (uint64_t x : deps) {
    if (d.deferred_ids.count(x)) op.deps.push_back(x);
  }
  for (Stream* s : streams) {
    const auto it = d.stream_last.find(s);
    if (it != d.stream_last.end() && d.deferred_ids.count(it->second)) op.deps.push_back(it->second);
    d.stream_last[s] = op.id;
  }
  if (nccl && implicit_launch_order()) {
    if (d.deferred_ids.count(d.nccl_last)) op.deps.push_back(d.nccl_last);
    d.nccl_last = op.id;
  }
  d.deferred_ids.insert(op.id);
  d.deferred.push_back(std::move(op));
  return d.next_id - 1;
}

}  // namespace

bool deferring() {
  static const bool on = parse_order_mode();
  return on;
}

uint64_t order_seed_value() { return order_seed(); }

void drain_pending() {
  Device& d = dev();
  if (d.draining || d.deferred.empty()) return;
  d.draining = true;
  const Site saved = g_site;
  while (!d.deferred.empty()) {
    std::vector<size_t> ready;
    for (size_t i = 0; i < d.deferred.size(); ++i) {
      bool ok = true;
      for (uint64_t x : d.deferred[i].deps) ok = ok && d.deferred_ids.count(x) == 0;
      if (ok) ready.push_back(i);
    }
    if (ready.empty()) fail("emulation", "the deferred operations wait on each other (an emulation bug)");
    const size_t pick = ready[static_cast<size_t>(order_rng()() % ready.size())];
    Deferred op = std::move(d.deferred[pick]);
    d.deferred.erase(d.deferred.begin() + static_cast<long>(pick));
    d.deferred_ids.erase(op.id);
    g_site = op.site;
    op.work();
  }
  g_site = saved;
  d.draining = false;
}

void host_sync_stream(Stream* s) {
  drain_pending();
  dev().host.join(s->vc);
}

void host_sync_device() {
  drain_pending();
  Device& d = dev();
  for (auto& s : d.streams) d.host.join(s->vc);
}

const VC& host_vc() { return dev().host; }

Event* event_create(bool timing) {
  auto e = std::make_unique<Event>();
  e->timing = timing;
  Event* raw = e.get();
  dev().events.push_back(std::move(e));
  dev().live_events.insert(raw);
  return raw;
}

Event* resolve_event(void* handle, const char* what) {
  Event* e = static_cast<Event*>(handle);
  if (handle == nullptr || dev().live_events.count(e) == 0) {
    fail("invalid event", std::string(what) + " was given " + (handle == nullptr ? "a null event" : "a destroyed or unknown event ") + hex(handle));
  }
  return e;
}

bool event_valid(const void* handle) {
  return handle != nullptr && dev().live_events.count(static_cast<const Event*>(handle)) != 0;
}

bool event_destroy(Event* e) {
  if (dev().live_events.erase(e) == 0) return false;
  e->destroyed = true;
  return true;
}

namespace {

int enqueue_impl(const std::vector<Stream*>& streams, std::function<void()> work, bool nccl, uint64_t* id,
                 const std::vector<uint64_t>& deps);

void record_now(Event* e, Stream* s) {
  Op op(s, "cudaEventRecord");
  e->vc = op.vc();
  e->recorded = true;
  e->t_ms = std::chrono::duration<double, std::milli>(
                std::chrono::steady_clock::now().time_since_epoch())
                .count();
}

void wait_now(Stream* s, Event* e) {
  if (!e->recorded) return;  // CUDA: waiting on a never-recorded event completes at once
  Op op(s, "cudaStreamWaitEvent");
  op.acquire(e->vc);
}

void invalidate(Capture* c, const std::string& why) {
  if (!c->invalid) note("stream capture invalidated: " + why + " (at " + site_text(g_site) + ")");
  c->invalid = true;
}

// Appends a node over `streams` (all in capture `c`): each stream's frontier joins the
// others' and records the node as its last. Event records and waits are no nodes of their
// own in CUDA's graph (`ordering`: they only order), so they do not count as a stream's
// last node for the join rule.
void add_node(Capture* c, const std::vector<Stream*>& streams, std::function<void()> work,
              bool ordering = false) {
  const long at = static_cast<long>(c->nodes.size());
  c->nodes.push_back(Node{streams.front(), g_site, std::move(work), streams});
  if (ordering) return;
  Frontier joined;
  for (Stream* x : streams) {
    for (const auto& kv : c->known[x]) joined[kv.first] = std::max(joined[kv.first], kv.second);
  }
  for (Stream* x : streams) joined[x] = at;
  for (Stream* x : streams) c->known[x] = joined;
}

}  // namespace

int event_record(Event* e, Stream* s) {
  if (s->cap != nullptr) {
    Capture* c = s->cap;
    if (c->invalid) return kErrCaptureInvalidated;
    add_node(c, {s}, [e, s] { record_now(e, s); }, true);
    c->nodes.back().order = 1;
    c->nodes.back().event = e;
    e->cap = c;
    e->known = c->known[s];
    c->events.push_back(e);
    return 0;
  }
  if (deferring()) {
    auto slot = std::make_shared<RecordSlot>();
    uint64_t id = 0;
    if (int err = enqueue_impl({s}, [e, s, slot] { record_now(e, s); slot->vc = e->vc; slot->done = true; }, false, &id, {})) return err;
    slot->op = id;
    e->last = slot;
    e->cap = nullptr;
    return 0;
  }
  if (int err = enqueue(s, [e, s] { record_now(e, s); })) return err;
  e->cap = nullptr;
  return 0;
}

namespace {

// A wait bound to the record it follows (deferring): the clock that record published,
// even when a later record of the event runs first.
int defer_wait(Stream* s, std::shared_ptr<RecordSlot> slot) {
  std::vector<uint64_t> deps;
  if (slot && !slot->done) deps.push_back(slot->op);
  return enqueue_impl({s}, [s, slot] {
    if (!slot) return;  // never recorded: completes at once
    Op op(s, "cudaStreamWaitEvent");
    op.acquire(slot->vc);
  }, false, nullptr, deps);
}

}  // namespace

int stream_wait_event(Stream* s, Event* e) {
  Capture* c = e->cap;
  if (c == nullptr) {
    if (s->cap != nullptr) {
      // CUDA: a capturing stream may wait only on events recorded in its own capture
      invalidate(s->cap, "cudaStreamWaitEvent of a capturing stream on an event recorded outside the capture");
      return kErrCaptureIsolation;
    }
    if (deferring()) {
      std::shared_ptr<RecordSlot> slot = e->last;
      if (!slot && e->recorded) {  // recorded before: its clock as it is now
        slot = std::make_shared<RecordSlot>();
        slot->vc = e->vc;
        slot->done = true;
      }
      return defer_wait(s, slot);
    }
    return enqueue(s, [s, e] { wait_now(s, e); });
  }
  if (s->cap != nullptr && s->cap != c) {
    invalidate(s->cap, "cudaStreamWaitEvent on an event of another capture");
    invalidate(c, "cudaStreamWaitEvent on an event of another capture");
    return kErrCaptureMerge;
  }
  if (c->invalid) return kErrCaptureInvalidated;
  if (s->cap == nullptr) {  // s joins the capture, forked from where the event was recorded
    s->cap = c;
    c->known[s] = e->known;
  } else {
    Frontier& f = c->known[s];
    for (const auto& kv : e->known) f[kv.first] = std::max(f[kv.first], kv.second);
  }
  add_node(c, {s}, [s, e] { wait_now(s, e); }, true);
  c->nodes.back().order = 2;
  c->nodes.back().event = e;
  return 0;
}

void host_sync_event(Event* e) {
  drain_pending();
  if (e->recorded) dev().host.join(e->vc);
}

bool event_captured(const Event* e) { return e->cap != nullptr; }

// ============================================================ stream capture

int enqueue(Stream* s, std::function<void()> work) { return enqueue_on({s}, std::move(work)); }

int enqueue_on(const std::vector<Stream*>& streams, std::function<void()> work, bool nccl) {
  return enqueue_impl(streams, std::move(work), nccl, nullptr, {});
}

namespace {

int enqueue_impl(const std::vector<Stream*>& streams, std::function<void()> work, bool nccl, uint64_t* id,
                 const std::vector<uint64_t>& deps) {
  if (id != nullptr) *id = 0;
  Device& d = dev();
  Capture* c = streams.front()->cap;
  for (Stream* x : streams) {
    if (x->cap != c) {
      if (c != nullptr) invalidate(c, "one operation on capturing and other streams");
      if (x->cap != nullptr) invalidate(x->cap, "one operation on capturing and other streams");
      return kErrCaptureIsolation;
    }
    if (x == d.legacy) {
      // the legacy stream synchronizes with blocking streams: not while one captures
      for (auto& cap : d.captures) {
        for (const auto& kv : cap->known) {
          if (!kv.first->nonblocking) {
            invalidate(cap.get(), "an operation on the legacy default stream while a blocking stream captures");
            return kErrCaptureImplicit;
          }
        }
      }
    }
  }
  if (c == nullptr) {
    if (!deferring()) {
      work();
      return 0;
    }
    const uint64_t x = defer(streams, std::move(work), nccl, deps);
    if (id != nullptr) *id = x;
    return 0;
  }
  if (c->invalid) return kErrCaptureInvalidated;
  add_node(c, streams, std::move(work));
  c->nodes.back().nccl = nccl;
  return 0;
}

}  // namespace

int capture_begin(Stream* s, int mode) {
  if (s == dev().legacy) return kErrCaptureUnsupported;  // CUDA: not on cudaStreamLegacy
  if (s->cap != nullptr) return kErrIllegalState;
  if (mode < 0 || mode > 2) return 1;  // cudaErrorInvalidValue
  auto c = std::make_unique<Capture>();
  c->origin = s;
  c->mode = mode;
  c->known[s] = Frontier{};
  s->cap = c.get();
  dev().captures.push_back(std::move(c));
  return 0;
}

int capture_end(Stream* s, Graph** out) {
  *out = nullptr;
  Capture* c = s->cap;
  if (c == nullptr) return kErrIllegalState;
  if (c->origin != s) {
    invalidate(c, "cudaStreamEndCapture on a stream that joined the capture, not the one it began on");
    return kErrCaptureUnmatched;
  }
  int err = c->invalid ? kErrCaptureInvalidated : 0;
  std::string unjoined;
  const Frontier& f = c->known[s];
  for (const auto& kv : c->known) {
    const auto last = kv.second.find(kv.first);
    if (last == kv.second.end()) continue;  // joined, but nothing recorded on it
    const auto seen = f.find(kv.first);
    if (seen == f.end() || seen->second < last->second) unjoined = kv.first->name;
  }
  if (err == 0 && !unjoined.empty()) {
    note("cudaStreamEndCapture: " + unjoined + " forked from the capture and was not joined back into " + s->name +
         " (an event recorded on it after its last operation, waited on by the origin stream) (at " + site_text(g_site) + ")");
    err = kErrCaptureUnjoined;
  }
  Device& d = dev();
  auto g = std::make_unique<Graph>();
  for (const auto& kv : c->known) {
    kv.first->cap = nullptr;
    g->streams.push_back(kv.first);
  }
  for (Event* e : c->events) {
    if (e->cap == c) e->cap = nullptr;
  }
  g->nodes = std::make_shared<const std::vector<Node>>(std::move(c->nodes));
  d.captures.erase(std::find_if(d.captures.begin(), d.captures.end(),
                                [c](const std::unique_ptr<Capture>& x) { return x.get() == c; }));
  if (err != 0) return err;
  *out = g.get();
  d.live_graphs.insert(g.get());
  d.graphs.push_back(std::move(g));
  return 0;
}

int capture_status(const Stream* s) {
  if (s->cap == nullptr) return 0;
  return s->cap->invalid ? 2 : 1;
}

bool refuse_unsafe(const std::string& call) {
  bool refused = false;
  for (auto& c : dev().captures) {
    if (c->mode == 2) continue;  // relaxed
    invalidate(c.get(), call + " is not allowed while a stream captures");
    refused = true;
  }
  return refused;
}

bool refuse_on_capturing(Stream* s, const std::string& call) {
  if (s->cap == nullptr) return false;
  invalidate(s->cap, call + " of a capturing stream");
  return true;
}

bool graph_valid(const void* handle) { return dev().live_graphs.count(static_cast<const Graph*>(handle)) != 0; }

bool graph_exec_valid(const void* handle) {
  return dev().live_execs.count(static_cast<const GraphExec*>(handle)) != 0;
}

bool graph_destroy(Graph* g) { return dev().live_graphs.erase(g) != 0; }

bool graph_exec_destroy(GraphExec* x) { return dev().live_execs.erase(x) != 0; }

GraphExec* graph_instantiate(Graph* g) {
  auto x = std::make_unique<GraphExec>();
  x->nodes = g->nodes;
  x->streams = g->streams;
  GraphExec* raw = x.get();
  dev().live_execs.insert(raw);
  dev().execs.push_back(std::move(x));
  return raw;
}

int graph_launch(GraphExec* x, Stream* s) {
  std::shared_ptr<const std::vector<Node>> nodes = x->nodes;
  std::vector<Stream*> streams = x->streams;
  if (deferring() && s->cap == nullptr) {
    // the graph's operations join the queue one by one, on their capture streams, after a
    // start on s and every capture stream and before an end on all of them; a wait is
    // bound to the record before it in the graph
    std::vector<Stream*> all = streams;
    if (std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
    if (int err = enqueue_impl(all, [streams, s] {
          s->vc.join(dev().host);
          for (Stream* t : streams) t->vc.join(s->vc);
        }, false, nullptr, {})) {
      return err;
    }
    const Site saved = g_site;
    std::map<const Event*, std::shared_ptr<RecordSlot>> slots;
    for (const Node& n : *nodes) {
      g_site = n.site;
      const std::vector<Stream*> on = n.streams.empty() ? std::vector<Stream*>{n.stream} : n.streams;
      if (n.order == 1) {
        auto slot = std::make_shared<RecordSlot>();
        Event* e = n.event;
        Stream* st = n.stream;
        uint64_t id = 0;
        enqueue_impl(on, [e, st, slot] { record_now(e, st); slot->vc = e->vc; slot->done = true; }, false, &id, {});
        slot->op = id;
        slots[e] = slot;
      } else if (n.order == 2) {
        const auto it = slots.find(n.event);
        defer_wait(n.stream, it != slots.end() ? it->second : nullptr);
      } else {
        enqueue_impl(on, n.work, n.nccl, nullptr, {});
      }
    }
    g_site = saved;
    return enqueue_impl(all, [streams, s] {
      for (Stream* t : streams) s->vc.join(t->vc);
    }, false, nullptr, {});
  }
  return enqueue(s, [nodes, streams, s] {
    // the graph starts after what came before it on s, and s goes on after all of it
    Device& d = dev();
    s->vc.join(d.host);
    for (Stream* t : streams) t->vc.join(s->vc);
    const Site saved = g_site;
    for (const Node& n : *nodes) {
      g_site = n.site;
      n.work();
    }
    g_site = saved;
    for (Stream* t : streams) s->vc.join(t->vc);
  });
}

bool event_recorded(const Event* e) { return e->recorded; }
bool event_timing(const Event* e) { return e->timing; }
double event_time_ms(const Event* e) { return e->t_ms; }

void set_last_error(int code) {
  if (dev().last_error == 0) dev().last_error = code;
}

int take_last_error() {
  const int e = dev().last_error;
  dev().last_error = 0;
  return e;
}

// ==================================================================== memory

// Racecheck: the threads of one block between two of its barriers (block_barrier) run in
// one "race epoch"; each granule remembers, for the epoch it was last touched in, the thread
// that wrote it and up to two threads that read it, with their source lines. A thread's
// access conflicts with another thread's write (or, writing, with another thread's read)
// of the same epoch: nothing orders the two on a GPU (compute-sanitizer's racecheck).
struct RaceCell {                  // 16 bytes per 2-byte granule
  uint32_t epoch;                  // race epoch of the accesses below, mod 2^32 (stale: none)
  uint16_t w, r1, r2;              // thread index + 1 of the writer and of two readers (0: none)
  uint16_t ws, r1s, r2s;           // their source lines (race_site index; 0: an API's own access)
};
static_assert(sizeof(RaceCell) == 16, "RaceCell");

namespace {

std::map<uintptr_t, std::unique_ptr<Alloc>>& allocs() {
  static auto* m = new std::map<uintptr_t, std::unique_ptr<Alloc>>();
  return *m;
}

size_t cell_count(size_t bytes) { return bytes / kGranule + 2; }

// Shared allocation file layout: [header][data padded to 4 KiB][cells]
struct SharedHeader {
  uint64_t magic;
  uint64_t bytes;
  SpinLock lock;
};
constexpr uint64_t kSharedMagic = 0x636f636f76697a31ull;  // "cocoviz1"

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
size_t data_offset() { return 4096; }
size_t cells_offset(size_t bytes) { return data_offset() + round_up(bytes ? bytes : 1, 4096); }
size_t file_size(size_t bytes) { return cells_offset(bytes) + round_up(cell_count(bytes) * sizeof(Cell), 4096); }

const Alloc* g_last = nullptr;  // lookup cache

Alloc* lookup(uintptr_t a) {
  auto& m = allocs();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  Alloc* x = it->second.get();
  if (a < x->base + std::max<size_t>(x->size, 1)) return x;
  return nullptr;
}

std::string describe_alloc(const Alloc& x) {
  std::string kind = x.kind == MemKind::device ? "device allocation" : (x.kind == MemKind::symmetric ? "ncclMemAlloc window memory" : "window memory of rank " + std::to_string(x.owner) + " (mapped)");
  return kind + " of " + std::to_string(x.size) + " bytes at " + hex(reinterpret_cast<void*>(x.base)) + " made by " + x.label;
}

// Racecheck cells are this process's own (also for a peer's mapped window).
void drop_race(Alloc* a) {
  if (a->race != nullptr) ::munmap(a->race, cell_count(a->size) * sizeof(RaceCell));
  a->race = nullptr;
}

Alloc* add(uintptr_t base, size_t size, MemKind kind, int owner, Cell* cells, SpinLock* lock) {
  auto& m = allocs();
  auto a = std::make_unique<Alloc>();
  a->base = base;
  a->size = size;
  a->kind = kind;
  a->owner = owner;
  a->label = site_text(g_site);
  a->cells = cells;
  a->lock = lock;
  Alloc* raw = a.get();
  m[base] = std::move(a);
  g_last = nullptr;
  return raw;
}

}  // namespace

void* device_alloc(size_t bytes) {
  // never reused: each allocation gets fresh pages, so a freed range stays recognisable
  const size_t len = round_up(std::max<size_t>(bytes, 1), 4096) + 4096;  // + a gap page
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0xA5, bytes);
  ::mprotect(static_cast<char*>(p) + len - 4096, 4096, PROT_NONE);
  Cell* cells = static_cast<Cell*>(std::calloc(cell_count(bytes), sizeof(Cell)));
  if (cells == nullptr) {
    ::munmap(p, len);
    return nullptr;
  }
  add(reinterpret_cast<uintptr_t>(p), bytes, MemKind::device, world_rank(), cells, nullptr);
  return p;
}

bool device_free(void* p) {
  Alloc* a = lookup(reinterpret_cast<uintptr_t>(p));
  if (a == nullptr || a->base != reinterpret_cast<uintptr_t>(p) || a->freed || a->kind != MemKind::device) return false;
  a->freed = true;
  a->freed_at = site_text(g_site);
  std::free(a->cells);
  a->cells = nullptr;
  drop_race(a);
  // the pages stay mapped but inaccessible: a stray host dereference faults
  ::mprotect(p, round_up(std::max<size_t>(a->size, 1), 4096), PROT_NONE);
  g_last = nullptr;
  return true;
}

void* shared_alloc(size_t bytes, std::string* path_out) {
  static int counter = 0;
  const std::string path = env_dir() + "/cocoviz-emu-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  g_owned_files.push_back(path);
  const size_t len = file_size(bytes);
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return nullptr;
  auto* h = new (m) SharedHeader();
  h->magic = kSharedMagic;
  h->bytes = bytes;
  char* data = static_cast<char*>(m) + data_offset();
  std::memset(data, 0xA5, bytes);
  Cell* cells = reinterpret_cast<Cell*>(static_cast<char*>(m) + cells_offset(bytes));
  Alloc* a = add(reinterpret_cast<uintptr_t>(data), bytes, MemKind::symmetric, world_rank(), cells, &h->lock);
  a->path = path;
  if (path_out != nullptr) *path_out = path;
  return data;
}

void* shared_map(const std::string& path, size_t bytes, int owner) {
  const int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) fail("window", "cannot open rank " + std::to_string(owner) + "'s window memory " + path + ": " + std::strerror(errno));
  const size_t len = file_size(bytes);
  void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail("window", "cannot map rank " + std::to_string(owner) + "'s window memory " + path);
  auto* h = static_cast<SharedHeader*>(m);
  if (h->magic != kSharedMagic || h->bytes != bytes) fail("window", "rank " + std::to_string(owner) + "'s window memory " + path + " is not what it announced");
  char* data = static_cast<char*>(m) + data_offset();
  Cell* cells = reinterpret_cast<Cell*>(static_cast<char*>(m) + cells_offset(bytes));
  Alloc* a = add(reinterpret_cast<uintptr_t>(data), bytes, MemKind::peer, owner, cells, &h->lock);
  a->path = path;
  return data;
}

void shared_unmap(void* local_base) {
  Alloc* a = lookup(reinterpret_cast<uintptr_t>(local_base));
  if (a == nullptr || a->kind != MemKind::peer || a->freed) return;
  a->freed = true;
  a->freed_at = site_text(g_site);
  ::munmap(static_cast<char*>(local_base) - data_offset(), file_size(a->size));
  a->cells = nullptr;
  a->lock = nullptr;
  drop_race(a);
  g_last = nullptr;
}

void shared_unlink(const std::string& path) {
  ::unlink(path.c_str());
  g_owned_files.erase(std::remove(g_owned_files.begin(), g_owned_files.end(), path), g_owned_files.end());
}

bool shared_free(void* p) {
  Alloc* a = lookup(reinterpret_cast<uintptr_t>(p));
  if (a == nullptr || a->base != reinterpret_cast<uintptr_t>(p) || a->freed || a->kind != MemKind::symmetric) return false;
  a->freed = true;
  a->freed_at = site_text(g_site);
  shared_unlink(a->path);
  ::munmap(static_cast<char*>(p) - data_offset(), file_size(a->size));
  a->cells = nullptr;
  a->lock = nullptr;
  drop_race(a);
  g_last = nullptr;
  return true;
}

const Alloc* find_alloc(const void* p) { return lookup(reinterpret_cast<uintptr_t>(p)); }

bool is_device_pointer(const void* p) { return lookup(reinterpret_cast<uintptr_t>(p)) != nullptr; }

const Alloc& check_range(const void* p, size_t n, const std::string& what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const Alloc* x = lookup(a);
  if (x == nullptr) {
    // the nearest allocation below, for the message
    auto& m = allocs();
    auto it = m.upper_bound(a);
    std::vector<std::string> detail;
    if (it != m.begin()) {
      --it;
      const Alloc& y = *it->second;
      detail.push_back("nearest below: " + describe_alloc(y) + " (the address is " + std::to_string(a - y.base - y.size) + " bytes past its end)");
    }
    fail("out of bounds", what + ": " + std::to_string(n) + " bytes at " + hex(p) + " lie in no device allocation", detail);
  }
  if (x->freed) {
    fail("use after free", what + ": " + std::to_string(n) + " bytes at " + hex(p) + " in freed memory", {describe_alloc(*x), "freed by " + x->freed_at});
  }
  if (a + n > x->base + x->size) {
    fail("out of bounds", what + ": bytes [" + std::to_string(a - x->base) + ", " + std::to_string(a - x->base + n) + ") of a " + std::to_string(x->size) + "-byte allocation", {describe_alloc(*x)});
  }
  return *x;
}

namespace {

[[noreturn]] void race(const char* kind, const Alloc& x, uintptr_t a, size_t n, uint64_t other,
                       const Op& op, const char* file, int line) {
  std::vector<std::string> d;
  d.push_back("this access: " + op.what() + (file != nullptr ? std::string(" (") + file + ":" + std::to_string(line) + ")" : std::string()) + " on " + agent_text(epoch_agent(op.epoch())) + ", bytes [" + std::to_string(a - x.base) + ", " + std::to_string(a - x.base + n) + ")");
  d.push_back("conflicts with: " + epoch_text(other));
  d.push_back("memory: " + describe_alloc(x));
  d.push_back("nothing orders the two (no stream order, event, synchronization, collective or barrier between them): add the missing cudaEventRecord/cudaStreamWaitEvent or barrier");
  fail("hazard", std::string(kind) + " between operations the program does not order", d);
}

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '0' && v[1] == '\0';
}
bool initcheck_on() {
  static const bool on = !env_off("COCOVIZ_EMU_INITCHECK");
  return on;
}
bool racecheck_on() {
  static const bool on = !env_off("COCOVIZ_EMU_RACECHECK");
  return on;
}

uint64_t g_race_epoch = 1;     // advanced when a block starts and when its barrier releases
uint32_t g_race_tid = 0;       // linear index of the running thread in its block
bool g_in_kernel = false;
bool g_atomic = false;         // the access being made is an atomic's (access_atomic)

// The program's static data ([__executable_start, _end), linker symbols): where __shared__
// variables live in the emulation (cuda_runtime.h makes them static).
extern "C" char __executable_start[] __attribute__((weak));
extern "C" char _end[] __attribute__((weak));
bool is_static_data(uintptr_t a, size_t n) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(__executable_start), hi = reinterpret_cast<uintptr_t>(_end);
  return lo != 0 && hi != 0 && a >= lo && a + n <= hi;
}
std::unordered_map<uintptr_t, RaceCell>& static_race_cells() {  // per granule address
  static auto* m = new std::unordered_map<uintptr_t, RaceCell>();
  return *m;
}

std::string thread_text(uint32_t t) {
  const Dim3 bd = g_pos.block_dim;
  return "thread (" + std::to_string(t % bd.x) + "," + std::to_string((t / bd.x) % bd.y) + "," +
         std::to_string(t / (bd.x * bd.y)) + ")";
}

std::string line_text(const char* file, int line) {
  return file != nullptr ? std::string(file) + ":" + std::to_string(line) : std::string("(an API's access, no source line)");
}

[[noreturn]] __attribute__((noinline)) void intra_block_race(const char* kind, const std::string& memory, bool write,
                                                             const char* file, int line, uint32_t other,
                                                             bool other_write, const char* of, int ol) {
  const Op* op = dev().current;
  const std::string block = "block (" + std::to_string(g_pos.block.x) + "," + std::to_string(g_pos.block.y) + "," +
                            std::to_string(g_pos.block.z) + ")";
  std::vector<std::string> d;
  d.push_back(std::string("this access: ") + (write ? "write" : "read") + " by " + thread_text(g_race_tid) + " at " +
              line_text(file, line));
  d.push_back(std::string("earlier access: ") + (other_write ? "write" : "read") + " by " + thread_text(other - 1) +
              " at " + line_text(of, ol));
  d.push_back("memory: " + memory);
  d.push_back("both threads belong to " + block + " of " + (op != nullptr ? op->what() : std::string("the kernel")) +
              " and no __syncthreads() (or CTA-wide barrier) lies between the two accesses: on a GPU they run in "
              "either order (compute-sanitizer racecheck reports this hazard)");
  fail("intra-block race", std::string(kind) + " between two threads of one block", d);
}

// Checks and records one granule's access by the running thread (the racecheck above).
// Source lines of racecheck records (file, line), by a 16-bit index (0: none). A kernel's
// accesses come from a few lines, so a small direct-mapped cache answers almost every call.
struct RaceSite {
  const char* file;
  int line;
};
std::vector<RaceSite>& race_sites() {
  static auto* v = new std::vector<RaceSite>{{nullptr, 0}};
  return *v;
}
uint16_t race_site(const char* f, int line) {
  if (f == nullptr) return 0;
  struct Slot {
    const char* f;
    int line;
    uint16_t id;
  };
  static Slot cache[256] = {};
  Slot& c = cache[((reinterpret_cast<uintptr_t>(f) >> 4) ^ (static_cast<unsigned>(line) * 2654435761u)) & 255u];
  if (c.f == f && c.line == line) return c.id;
  static auto* index = new std::map<std::pair<const char*, int>, uint16_t>();
  auto it = index->find({f, line});
  uint16_t id = 0;
  if (it != index->end()) {
    id = it->second;
  } else if (race_sites().size() < 0xffff) {  // (never in practice) past that, lines are lost
    id = static_cast<uint16_t>(race_sites().size());
    race_sites().push_back({f, line});
    index->emplace(std::make_pair(f, line), id);
  }
  c = Slot{f, line, id};
  return id;
}

inline void race_step(RaceCell& c, bool write, const char* file, int line, const Alloc* x, uintptr_t a, size_t n) {
  const uint16_t me = static_cast<uint16_t>(g_race_tid + 1);  // blocks have at most 1024 threads
  const uint32_t epoch = static_cast<uint32_t>(g_race_epoch);  // a cell 2^32 epochs old: never
  if (c.epoch != epoch) {
    c = RaceCell{epoch, 0, 0, 0, 0, 0, 0};
  }
  const char* kind = nullptr;
  uint32_t other = 0;
  bool ow = false;
  uint16_t os = 0;
  if (c.w != 0 && c.w != me) {
    kind = write ? "write after write" : "read after write";
    other = c.w, ow = true, os = c.ws;
  } else if (write && c.r1 != 0 && c.r1 != me) {
    kind = "write after read", other = c.r1, os = c.r1s;
  } else if (write && c.r2 != 0 && c.r2 != me) {
    kind = "write after read", other = c.r2, os = c.r2s;
  }
  if (kind != nullptr) {
    const std::string memory =
        x != nullptr ? describe_alloc(*x) + ", bytes [" + std::to_string(a - x->base) + ", " + std::to_string(a - x->base + n) + ")"
                     : "__shared__ memory (a static variable in the emulation) at " + hex(reinterpret_cast<void*>(a)) + ", " +
                           std::to_string(n) + " bytes";
    const RaceSite o = race_sites()[os];
    intra_block_race(kind, memory, write, file, line, other, ow, o.file, o.line);
  }
  if (write) {
    c.w = me, c.ws = race_site(file, line);
  } else if (c.r1 == 0) {
    c.r1 = me, c.r1s = race_site(file, line);
  } else if (c.r1 != me && c.r2 == 0) {
    c.r2 = me, c.r2s = race_site(file, line);
  }
}

// An access of the block's __shared__ (static) data: racecheck only (it is the block's own).
void access_static(uintptr_t a, size_t n, bool write, const char* file, int line) {
  if (!racecheck_on() || g_atomic || n == 0) return;
  auto& m = static_race_cells();
  for (uintptr_t g = a / kGranule; g <= (a + n - 1) / kGranule; ++g) race_step(m[g], write, file, line, nullptr, a, n);
}

[[noreturn]] __attribute__((noinline)) void uninitialized(const Alloc& x, uintptr_t a, size_t n, size_t g_first,
                                                          const Op& op, const char* file, int line) {
  // the unwritten run of granules inside the access, from its first unwritten one
  const size_t g1 = (a - x.base + n - 1) / kGranule;
  size_t gl = g_first;
  while (gl + 1 <= g1 && x.cells[gl + 1].w == 0) ++gl;
  const size_t lo = std::max(a - x.base, g_first * kGranule), hi = std::min(a - x.base + n, (gl + 1) * kGranule);
  std::vector<std::string> d;
  d.push_back("this access: " + op.what() + (file != nullptr ? std::string(" (load at ") + file + ":" + std::to_string(line) + ")" : std::string()) +
              ", bytes [" + std::to_string(a - x.base) + ", " + std::to_string(a - x.base + n) + ")");
  d.push_back("unwritten: bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ")" +
              (gl < g1 ? " (the first unwritten run in the access)" : ""));
  d.push_back("memory: " + describe_alloc(x));
  d.push_back("no kernel, copy, memset, NCCL or cuBLAS call wrote these bytes since the allocation: the read sees "
              "garbage on a GPU (compute-sanitizer initcheck reports it); COCOVIZ_EMU_INITCHECK=0 turns the check off");
  fail("uninitialized read", "a read of device memory that nothing wrote", d);
}

}  // namespace

void access(const void* p, size_t n, bool write, const char* file, int line, bool multicast) {
  Op* op = dev().current;
  if (op == nullptr) fail("emulation", "device memory accessed outside any operation (host code must not dereference device pointers)");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const Alloc* x = g_last;
  if (x == nullptr || a < x->base || a + n > x->base + x->size || x->freed) {
    if (g_in_kernel && lookup(a) == nullptr && is_static_data(a, n)) {
      access_static(a, n, write, file, line);
      return;
    }
    std::string what = op->what();
    if (file != nullptr) what += std::string(" (") + (write ? "store" : "load") + " at " + file + ":" + std::to_string(line) + ")";
    x = &check_range(p, n, what);
    g_last = x;
  }
  if (n == 0) return;
  if (x->kind == MemKind::peer && !multicast) op->unicast_window_access(file, line);
  const VC& v = op->vc();
  const uint64_t me = op->epoch();
  if (x->lock != nullptr) x->lock->lock();
  const size_t g0 = (a - x->base) / kGranule, g1 = (a - x->base + n - 1) / kGranule;
  for (size_t g = g0; g <= g1; ++g) {
    Cell& c = x->cells[g];
    if (write) {
      if (c.w != me && !v.covers(c.w)) {
        if (x->lock != nullptr) x->lock->unlock();
        race("write after write", *x, a, n, c.w, *op, file, line);
      }
      for (uint64_t r : c.r) {
        if (r != 0 && r != me && !v.covers(r)) {
          if (x->lock != nullptr) x->lock->unlock();
          race("write after read", *x, a, n, r, *op, file, line);
        }
      }
      c.w = me;
      std::memset(c.r, 0, sizeof c.r);
    } else {
      if (c.w == 0 && initcheck_on()) {
        if (x->lock != nullptr) x->lock->unlock();
        uninitialized(*x, a, n, g, *op, file, line);
      }
      if (c.w != me && !v.covers(c.w)) {
        if (x->lock != nullptr) x->lock->unlock();
        race("read after write", *x, a, n, c.w, *op, file, line);
      }
      int free_slot = -1;
      bool have = false;
      for (int i = 0; i < kReads; ++i) {
        if (c.r[i] == me) have = true;
        else if (c.r[i] != 0 && v.covers(c.r[i])) c.r[i] = 0;  // ordered before us: we stand for it
        if (c.r[i] == 0 && free_slot < 0) free_slot = i;
      }
      if (!have) {
        if (free_slot < 0) {
          free_slot = 0;  // more concurrent readers than slots: the oldest is forgotten
        }
        c.r[free_slot] = me;
      }
    }
  }
  if (x->lock != nullptr) x->lock->unlock();
  if (g_in_kernel && !g_atomic && racecheck_on()) {
    Alloc* xm = const_cast<Alloc*>(x);
    if (xm->race == nullptr) {
      // zero pages, touched only where kernels access
      void* m = ::mmap(nullptr, cell_count(x->size) * sizeof(RaceCell), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) fail("emulation", "cannot allocate racecheck cells (COCOVIZ_EMU_RACECHECK=0 turns racecheck off)");
      xm->race = static_cast<RaceCell*>(m);
    }
    for (size_t g = g0; g <= g1; ++g) race_step(xm->race[g], write, file, line, x, a, n);
  }
}

void access_atomic(const void* p, size_t n, const char* file, int line) {
  g_atomic = true;
  access(p, n, false, file, line);
  g_atomic = false;
}

// =================================================================== waiting
//
// Every rank has a status board: a 4 KiB file $COCOVIZ_EMU_DIR/status-R that every rank maps.
// It holds the text of the operation the rank waits for (the watchdog prints it) and, for
// the deadlock detector, the rank's state: running, waiting in wait_until (with the ranks it
// waits for and a count of its failed polls), inside a blocking MPI call (wrapped through
// MPI's profiling interface, below) or exited. A wait serial counts the rank's waits.
//
// Deadlock: a waiting rank reads every board; when every rank is waiting, in a blocking MPI
// call or exited, it remembers their serials; if after COCOVIZ_EMU_DEADLOCK_S seconds
// (default 0.5) every rank is still in the same wait and every polling rank has polled and
// failed at least kDeadlockPolls more times, no rank can make progress: nothing is left to
// post what the others wait for (a rank that waits only completes what peers posted). It
// reports the wait-for cycle and ends the job. The watchdog (COCOVIZ_EMU_TIMEOUT) stays as
// the backstop for what this misses (a rank spinning in host code, an MPI-only hang).

namespace {

enum BoardState : int32_t { kRunning = 0, kWaiting = 1, kInMpi = 2, kExited = 3 };
constexpr size_t kStatusBytes = 1024;
constexpr int kBoardPeers = 256;
constexpr uint64_t kDeadlockPolls = 100;

struct BoardSlot {
  char text[kStatusBytes];     // the pending operation (offset 0: everyone_pending reads it)
  uint64_t serial;             // waits entered so far
  uint64_t polls;              // failed polls of the current wait
  int32_t state;               // BoardState
  int32_t npeers;              // entries of peers (-1: every other rank)
  int32_t peers[kBoardPeers];  // world ranks this wait needs something from
  char key[128];               // ranks with one key wait together (one communicator's collective)
  int64_t job;                 // the launcher's process (getppid): a board left by another run differs
  char sends[1536];            // this rank's sends posted and not yet received (set_posted_sends)
};
constexpr size_t kBoardBytes = 4096;
static_assert(sizeof(BoardSlot) <= kBoardBytes, "board slot");

struct StatusBoard {
  BoardSlot* mine = nullptr;
  bool tried = false;
  std::vector<const BoardSlot*> all;  // every rank's board, mapped when it exists
};
StatusBoard g_board;

const char* emu_dir_env() {
  const char* d = std::getenv("COCOVIZ_EMU_DIR");
  return d != nullptr && d[0] != '\0' ? d : nullptr;
}

void board_exit() {
  if (g_board.mine != nullptr) __atomic_store_n(&g_board.mine->state, kExited, __ATOMIC_RELEASE);
}

void board_open() {
  if (g_board.tried) return;
  g_board.tried = true;
  const char* d = emu_dir_env();
  if (d == nullptr) return;
  const std::string path = std::string(d) + "/status-" + std::to_string(world_rank());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return;
  if (::ftruncate(fd, kBoardBytes) == 0) {
    void* m = ::mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      g_board.mine = static_cast<BoardSlot*>(m);
      std::memset(m, 0, sizeof(BoardSlot));  // a board left by an earlier run in this directory
      __atomic_store_n(&g_board.mine->job, static_cast<int64_t>(::getppid()), __ATOMIC_RELEASE);
      std::atexit(board_exit);
    }
  }
  ::close(fd);
}

// Rank r's board, mapped read-only once its file has its full size (nullptr before).
const BoardSlot* board_of(int r) {
  if (g_board.all.size() < static_cast<size_t>(world_size())) g_board.all.resize(static_cast<size_t>(world_size()), nullptr);
  const BoardSlot*& b = g_board.all[static_cast<size_t>(r)];
  if (b != nullptr) return b;
  const char* d = emu_dir_env();
  if (d == nullptr) return nullptr;
  const std::string path = std::string(d) + "/status-" + std::to_string(r);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kBoardBytes)) {
    void* m = ::mmap(nullptr, kBoardBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) b = static_cast<const BoardSlot*>(m);
  }
  ::close(fd);
  return b;
}

std::string g_pending;

std::vector<std::string> everyone_pending() {
  std::vector<std::string> out;
  const char* d = emu_dir_env();
  if (d == nullptr) {
    out.push_back("rank " + std::to_string(world_rank()) + ": " + g_pending + "  (set COCOVIZ_EMU_DIR, as run.sh --emulate does, to see every rank)");
    return out;
  }
  for (int r = 0; r < world_size(); ++r) {
    const std::string path = std::string(d) + "/status-" + std::to_string(r);
    std::string text = "(no status: not started, or finished before waiting)";
    FILE* f = std::fopen(path.c_str(), "r");
    if (f != nullptr) {
      char buf[kStatusBytes + 1] = {};
      const size_t k = std::fread(buf, 1, kStatusBytes, f);
      std::fclose(f);
      buf[k] = '\0';
      if (buf[0] != '\0') text = buf;
      else text = "running host code (not waiting on the device)";
    }
    out.push_back("rank " + std::to_string(r) + ": " + text);
  }
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void board_text(const std::string& what) {
  board_open();
  if (g_board.mine != nullptr) {
    const size_t n = std::min(what.size(), kStatusBytes - 1);
    std::memcpy(g_board.mine->text, what.data(), n);
    g_board.mine->text[n] = '\0';
  }
}

// Enters a wait (state kWaiting or kInMpi) with the ranks it needs and its key.
void board_enter(int32_t state, const std::vector<int>& peers, const std::string& key) {
  board_open();
  BoardSlot* b = g_board.mine;
  if (b == nullptr) return;
  if (peers.size() > static_cast<size_t>(kBoardPeers)) {
    b->npeers = -1;
  } else {
    b->npeers = static_cast<int32_t>(peers.size());
    for (size_t i = 0; i < peers.size(); ++i) b->peers[i] = peers[i];
  }
  const size_t k = std::min(key.size(), sizeof b->key - 1);
  std::memcpy(b->key, key.data(), k);
  b->key[k] = '\0';
  __atomic_store_n(&b->polls, 0, __ATOMIC_RELAXED);
  __atomic_add_fetch(&b->serial, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&b->state, state, __ATOMIC_RELEASE);
}

void board_leave() {
  if (g_board.mine != nullptr) __atomic_store_n(&g_board.mine->state, kRunning, __ATOMIC_RELEASE);
}

double deadlock_s() {
  static const double t = [] {
    const char* v = std::getenv("COCOVIZ_EMU_DEADLOCK_S");
    return v != nullptr && v[0] != '\0' ? std::atof(v) : 0.5;
  }();
  return t;
}

struct Seen {
  uint64_t serial, polls;
  int32_t state;
};

// One reading of every board: false unless every rank waits, is in MPI or has exited.
bool all_blocked(std::vector<Seen>* out) {
  out->assign(static_cast<size_t>(world_size()), Seen{});
  for (int r = 0; r < world_size(); ++r) {
    const BoardSlot* b = board_of(r);
    if (b == nullptr || __atomic_load_n(&b->job, __ATOMIC_ACQUIRE) != static_cast<int64_t>(::getppid())) return false;
    Seen& s = (*out)[static_cast<size_t>(r)];
    s.state = __atomic_load_n(&b->state, __ATOMIC_ACQUIRE);
    s.serial = __atomic_load_n(&b->serial, __ATOMIC_ACQUIRE);
    s.polls = __atomic_load_n(&b->polls, __ATOMIC_ACQUIRE);
    if (s.state == kRunning) return false;
  }
  return true;
}

const char* state_text(int32_t s) {
  return s == kWaiting ? "waits" : s == kInMpi ? "is blocked in MPI" : s == kExited ? "has exited" : "runs";
}

// The wait-for edges of rank r: the ranks its board names (all others if it names none),
// less those waiting with the same key (they are in the same collective as r).
std::vector<int> waits_for(int r) {
  const BoardSlot* b = board_of(r);
  std::vector<int> out;
  if (b == nullptr || b->state == kExited) return out;
  std::vector<int> cand;
  if (b->npeers < 0 || (b->npeers == 0 && b->state == kInMpi)) {
    for (int q = 0; q < world_size(); ++q) cand.push_back(q);
  } else {
    cand.assign(b->peers, b->peers + b->npeers);
  }
  for (int q : cand) {
    if (q == r || q < 0 || q >= world_size()) continue;
    const BoardSlot* o = board_of(q);
    if (o != nullptr && b->key[0] != '\0' && o->state == b->state && std::strcmp(o->key, b->key) == 0) continue;
    out.push_back(q);
  }
  return out;
}

std::string board_line(int r) {
  const BoardSlot* b = board_of(r);
  std::string text = b != nullptr && b->text[0] != '\0' ? std::string(b->text, strnlen(b->text, kStatusBytes)) : std::string("(no operation recorded)");
  std::string line = "rank " + std::to_string(r) + " " + state_text(b != nullptr ? b->state : kRunning) + ": " + text;
  const std::vector<int> w = waits_for(r);
  if (!w.empty()) {
    line += "  -> needs rank";
    line += w.size() > 1 ? "s " : " ";
    for (size_t i = 0; i < w.size(); ++i) line += (i ? ", " : "") + std::to_string(w[i]);
  }
  if (b != nullptr && b->sends[0] != '\0') {
    line += "; its sends not received: " + std::string(b->sends, strnlen(b->sends, sizeof b->sends));
  }
  return line;
}

// A cycle of the wait-for graph (ranks in order), or empty.
std::vector<int> find_cycle() {
  const int n = world_size();
  std::vector<int> color(static_cast<size_t>(n), 0), parent(static_cast<size_t>(n), -1);
  std::vector<int> cycle;
  std::function<bool(int)> dfs = [&](int u) {
    color[static_cast<size_t>(u)] = 1;
    for (int v : waits_for(u)) {
      if (color[static_cast<size_t>(v)] == 1) {
        for (int x = u; x != v; x = parent[static_cast<size_t>(x)]) cycle.push_back(x);
        cycle.push_back(v);
        std::reverse(cycle.begin(), cycle.end());
        return true;
      }
      if (color[static_cast<size_t>(v)] == 0) {
        parent[static_cast<size_t>(v)] = u;
        if (dfs(v)) return true;
      }
    }
    color[static_cast<size_t>(u)] = 2;
    return false;
  };
  for (int r = 0; r < n && cycle.empty(); ++r) {
    if (color[static_cast<size_t>(r)] == 0) dfs(r);
  }
  return cycle;
}

// The first rank to see the job stuck prints the report; the others let it (abort follows).
bool claim_report() {
  const char* d = emu_dir_env();
  if (d == nullptr) return true;
  const std::string lock = std::string(d) + "/watchdog";
  const int fd = ::open(lock.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  const timespec grace{5, 0};
  nanosleep(&grace, nullptr);
  return false;
}

struct Detector {
  bool armed = false;
  double since = 0;
  std::vector<Seen> first;
};

// Called by a waiting rank now and then: reports a deadlock once it is certain.
void check_deadlock(Detector& det, const std::string& pending) {
  if (deadlock_s() <= 0 || world_size() < 1 || emu_dir_env() == nullptr || g_board.mine == nullptr) return;
  std::vector<Seen> now;
  if (!all_blocked(&now)) {
    det.armed = false;
    return;
  }
  bool same = det.armed;
  for (size_t r = 0; same && r < now.size(); ++r) {
    same = now[r].serial == det.first[r].serial && now[r].state == det.first[r].state;
  }
  if (!same) {
    det.armed = true;
    det.since = now_s();
    det.first = now;
    return;
  }
  if (now_s() - det.since < deadlock_s()) return;
  for (size_t r = 0; r < now.size(); ++r) {
    if (now[r].state == kWaiting && now[r].polls < det.first[r].polls + kDeadlockPolls) return;
  }
  std::vector<std::string> detail;
  const bool first = claim_report();
  if (first) {
    const std::vector<int> cycle = find_cycle();
    if (!cycle.empty()) {
      detail.push_back("wait-for cycle:");
      for (int r : cycle) detail.push_back("  " + board_line(r));
      detail.push_back("  (back to rank " + std::to_string(cycle.front()) + ")");
    }
    detail.push_back("every rank:");
    for (int r = 0; r < world_size(); ++r) detail.push_back("  " + board_line(r));
    detail.push_back("no rank can make progress: each waits for an operation that no other rank will post (a "
                     "send/recv peer or count mismatch, or collectives issued in different orders); found after " +
                     std::to_string(deadlock_s()) + " s of every rank blocked (COCOVIZ_EMU_DEADLOCK_S; 0 leaves it to the "
                     "COCOVIZ_EMU_TIMEOUT watchdog)");
    if (deferring()) {
      detail.push_back(std::string("order: COCOVIZ_EMU_ORDER=adversarial, COCOVIZ_EMU_SEED=") + std::to_string(order_seed_value()) +
                       ", NCCL_LAUNCH_ORDER_IMPLICIT " + (implicit_launch_order() ? "on" : "off"));
    }
  }
  fail("deadlock", "every rank is blocked while waiting: " + pending, detail);
}

}  // namespace

void set_pending(const std::string& what) {
  g_pending = what;
  board_text(what);
}

void wait_until(const std::function<bool()>& ready, const std::string& pending,
                const std::function<void()>& progress, const std::vector<int>& peers, const std::string& key) {
  drain_pending();  // a host that blocks lets the device run what it has queued
  if (ready()) return;
  set_pending(pending + " (" + site_text(g_site) + ")");
  board_enter(kWaiting, peers, key);
  const double start = now_s();
  long spins = 0;
  Detector det;
  while (!ready()) {
    if (g_board.mine != nullptr) __atomic_add_fetch(&g_board.mine->polls, 1, __ATOMIC_RELEASE);
    if (progress) progress();
    ++spins;
    if (spins < 200) {
      sched_yield();
    } else {
      const timespec ts{0, 200000};  // 0.2 ms
      nanosleep(&ts, nullptr);
    }
    if ((spins & 15) == 0) check_deadlock(det, pending);
    if ((spins & 63) == 0 && now_s() - start > timeout_s()) {
      std::vector<std::string> detail;
      const bool first = claim_report();
      if (first) {
        detail.push_back("pending operations:");
        for (const std::string& s : everyone_pending()) detail.push_back("  " + s);
        detail.push_back("hint: every rank must issue the same collectives in the same order on a communicator, and each send needs its receive");
        if (deferring()) {
          detail.push_back(std::string("order: COCOVIZ_EMU_ORDER=adversarial, COCOVIZ_EMU_SEED=") + std::to_string(order_seed_value()) +
                           ", NCCL_LAUNCH_ORDER_IMPLICIT " + (implicit_launch_order() ? "on" : "off") +
                           " (operations on different communicators that no stream, event or launch order ties may run in either order)");
        }
      }
      fail("watchdog", "no progress for " + std::to_string(static_cast<int>(timeout_s())) + " s (COCOVIZ_EMU_TIMEOUT) while waiting: " + pending, detail);
    }
  }
  board_leave();
  set_pending("");
}

void set_posted_sends(const std::string& text) {
  board_open();
  if (g_board.mine == nullptr) return;
  const size_t n = std::min(text.size(), sizeof g_board.mine->sends - 1);
  std::memcpy(g_board.mine->sends, text.data(), n);
  g_board.mine->sends[n] = '\0';
}

void mpi_blocking_enter(const char* call) {
  if (g_board.mine == nullptr && !g_board.tried) board_open();
  if (g_board.mine == nullptr) return;
  board_text(std::string(call) + " (a blocking MPI call of the program" +
             (g_site.file.empty() ? std::string(")") : ", after " + site_text(g_site) + ")"));
  board_enter(kInMpi, {}, std::string("mpi:") + call);
}

void mpi_blocking_leave() {
  if (g_board.mine == nullptr) return;
  board_leave();
  g_board.mine->text[0] = '\0';
}

// ==================================================================== fibers

ThreadPos g_pos;

namespace {

enum class FState { idle, ready, barrier, done };

struct Fiber {
  ucontext_t uc;
  jmp_buf jb;
  void* stack = nullptr;
  FState state = FState::idle;
  Dim3 tid;
  uint32_t index = 0;  // linear thread index in the block
};

std::vector<Fiber*> g_fibers;
jmp_buf g_sched;
Fiber* g_cur = nullptr;
const std::function<void()>* g_body = nullptr;
unsigned g_nthreads = 0;
unsigned g_arrived = 0;

size_t stack_bytes() {
  static size_t s = [] {
    const char* v = std::getenv("COCOVIZ_EMU_STACK_KB");
    long kb = v != nullptr ? std::atol(v) : 0;
    return static_cast<size_t>(kb >= 16 ? kb : 128) * 1024;
  }();
  return s;
}

void fiber_main() {
  Fiber* f = g_cur;
  for (;;) {
    if (!_setjmp(f->jb)) _longjmp(g_sched, 1);
    (*g_body)();
    f->state = FState::done;
  }
}

__attribute__((noinline)) void start_fiber(Fiber* f) {
  g_cur = f;
  if (!_setjmp(g_sched)) {
    ucontext_t tmp;
    swapcontext(&tmp, &f->uc);
  }
}

__attribute__((noinline)) Fiber* make_fiber() {
  Fiber* f = new Fiber();
  const size_t len = stack_bytes() + 4096;
  void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) fail("emulation", "cannot allocate a fiber stack");
  ::mprotect(m, 4096, PROT_NONE);  // guard page below the stack
  f->stack = m;
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = static_cast<char*>(m) + 4096;
  f->uc.uc_stack.ss_size = stack_bytes();
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, fiber_main, 0);
  return f;
}

Fiber* fiber(size_t i) {
  while (g_fibers.size() <= i) {
    Fiber* f = make_fiber();
    start_fiber(f);
    g_fibers.push_back(f);
  }
  return g_fibers[i];
}

__attribute__((noinline)) void switch_to(Fiber* f) {
  g_cur = f;
  g_pos.thread = f->tid;
  g_race_tid = f->index;
  if (!_setjmp(g_sched)) _longjmp(f->jb, 1);
}

void yield_fiber() {
  Fiber* f = g_cur;
  if (!_setjmp(f->jb)) _longjmp(g_sched, 1);
}

void run_block(unsigned n, Dim3 bd) {
  for (unsigned t = 0; t < n; ++t) {
    Fiber* f = fiber(t);
    f->state = FState::ready;
    f->tid = Dim3{t % bd.x, (t / bd.x) % bd.y, t / (bd.x * bd.y)};
    f->index = t;
  }
  ++g_race_epoch;  // a block's accesses never race with an earlier block's here (racecheck)
  g_nthreads = n;
  g_arrived = 0;
  for (;;) {
    bool any = false;
    for (unsigned t = 0; t < n; ++t) {
      if (g_fibers[t]->state == FState::ready) {
        any = true;
        switch_to(g_fibers[t]);
      }
    }
    if (any) continue;
    unsigned waiting = 0;
    for (unsigned t = 0; t < n; ++t) waiting += g_fibers[t]->state == FState::barrier ? 1 : 0;
    if (waiting == 0) return;
    fail("barrier divergence",
         "__syncthreads() (or a CTA-wide barrier) reached by " + std::to_string(waiting) + " of " + std::to_string(n) +
             " threads of block (" + std::to_string(g_pos.block.x) + "," + std::to_string(g_pos.block.y) + "," +
             std::to_string(g_pos.block.z) + "); the others exited: on a GPU this hangs or is undefined");
  }
}

}  // namespace

bool in_kernel() { return g_in_kernel; }

void fence_proxy_alias() {
  if (!g_in_kernel) fail("emulation", "fence.proxy.alias outside a kernel");
  if (Op* op = dev().current) op->fence_proxy_alias();
}

void block_barrier(const std::function<void()>& at_release) {
  if (!g_in_kernel) fail("emulation", "__syncthreads() called outside a kernel");
  ++g_arrived;
  if (g_arrived == g_nthreads) {
    g_arrived = 0;
    ++g_race_epoch;  // the barrier orders every access before it with every access after it
    if (at_release) at_release();
    ++g_race_epoch;
    for (unsigned t = 0; t < g_nthreads; ++t) {
      if (g_fibers[t]->state == FState::barrier) g_fibers[t]->state = FState::ready;
    }
    return;
  }
  g_cur->state = FState::barrier;
  yield_fiber();
}

void launch_kernel(const char* name, const char* file, int line, Dim3 grid, Dim3 block,
                   size_t smem, void* stream, const std::function<void()>& body) {
  set_site(g_site.stage.c_str(), file, line, (std::string("launch of ") + name).c_str());
  g_site.stage.clear();
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  const bool bad = grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
                   grid.z > 65535 || threads == 0 || threads > 1024 || block.z > 64 || smem > 48 * 1024;
  if (bad) {
    set_last_error(9);  // cudaErrorInvalidConfiguration
    note(std::string("launch of ") + name + " at " + file + ":" + std::to_string(line) + ": invalid configuration grid (" +
         std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) + ") block (" +
         std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) + ")");
    return;
  }
  if (!stream_valid(stream)) {
    set_last_error(400);  // cudaErrorInvalidResourceHandle
    return;
  }
  Stream* s = resolve_stream(stream, "kernel launch");
  const int err = enqueue(s, [name, grid, block, s, body, threads] {
    Op op(s, std::string("kernel ") + name);
    g_in_kernel = true;
    g_body = &body;
    g_pos.grid_dim = grid;
    g_pos.block_dim = block;
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          g_pos.block = Dim3{x, y, z};
          op.begin_block(x + grid.x * (y + grid.y * z));
          run_block(static_cast<unsigned>(threads), block);
        }
      }
    }
    op.end_blocks();
    g_in_kernel = false;
    g_body = nullptr;
  });
  if (err != 0) set_last_error(err);
}

}  // namespace cocoviz_emu
