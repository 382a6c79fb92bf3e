// The per-thread Tracer and its RAII scopes. A Tracer collects one rank's Trace; it is made
// current for a thread by TracerActivation. With no current tracer every hook is a null check.
// Recording copies ids and numbers into fixed-size records (strings, shapes, placement lists and
// meshes are interned): no allocation per record once the tables and vectors have grown, and no
// text is formatted. Iterations marked with next_iteration() that repeat the previous one exactly
// are folded into it (a repeat count), so a long run costs the memory of one iteration.
//
// Replay. While an iteration repeats the one before, each event is compared with the record at
// its position, argument by argument as the call site's describer gives them (record() and
// begin() below): no hashing, no new record, nothing copied. At the first difference the events
// so far become records and the rest of the iteration is written. An event with a key
// (EventHead::key: an id of everything that determines it and the events recorded inside it, such
// as a DTensor op's sharding plan) matches its record by the key alone, and the events inside it
// are implied: their describers are not called. A keyed region (begin_region) does the same for
// a stretch of events with no record of its own (an optimizer step).
//
// Timing. Every event written as a new record is timed (two clock reads). A repeat is timed while
// its block has fewer than TimingPolicy::first occurrences, then one repeat in `every`: a long
// run reads the clock on a sample of its iterations, and a record's duration is the mean over its
// timed occurrences (Block::untimed counts the others).
//
// Not thread-safe: one tracer belongs to one thread (one rank) at a time.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tracer/clock.h"
#include "tracer/trace.h"

// The replay path's functions: inlined into the recording sites (they run for every event).
#if defined(__GNUC__)
#define COMMTRACE_HOT [[gnu::always_inline]] inline
#else
#define COMMTRACE_HOT inline
#endif

namespace commtrace {

// A slot a tensor keeps for the tracer that last recorded it: the index of a stored argument
// (Trace::args) equal to the tensor's view, so a tensor recorded again (an op's output is the
// next op's input) costs a compare, not a lookup. Modules keep one for their node in the module
// tree. Atomic because a tensor may be read by several ranks' threads (each with its own tracer).
// REQUIRES: what the view shows of the tensor (shapes, placements) never changes.
class TraceSlot {
 public:
  std::uint64_t raw() const { return slot_.load(std::memory_order_relaxed); }
  bool get(std::uint32_t tracer, std::uint32_t& arg) const {
    const std::uint64_t v = slot_.load(std::memory_order_relaxed);
    if (std::uint32_t(v >> 32) != tracer) return false;
    arg = std::uint32_t(v);
    return true;
  }
  void set(std::uint32_t tracer, std::uint32_t arg) const {
    slot_.store(std::uint64_t(tracer) << 32 | arg, std::memory_order_relaxed);
  }

 private:
  mutable std::atomic<std::uint64_t> slot_{0};  // tracer id << 32 | argument index; tracer 0: none
};

// A tensor as the recording sites describe it; global and placements are empty for a plain
// tensor (then global is the shape). The slots are optional: `slot` is the slot of the tensor
// this view describes whole (a plain tensor's own, a DTensor's); `shape_slot` one of a plain
// tensor of this view's shape (the plain tensor itself, a DTensor's local shard, a collective's
// buffer), read for the shape alone. A transposed view shows the tensor with its last two dims
// swapped (shapes and shard dims: PyTorch records a GEMM's op(b) = bᵀ) and has no slots (they
// describe the tensor, not its transpose).
struct ArgView {
  std::span<const std::int64_t> shape;
  std::span<const std::int64_t> global;
  std::span<const Placement> placements;
  const TraceSlot* slot = nullptr;
  const TraceSlot* shape_slot = nullptr;
  bool transposed = false;

