// libcommtrace_nccl_profiler.so: an NCCL profiler plugin (interface v5, NCCL 2.28) that records
// every collective and p2p call of every communicator of the process and writes them as one
// commtrace trace file for this process's rank, at exit, when its last communicator is
// finalized, or when the program asks (commtrace_nccl_profiler_dump). `merge` joins the ranks'
// files; show, diff, check and --rank all read them.
//
// What NCCL tells a profiler, and so what a record holds: the collective, its element count and
// type (bytes by the nccl-tests convention), the communicator (its name, or "comm<k>" for the
// process's k-th communicator, which SPMD ranks create in the same order), the rank and size, the
// peer of a send/recv, the root of a broadcast, and times. NCCL does not know forward from
// backward or modules: every call is in the forward phase under Global; iterations are marked by
// the program (commtrace_nccl_profiler_mark_iteration), else the run is one iteration.
// Durations: from the first kernel channel's start to the last one's end (NCCL's GPU timers)
// when every channel of the call reported, else the host enqueue time.
//
// Environment: COMMTRACE_NCCL_TRACE (the file; "%r" is the rank; default
// commtrace-nccl-rank%r.json), COMMTRACE_NCCL_KERNEL_TIMES=0 (host times only, no kernel channel
// events), COMMTRACE_NCCL_MAX_CALLS (default 1000000; later calls are counted, not recorded),
// COMMTRACE_RUN_ID (the id merge matches; default the job's id from the launcher, else the
// largest communicator's id). The rank comes from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or
// SLURM_PROCID, else from the largest communicator.
//
// No entry point lets an exception reach NCCL: errors are logged and the call succeeds (init
// fails instead, and NCCL disables the plugin).
#include "cli/nccl_profiler/plugin.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cli/nccl_profiler/abi_v5.h"
#include "report/trace_json.h"
#include "tracer/clock.h"
#include "tracer/collectives.h"
#include "tracer/trace.h"

namespace commtrace {
namespace {

using namespace nccl_abi;

class Recorder;
Recorder& recorder();

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// NCCL's function names → commtrace's collectives; null for those it has no row for.
const CollectiveSpec* spec_of(std::string_view func) {
  static const std::map<std::string_view, Collective> kFuncs{
      {"AllReduce", Collective::AllReduce},
      {"AllGather", Collective::AllGather},
      {"ReduceScatter", Collective::ReduceScatter},
      {"AlltoAll", Collective::AllToAll},
      {"Broadcast", Collective::Broadcast},
      {"Send", Collective::Send},
      {"Recv", Collective::Recv},
  };
  const auto it = kFuncs.find(func);
  return it == kFuncs.end() ? nullptr : &collective_spec(it->second);
}

// NCCL's datatype names → (commtrace's dtype, element size); types commtrace has no name for
// keep their size and show as f32. Size 0: unknown.
std::pair<DType, std::size_t> type_of(std::string_view t) {
  static const std::map<std::string_view, std::pair<DType, std::size_t>> kTypes{
      {"ncclFloat32", {DType::F32, 4}},    {"ncclFloat64", {DType::F64, 8}},
      {"ncclBfloat16", {DType::BF16, 2}},  {"ncclInt64", {DType::I64, 8}},
      {"ncclUint64", {DType::F32, 8}},     {"ncclInt32", {DType::F32, 4}},
      {"ncclUint32", {DType::F32, 4}},     {"ncclFloat16", {DType::F32, 2}},
      {"ncclInt8", {DType::F32, 1}},       {"ncclUint8", {DType::F32, 1}},
      {"ncclFloat8e4m3", {DType::F32, 1}}, {"ncclFloat8e5m2", {DType::F32, 1}},
  };
  const auto it = kTypes.find(t);
  return it == kTypes.end() ? std::pair{DType::F32, std::size_t(0)} : it->second;
}

const char* or_empty(const char* s) { return s ? s : ""; }

// NCCL passes its names as string literals: a lookup is cached by the pointer, so the string is
// compared once per distinct pointer, not per call. REQUIRES the caller's lock.
template <class V, std::size_t N = 32>
class PointerCache {
 public:
  template <class Lookup>
  V get(const char* key, Lookup&& lookup) {
    for (std::size_t i = 0; i < size_; ++i) {
      if (keys_[i] == key) return values_[i];
    }
    const V v = lookup(std::string_view(or_empty(key)));
    if (size_ < N && key) keys_[size_] = key, values_[size_++] = v;
    return v;
  }

