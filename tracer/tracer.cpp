// The tracer: interning, fixed-size records, iteration folding, the tick clock and the scopes.
#include "tracer/tracer.h"

#include <chrono>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace commtrace {

namespace {
thread_local Tracer* g_current = nullptr;
std::atomic<std::uint32_t> g_next_tracer_id{1};  // 0 marks an empty shape cache

// A cheap monotonic counter: the TSC on x86 (about 10 ns a read against 30 ns for steady_clock
// on a VM), steady_clock nanoseconds elsewhere. take() converts ticks to seconds against
// steady_clock over the trace's whole span.
std::uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::uint16_t arg_count(std::size_t n, const char* what) {
  COMMTRACE_CHECK(n <= 0xffff, ErrorCode::Internal, "tracer: {} {} arguments in one record", n,
                  what);
  return std::uint16_t(n);
}
}  // namespace

Tracer::Tracer(int rank)
    : id_(g_next_tracer_id.fetch_add(1, std::memory_order_relaxed)),
      start_ticks_(ticks()),
      start_steady_s_(steady_seconds()) {
  trace_.rank = rank;
  trace_.records.reserve(1024);
  trace_.args.reserve(4096);
  trace_.blocks.push_back(Block{0, 0, 0, 1});
}

Tracer* Tracer::current() { return g_current; }

int Tracer::enter_module(std::string_view fqn, std::string_view type) {
  const int parent = stack_.back();
  for (int c : trace_.modules[std::size_t(parent)].children) {
    if (trace_.modules[std::size_t(c)].fqn == fqn) {
      stack_.push_back(c);
      return c;
    }
  }
  const int id = int(trace_.modules.size());
  ModuleNode node;
  node.fqn = fqn;
  node.type = type;
  node.parent = parent;
  node.depth = trace_.modules[std::size_t(parent)].depth + 1;
  trace_.modules.push_back(std::move(node));
  trace_.modules[std::size_t(parent)].children.push_back(id);
  stack_.push_back(id);
  return id;
}

void Tracer::exit_module() {
  COMMTRACE_CHECK(stack_.size() > 1, ErrorCode::Internal, "tracer: exit_module without enter");
  stack_.pop_back();
}

