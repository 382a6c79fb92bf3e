// The tracer: interning, fixed-size records, iteration folding with its replay of repeated
// iterations, the timing sample, and the scopes.
#include "tracer/tracer.h"

#include <algorithm>
#include <utility>

#include "tracer/nvtx.h"

namespace commtrace {

namespace {
std::atomic<std::uint32_t> g_next_tracer_id{1};  // 0 marks an empty slot
std::atomic<std::uint64_t> g_next_key{1};        // 0 is no key

// Dim i of an n-d shape (n >= 2) as a transposed view shows it (the last two swapped).
std::size_t swapped_dim(std::size_t i, std::size_t n) { return i + 2 >= n ? 2 * n - 3 - i : i; }

// A shard placement of a tensor of rank last + 1 as its transposed view shows it.
Placement swapped_placement(Placement p, int last) {
  if (p.is_shard() && p.dim >= last - 1) p.dim = p.dim == last ? last - 1 : last;
  return p;
}

// What a view that swaps() records: its shapes and shard dims swapped.
struct SwappedArg {
  explicit SwappedArg(const ArgView& a) {
    auto swap = [](std::span<const std::int64_t> s, Shape& out) {
      out.assign(s.begin(), s.end());
      if (out.size() >= 2) std::swap(out[out.size() - 2], out[out.size() - 1]);
    };
    swap(a.shape, shape);
    swap(a.global, global);
    const int last = int(a.global.empty() ? a.shape.size() : a.global.size()) - 1;
    for (const Placement& p : a.placements) placements.push_back(swapped_placement(p, last));
  }
  Shape shape, global;
  std::vector<Placement> placements;
};
}  // namespace

std::uint64_t new_trace_key() { return g_next_key.fetch_add(1, std::memory_order_relaxed); }

Tracer::Tracer(int rank, TimingPolicy timing)
    : nvtx_(nvtx::attached()),
      id_(g_next_tracer_id.fetch_add(1, std::memory_order_relaxed)),
      slot_tag_(std::uint64_t(id_) << 32),
      policy_(timing) {
  trace_.rank = rank;
  trace_.records.reserve(1024);
  sources_.reserve(1024);
  trace_.args.reserve(4096);
  trace_.blocks.push_back(Block{0, 0, 0, 1});
}

int Tracer::enter_module(std::string_view fqn, std::string_view type, const TraceSlot* slot) {
  const int parent = stack_.back();
  std::uint32_t known = 0;
  if (slot && slot->get(id_, known) && known < trace_.modules.size() &&
      trace_.modules[known].parent == parent) {
    stack_.push_back(int(known));
    if (nvtx_) nvtx_push(trace_.modules[known].fqn.c_str());
    return int(known);
  }
  int id = -1;
  for (int c : trace_.modules[std::size_t(parent)].children) {
    if (trace_.modules[std::size_t(c)].fqn == fqn) {
      id = c;
      break;
    }
  }
  if (id < 0) {
    const int depth = trace_.modules[std::size_t(parent)].depth + 1;
    COMMTRACE_CHECK(depth <= kMaxModuleDepth, ErrorCode::InvalidArgument,
                    "tracer: module '{}' nests {} levels deep, more than {}", fqn, depth,
                    kMaxModuleDepth);
    id = int(trace_.modules.size());
    ModuleNode node;
    node.fqn = fqn;
    node.type = type;
    node.parent = parent;
    node.depth = depth;
    trace_.modules.push_back(std::move(node));
    trace_.modules[std::size_t(parent)].children.push_back(id);
  }
  if (slot) slot->set(id_, std::uint32_t(id));
  stack_.push_back(id);
  if (nvtx_) nvtx_push(trace_.modules[std::size_t(id)].fqn.c_str());
  return id;
}

void Tracer::nvtx_push(const char* name) { nvtx::push(name); }
void Tracer::nvtx_pop() { nvtx::pop(); }

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

StrId Tracer::intern_static(const char* s) {
  StaticSlot& slot = static_cache_[(reinterpret_cast<std::uintptr_t>(s) >> 3) & 255];
  if (slot.ptr == s) return slot.id;
  auto [it, inserted] = static_ids_.try_emplace(s, 0);
  if (inserted) it->second = trace_.pools.intern(s);
  slot = StaticSlot{s, it->second};
  return it->second;
}

// A view's argument, its ids taken from the slots where they hold one for this tracer.
void Tracer::push_arg(const ArgView& a) {
  TensorArg t;
  if (a.swaps()) {
    const SwappedArg sw(a);
    t.shape = trace_.pools.intern_shape(sw.shape);
    t.global_shape = sw.global.empty() ? t.shape : trace_.pools.intern_shape(sw.global);
    t.placements = sw.placements.empty() ? 0 : trace_.pools.intern_placements(sw.placements);
    trace_.args.push_back(t);
    return;
  }
  std::uint32_t q = 0;
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

MeshId Tracer::mesh_id(const MeshInfo& m, std::uint64_t key) {
  return key != 0 && key == last_mesh_.first ? last_mesh_.second : intern_mesh(m, key);
}

// arg_matches without the slots: a transposed view, or a tensor no slot covers.
bool Tracer::arg_matches_by_value(ArgView a, std::uint32_t index) const {
  const TensorArg& t = trace_.args[index];
  const bool sw = a.swaps();
  auto same_dims = [&](std::span<const std::int64_t> dims, ShapeId id) {
    const auto s = trace_.pools.shape(id);
    if (s.size() != dims.size()) return false;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] != dims[sw ? swapped_dim(i, s.size()) : i]) return false;
    }
    return true;
  };
  if (!same_dims(a.shape, t.shape)) return false;
  if (a.global.empty() ? t.global_shape != t.shape : !same_dims(a.global, t.global_shape)) {
    return false;
  }
  const auto p = trace_.pools.placements(t.placements);
  if (p.size() != a.placements.size()) return false;
  const int last = int(a.global.empty() ? a.shape.size() : a.global.size()) - 1;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (!(p[i] == (sw ? swapped_placement(a.placements[i], last) : a.placements[i]))) return false;
  }
  return true;
}