  static ArgView plain(std::span<const std::int64_t> shape, const TraceSlot* slot) {
    return ArgView{shape, {}, {}, slot, slot};
  }
  bool swaps() const { return transposed && shape.size() >= 2; }  // a 1-d view shows itself
};

// What an event is, apart from its arguments. name and overload are static strings (compared and
// interned by address); reason is copied into the trace when stored.
struct EventHead {
  EventKind kind = EventKind::Compute;
  const char* name = "";
  const char* overload = "default";
  DType dtype = DType::F32;
  bool sharded = false;
  const MeshInfo* mesh = nullptr;
  std::uint64_t mesh_key = 0;  // a key unique to the mesh object (never reused); 0: compare
  std::string_view reason;
  // 0, or an id never reused that determines the rest of the head, the event's arguments and
  // every event recorded between its begin() and finish(), given the module and phase it runs in.
  std::uint64_t key = 0;
};

// An event with its arguments given at once (Tracer::record / begin).
struct EventView : EventHead {
  std::span<const ArgView> inputs;
  std::span<const ArgView> outputs;
};

// The collective fields of an event; placements before/after describe the redistribution.
struct CollectiveView {
  Collective op = Collective::AllReduce;
  ReduceOp reduce_op = ReduceOp::None;
  std::uint64_t seq = 0;
  std::string_view group;
  int group_size = 0, group_rank = 0, peer = -1, root = -1;
  std::uint64_t bytes = 0;
  std::span<const Placement> before, after;
};

// A describer of an event's arguments: a function object called with a sink (see Tracer::record).
template <class F>
concept Describer = std::is_class_v<std::remove_reference_t<F>>;

// Which repeats of an iteration are timed: the first `first` occurrences of a block (the first
// one, written as records, always is), then every `every`-th (0: none after those; 1: all).
struct TimingPolicy {
  std::uint64_t first = 4;
  std::uint64_t every = 16;
};

// The start of an event in an iteration that is not timed.
inline constexpr std::uint64_t kNoTime = ~std::uint64_t(0);

class Tracer {
 public:
  explicit Tracer(int rank = 0, TimingPolicy timing = {});
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  static Tracer* current() { return current_; }  // null when no tracer is active on this thread

  // Module scopes: entering finds or creates the child `fqn` of the current module; `slot`
  // (optional, kept by the module object) remembers the node for the next entry.
  int enter_module(std::string_view fqn, std::string_view type, const TraceSlot* slot = nullptr);
  void exit_module() {
    COMMTRACE_CHECK(stack_.size() > 1, ErrorCode::Internal, "tracer: exit_module without enter");
    stack_.pop_back();
    if (nvtx_) nvtx_pop();
  }
  int current_module() const { return stack_.back(); }
  // Backward attribution: events recorded until restore_module() belong to `module` (an index of
  // this trace), found without the FQN lookup. It takes the current module's place on the stack
  // (the same as pushing it, one write cheaper); returns the module it replaced.
  int attribute_to(int module) {
    COMMTRACE_CHECK(module >= 0 && std::size_t(module) < trace_.modules.size(), ErrorCode::Internal,
                    "tracer: module {} out of range [0, {})", module, trace_.modules.size());
    if (nvtx_) nvtx_push(trace_.modules[std::size_t(module)].fqn.c_str());
    return std::exchange(stack_.back(), module);
  }
  void restore_module(int previous) {
    stack_.back() = previous;
    if (nvtx_) nvtx_pop();
  }
  std::size_t module_count() const { return trace_.modules.size(); }

  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }

  bool has_params(int module) const;
  // (local name, placements) per parameter; placements empty for a plain one.
  void set_params(int module, std::span<const std::pair<std::string, std::vector<Placement>>> ps);

  // The clock of the records: ticks since the tracer began (cheap; converted by take()).
  std::uint64_t now() const { return clock_.now(); }
  // True when events recorded now are timed (see the file comment): call sites take their start
  // and device timers only then.
  bool timing() const { return !speculating_ || timed_iteration_; }
  // now() when timing(), else kNoTime: the start to pass to record().
  std::uint64_t start_time() const { return timing() ? now() : kNoTime; }

  // Records an event. `describe(sink)` gives its arguments as ArgViews: sink.input(a) for each
  // input, then sink.output(a) for each output. It may run twice (compared with the expected
  // record, then written when it differs) or not at all (an implied event), so it only reads.
  // record(): the event ran from `start` (start_time() when it began) until now. begin(): it
  // starts now and ends with finish(), which may describe outputs not given before; events
  // recorded in between nest inside it. Both return the event's index.
  template <Describer Describe>
  std::uint32_t record(const EventHead& h, Describe&& describe, std::uint64_t start);
  template <Describer Describe>
  std::uint32_t begin(const EventHead& h, Describe&& describe,
                      const CollectiveView* collective = nullptr);
  void finish(std::uint32_t index) {
    finish(index, [](auto&) {});
  }
  template <Describer Describe>
  void finish(std::uint32_t index, Describe&& describe_outputs);

