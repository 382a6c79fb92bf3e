// The tracer: interning, fixed-size records, iteration folding and the scopes.
#include "tracer/tracer.h"

#include <algorithm>
#include <utility>

#include "tracer/nvtx.h"

// The per-event helpers of the matching path: inlined into their callers.
#if defined(__GNUC__)
#define COMMTRACE_HOT [[gnu::always_inline]] inline
#else
#define COMMTRACE_HOT inline
#endif

namespace commtrace {

namespace {
std::atomic<std::uint32_t> g_next_tracer_id{1};  // 0 marks an empty slot

COMMTRACE_HOT std::uint16_t arg_count(std::size_t n, const char* what) {
  COMMTRACE_CHECK(n <= 0xffff, ErrorCode::Internal, "tracer: {} {} arguments in one record", n,
                  what);
  return std::uint16_t(n);
}
}  // namespace

Tracer::Tracer(int rank) : id_(g_next_tracer_id.fetch_add(1, std::memory_order_relaxed)) {
  trace_.rank = rank;
  trace_.records.reserve(1024);
  sources_.reserve(1024);
  trace_.args.reserve(4096);
  trace_.blocks.push_back(Block{0, 0, 0, 1});
}

int Tracer::enter_module(std::string_view fqn, std::string_view type) {
  const int parent = stack_.back();
  for (int c : trace_.modules[std::size_t(parent)].children) {
    if (trace_.modules[std::size_t(c)].fqn == fqn) {
      stack_.push_back(c);
      nvtx::push(trace_.modules[std::size_t(c)].fqn.c_str());
      return c;
    }
  }
  const int depth = trace_.modules[std::size_t(parent)].depth + 1;
  COMMTRACE_CHECK(depth <= kMaxModuleDepth, ErrorCode::InvalidArgument,
                  "tracer: module '{}' nests {} levels deep, more than {}", fqn, depth,
                  kMaxModuleDepth);
  const int id = int(trace_.modules.size());
  ModuleNode node;
  node.fqn = fqn;
  node.type = type;
  node.parent = parent;
  node.depth = depth;
  trace_.modules.push_back(std::move(node));
  trace_.modules[std::size_t(parent)].children.push_back(id);
  stack_.push_back(id);
  nvtx::push(trace_.modules[std::size_t(id)].fqn.c_str());
  return id;
}

void Tracer::exit_module() {
  COMMTRACE_CHECK(stack_.size() > 1, ErrorCode::Internal, "tracer: exit_module without enter");
  stack_.pop_back();
  nvtx::pop();
}

void Tracer::push_module(int module) {
  COMMTRACE_CHECK(module >= 0 && std::size_t(module) < trace_.modules.size(), ErrorCode::Internal,
                  "tracer: module {} out of range [0, {})", module, trace_.modules.size());
  stack_.push_back(module);
  nvtx::push(trace_.modules[std::size_t(module)].fqn.c_str());
}

bool Tracer::has_params(int module) const {
  return !trace_.modules.at(std::size_t(module)).params.empty();
}

void Tracer::set_params(int module,
                        std::span<const std::pair<std::string, std::vector<Placement>>> ps) {
  std::vector<ParamInfo>& out = trace_.modules.at(std::size_t(module)).params;
  out.clear();
  for (const auto& [name, placements] : ps) {
    out.push_back(ParamInfo{name, trace_.pools.intern_placements(placements)});
  }
}

COMMTRACE_HOT StrId Tracer::intern_static(const char* s) {
  StaticSlot& slot = static_cache_[(reinterpret_cast<std::uintptr_t>(s) >> 3) & 255];
  if (slot.ptr == s) return slot.id;
  auto [it, inserted] = static_ids_.try_emplace(s, 0);
  if (inserted) it->second = trace_.pools.intern(s);
  slot = StaticSlot{s, it->second};
  return it->second;
}

// A view's argument, its ids taken from the slots where they hold one for this tracer.
void Tracer::push_arg(const ArgView& a) {
  std::uint32_t q = 0;
  TensorArg t;
  if (a.slot && a.slot->get(id_, q)) {
    t = trace_.args[q];
  } else {
    t.shape = a.shape_slot && a.shape_slot->get(id_, q) ? trace_.args[q].shape
                                                        : trace_.pools.intern_shape(a.shape);
    t.global_shape = a.global.empty() ? t.shape : trace_.pools.intern_shape(a.global);
    t.placements = a.placements.empty() ? 0 : trace_.pools.intern_placements(a.placements);
    if (a.slot) a.slot->set(id_, std::uint32_t(trace_.args.size()));
  }
  trace_.args.push_back(t);
}

MeshId Tracer::intern_mesh(const MeshInfo& m, std::uint64_t key) {
  if (key == 0) return trace_.pools.intern_mesh(m);
  auto it = std::find_if(mesh_keys_.begin(), mesh_keys_.end(),
                         [&](const auto& k) { return k.first == key; });
  if (it == mesh_keys_.end()) {
    mesh_keys_.emplace_back(key, trace_.pools.intern_mesh(m));
    it = mesh_keys_.end() - 1;
  }
  last_mesh_ = *it;
  return it->second;
}

COMMTRACE_HOT MeshId Tracer::mesh_id(const MeshInfo& m, std::uint64_t key) {
  return key != 0 && key == last_mesh_.first ? last_mesh_.second : intern_mesh(m, key);
}

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
  std::uint32_t q = 0;
  if (a.slot && a.slot->get(id_, q)) return q == index || args[q] == args[index];
  const TensorArg& t = args[index];
  if (a.shape_slot && a.shape_slot != a.slot && a.shape_slot->get(id_, q)) {
    if (args[q].shape != t.shape) return false;
  } else if (!dims_equal(a.shape, t.shape)) {
    return false;
  }
  if (a.global.empty() ? t.global_shape != t.shape : !dims_equal(a.global, t.global_shape)) {
    return false;
  }
  if (t.placements == 0) {  // a plain tensor: no table lookup
    if (!a.placements.empty()) return false;
  } else {
    const auto p = trace_.pools.placements(t.placements);
    if (!std::equal(p.begin(), p.end(), a.placements.begin(), a.placements.end())) return false;
  }
  if (a.slot) a.slot->set(id_, index);
  return true;
}