// head_matches by value: names by interned id, the reason by text, the mesh by id. A match keeps
// the new addresses, so the next repeat compares them.
bool Tracer::head_matches_slow(EventHead h, std::uint32_t index) {
  const Record& r = trace_.records[index];
  if (r.kind != h.kind || r.phase != phase_ || r.dtype != h.dtype || r.sharded != h.sharded ||
      r.module != std::uint32_t(stack_.back()) || r.name != intern_static(h.name) ||
      r.overload != intern_static(h.overload) || trace_.pools.str(r.reason) != h.reason ||
      (h.mesh ? r.mesh != mesh_id(*h.mesh, h.mesh_key) : r.mesh != kNoMesh)) {
    return false;
  }
  Source& s = sources_[index];
  s.name = h.name;
  s.overload = h.overload;
  s.mesh_key = h.mesh ? h.mesh_key : 0;
  return true;
}

bool Tracer::collective_matches(const CollectiveView& c, const Record& r) const {
  const CollectiveInfo& ci = r.collective;
  auto same = [&](PlacementsId id, std::span<const Placement> p) {
    const auto l = trace_.pools.placements(id);
    return std::equal(l.begin(), l.end(), p.begin(), p.end());
  };
  return ci.op == c.op && ci.reduce_op == c.reduce_op && ci.group_size == c.group_size &&
         ci.group_rank == c.group_rank && ci.peer == c.peer && ci.root == c.root &&
         ci.bytes == c.bytes && trace_.pools.str(ci.group) == c.group &&
         same(ci.before, c.before) && same(ci.after, c.after);
}