 private:
  const char* keys_[N] = {};
  V values_[N] = {};
  std::size_t size_ = 0;
};

enum class Tag : int { Free = 0, Call = 0x43414c4c, Channel = 0x4348414e };

struct Comm {
  std::uint64_t id;
  StrId group;
  int nranks, rank;
  Logger log;
  std::uint64_t coll_seq = 0;
  std::map<std::pair<int, bool>, std::uint64_t> p2p_seq;  // (peer, is send) → last seq
};

// What the trace keeps of a call (compact: a long run keeps many); records are made from it
// when the file is written.
struct CallInfo {
  Collective op = Collective::AllReduce;
  DType dtype = DType::F32;
  bool duration_in_ticks = true;  // else seconds (NCCL's kernel timers)
  StrId group = 0;
  int group_size = 0, group_rank = 0, peer = -1, root = -1;
  std::uint32_t iteration = 0;
  std::uint64_t issue = 0;  // process-wide call order
  std::uint64_t seq = 0, bytes = 0;
  std::int64_t in = 0, out = 0;  // elements of the input and output buffers
  std::uint64_t start = 0;       // ticks
  double duration = 0;
};

// A Coll or P2p event, pending until its host enqueue stopped and its kernel channels reported.
struct Call {
  Tag tag = Tag::Call;
  Call *prev = nullptr, *next = nullptr;  // the pending list
  Comm* comm = nullptr;
  CallInfo info;
  std::uint64_t host_stop = 0;
  bool host_done = false;
  int channels = 0, channels_started = 0, channels_done = 0;
  std::uint64_t gpu_start = ~std::uint64_t(0), gpu_stop = 0;
};

struct Channel {
  Tag tag = Tag::Channel;
  Call* call = nullptr;
  std::uint64_t start = 0;
};

// Objects handed to NCCL as handles are recycled, never freed while the plugin lives: a late
// event for a finished one finds its tag Free. REQUIRES the caller's lock.
template <class T>
class Recycler {
 public:
  T* get() {
    T* t;
    if (free_.empty()) {
      all_.push_back(std::make_unique<T>());
      t = all_.back().get();
    } else {
      t = free_.back();
      free_.pop_back();
    }
    *t = T{};
    return t;
  }
  void put(T* t) {
    t->tag = Tag::Free;
    free_.push_back(t);
  }

 private:
  std::vector<std::unique_ptr<T>> all_;
  std::vector<T*> free_;
};

class Recorder {
 public:
  Recorder()
      : kernel_times_(env("COMMTRACE_NCCL_KERNEL_TIMES", "1") != "0"),
        max_calls_(std::strtoull(env("COMMTRACE_NCCL_MAX_CALLS", "1000000").c_str(), nullptr, 10)) {
    for (int c = 0; c < kCollectiveCount; ++c) {
      names_[c] = pools_.intern(collective_name(Collective(c)));
    }
  }

  Result init(void** context, std::uint64_t comm_id, int* mask, const char* name, int nranks,
              int rank, Logger log) {
    std::lock_guard lock(mu_);
    auto comm = std::make_unique<Comm>();
    comm->id = comm_id;
    comm->nranks = nranks;
    comm->rank = rank;
    comm->log = log;
    const std::string group =
        name && *name ? std::string(name) : "comm" + std::to_string(comms_created_);
    comm->group = pools_.intern(group);
    ++comms_created_;
    if (nranks > world_nranks_) {
      world_nranks_ = nranks;
      world_rank_ = rank;
      world_id_ = comm_id;
    }
    *mask = int(kProfileColl | kProfileP2p | (kernel_times_ ? kProfileKernelCh : std::uint64_t(0)));
    *context = comm.get();
    if (log) {
      log(3, ~0ul, __FILE__, __LINE__,
          "commtrace: recording communicator %s (rank %d of %d) into %s", group.c_str(), rank,
          nranks, path().c_str());
    }
    live_.insert(comm.get());
    comms_.push_back(std::move(comm));
    if (!atexit_registered_) {
      atexit_registered_ = true;
      std::atexit([] { recorder().dump_if_changed(); });
    }
    return kSuccess;
  }