COMMTRACE_HOT bool Tracer::outputs_match(std::span<const ArgView> outputs, const Record& r) {
  if (outputs.size() != r.n_outputs) return false;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!arg_matches(outputs[i], r.outputs_begin + std::uint32_t(i))) return false;
  }
  return true;
}

// Everything same_event compares, read from the view instead of the stored record `index`.
// Names and meshes are compared by address (the view's pointer, the mesh's key) before by id.
COMMTRACE_HOT bool Tracer::matches(const EventView& e, const CollectiveView* c,
                                   std::uint32_t index) {
  const Record& r = trace_.records[index];
  const Source& s = sources_[index];
  if (r.kind != e.kind || r.phase != phase_ || r.dtype != e.dtype || r.sharded != e.sharded ||
      r.module != std::uint32_t(stack_.back()) || r.n_inputs != e.inputs.size() ||
      (s.name != e.name && r.name != intern_static(e.name)) ||
      (s.overload != e.overload && r.overload != intern_static(e.overload)) ||
      (e.reason.empty() ? r.reason != 0 : trace_.pools.str(r.reason) != e.reason) ||
      (e.mesh
           ? (e.mesh_key == 0 || e.mesh_key != s.mesh_key) && r.mesh != mesh_id(*e.mesh, e.mesh_key)
           : r.mesh != kNoMesh) ||
      (r.kind == EventKind::Collective) != (c != nullptr)) {
    return false;
  }
  if (c) {
    const CollectiveInfo& ci = r.collective;
    auto same = [&](PlacementsId id, std::span<const Placement> p) {
      const auto l = trace_.pools.placements(id);
      return std::equal(l.begin(), l.end(), p.begin(), p.end());
    };
    if (ci.op != c->op || ci.reduce_op != c->reduce_op || ci.group_size != c->group_size ||
        ci.group_rank != c->group_rank || ci.peer != c->peer || ci.root != c->root ||
        ci.bytes != c->bytes || trace_.pools.str(ci.group) != c->group ||
        !same(ci.before, c->before) || !same(ci.after, c->after)) {
      return false;
    }
  }
  for (std::size_t i = 0; i < e.inputs.size(); ++i) {
    if (!arg_matches(e.inputs[i], r.inputs_begin + std::uint32_t(i))) return false;
  }
  return e.outputs.empty() || outputs_match(e.outputs, r);
}