void Tracer::push_module(int module) {
  COMMTRACE_CHECK(module >= 0 && std::size_t(module) < trace_.modules.size(), ErrorCode::Internal,
                  "tracer: module {} out of range [0, {})", module, trace_.modules.size());
  stack_.push_back(module);
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

std::uint64_t Tracer::now() const { return ticks() - start_ticks_; }

StrId Tracer::intern_static(const char* s) {
  StaticSlot& slot = static_cache_[(reinterpret_cast<std::uintptr_t>(s) >> 3) & 255];
  if (slot.ptr == s) return slot.id;
  auto [it, inserted] = static_ids_.try_emplace(s, 0);
  if (inserted) it->second = trace_.pools.intern(s);
  slot = StaticSlot{s, it->second};
  return it->second;
}

ShapeId Tracer::intern_shape(std::span<const std::int64_t> dims, const ShapeCache* cache) {
  ShapeId id = 0;
  if (cache && cache->get(id_, id)) return id;
  id = trace_.pools.intern_shape(dims);
  if (cache) cache->set(id_, id);
  return id;
}

TensorArg Tracer::intern_arg(const ArgView& a) {
  TensorArg t;
  t.shape = intern_shape(a.shape, a.shape_cache);
  t.global_shape = a.global.empty() || std::equal(a.global.begin(), a.global.end(), a.shape.begin(),
                                                  a.shape.end())
                       ? t.shape
                       : intern_shape(a.global, a.global_cache);
  t.placements = trace_.pools.intern_placements(a.placements);
  return t;
}

MeshId Tracer::intern_mesh(const MeshInfo& m, std::uint64_t key) {
  if (key == 0) return trace_.pools.intern_mesh(m);
  for (const auto& [k, id] : mesh_keys_) {
    if (k == key) return id;
  }
  const MeshId id = trace_.pools.intern_mesh(m);
  mesh_keys_.emplace_back(key, id);
  return id;
}

std::uint32_t Tracer::store(const EventView& e, const CollectiveView* c, std::uint64_t start) {
  Record r;
  r.kind = e.kind;
  r.phase = phase_;
  r.dtype = e.dtype;
  r.sharded = e.sharded;
  r.name = intern_static(e.name);
  r.overload = intern_static(e.overload);
  r.reason = e.reason.empty() ? 0 : trace_.pools.intern(e.reason);
  r.module = std::uint32_t(stack_.back());
  if (e.mesh) r.mesh = intern_mesh(*e.mesh, e.mesh_key);
  r.inputs_begin = std::uint32_t(trace_.args.size());
  r.n_inputs = arg_count(e.inputs.size(), "input");
  for (const ArgView& a : e.inputs) trace_.args.push_back(intern_arg(a));
  r.outputs_begin = std::uint32_t(trace_.args.size());
  r.n_outputs = arg_count(e.outputs.size(), "output");
  for (const ArgView& a : e.outputs) trace_.args.push_back(intern_arg(a));
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
  return index;
}

std::uint32_t Tracer::record(const EventView& e, std::uint64_t start) {
  const std::uint32_t i = store(e, nullptr, start);
  trace_.records[i].duration_s = double(now() - start);
  return i;
}

std::uint32_t Tracer::begin(const EventView& e, const CollectiveView* collective) {
  return store(e, collective, now());
}

void Tracer::add_outputs(std::uint32_t index, std::span<const ArgView> outputs) {
  Record& r = trace_.records.at(index);
  r.outputs_begin = std::uint32_t(trace_.args.size());
  r.n_outputs = arg_count(outputs.size(), "output");
  for (const ArgView& a : outputs) trace_.args.push_back(intern_arg(a));
}

void Tracer::finish(std::uint32_t index) {
  Record& r = trace_.records.at(index);
  r.duration_s = double(now()) - r.start_s;
}

// Folds the open block into the one before when it repeats it: same events, and every
// collective's sequence number advanced by its stride (set by the first repeat).
void Tracer::close_block() {
  std::vector<Block>& blocks = trace_.blocks;
  Block& cur = blocks.back();
  cur.count = std::uint32_t(trace_.records.size()) - cur.first;
  if (blocks.size() < 2) return;
  if (cur.count == 0) {  // an iteration that recorded nothing leaves no block
    blocks.pop_back();
    return;
  }
  Block& prev = blocks[blocks.size() - 2];
  if (prev.count != cur.count) return;
  std::vector<Record>& rs = trace_.records;
  for (std::uint32_t i = 0; i < cur.count; ++i) {
    const Record& a = rs[prev.first + i];
    const Record& b = rs[cur.first + i];
    if (!same_event(trace_, a, b)) return;
    if (a.kind == EventKind::Collective) {
      const std::uint64_t last = a.collective.seq + (prev.repeat - 1) * a.collective.seq_stride;
      if (b.collective.seq < last ||
          (prev.repeat > 1 && b.collective.seq - last != a.collective.seq_stride)) {
        return;
      }
    }
  }
  for (std::uint32_t i = 0; i < cur.count; ++i) {
    Record& a = rs[prev.first + i];
    const Record& b = rs[cur.first + i];
    if (a.kind == EventKind::Collective && prev.repeat == 1) {
      a.collective.seq_stride = b.collective.seq - a.collective.seq;
    }
    // Running mean of the durations over the repeats.
    a.duration_s += (b.duration_s - a.duration_s) / double(prev.repeat + 1);
  }
  ++prev.repeat;
  trace_.args.resize(rs[cur.first].inputs_begin);
  rs.resize(cur.first);
  blocks.pop_back();
}

void Tracer::next_iteration() {
  close_block();
  ++iteration_;
  trace_.blocks.push_back(Block{std::uint32_t(trace_.records.size()), 0, iteration_, 1});
}

std::size_t Tracer::memory_bytes() const {
  return trace_.records.capacity() * sizeof(Record) + trace_.args.capacity() * sizeof(TensorArg) +
         trace_.blocks.capacity() * sizeof(Block) + trace_.pools.bytes();
}

Trace Tracer::take() {
  close_block();
  // Ticks to seconds, against steady_clock over the trace's span.
  const std::uint64_t span_ticks = now();
  const double span_s = steady_seconds() - start_steady_s_;
  const double per_tick = span_ticks > 0 ? span_s / double(span_ticks) : 0.0;
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
  id_ = g_next_tracer_id.fetch_add(1, std::memory_order_relaxed);  // the caches' ids are stale
  static_ids_.clear();
  static_cache_.fill(StaticSlot{});
  mesh_keys_.clear();
  start_ticks_ = ticks();
  start_steady_s_ = steady_seconds();
  return out;
}

TracerActivation::TracerActivation(Tracer& t) : previous_(g_current) { g_current = &t; }
TracerActivation::~TracerActivation() { g_current = previous_; }

ModuleScope::ModuleScope(std::string_view fqn, std::string_view type) : tracer_(g_current) {
  if (tracer_) module_ = tracer_->enter_module(fqn, type);
}
ModuleScope::~ModuleScope() {
  if (tracer_) tracer_->exit_module();
}

AttributionScope::AttributionScope(const Tracer* owner, int module, Phase phase)
    : tracer_(g_current) {
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

PhaseScope::PhaseScope(Phase p) : tracer_(g_current) {
  if (!tracer_) return;
  previous_ = tracer_->phase();
  tracer_->set_phase(p);
}
PhaseScope::~PhaseScope() {
  if (tracer_) tracer_->set_phase(previous_);
}

}  // namespace commtrace