  // What begin() does for an event it can match without its head: one inside a keyed event or
  // region that matched, or one whose key (EventHead::key, non-zero) matches the record at its
  // position. Returns its index, or kNone: then begin() it with its whole head. A keyed site
  // calls this first and builds the head only when it returns kNone.
  static constexpr std::uint32_t kNone = 0xffffffffu;
  std::uint32_t begin_by_key(std::uint64_t key, const CollectiveView* collective = nullptr);

  // True when the next event is implied (inside a keyed event that matched) in an untimed
  // repeat: a call site may then skip describing and timing it and call record_implied() in place
  // of record(), begin_implied() in place of a collective's begin() (they only count the event:
  // nothing about it is compared, stored or timed).
  bool next_implied() const { return implying() && !timed_iteration_; }
  // True when the next event is implied, timed or not: a region begun now would add nothing.
  bool implying() const { return speculating_ && n_pending_ < implied_end_; }
  void record_implied() { pend(prev_.first + n_pending_, nullptr, 0, true, Implied::Inside); }
  // The same for a collective of sequence number `seq` (checked as begin() checks it): returns
  // its index, for finish().
  std::uint32_t begin_implied(std::uint64_t seq) {
    CollectiveView c;
    c.seq = seq;
    return pend(prev_.first + n_pending_, &c, 0, true, Implied::Inside);
  }

  // Regions: begin_region(key) and end_region() bound a stretch of events that `key` determines
  // (an id never reused, as EventHead::key: given the module and phase the stretch starts in, it
  // fixes every event recorded until end_region()). Nothing is recorded for a region. In a repeat
  // where the stretch at this position began with the same key, its events are implied, as inside
  // a keyed event: counted, not compared, and end_region() checks their number. Regions nest.
  void begin_region(std::uint64_t key);
  void end_region();
  void abandon_region();  // an exception left the region: it is dropped, unchecked

  // The same with the arguments given at once.
  std::uint32_t record(const EventView& e, std::uint64_t start);
  std::uint32_t begin(const EventView& e, const CollectiveView* collective = nullptr);
  void finish(std::uint32_t index, std::span<const ArgView> outputs);
  // Event `index` of the open iteration ran on a device: when the iteration closes (or at
  // take()) its duration becomes `timer`'s measurement of `token`, replacing the host's (which
  // on a device is the time to enqueue). The timer must outlive the iteration. The seconds pass
  // through the tick clock's calibration so far: within ~1e-4 once the tracer has run for a
  // millisecond.
  void time_on_device(std::uint32_t index, DeviceTimer& timer, std::uint32_t token);

  // Ends the current iteration and starts the next: an iteration identical to the one before
  // (same events in the same order; sequence numbers advancing by the same stride) is folded
  // into it. The first iteration is 0.
  void next_iteration();
  std::uint32_t iteration() const { return iteration_; }
  // Records stored so far (events of an iteration still matching the previous one excluded).
  std::size_t record_count() const { return trace_.records.size(); }
  // Bytes held by the trace (records, arguments, tables).
  std::size_t memory_bytes() const;

  // Moves the trace out (times in seconds, the last iteration folded) and resets the tracer.
  Trace take();

 private:
  enum class Implied : std::uint8_t { No, Key, Inside };  // by its key, inside a keyed event

  // Compares described arguments with the expected record's, in order.
  struct Matcher {
    Tracer& t;
    std::uint32_t in, in_end, out, out_begin, out_end;
    bool ok = true;
    COMMTRACE_HOT void input(const ArgView& a) {
      ok = ok && in < in_end && t.arg_matches(a, in);
      ++in;
    }
    COMMTRACE_HOT void output(const ArgView& a) {
      ok = ok && in == in_end && out < out_end && t.arg_matches(a, out);
      ++out;
    }
  };
  // Appends described arguments to record `index` (inputs, then outputs).
  struct Writer {
    Tracer& t;
    std::uint32_t index;
    bool replace_outputs = false;
    void input(const ArgView& a);
    void output(const ArgView& a);
  };