  Result start(void* context, void** handle, const EventDescr* d) {
    *handle = nullptr;
    if (!d) return kSuccess;
    if (d->type == kProfileKernelCh) return start_channel(handle, d);
    if (d->type != kProfileColl && d->type != kProfileP2p) return kSuccess;
    const bool coll = d->type == kProfileColl;
    const char* func = coll ? d->coll.func : d->p2p.func;
    std::lock_guard lock(mu_);
    const CollectiveSpec* spec = funcs_.get(func, spec_of);
    Comm* comm = static_cast<Comm*>(context);
    if (!comm || !live_.count(comm)) return kSuccess;
    if (!spec) {
      ++skipped_[func ? func : "(no name)"];
      return kSuccess;
    }
    if (calls_ >= max_calls_) {
      ++dropped_;
      return kSuccess;
    }
    ++calls_;
    Call* call = new_call();
    call->comm = comm;
    call->channels = kernel_times_ ? (coll ? d->coll.nChannels : d->p2p.nChannels) : 0;
    CallInfo& c = call->info;
    c.issue = next_issue_++;
    c.iteration = iteration_;
    c.start = clock_.now();
    c.op = spec->op;
    c.group = comm->group;
    c.group_size = comm->nranks;
    c.group_rank = comm->rank;
    const auto [dtype, size] = types_.get(coll ? d->coll.datatype : d->p2p.datatype, type_of);
    c.dtype = dtype;
    if (size == 0) ++unknown_types_;
    const auto count = std::int64_t(coll ? d->coll.count : d->p2p.count);
    const std::int64_t n = comm->nranks;
    // Elements of the input and output buffers (DESIGN §3's buffers; count is per rank).
    switch (spec->buffers) {
      case BufferRule::Gather:
        c.in = count, c.out = count * n;
        break;
      case BufferRule::Scatter:
        c.in = count * n, c.out = count;
        break;
      case BufferRule::Exchange:
        c.in = c.out = count * n;
        break;
      case BufferRule::Send:
        c.in = count;
        break;
      case BufferRule::Recv:
        c.out = count;
        break;
      default:
        c.in = c.out = count;
    }
    c.bytes = std::uint64_t(spec->bytes == ByteSource::Output ? c.out : c.in) * size;
    if (spec->p2p) {
      c.peer = d->p2p.peer;
      c.seq = ++comm->p2p_seq[{c.peer, spec->op == Collective::Send}];
    } else {
      c.seq = ++comm->coll_seq;
      if (spec->rooted) c.root = d->coll.root;
    }
    *handle = call;
    return kSuccess;
  }

  Result stop(void* handle) {
    if (!handle) return kSuccess;
    std::lock_guard lock(mu_);
    const Tag tag = *static_cast<const Tag*>(handle);
    if (tag == Tag::Channel) {
      auto* ch = static_cast<Channel*>(handle);
      Call* call = ch->call;
      channel_pool_.put(ch);
      if (call->tag != Tag::Call) return kSuccess;  // kept already (its communicator finalized)
      ++call->channels_done;
      if (call->host_done && done_with_channels(*call)) complete(call);
    } else if (tag == Tag::Call) {
      auto* call = static_cast<Call*>(handle);
      call->host_stop = clock_.now();
      call->host_done = true;
      if (done_with_channels(*call)) complete(call);
    }
    return kSuccess;
  }