// A region stored at this position of the previous block with this key, module and phase makes
// the events up to its count implied, as a keyed event's (begin()).
void Tracer::begin_region(std::uint64_t key) {
  const std::uint32_t pos = n_pending_;
  Region r;
  r.first = std::uint32_t(trace_.records.size()) + pos;
  r.module = std::uint32_t(stack_.back());
  r.phase = phase_;
  r.key = key;
  if (speculating_ && pos >= implied_end_ && pos < prev_.count) {
    const std::uint32_t at = prev_.first + pos;
    while (region_cursor_ < regions_.size() && regions_[region_cursor_].first < at) {
      ++region_cursor_;
    }
    for (std::size_t c = region_cursor_; c < regions_.size() && regions_[c].first == at; ++c) {
      const Region& e = regions_[c];
      if (e.key == key && e.module == r.module && e.phase == r.phase && e.count != kNoInner) {
        r.expected = e.count;
        implied_end_ = pos + e.count;
        break;
      }
    }
  }
  region_stack_.push_back(std::uint32_t(open_regions_.size()));
  open_regions_.push_back(r);
}

void Tracer::end_region() {
  COMMTRACE_CHECK(!region_stack_.empty(), ErrorCode::Internal, "tracer: end_region() outside one");
  Region& r = open_regions_[region_stack_.back()];
  region_stack_.pop_back();
  r.count = std::uint32_t(trace_.records.size()) + n_pending_ - r.first;
  COMMTRACE_CHECK(r.expected == kNoInner || r.count == r.expected, ErrorCode::Internal,
                  "tracer: {} events ran inside a region of key {}, {} the first time", r.count,
                  r.key, r.expected);
}

// Its count stays kNoInner (never matched). Events it implied so far ran; none after them is.
void Tracer::abandon_region() {
  if (region_stack_.empty()) return;
  if (open_regions_[region_stack_.back()].expected != kNoInner) {
    implied_end_ = std::min(implied_end_, n_pending_);
  }
  region_stack_.pop_back();
}

// The open block's matched events become records: copies of the previous block's records with
// their own times (estimated when the iteration is not timed) and sequence numbers.
void Tracer::materialize() {
  speculating_ = false;
  implied_end_ = 0;
  std::vector<Record>& rs = trace_.records;
  rs.reserve(rs.size() + n_pending_);
  sources_.reserve(rs.capacity());
  const double block_start = n_pending_ ? rs[prev_.first].start_s : 0.0;
  auto copy_args = [&](std::uint32_t begin, std::uint16_t n) {
    const std::uint32_t at = std::uint32_t(trace_.args.size());
    for (std::uint32_t k = 0; k < n; ++k) {
      const TensorArg a = trace_.args[begin + k];
      trace_.args.push_back(a);
    }
    return at;
  };
  for (std::size_t i = 0; i < n_pending_; ++i) {
    Record r = rs[prev_.first + i];
    const Pending& p = pending_[i];
    r.inputs_begin = copy_args(r.inputs_begin, r.n_inputs);
    if (!p.outputs_seen) r.n_outputs = 0;
    r.outputs_begin = copy_args(r.outputs_begin, r.n_outputs);
    if (timed_iteration_) {
      r.start_s = double(p.start);
      r.duration_s = double(p.duration);
      r.estimated = false;
    } else {  // the duration stays the repeated record's mean
      r.start_s = double(iteration_start_) + (r.start_s - block_start);
      r.estimated = true;
    }
    if (r.kind == EventKind::Collective) {
      r.collective.seq = p.seq;
      r.collective.seq_stride = 0;
    }
    rs.push_back(r);
    sources_.push_back(sources_[prev_.first + i]);
  }
  n_pending_ = 0;
}

void Tracer::Writer::input(const ArgView& a) {
  Record& r = t.trace_.records[index];
  COMMTRACE_CHECK(r.n_outputs == 0 && r.n_inputs < 0xffff, ErrorCode::Internal,
                  "tracer: an input after the outputs, or more than 65535 inputs");
  t.push_arg(a);
  ++r.n_inputs;
}