  // Replay (see the file comment).
  bool keyed(std::uint64_t key, std::uint32_t index) const;
  // How the next event matches without its arguments, while speculating: Inside a keyed event or
  // region that matched, by its Key (non-zero) at its position, or No (compare it).
  Implied implied_by(std::uint64_t key) const;
  bool head_matches(const EventHead& h, std::uint32_t index);
  // Out of line, their arguments by value (copies made on these rare paths keep the hot path's
  // views in registers).
  bool head_matches_slow(EventHead h, std::uint32_t index);
  bool collective_matches(const CollectiveView& c, const Record& r) const;
  bool arg_matches(const ArgView& a, std::uint32_t index);
  bool arg_matches_by_value(ArgView a, std::uint32_t index) const;
  bool dims_equal(std::span<const std::int64_t> dims, ShapeId id) const;
  // The expected record `index` matched: the event becomes pending (no record); returns its
  // index (where materialize() would put its record).
  std::uint32_t pend(std::uint32_t index, const CollectiveView* c, std::uint64_t start, bool seen,
                     Implied implied);
  void finish_pending(std::uint32_t pos);
  void materialize();
  bool speculating(std::uint32_t index) const { return index >= trace_.records.size(); }

  // Writing. `like` is the record the event was compared with (kNone: none), whose mean
  // duration estimates an event that began untimed.
  template <class Describe>
  std::uint32_t write_record(EventHead h, Describe describe, std::uint64_t start,
                             std::uint32_t like);
  template <class Describe>
  std::uint32_t write_begin(EventHead h, Describe describe, const CollectiveView* c);
  std::uint32_t append_head(const EventHead& h);
  void end_record(std::uint32_t index, std::uint64_t start, std::uint32_t like);
  void begin_record(std::uint32_t index, const CollectiveView* c);
  std::uint32_t finish_written(std::uint32_t index);  // returns where its outputs go
  void set_collective(Record& r, const CollectiveView& c);
  std::uint32_t intern_static(const char* s);
  void push_arg(const ArgView& a);
  MeshId mesh_id(const MeshInfo& m, std::uint64_t key);
  MeshId intern_mesh(const MeshInfo& m, std::uint64_t key);
  void close_block();
  void resolve_device_times();
  // NVTX ranges, out of line (tracer/nvtx.h is internal); only when a tool is attached (nvtx_).
  static void nvtx_push(const char* name);
  static void nvtx_pop();

  // An event of the open block that matched the previous block's record at its position.
  struct Pending {
    std::uint64_t start = 0, duration = 0;  // when the iteration is timed
    std::uint64_t seq = 0;                  // a collective's
    bool outputs_seen = false;              // false while outputs added by finish() are to come
    Implied implied = Implied::No;
  };
  bool speculating_ = false;
  bool timed_iteration_ = true;  // this iteration's matched events carry times
  Block prev_;  // while speculating: the block compared with (the open one starts after it)
  std::vector<Pending> pending_;  // the first n_pending_ are the open block's
  std::uint32_t n_pending_ = 0;
  std::size_t unseen_ = 0;  // pending events whose outputs are still to come
  bool seq_ok_ = true;      // every pending collective's sequence number advanced by its stride
  std::uint64_t iteration_start_ = 0;
  std::uint32_t implied_end_ = 0;  // pending positions below it are inside a keyed event

  // Per record: the addresses its event's head gave (compared before the interned ids), its
  // reason's text in the trace's pool, and its key with the number of events recorded inside it
  // (kNoInner until its finish()).
  static constexpr std::uint32_t kNoInner = 0xffffffffu;
  struct Source {
    const char* name;
    const char* overload;
    std::string_view reason;
    std::uint64_t mesh_key;
    std::uint64_t key = 0;
    std::uint32_t inner = kNoInner;
  };
  std::vector<Source> sources_;