// The open block's matched events become records: copies of the previous block's records with
// their own times and sequence numbers.
void Tracer::materialize() {
  speculating_ = false;
  std::vector<Record>& rs = trace_.records;
  rs.reserve(rs.size() + n_pending_);
  sources_.reserve(rs.capacity());
  for (std::size_t i = 0; i < n_pending_; ++i) {
    Record r = rs[prev_.first + i];
    const Pending& p = pending_[i];
    auto copy_args = [&](std::uint32_t begin, std::uint16_t n) {
      const std::uint32_t at = std::uint32_t(trace_.args.size());
      for (std::uint32_t k = 0; k < n; ++k) {
        const TensorArg a = trace_.args[begin + k];
        trace_.args.push_back(a);
      }
      return at;
    };
    r.inputs_begin = copy_args(r.inputs_begin, r.n_inputs);
    if (!p.outputs_seen) r.n_outputs = 0;
    r.outputs_begin = copy_args(r.outputs_begin, r.n_outputs);
    r.start_s = double(p.start);
    r.duration_s = double(p.duration);
    r.collective.seq = p.seq;
    r.collective.seq_stride = 0;
    rs.push_back(r);
    sources_.push_back(sources_[prev_.first + i]);
  }
  n_pending_ = 0;
}

// The event matched the previous block's record at its position: it becomes pending (no record).
COMMTRACE_HOT bool Tracer::match_next(const EventView& e, const CollectiveView* c,
                                      std::uint64_t start) {
  const std::uint32_t pos = n_pending_;
  if (pos >= prev_.count || !matches(e, c, prev_.first + pos)) return false;
  const Record& r = trace_.records[prev_.first + pos];
  const bool seen = !e.outputs.empty() || r.n_outputs == 0;
  unseen_ += !seen;
  if (c) {  // the sequence number advances by the stride the first repeat set
    const CollectiveInfo& ci = r.collective;
    const std::uint64_t last = ci.seq + (prev_.repeat - 1) * ci.seq_stride;
    seq_ok_ = seq_ok_ && c->seq >= last && (prev_.repeat == 1 || c->seq - last == ci.seq_stride);
  }
  pending_[pos] = Pending{start, 0, c ? c->seq : 0, seen};  // sized by next_iteration()
  ++n_pending_;
  // The next event is compared with the next record: fetch it (and the arguments that usually
  // follow this record's) while the op runs, so the compare finds them in cache.
  if (pos + 1 < prev_.count) {
    const char* next = reinterpret_cast<const char*>(&r + 1);
    for (std::size_t off = 0; off < sizeof(Record); off += 64) __builtin_prefetch(next + off);
    __builtin_prefetch(trace_.args.data() + r.outputs_begin + r.n_outputs);
  }
  return true;
}

// A new record (after the pending ones, when the event ended speculation).
std::uint32_t Tracer::append(const EventView& e, const CollectiveView* c, std::uint64_t start) {
  if (speculating_) materialize();
  Record r;
  r.kind = e.kind;
  r.phase = phase_;
  r.dtype = e.dtype;
  r.sharded = e.sharded;
  r.name = intern_static(e.name);
  r.overload = intern_static(e.overload);
  r.reason = e.reason.empty() ? 0 : trace_.pools.intern(e.reason);
  r.module = std::uint32_t(stack_.back());
  if (e.mesh) r.mesh = mesh_id(*e.mesh, e.mesh_key);
  r.inputs_begin = std::uint32_t(trace_.args.size());
  r.n_inputs = arg_count(e.inputs.size(), "input");
  for (const ArgView& a : e.inputs) push_arg(a);
  r.outputs_begin = std::uint32_t(trace_.args.size());
  r.n_outputs = arg_count(e.outputs.size(), "output");
  for (const ArgView& a : e.outputs) push_arg(a);
  if (c) {
    CollectiveInfo& ci = r.collective;
    ci.op = c->op;
    ci.reduce_op = c->reduce_op;
    ci.seq = c->seq;
    ci.group = trace_.pools.intern(c->group);
    ci.group_size = c->group_size;
    ci.group_rank = c->group_rank;
    ci.peer = c->peer;
    ci.root = c->root;
    ci.bytes = c->bytes;
    ci.before = trace_.pools.intern_placements(c->before);
    ci.after = trace_.pools.intern_placements(c->after);
  }
  // Ticks until take() converts them.
  r.start_s = double(start);
  const std::uint32_t index = std::uint32_t(trace_.records.size());
  trace_.records.push_back(r);
  sources_.push_back(Source{e.name, e.overload, e.mesh ? e.mesh_key : 0});
  return index;
}