  Result record_state(void* handle, EventState state, const EventStateArgs* args) {
    if (!handle || state != kKernelChStop || !args) return kSuccess;
    std::lock_guard lock(mu_);
    if (*static_cast<const Tag*>(handle) != Tag::Channel) return kSuccess;
    auto* ch = static_cast<Channel*>(handle);
    Call* call = ch->call;
    if (call->tag != Tag::Call) return kSuccess;
    call->gpu_start = std::min(call->gpu_start, ch->start);
    call->gpu_stop = std::max(call->gpu_stop, args->kernelCh.pTimer);
    return kSuccess;
  }

  // The last communicator's finalize writes the file. Its calls that never completed (a
  // channel that did not report) are kept with their host times.
  Result finalize(void* context) {
    bool last = false;
    {
      std::lock_guard lock(mu_);
      Comm* comm = static_cast<Comm*>(context);
      if (!live_.erase(comm)) return kSuccess;
      std::vector<Call*> mine;
      for (Call* c = pending_; c; c = c->next) {
        if (c->comm == comm) mine.push_back(c);
      }
      for (Call* c : mine) {
        ++untimed_;
        keep(c, false);
      }
      last = live_.empty();
    }
    if (last) dump_if_changed();
    return kSuccess;
  }

  void mark_iteration() {
    std::lock_guard lock(mu_);
    ++iteration_;
    changed_ = true;
  }

  // Writes the trace file; returns false (after printing why on stderr) when it cannot.
  bool dump() {
    std::vector<Trace> traces(1);
    std::string file;
    {
      std::lock_guard lock(mu_);
      traces[0] = snapshot();
      file = path();
      changed_ = false;
    }
    try {
      write_trace_file(file, traces);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "commtrace nccl profiler: cannot write the trace: %s\n", e.what());
      return false;
    }
    std::lock_guard lock(mu_);
    std::fprintf(stderr, "commtrace nccl profiler: rank %d: wrote %s (%zu calls)%s\n", rank(),
                 file.c_str(), traces[0].records.size(), notes().c_str());
    return true;
  }

  void dump_if_changed() {
    bool changed;
    {
      std::lock_guard lock(mu_);
      changed = changed_;
    }
    if (changed) dump();
  }

 private:
  Result start_channel(void** handle, const EventDescr* d) {
    std::lock_guard lock(mu_);
    auto* call = static_cast<Call*>(d->parentObj);
    if (!call || call->tag != Tag::Call) return kSuccess;
    ++call->channels_started;
    Channel* ch = channel_pool_.get();
    ch->call = call;
    ch->start = d->kernelCh.pTimer;
    *handle = ch;
    return kSuccess;
  }

  // REQUIRES mu_. A fresh call at the head of the pending list.
  Call* new_call() {
    Call* c = call_pool_.get();
    c->next = pending_;
    if (pending_) pending_->prev = c;
    pending_ = c;
    return c;
  }

  // REQUIRES mu_. Off the pending list, back to the free ones.
  void release(Call* c) {
    (c->prev ? c->prev->next : pending_) = c->next;
    if (c->next) c->next->prev = c->prev;
    call_pool_.put(c);
  }

  // Every channel the call announced reported, and none is still open.
  static bool done_with_channels(const Call& c) {
    return c.channels_done >= c.channels && c.channels_done == c.channels_started;
  }

  // REQUIRES mu_. A call is done: its record joins the trace, the call is recycled.
  void complete(Call* c) { keep(c, c->channels > 0); }

  void keep(Call* c, bool gpu_timed) {
    done_.push_back(finish(*c, gpu_timed));
    release(c);
    changed_ = true;
  }

  // The call's info with its duration: from NCCL's kernel timers when `gpu_timed` and its
  // channels gave times (seconds), else the host's enqueue, or so far for a call still pending
  // (ticks).
  CallInfo finish(const Call& c, bool gpu_timed) const {
    CallInfo i = c.info;
    if (gpu_timed && c.gpu_stop > 0 && c.gpu_stop >= c.gpu_start) {
      i.duration = double(c.gpu_stop - c.gpu_start) * 1e-9;
      i.duration_in_ticks = false;
    } else {
      i.duration = double((c.host_done ? c.host_stop : clock_.now()) - i.start);
    }
    return i;
  }

