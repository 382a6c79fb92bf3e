// The per-thread Tracer and its RAII scopes. A Tracer collects one rank's Trace; it is made
// current for a thread by TracerActivation. With no current tracer every hook is a null check.
// Recording copies ids and numbers into fixed-size records (strings, shapes, placement lists and
// meshes are interned): no allocation per record once the tables and vectors have grown, and no
// text is formatted. Iterations marked with next_iteration() that repeat the previous one exactly
// are folded into it (a repeat count), so a long run costs the memory of one iteration. While an
// iteration repeats the one before, each event is only compared with the record at its position
// (no hashing, no new record); at the first difference the events so far become records.
// Not thread-safe: one tracer belongs to one thread (one rank) at a time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tracer/clock.h"
#include "tracer/trace.h"

namespace commtrace {

// A slot a tensor keeps for the tracer that last recorded it: the index of a stored argument
// (Trace::args) equal to the tensor's view, so a tensor recorded again (an op's output is the
// next op's input) costs a compare, not a lookup. Atomic because a tensor may be read by several
// ranks' threads (each with its own tracer).
// REQUIRES: what the view shows of the tensor (shapes, placements) never changes.
class TraceSlot {
 public:
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
// buffer), read for the shape alone.
struct ArgView {
  std::span<const std::int64_t> shape;
  std::span<const std::int64_t> global;
  std::span<const Placement> placements;
  const TraceSlot* slot = nullptr;
  const TraceSlot* shape_slot = nullptr;

  static ArgView plain(std::span<const std::int64_t> shape, const TraceSlot* slot) {
    return ArgView{shape, {}, {}, slot, slot};
  }
};

// At most N argument views, built in place: the entries are not initialized until emplaced (an
// op's recording site fills only the few it has).
template <std::size_t N>
class ArgViewList {
 public:
  ArgViewList() {}  // NOLINT: the union's entries are written before they are read
  // Appends make()'s view, built in place (no copy).
  template <class Make>
  ArgView& emplace(Make&& make) {
    return *::new (static_cast<void*>(&items_[n_++])) ArgView(make());
  }
  std::span<const ArgView> views() const { return {items_, n_}; }

 private:
  union {
    ArgView items_[N];
  };
  std::size_t n_ = 0;
};

// One event to record. name and overload are static strings (interned by address); reason is
// copied when it is not already known.
struct EventView {
  EventKind kind = EventKind::Compute;
  const char* name = "";
  const char* overload = "default";
  DType dtype = DType::F32;
  bool sharded = false;
  const MeshInfo* mesh = nullptr;
  std::uint64_t mesh_key = 0;  // a key unique to the mesh object (never reused); 0: compare
  std::string_view reason;
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

class Tracer {
 public:
  explicit Tracer(int rank = 0);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  static Tracer* current() { return current_; }  // null when no tracer is active on this thread

  // Module scopes: entering finds or creates the child `fqn` of the current module.
  int enter_module(std::string_view fqn, std::string_view type);
  void exit_module();
  int current_module() const { return stack_.back(); }
  // Backward attribution: run under `module` (an index of this trace) without the FQN lookup.
  void push_module(int module);
  std::size_t module_count() const { return trace_.modules.size(); }

  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }

  bool has_params(int module) const;
  // (local name, placements) per parameter; placements empty for a plain one.
  void set_params(int module, std::span<const std::pair<std::string, std::vector<Placement>>> ps);

  // The clock of the records: ticks since the tracer began (cheap; converted by take()).
  std::uint64_t now() const { return clock_.now(); }

  // Records an event that ran from `start` (a now() value) until now; returns its index.
  std::uint32_t record(const EventView& e, std::uint64_t start);
  // Records an event that starts now and is finished by finish(), which may give its outputs
  // (when they were not known at begin()).
  std::uint32_t begin(const EventView& e, const CollectiveView* collective = nullptr);
  void finish(std::uint32_t index, std::span<const ArgView> outputs = {});
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
  bool match_next(const EventView& e, const CollectiveView* c, std::uint64_t start);
  std::uint32_t append(const EventView& e, const CollectiveView* c, std::uint64_t start);
  std::uint32_t intern_static(const char* s);
  void push_arg(const ArgView& a);
  MeshId mesh_id(const MeshInfo& m, std::uint64_t key);
  MeshId intern_mesh(const MeshInfo& m, std::uint64_t key);
  void close_block();
  void resolve_device_times();
  // Speculative folding (see the file comment).
  bool matches(const EventView& e, const CollectiveView* c, std::uint32_t index);
  bool arg_matches(const ArgView& a, std::uint32_t index);
  bool dims_equal(std::span<const std::int64_t> dims, ShapeId id) const;
  bool outputs_match(std::span<const ArgView> outputs, const Record& r);
  void materialize();
  // A pending event's index is where materialize() would put its record.
  bool speculating(std::uint32_t index) const { return index >= trace_.records.size(); }
  std::uint32_t last_pending() const {
    return std::uint32_t(trace_.records.size()) + n_pending_ - 1;
  }

  // An event of the open block that matched the previous block's record at its position.
  struct Pending {
    std::uint64_t start = 0, duration = 0, seq = 0;
    bool outputs_seen = false;  // false while outputs added later are still to come
  };
  bool speculating_ = false;
  Block prev_;  // while speculating: the block compared with (the open one starts after it)
  std::vector<Pending> pending_;  // the first n_pending_ are the open block's
  std::uint32_t n_pending_ = 0;
  std::size_t unseen_ = 0;  // pending events whose outputs are still to come
  bool seq_ok_ = true;      // every pending collective's sequence number advanced by its stride

  // Per record: the addresses its event's view gave (name, overload, mesh key), compared before
  // the interned ids.
  struct Source {
    const char* name;
    const char* overload;
    std::uint64_t mesh_key;
  };
  std::vector<Source> sources_;

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
  static inline thread_local Tracer* current_ = nullptr;  // set by TracerActivation

  std::uint32_t id_;  // unique per tracer and trace: the key of the tensors' slots
  Trace trace_;
  std::vector<int> stack_{0};
  Phase phase_ = Phase::Forward;
  TickClock clock_;
  std::uint32_t iteration_ = 0;
  std::unordered_map<const char*, StrId> static_ids_;
  std::vector<std::pair<std::uint64_t, MeshId>> mesh_keys_;
  std::pair<std::uint64_t, MeshId> last_mesh_{0, kNoMesh};  // mesh_keys_' last hit
};

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

// Enters module `fqn` of the current tracer, if any, for the scope.
class ModuleScope {
 public:
  ModuleScope(std::string_view fqn, std::string_view type);
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

}  // namespace commtrace