std::uint32_t Tracer::record(const EventView& e, std::uint64_t start) {
  if (speculating_ && match_next(e, nullptr, start)) {
    pending_[n_pending_ - 1].duration = now() - start;
    return last_pending();
  }
  const std::uint32_t i = append(e, nullptr, start);
  trace_.records[i].duration_s = double(now()) - trace_.records[i].start_s;
  return i;
}

std::uint32_t Tracer::begin(const EventView& e, const CollectiveView* collective) {
  const std::uint64_t start = now();
  return speculating_ && match_next(e, collective, start) ? last_pending()
                                                          : append(e, collective, start);
}

void Tracer::time_on_device(std::uint32_t index, DeviceTimer& timer, std::uint32_t token) {
  device_spans_.push_back(DeviceSpan{index, &timer, token});
}

// Each device-timed event's duration becomes its timer's measurement, in ticks like the host
// durations it replaces (converted back to seconds by take()).
void Tracer::resolve_device_times() {
  if (device_spans_.empty()) return;
  const double per_tick = clock_.seconds_per_tick();
  for (const DeviceSpan& d : device_spans_) {
    const double s = d.timer->elapsed_s(d.token);
    const double ticks = per_tick > 0 ? s / per_tick : 0.0;
    if (speculating(d.index)) {
      const std::size_t pos = d.index - trace_.records.size();
      COMMTRACE_CHECK(speculating_ && pos < n_pending_, ErrorCode::Internal,
                      "tracer: device time for unknown record {}", d.index);
      pending_[pos].duration = std::uint64_t(ticks);
    } else {
      trace_.records.at(d.index).duration_s = ticks;
    }
  }
  device_spans_.clear();
}

void Tracer::finish(std::uint32_t index, std::span<const ArgView> outputs) {
  const std::uint64_t end = now();
  if (speculating(index)) {
    const std::size_t pos = index - trace_.records.size();
    COMMTRACE_CHECK(speculating_ && pos < n_pending_, ErrorCode::Internal,
                    "tracer: finish for unknown record {}", index);
    Pending& p = pending_[pos];
    if (outputs.empty() || outputs_match(outputs, trace_.records[prev_.first + pos])) {
      if (!outputs.empty() && !p.outputs_seen) {
        p.outputs_seen = true;
        --unseen_;
      }
      p.duration = end - p.start;
      return;
    }
    materialize();  // the record now exists at `index`
  }
  Record& r = trace_.records.at(index);
  if (!outputs.empty()) {
    r.outputs_begin = std::uint32_t(trace_.args.size());
    r.n_outputs = arg_count(outputs.size(), "output");
    for (const ArgView& a : outputs) push_arg(a);
  }
  r.duration_s = double(end) - r.start_s;
}

// Ends the open block: folded into the one before when every event matched it and every
// collective's sequence number advanced by its stride (set by the first repeat).
void Tracer::close_block() {
  resolve_device_times();
  std::vector<Block>& blocks = trace_.blocks;
  if (speculating_) {
    Block& p = blocks[blocks.size() - 2];
    if (n_pending_ == p.count && unseen_ == 0 && seq_ok_) {
      const double weight = 1.0 / double(p.repeat + 1);
      for (std::uint32_t i = 0; i < p.count; ++i) {
        Record& a = trace_.records[p.first + i];
        if (a.kind == EventKind::Collective && p.repeat == 1) {
          a.collective.seq_stride = pending_[i].seq - a.collective.seq;
        }
        // Running mean of the durations over the repeats.
        a.duration_s += (double(pending_[i].duration) - a.duration_s) * weight;
      }
      ++p.repeat;
      speculating_ = false;
      n_pending_ = 0;
      blocks.pop_back();
      return;
    }
    materialize();
  }
  Block& cur = blocks.back();
  cur.count = std::uint32_t(trace_.records.size()) - cur.first;
  if (blocks.size() >= 2 && cur.count == 0) blocks.pop_back();  // an empty iteration: no block
}