  // A region (begin_region): events [first, first + count) in the records' numbering (a pending
  // event numbered where materialize() would put it).
  struct Region {
    std::uint32_t first = 0;
    std::uint32_t count = kNoInner;     // kNoInner until end_region()
    std::uint32_t expected = kNoInner;  // the count of the region it matched, if it did
    std::uint32_t module = 0;
    Phase phase = Phase::Forward;
    std::uint64_t key = 0;
  };
  std::vector<Region> regions_;              // of the stored blocks, by first
  std::vector<Region> open_regions_;         // of the open iteration, in the order they began
  std::vector<std::uint32_t> region_stack_;  // open_regions_' indices not ended yet
  std::size_t region_cursor_ = 0;            // while speculating: regions_ before it end earlier

  struct DeviceSpan {
    std::uint32_t index;
    DeviceTimer* timer;
    std::uint32_t token;
  };
  std::vector<DeviceSpan> device_spans_;  // of the open iteration

  // Interning of static strings by address: a direct-mapped cache in front of the map.
  struct StaticSlot {
    const char* ptr = nullptr;
    StrId id = 0;
  };
  std::array<StaticSlot, 256> static_cache_{};

  friend class TracerActivation;
  friend class PhaseScope;
  static inline thread_local Tracer* current_ = nullptr;  // set by TracerActivation

  bool nvtx_;               // nvtx::attached() when the tracer was made
  std::uint32_t id_;        // unique per tracer and trace: the key of the tensors' slots
  std::uint64_t slot_tag_;  // id_ << 32: a slot holding argument i of this tracer is tag | i
  TimingPolicy policy_;
  Trace trace_;
  std::vector<int> stack_{0};
  Phase phase_ = Phase::Forward;
  TickClock clock_;
  std::uint32_t iteration_ = 0;
  std::unordered_map<const char*, StrId> static_ids_;
  std::vector<std::pair<std::uint64_t, MeshId>> mesh_keys_;
  std::pair<std::uint64_t, MeshId> last_mesh_{0, kNoMesh};  // mesh_keys_' last hit
};

// ---- the replay path, inline: it runs for every event of a repeated iteration ----