void Tracer::Writer::output(const ArgView& a) {
  Record& r = t.trace_.records[index];
  if (replace_outputs) {  // outputs given at finish() replace those given before
    r.n_outputs = 0;
    replace_outputs = false;
  }
  COMMTRACE_CHECK(r.n_outputs < 0xffff, ErrorCode::Internal, "tracer: more than 65535 outputs");
  if (r.n_outputs == 0) r.outputs_begin = std::uint32_t(t.trace_.args.size());
  t.push_arg(a);
  ++r.n_outputs;
}

// A written record() event ran from `start` until now; one that began while the iteration was
// not timed gets estimates: the mean duration of `like` (the record it was compared with).
void Tracer::end_record(std::uint32_t index, std::uint64_t start, std::uint32_t like) {
  Record& r = trace_.records[index];
  Source& s = sources_[index];
  if (s.key != 0) s.inner = 0;  // a record() event has nothing inside
  const double end = double(now());
  if (start == kNoTime) {
    r.estimated = true;
    r.duration_s = like == kNone ? 0.0 : trace_.records[like].duration_s;
    r.start_s = std::max(0.0, end - r.duration_s);
  } else {
    r.start_s = double(start);
    r.duration_s = end - r.start_s;
  }
}

void Tracer::begin_record(std::uint32_t index, const CollectiveView* c) {
  Record& r = trace_.records[index];
  if (c) set_collective(r, *c);
  r.start_s = double(now());
}

// A written event ends: its duration, and the number of events inside a keyed one.
std::uint32_t Tracer::finish_written(std::uint32_t index) {
  Record& r = trace_.records.at(index);
  if (!r.estimated) r.duration_s = double(now()) - r.start_s;
  Source& s = sources_[index];
  if (s.key != 0) s.inner = std::uint32_t(trace_.records.size()) - index - 1;
  return index;
}

std::uint32_t Tracer::append_head(const EventHead& h) {
  Record r;
  r.kind = h.kind;
  r.phase = phase_;
  r.dtype = h.dtype;
  r.sharded = h.sharded;
  r.name = intern_static(h.name);
  r.overload = intern_static(h.overload);
  r.reason = h.reason.empty() ? 0 : trace_.pools.intern(h.reason);
  r.module = std::uint32_t(stack_.back());
  if (h.mesh) r.mesh = mesh_id(*h.mesh, h.mesh_key);
  r.inputs_begin = r.outputs_begin = std::uint32_t(trace_.args.size());
  const std::uint32_t index = std::uint32_t(trace_.records.size());
  trace_.records.push_back(r);
  sources_.push_back(Source{h.name, h.overload, trace_.pools.str(r.reason), h.mesh ? h.mesh_key : 0,
                            h.key, kNoInner});
  return index;
}