  // A record of a finished call, its buffers' shapes in t's tables.
  Record record_of(const CallInfo& i, double per_tick, Trace& t) const {
    Record r;
    r.kind = EventKind::Collective;
    r.phase = Phase::Forward;
    r.dtype = i.dtype;
    r.name = names_[std::size_t(i.op)];
    CollectiveInfo& c = r.collective;
    c.op = i.op;
    c.seq = i.seq;
    c.group = i.group;
    c.group_size = i.group_size;
    c.group_rank = i.group_rank;
    c.peer = i.peer;
    c.root = i.root;
    c.bytes = i.bytes;
    r.start_s = double(i.start) * per_tick;
    r.duration_s = i.duration_in_ticks ? i.duration * per_tick : i.duration;
    r.inputs_begin = std::uint32_t(t.args.size());
    if (i.op != Collective::Recv) {
      const std::int64_t dims[1] = {i.in};
      const ShapeId s = t.pools.intern_shape(dims);
      t.args.push_back(TensorArg{s, s, 0});
      r.n_inputs = 1;
    }
    r.outputs_begin = std::uint32_t(t.args.size());
    if (i.op != Collective::Send) {
      const std::int64_t dims[1] = {i.out};
      const ShapeId s = t.pools.intern_shape(dims);
      t.args.push_back(TensorArg{s, s, 0});
      r.n_outputs = 1;
    }
    return r;
  }

  int rank() const {
    for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
      const std::string s = env(v);
      if (!s.empty()) return std::atoi(s.c_str());
    }
    return world_rank_;
  }

  std::string path() const {
    std::string p = env("COMMTRACE_NCCL_TRACE", "commtrace-nccl-rank%r.json");
    const std::string r = std::to_string(rank());
    for (std::size_t at = p.find("%r"); at != std::string::npos; at = p.find("%r", at + r.size())) {
      p.replace(at, 2, r);
    }
    return p;
  }

  std::string run_id() const {
    std::string id = env("COMMTRACE_RUN_ID");
    if (id.empty()) id = env("TORCHELASTIC_RUN_ID");
    if (id.empty() && !env("SLURM_JOB_ID").empty()) {
      id = "slurm-" + env("SLURM_JOB_ID") + "." + env("SLURM_STEP_ID", "0");
    }
    if (id.empty()) id = env("OMPI_MCA_ess_base_jobid");
    if (id.empty()) id = fmt::format("nccl-{:016x}", world_id_);
    return id;
  }

  // REQUIRES mu_. The trace so far: completed calls, then the pending ones with host times, in
  // call order, one block per iteration.
  Trace snapshot() {
    std::vector<CallInfo> all(done_.begin(), done_.end());
    for (const Call* c = pending_; c; c = c->next) all.push_back(finish(*c, false));
    std::sort(all.begin(), all.end(),
              [](const CallInfo& a, const CallInfo& b) { return a.issue < b.issue; });
    Trace t;
    t.pools = pools_;
    const double per_tick = clock_.seconds_per_tick();
    const std::uint32_t iterations = std::max<std::uint32_t>(
        1, iteration_ + (all.empty() || all.back().iteration < iteration_ ? 0 : 1));
    std::size_t k = 0;
    for (std::uint32_t it = 0; it < iterations; ++it) {
      Block b{std::uint32_t(t.records.size()), 0, it, 1};
      for (; k < all.size() && all[k].iteration == it; ++k) {
        t.records.push_back(record_of(all[k], per_tick, t));
      }
      b.count = std::uint32_t(t.records.size()) - b.first;
      t.blocks.push_back(b);
    }
    t.rank = rank();
    t.metadata = {
        {"format", "nccl-profiler"},
        {"world_size", std::to_string(std::max(1, world_nranks_))},
        {"run_id", run_id()},
        {"iterations", std::to_string(iterations)},
        {"phases", "not known to NCCL: every call is filed under forward"},
        {"modules", "not known to NCCL: every call is filed under Global"},
        {"durations",
         "NCCL's kernel timers (first channel start to last channel end) where every channel "
         "reported, else the host enqueue time"},
    };
    return t;
  }