void Tracer::next_iteration() {
  close_block();
  ++iteration_;
  trace_.blocks.push_back(Block{std::uint32_t(trace_.records.size()), 0, iteration_, 1});
  prev_ = trace_.blocks[trace_.blocks.size() - 2];
  speculating_ = prev_.count > 0;
  if (pending_.size() < prev_.count) pending_.resize(prev_.count);
  unseen_ = 0;
  seq_ok_ = true;
}

std::size_t Tracer::memory_bytes() const {
  return trace_.records.capacity() * sizeof(Record) + sources_.capacity() * sizeof(Source) +
         trace_.args.capacity() * sizeof(TensorArg) + trace_.blocks.capacity() * sizeof(Block) +
         pending_.capacity() * sizeof(Pending) + trace_.pools.bytes();
}

Trace Tracer::take() {
  close_block();
  const double per_tick = clock_.seconds_per_tick();
  for (Record& r : trace_.records) {
    r.start_s *= per_tick;
    r.duration_s *= per_tick;
  }
  if (trace_.blocks.size() == 1 && trace_.blocks[0].repeat == 1) trace_.blocks.clear();
  Trace out = std::move(trace_);
  trace_ = Trace{};
  trace_.rank = out.rank;
  trace_.blocks.push_back(Block{0, 0, 0, 1});
  stack_.assign(1, 0);
  phase_ = Phase::Forward;
  iteration_ = 0;
  speculating_ = false;
  n_pending_ = 0;
  sources_.clear();
  id_ = g_next_tracer_id.fetch_add(1, std::memory_order_relaxed);  // the slots' ids are stale
  static_ids_.clear();
  static_cache_.fill(StaticSlot{});
  mesh_keys_.clear();
  last_mesh_ = {0, kNoMesh};
  clock_.restart();
  return out;
}

void DeviceTiming::abandon() {
  try {
    timer_->stop(token_);
    (void)timer_->elapsed_s(token_);
  } catch (const Error&) {  // the device failed already: the first error is the one reported
  }
}

void DeviceTiming::hand_over(Tracer& tracer, std::uint32_t index) {
  timer_->stop(token_);
  tracer.time_on_device(index, *timer_, token_);
  timer_ = nullptr;
}

TracerActivation::TracerActivation(Tracer& t) : previous_(Tracer::current_) {
  Tracer::current_ = &t;
}
TracerActivation::~TracerActivation() { Tracer::current_ = previous_; }

ModuleScope::ModuleScope(std::string_view fqn, std::string_view type) : tracer_(Tracer::current()) {
  if (tracer_) module_ = tracer_->enter_module(fqn, type);
}
ModuleScope::~ModuleScope() {
  if (tracer_) tracer_->exit_module();
}

AttributionScope::AttributionScope(const Tracer* owner, int module, Phase phase)
    : tracer_(Tracer::current()) {
  if (!tracer_) return;
  tracer_->push_module(owner == tracer_ && module >= 0 ? module : 0);
  previous_phase_ = tracer_->phase();
  tracer_->set_phase(phase);
}
AttributionScope::~AttributionScope() {
  if (!tracer_) return;
  tracer_->set_phase(previous_phase_);
  tracer_->exit_module();
}

PhaseScope::PhaseScope(Phase p) : tracer_(Tracer::current()) {
  if (!tracer_) return;
  previous_ = tracer_->phase();
  tracer_->set_phase(p);
  nvtx::push(phase_name(p));
}
PhaseScope::~PhaseScope() {
  if (!tracer_) return;
  tracer_->set_phase(previous_);
  nvtx::pop();
}

}  // namespace commtrace