void Tracer::set_collective(Record& r, const CollectiveView& c) {
  CollectiveInfo& ci = r.collective;
  ci.op = c.op;
  ci.reduce_op = c.reduce_op;
  ci.seq = c.seq;
  ci.seq_stride = 0;
  ci.group = trace_.pools.intern(c.group);
  ci.group_size = c.group_size;
  ci.group_rank = c.group_rank;
  ci.peer = c.peer;
  ci.root = c.root;
  ci.bytes = c.bytes;
  ci.before = trace_.pools.intern_placements(c.before);
  ci.after = trace_.pools.intern_placements(c.after);
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

// Ends the open block: folded into the one before when every event matched it and every
// collective's sequence number advanced by its stride (set by the first repeat). A timed repeat
// joins the records' mean durations; an untimed one is counted.
void Tracer::close_block() {
  resolve_device_times();
  std::vector<Block>& blocks = trace_.blocks;
  if (speculating_) {
    Block& p = blocks[blocks.size() - 2];
    if (n_pending_ == p.count && unseen_ == 0 && seq_ok_) {
      Record* rs = trace_.records.data() + p.first;
      if (p.repeat == 1) {
        for (std::uint32_t i = 0; i < p.count; ++i) {
          if (rs[i].kind == EventKind::Collective) {
            rs[i].collective.seq_stride = pending_[i].seq - rs[i].collective.seq;
          }
        }
      }
      if (timed_iteration_) {
        const double weight = 1.0 / double(p.repeat - p.untimed + 1);
        for (std::uint32_t i = 0; i < p.count; ++i) {
          rs[i].duration_s += (double(pending_[i].duration) - rs[i].duration_s) * weight;
        }
      } else {
        ++p.untimed;
      }
      ++p.repeat;
      speculating_ = false;
      n_pending_ = 0;
      blocks.pop_back();
      open_regions_.clear();
      return;
    }
    materialize();
  }
  regions_.insert(regions_.end(), open_regions_.begin(), open_regions_.end());
  open_regions_.clear();
  Block& cur = blocks.back();
  cur.count = std::uint32_t(trace_.records.size()) - cur.first;
  if (blocks.size() >= 2 && cur.count == 0) blocks.pop_back();  // an empty iteration: no block
}

void Tracer::next_iteration() {
  COMMTRACE_CHECK(region_stack_.empty(), ErrorCode::InvalidArgument,
                  "tracer: next_iteration() inside a region of key {}",
                  open_regions_[region_stack_.back()].key);
  close_block();
  ++iteration_;
  trace_.blocks.push_back(Block{std::uint32_t(trace_.records.size()), 0, iteration_, 1});
  prev_ = trace_.blocks[trace_.blocks.size() - 2];
  speculating_ = prev_.count > 0;
  // This iteration is occurrence prev_.repeat of the previous block, if it repeats it.
  const std::uint64_t k = prev_.repeat;
  timed_iteration_ =
      !speculating_ || k < policy_.first || (policy_.every > 0 && k % policy_.every == 0);
  if (pending_.size() < prev_.count) pending_.resize(prev_.count);
  unseen_ = 0;
  seq_ok_ = true;
  implied_end_ = 0;
  region_cursor_ =
      std::size_t(std::partition_point(regions_.begin(), regions_.end(),
                                       [this](const Region& r) { return r.first < prev_.first; }) -
                  regions_.begin());
  iteration_start_ = now();
}

std::size_t Tracer::memory_bytes() const {
  return trace_.records.capacity() * sizeof(Record) + sources_.capacity() * sizeof(Source) +
         trace_.args.capacity() * sizeof(TensorArg) + trace_.blocks.capacity() * sizeof(Block) +
         pending_.capacity() * sizeof(Pending) + regions_.capacity() * sizeof(Region) +
         open_regions_.capacity() * sizeof(Region) + trace_.pools.bytes();
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
  timed_iteration_ = true;
  n_pending_ = 0;
  iteration_start_ = 0;
  implied_end_ = 0;
  sources_.clear();
  regions_.clear();
  open_regions_.clear();
  region_stack_.clear();
  region_cursor_ = 0;
  id_ = g_next_tracer_id.fetch_add(1, std::memory_order_relaxed);  // the slots' ids are stale
  slot_tag_ = std::uint64_t(id_) << 32;
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

PhaseScope::PhaseScope(Phase p) : tracer_(Tracer::current()) {
  if (!tracer_) return;
  previous_ = tracer_->phase();
  tracer_->set_phase(p);
  if (tracer_->nvtx_) Tracer::nvtx_push(phase_name(p));
}
PhaseScope::~PhaseScope() {
  if (!tracer_) return;
  tracer_->set_phase(previous_);
  if (tracer_->nvtx_) Tracer::nvtx_pop();
}

}  // namespace commtrace