  // REQUIRES mu_. What a trace file does not hold, for stderr (per rank, so not metadata).
  std::string notes() const {
    std::string s;
    for (const auto& [func, n] : skipped_)
      s += fmt::format("; {} × {} not recorded (no row)", n, func);
    if (dropped_ > 0)
      s += fmt::format("; {} calls past COMMTRACE_NCCL_MAX_CALLS not recorded", dropped_);
    if (untimed_ > 0)
      s += fmt::format("; {} calls with host times only (a channel did not report)", untimed_);
    if (unknown_types_ > 0)
      s += fmt::format("; {} calls of an unknown datatype: bytes 0", unknown_types_);
    return s;
  }

  std::mutex mu_;
  TickClock clock_;
  const bool kernel_times_;
  const std::uint64_t max_calls_;
  TracePools pools_;  // group and collective names
  std::vector<std::unique_ptr<Comm>> comms_;
  std::unordered_set<Comm*> live_;
  Call* pending_ = nullptr;  // started, not yet kept
  Recycler<Call> call_pool_;
  Recycler<Channel> channel_pool_;
  std::array<StrId, kCollectiveCount> names_{};
  PointerCache<const CollectiveSpec*> funcs_;
  PointerCache<std::pair<DType, std::size_t>> types_;
  std::deque<CallInfo> done_;  // a deque: growing never copies what it holds
  int comms_created_ = 0;
  int world_nranks_ = 0, world_rank_ = 0;
  std::uint64_t world_id_ = 0;
  std::uint64_t next_issue_ = 0, calls_ = 0, dropped_ = 0, untimed_ = 0, unknown_types_ = 0;
  std::uint32_t iteration_ = 0;
  std::map<std::string, std::uint64_t> skipped_;
  bool changed_ = false, atexit_registered_ = false;
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // never destroyed: NCCL's threads may outlive statics
  return *r;
}

// The entry points: no exception reaches NCCL.
template <class F>
Result guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "commtrace nccl profiler: %s: %s\n", what, e.what());
  } catch (...) {
    std::fprintf(stderr, "commtrace nccl profiler: %s: unknown error\n", what);
  }
  return kSuccess;
}

Result init_v5(void** context, std::uint64_t comm_id, int* mask, const char* name, int /*nNodes*/,
               int nranks, int rank, Logger log) {
  if (context) *context = nullptr;
  const Result r = guarded("init", [&] {
    if (!context || !mask || nranks < 1 || rank < 0 || rank >= nranks) return kInternalError;
    return recorder().init(context, comm_id, mask, name, nranks, rank, log);
  });
  return context && *context ? r : kInternalError;
}
Result start_v5(void* context, void** handle, EventDescr* d) {
  return guarded("startEvent", [&] {
    if (!handle) return kSuccess;
    *handle = nullptr;
    return recorder().start(context, handle, d);
  });
}
Result stop_v5(void* handle) {
  return guarded("stopEvent", [&] { return recorder().stop(handle); });
}
Result state_v5(void* handle, EventState state, EventStateArgs* args) {
  return guarded("recordEventState", [&] { return recorder().record_state(handle, state, args); });
}
Result finalize_v5(void* context) {
  return guarded("finalize", [&] { return recorder().finalize(context); });
}

}  // namespace
}  // namespace commtrace

extern "C" {

// Not const: a const object would have internal linkage. NCCL reads it, never writes it.
COMMTRACE_NCCL_EXPORT commtrace::nccl_abi::Profiler ncclProfiler_v5 = {
    "commtrace",        commtrace::init_v5,  commtrace::start_v5,
    commtrace::stop_v5, commtrace::state_v5, commtrace::finalize_v5};

COMMTRACE_NCCL_EXPORT int commtrace_nccl_profiler_dump(void) {
  try {
    return commtrace::recorder().dump() ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

COMMTRACE_NCCL_EXPORT void commtrace_nccl_profiler_mark_iteration(void) {
  try {
    commtrace::recorder().mark_iteration();
  } catch (...) {
  }
}

}  // extern "C"