COMMTRACE_HOT bool Tracer::dims_equal(std::span<const std::int64_t> dims, ShapeId id) const {
  const auto s = trace_.pools.shape(id);
  if (s.size() != dims.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {  // a loop: shapes are short, memcmp is a call
    if (s[i] != dims[i]) return false;
  }
  return true;
}

// Stored argument `index` describes view `a`, found without interning: a slot holding this
// tracer's argument is one compare of ids (equal dims have equal ids, so a global shape equal to
// the shape matches the shape's id whichever way the view gives it). A match fills the slot.
COMMTRACE_HOT bool Tracer::arg_matches(const ArgView& a, std::uint32_t index) {
  const TensorArg* args = trace_.args.data();
  const TensorArg& t = args[index];
  if (a.slot) {
    const std::uint64_t v = a.slot->raw();
    if (v == (slot_tag_ | index)) return true;
    if (std::uint32_t(v >> 32) == id_) return args[std::uint32_t(v)] == t;
  }
  if (a.transposed) return arg_matches_by_value(a, index);
  std::uint32_t q = 0;
  if (a.shape_slot && a.shape_slot != a.slot && a.shape_slot->get(id_, q)) {
    if (args[q].shape != t.shape) return false;
  } else if (!dims_equal(a.shape, t.shape)) {
    return false;
  }
  if (a.global.empty() ? t.global_shape != t.shape : !dims_equal(a.global, t.global_shape)) {
    return false;
  }
  if (t.placements != 0 || !a.placements.empty()) {
    const auto p = trace_.pools.placements(t.placements);
    if (!std::equal(p.begin(), p.end(), a.placements.begin(), a.placements.end())) return false;
  }
  if (a.slot) a.slot->set(id_, index);
  return true;
}

COMMTRACE_HOT bool Tracer::head_matches(const EventHead& h, std::uint32_t index) {
  const Record& r = trace_.records[index];
  const Source& s = sources_[index];
  if (s.name == h.name && s.overload == h.overload && r.kind == h.kind && r.dtype == h.dtype &&
      r.sharded == h.sharded && r.phase == phase_ && r.module == std::uint32_t(stack_.back()) &&
      s.reason.size() == h.reason.size() && (h.reason.empty() || s.reason == h.reason) &&
      (h.mesh ? h.mesh_key != 0 && h.mesh_key == s.mesh_key : r.mesh == kNoMesh)) {
    return true;
  }
  return head_matches_slow(h, index);
}

// The key determines the head too; the module and phase the event runs in are compared.
COMMTRACE_HOT bool Tracer::keyed(std::uint64_t key, std::uint32_t index) const {
  const Source& s = sources_[index];
  const Record& r = trace_.records[index];
  return key != 0 && s.key == key && s.inner != kNoInner &&
         r.module == std::uint32_t(stack_.back()) && r.phase == phase_;
}

COMMTRACE_HOT std::uint32_t Tracer::pend(std::uint32_t index, const CollectiveView* c,
                                         std::uint64_t start, bool seen, Implied implied) {
  const std::uint32_t pos = n_pending_++;
  Pending& p = pending_[pos];  // sized by next_iteration()
  p.outputs_seen = seen;
  p.implied = implied;
  unseen_ += !seen;
  if (c) {  // the sequence number advances by the stride the first repeat set
    const CollectiveInfo& ci = trace_.records[index].collective;
    const std::uint64_t last = ci.seq + (prev_.repeat - 1) * ci.seq_stride;
    seq_ok_ = seq_ok_ && c->seq >= last && (prev_.repeat == 1 || c->seq - last == ci.seq_stride);
    p.seq = c->seq;
  }
  if (timed_iteration_) p.start = start;
  // The next event compared (after a keyed event's insides) is fetched while the op runs.
  const std::uint32_t next = std::max(pos + 1, implied_end_);
  if (implied != Implied::Inside && next < prev_.count) {
    const char* r = reinterpret_cast<const char*>(&trace_.records[prev_.first + next]);
    for (std::size_t off = 0; off < sizeof(Record); off += 64) __builtin_prefetch(r + off);
    __builtin_prefetch(&sources_[prev_.first + next]);
  }
  return std::uint32_t(trace_.records.size()) + pos;
}

template <Describer Describe>
COMMTRACE_HOT std::uint32_t Tracer::record(const EventHead& h, Describe&& describe,
                                           std::uint64_t start) {
  std::uint32_t like = kNone;
  if (speculating_) {
    const std::uint32_t pos = n_pending_, index = prev_.first + pos;
    std::uint32_t i = kNone;
    if (const Implied k = implied_by(h.key); k != Implied::No) {
      i = pend(index, nullptr, start, true, k);
    } else if (pos < prev_.count && head_matches(h, index)) {
      const Record& r = trace_.records[index];
      Matcher m{*this,           r.inputs_begin,  r.inputs_begin + r.n_inputs,
                r.outputs_begin, r.outputs_begin, r.outputs_begin + r.n_outputs};
      describe(m);
      if (m.ok && m.in == m.in_end && m.out == m.out_end && r.kind != EventKind::Collective) {
        i = pend(index, nullptr, start, true, Implied::No);
      }
      like = index;
    }
    if (i != kNone) {
      if (timed_iteration_) pending_[i - trace_.records.size()].duration = now() - start;
      return i;
    }
  }
  return write_record(h, describe, start, like);
}

COMMTRACE_HOT Tracer::Implied Tracer::implied_by(std::uint64_t key) const {
  const std::uint32_t pos = n_pending_;
  if (pos < implied_end_) return Implied::Inside;
  return pos < prev_.count && keyed(key, prev_.first + pos) ? Implied::Key : Implied::No;
}

COMMTRACE_HOT std::uint32_t Tracer::begin_by_key(std::uint64_t key, const CollectiveView* c) {
  if (!speculating_) return kNone;
  const Implied k = implied_by(key);
  if (k == Implied::No) return kNone;
  const std::uint32_t pos = n_pending_, index = prev_.first + pos;
  const std::uint64_t start = timed_iteration_ ? now() : 0;
  if (k == Implied::Inside) return pend(index, c, start, true, k);
  implied_end_ = pos + 1 + sources_[index].inner;  // its insides follow
  return pend(index, c, start, trace_.records[index].n_outputs == 0, k);
}

template <Describer Describe>
COMMTRACE_HOT std::uint32_t Tracer::begin(const EventHead& h, Describe&& describe,
                                          const CollectiveView* c) {
  if (const std::uint32_t i = begin_by_key(h.key, c); i != kNone) return i;
  const std::uint32_t pos = n_pending_, index = prev_.first + pos;
  if (speculating_ && pos < prev_.count) {
    const std::uint64_t start = timed_iteration_ ? now() : 0;
    if (head_matches(h, index)) {
      const Record& r = trace_.records[index];
      Matcher m{*this,           r.inputs_begin,  r.inputs_begin + r.n_inputs,
                r.outputs_begin, r.outputs_begin, r.outputs_begin + r.n_outputs};
      describe(m);
      // Outputs given now are seen; none given: finish() gives them.
      if (m.ok && m.in == m.in_end && (m.out == m.out_end || m.out == m.out_begin) &&
          (c ? r.kind == EventKind::Collective && collective_matches(*c, r)
             : r.kind != EventKind::Collective)) {
        return pend(index, c, start, m.out == m.out_end, Implied::No);
      }
    }
  }
  return write_begin(h, describe, c);
}

template <Describer Describe>
COMMTRACE_HOT void Tracer::finish(std::uint32_t index, Describe&& describe_outputs) {
  if (speculating(index)) {
    const std::uint32_t pos = index - std::uint32_t(trace_.records.size());
    COMMTRACE_CHECK(speculating_ && pos < n_pending_, ErrorCode::Internal,
                    "tracer: finish for unknown record {}", index);
    Pending& p = pending_[pos];
    if (p.implied == Implied::No) {
      const Record& r = trace_.records[prev_.first + pos];
      Matcher m{*this, 0, 0, r.outputs_begin, r.outputs_begin, r.outputs_begin + r.n_outputs};
      describe_outputs(m);
      if (m.out != m.out_begin) {  // outputs given: they must match
        if (!m.ok || m.out != m.out_end) {
          materialize();  // the record now exists at `index`
          Writer w{*this, finish_written(index), true};
          describe_outputs(w);
          return;
        }
        unseen_ -= !p.outputs_seen;
        p.outputs_seen = true;
      }
    }
    finish_pending(pos);
    return;
  }
  Writer w{*this, finish_written(index), true};
  describe_outputs(w);
}

COMMTRACE_HOT void Tracer::finish_pending(std::uint32_t pos) {
  Pending& p = pending_[pos];
  if (p.implied == Implied::Key) {
    const Source& s = sources_[prev_.first + pos];
    COMMTRACE_CHECK(n_pending_ == pos + 1 + s.inner, ErrorCode::Internal,
                    "tracer: {} events ran inside an event of key {}, {} the first time",
                    n_pending_ - pos - 1, s.key, s.inner);
  }
  if (p.implied != Implied::No) {  // its outputs are what they were
    unseen_ -= !p.outputs_seen;
    p.outputs_seen = true;
  }
  if (timed_iteration_) p.duration = now() - p.start;
}

template <class Describe>
[[gnu::noinline]] std::uint32_t Tracer::write_record(EventHead h, Describe describe,
                                                     std::uint64_t start, std::uint32_t like) {
  if (speculating_) materialize();
  const std::uint32_t index = append_head(h);
  Writer w{*this, index};
  describe(w);
  end_record(index, start, like);
  return index;
}

template <class Describe>
[[gnu::noinline]] std::uint32_t Tracer::write_begin(EventHead h, Describe describe,
                                                    const CollectiveView* c) {
  if (speculating_) materialize();
  const std::uint32_t index = append_head(h);
  Writer w{*this, index};
  describe(w);
  begin_record(index, c);
  return index;
}

inline std::uint32_t Tracer::record(const EventView& e, std::uint64_t start) {
  return record(
      e,
      [&e](auto& sink) {
        for (const ArgView& a : e.inputs) sink.input(a);
        for (const ArgView& a : e.outputs) sink.output(a);
      },
      start);
}

inline std::uint32_t Tracer::begin(const EventView& e, const CollectiveView* collective) {
  return begin(
      e,
      [&e](auto& sink) {
        for (const ArgView& a : e.inputs) sink.input(a);
        for (const ArgView& a : e.outputs) sink.output(a);
      },
      collective);
}

inline void Tracer::finish(std::uint32_t index, std::span<const ArgView> outputs) {
  finish(index, [outputs](auto& sink) {
    for (const ArgView& a : outputs) sink.output(a);
  });
}

// Times one event on its device. Made before the work is queued (timer null: the host clock
// times it, as on cpu); end() after the event was recorded hands the measurement to the tracer.
// Destroyed without end() (the work threw), the token is returned to its timer.
class DeviceTiming {
 public:
  explicit DeviceTiming(DeviceTimer* timer) : timer_(timer), token_(timer ? timer->start() : 0) {}
  ~DeviceTiming() {
    if (timer_) abandon();
  }
  DeviceTiming(const DeviceTiming&) = delete;
  DeviceTiming& operator=(const DeviceTiming&) = delete;
  void end(Tracer& tracer, std::uint32_t index) {
    if (timer_) hand_over(tracer, index);
  }

 private:
  // Out of line: only device-timed events (a timer) reach them.
  void abandon();
  void hand_over(Tracer& tracer, std::uint32_t index);

  DeviceTimer* timer_;
  std::uint32_t token_;
};

// A region of the current tracer, if any (Tracer::begin_region), from construction to end();
// destroyed without end() (an exception left it), the region is abandoned. Key 0: no region.
class KeyedRegion {
 public:
  explicit KeyedRegion(std::uint64_t key) : tracer_(key ? Tracer::current() : nullptr) {
    if (tracer_) tracer_->begin_region(key);
  }
  ~KeyedRegion() {
    if (tracer_) tracer_->abandon_region();
  }
  KeyedRegion(const KeyedRegion&) = delete;
  KeyedRegion& operator=(const KeyedRegion&) = delete;
  void end() {
    if (tracer_) std::exchange(tracer_, nullptr)->end_region();
  }

 private:
  Tracer* tracer_;
};

// A key never handed out before in this process (EventHead::key, Tracer::begin_region).
std::uint64_t new_trace_key();

// Makes `t` the current tracer of this thread for the scope; restores the previous one.
class TracerActivation {
 public:
  explicit TracerActivation(Tracer& t);
  ~TracerActivation();
  TracerActivation(const TracerActivation&) = delete;
  TracerActivation& operator=(const TracerActivation&) = delete;

 private:
  Tracer* previous_;
};

// Enters module `fqn` of the current tracer, if any, for the scope; `slot` as enter_module's.
class ModuleScope {
 public:
  ModuleScope(std::string_view fqn, std::string_view type, const TraceSlot* slot = nullptr);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
  int module() const { return module_; }  // -1 when no tracer is active

 private:
  Tracer* tracer_;
  int module_ = -1;
};

// Runs the scope under a module index recorded earlier (backward attribution) and a phase.
// A module of another tracer (or -1) maps to Global.
class AttributionScope {
 public:
  AttributionScope(const Tracer* owner, int module, Phase phase);
  ~AttributionScope();
  AttributionScope(const AttributionScope&) = delete;
  AttributionScope& operator=(const AttributionScope&) = delete;

 private:
  Tracer* tracer_;
  int previous_module_ = 0;
  Phase previous_phase_ = Phase::Forward;
};

// Sets the phase of the current tracer, if any, for the scope.
class PhaseScope {
 public:
  explicit PhaseScope(Phase p);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Tracer* tracer_;
  Phase previous_ = Phase::Forward;
};

// The scopes run for every module call and backward node: inline.
inline ModuleScope::ModuleScope(std::string_view fqn, std::string_view type, const TraceSlot* slot)
    : tracer_(Tracer::current()) {
  if (tracer_) module_ = tracer_->enter_module(fqn, type, slot);
}
inline ModuleScope::~ModuleScope() {
  if (tracer_) tracer_->exit_module();
}

inline AttributionScope::AttributionScope(const Tracer* owner, int module, Phase phase)
    : tracer_(Tracer::current()) {
  if (!tracer_) return;
  previous_module_ = tracer_->attribute_to(owner == tracer_ && module >= 0 ? module : 0);
  previous_phase_ = tracer_->phase();
  tracer_->set_phase(phase);
}
inline AttributionScope::~AttributionScope() {
  if (!tracer_) return;
  tracer_->set_phase(previous_phase_);
  tracer_->restore_module(previous_module_);
}

}  // namespace commtrace
