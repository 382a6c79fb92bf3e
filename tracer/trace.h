// The trace model as plain data: records of collectives, GEMMs and other ops, the module tree
// they belong to, and the tables records point into (interned strings, shapes, placement lists,
// meshes). A record is a fixed-size struct of enums, numbers and ids: no text is made while
// tracing; reports render it. Records are grouped in blocks of iterations: a block that repeats
// identically is stored once with its repeat count. Enum values are serialized, so they are
// explicit and never renumbered.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/base.h"
#include "tracer/collectives.h"

namespace commtrace {

enum class Phase : std::uint8_t { Forward = 0, Backward = 1, Optimizer = 2, Recompute = 3 };
inline constexpr int kPhaseCount = 4;
enum class EventKind : std::uint8_t { Collective = 0, Gemm = 1, Compute = 2, Trivial = 3 };

const char* phase_name(Phase p);  // "forward", "backward", "optimizer", "recompute"
const char* event_kind_name(EventKind k);
Phase parse_phase(const std::string& s);
EventKind parse_event_kind(const std::string& s);
ReduceOp parse_reduce_op(const std::string& s);

// A DTensor's layout on one mesh dim (DESIGN §2): Shard(dim), Replicate(), Partial(op).
struct Placement {
  enum class Kind : std::uint8_t { Shard = 0, Replicate = 1, Partial = 2 };
  Kind kind = Kind::Replicate;
  ReduceOp op = ReduceOp::None;  // Partial: how pending values combine
  int dim = 0;                   // Shard: the tensor dim (negative until normalized)

  static Placement shard(int d) { return {Kind::Shard, ReduceOp::None, d}; }
  static Placement replicate() { return {Kind::Replicate, ReduceOp::None, 0}; }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return {Kind::Partial, op, 0}; }

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int d) const { return kind == Kind::Shard && dim == d; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind != Kind::Shard || dim == o.dim) &&
           (kind != Kind::Partial || op == o.op);
  }
  std::string str() const;  // PyTorch's repr: "Shard(dim=0)", "Replicate()", "Partial(sum)"
};
// PyTorch's tuple repr: "(Shard(dim=0),)", "(Shard(dim=0), Replicate())"; "" for none.
std::string placements_str(std::span<const Placement> p);
// Parses "S(0)", "Shard(0)", "Shard(dim=-1)", "R", "Replicate()", "P", "Partial(sum)", ... A
// negative shard dim stays negative. Throws InvalidArgument naming the text.
Placement parse_placement(std::string_view text);
// Parses placements_str's form ("(Shard(dim=0), Replicate())"; "" is none).
std::vector<Placement> parse_placements(std::string_view text);

// A device mesh as data: its shape, dim names, device type. `named` is false for a mesh whose
// names are commtrace's defaults (PyTorch's repr omits them then).
struct MeshInfo {
  std::vector<int> shape;
  std::vector<std::string> dim_names;
  bool named = false;
  Device device = Device::CPU;
  bool operator==(const MeshInfo& o) const = default;
};
// PyTorch's repr: "DeviceMesh((4,), 'cpu', stride=(1,))", with mesh_dim_names when named.
std::string mesh_str(const MeshInfo& m);
// Parses mesh_str's form, older PyTorch's "DeviceMesh('cpu', [[0, 1], [2, 3]], ...)" and
// commtrace 1.x's "DeviceMesh((tp=4))" (cpu). An unnamed mesh gets commtrace's default names
// ("tp"; "dp", "tp"; "dim0", ...).
MeshInfo parse_mesh_str(std::string_view text);
std::vector<std::string> default_mesh_dim_names(std::size_t ndim);

using StrId = std::uint32_t;         // 0 is ""
using ShapeId = std::uint32_t;       // 0 is the 0-d shape []
using PlacementsId = std::uint32_t;  // 0 is "no placements" (a plain tensor)
using MeshId = std::uint32_t;
inline constexpr MeshId kNoMesh = 0xffffffffu;

// One tensor argument or result. A plain tensor has global_shape == shape and placements 0;
// for a DTensor, shape is the local shard.
struct TensorArg {
  ShapeId shape = 0;
  ShapeId global_shape = 0;
  PlacementsId placements = 0;
  bool operator==(const TensorArg&) const = default;
};

// The collective-only fields of a record (DESIGN §1).
struct CollectiveInfo {
  Collective op = Collective::AllReduce;
  ReduceOp reduce_op = ReduceOp::None;
  std::uint64_t seq = 0;         // per communicator (p2p: per peer and direction), equal on
                                 // every rank for one collective
  std::uint64_t seq_stride = 0;  // in repeat k of the record's block the seq is seq + k × stride
  StrId group = 0;               // mesh dim name, e.g. "tp"
  int group_size = 0;
  int group_rank = 0;
  int peer = -1;            // p2p: the peer's group rank; -1 otherwise
  int root = -1;            // broadcast: the root's group rank; -1 otherwise
  std::uint64_t bytes = 0;  // nccl-tests convention (tracer/collectives.h)
  PlacementsId before = 0;  // the redistribution it serves, when one does
  PlacementsId after = 0;
  bool operator==(const CollectiveInfo&) const = default;
};

struct Record {
  EventKind kind = EventKind::Compute;
  Phase phase = Phase::Forward;
  DType dtype = DType::F32;
  bool sharded = false;      // an op on DTensor arguments (shown at noise >= 1)
  StrId name = 0;            // "all_reduce", "addmm", "relu", "t", ...
  StrId overload = 0;        // PyTorch overload: "default", "dim_IntList", "Tensor"
  StrId reason = 0;          // why it happened (redistribute, style, op)
  std::uint32_t module = 0;  // index into Trace::modules; 0 is Global
  MeshId mesh = kNoMesh;     // of a sharded op or collective
  std::uint32_t inputs_begin = 0, outputs_begin = 0;  // into Trace::args
  std::uint16_t n_inputs = 0, n_outputs = 0;
  // Its times are estimates, not measured: the occurrence was not timed (a sampled-out repeat that
  // then diverged): start_s from its iteration's start, duration_s the mean of the record it
  // repeated (0 when none).
  bool estimated = false;
  CollectiveInfo collective;  // meaningful when kind == Collective
  double start_s = 0;         // since the trace began; a repeated block's first occurrence
  double duration_s = 0;      // a repeated block's mean over its timed occurrences
};

// A run of records that happened `repeat` times in a row: iteration `iteration` and the next
// repeat − 1 identical ones (or, read from a PyTorch dump, one collective counted repeat times).
// `untimed` of the repeats were not timed (the tracer samples the times of long runs): the
// records' durations are the means over the other repeat − untimed.
struct Block {
  std::uint32_t first = 0;  // index of its first record
  std::uint32_t count = 0;
  std::uint32_t iteration = 0;
  std::uint64_t repeat = 1;
  std::uint64_t untimed = 0;
};

struct ParamInfo {
  std::string name;             // local name: "weight"
  PlacementsId placements = 0;  // 0 for a plain parameter
};

// Modules nest at most this deep below Global: a PyTorch-compatible dump nests two JSON levels
// per module, so this keeps every trace's dump within the readers' JSON nesting limit, and keeps
// `show`'s indentation bounded for a hostile file.
inline constexpr int kMaxModuleDepth = 30;

// Node 0 is always "Global" with parent -1. Children keep first-call order.
struct ModuleNode {
  std::string fqn;
  std::string type;
  int parent = -1;
  int depth = 0;
  std::vector<int> children;
  std::vector<ParamInfo> params;
};

// An open-addressing index from 64-bit hashes to ids (linear probing, power-of-two capacity,
// at most half full); the caller tells entries of equal hash apart.
class HashIndex {
 public:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  // The id of the first entry with hash h that `same(id)` accepts, or kNone.
  template <class Same>
  std::uint32_t find(std::uint64_t h, Same&& same) const {
    if (slots_.empty()) return kNone;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = std::size_t(h) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.id == kNone) return kNone;
      if (s.hash == h && same(s.id)) return s.id;
    }
  }
  void insert(std::uint64_t h, std::uint32_t id);
  std::size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t id = kNone;
  };
  std::vector<Slot> slots_;
  std::size_t count_ = 0;
};

// The tables records point into. Interning returns the id of an equal entry when there is one.
class TracePools {
 public:
  TracePools();
  TracePools(const TracePools& o);
  TracePools& operator=(const TracePools& o);
  TracePools(TracePools&&) = default;
  TracePools& operator=(TracePools&&) = default;

  StrId intern(std::string_view s);
  ShapeId intern_shape(std::span<const std::int64_t> dims);
  PlacementsId intern_placements(std::span<const Placement> p);  // empty → 0
  MeshId intern_mesh(const MeshInfo& m);

  std::string_view str(StrId id) const { return strings_[id]; }
  std::span<const std::int64_t> shape(ShapeId id) const {
    const Span s = shapes_[id];
    return {dims_.data() + s.offset, s.size};
  }
  std::span<const Placement> placements(PlacementsId id) const {
    const Span s = placement_lists_[id];
    return {placement_items_.data() + s.offset, s.size};
  }
  const MeshInfo& mesh(MeshId id) const { return meshes_[id]; }
  std::size_t mesh_count() const { return meshes_.size(); }
  std::size_t string_count() const { return strings_.size(); }
  std::size_t shape_count() const { return shapes_.size(); }
  std::size_t placements_count() const { return placement_lists_.size(); }
  std::size_t bytes() const;  // memory held by the tables (approximate)

 private:
  struct Span {
    std::uint32_t offset = 0, size = 0;
  };
  std::deque<std::string> strings_;                         // a deque: its elements never move
  std::unordered_map<std::string_view, StrId> string_ids_;  // views of strings_' elements
  std::vector<std::int64_t> dims_;
  std::vector<Span> shapes_;
  HashIndex shape_ids_;
  std::vector<Placement> placement_items_;
  std::vector<Span> placement_lists_;
  HashIndex placement_ids_;
  std::vector<MeshInfo> meshes_;
};

// A module's own memory on this rank, in bytes (not rolled up): its parameters as stored between
// steps (FSDP: the local chunks), their gradients, the optimizer's state for them, and what its
// forward left allocated for backward (the activations saved for backward, at their peak: when
// backward begins).
struct ModuleMemory {
  std::uint64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  bool operator==(const ModuleMemory&) const = default;
};

struct Trace {
  int rank = 0;
  std::vector<ModuleNode> modules{ModuleNode{"Global", "", -1, 0, {}, {}}};
  std::vector<Record> records;
  std::vector<TensorArg> args;
  std::vector<Block> blocks;  // cover records in order; empty means one block of them all
  TracePools pools;
  std::map<std::string, std::string> metadata;  // model, plan, world size, mesh, device, ...
  // Per module (index as modules), from the last traced iteration; empty when not measured.
  std::vector<ModuleMemory> memory;
  // The most bytes the iteration's own allocations held at once (activations, temporaries,
  // gradients); the rank's peak is this plus the parameters and the optimizer state.
  std::uint64_t memory_peak = 0;

  int find_module(const std::string& fqn) const;  // -1 when absent
  // True when `module` is `ancestor` or lies below it.
  bool is_within(int module, int ancestor) const;

  std::string_view str(StrId id) const { return pools.str(id); }
  std::span<const std::int64_t> shape(ShapeId id) const { return pools.shape(id); }
  std::span<const Placement> placements(PlacementsId id) const { return pools.placements(id); }
  std::span<const TensorArg> inputs(const Record& r) const {
    return {args.data() + r.inputs_begin, r.n_inputs};
  }
  std::span<const TensorArg> outputs(const Record& r) const {
    return {args.data() + r.outputs_begin, r.n_outputs};
  }
  std::string_view name(const Record& r) const { return str(r.name); }

  // The blocks, or one block of every record when none were marked.
  std::vector<Block> block_list() const;
  // Calls f(record, repeat): every stored record with the repeat count of its block.
  template <class F>
  void for_each_record(F&& f) const {
    for (const Block& b : block_list()) {
      for (std::uint32_t i = b.first; i < b.first + b.count; ++i) f(records[i], b.repeat);
    }
  }
  // Calls f(record, seq) over the expanded sequence: each block `repeat` times in order, seq the
  // collective's sequence number in that repeat.
  template <class F>
  void for_each_event(F&& f) const {
    for (const Block& b : block_list()) {
      for (std::uint64_t k = 0; k < b.repeat; ++k) {
        for (std::uint32_t i = b.first; i < b.first + b.count; ++i) {
          const Record& r = records[i];
          f(r, r.collective.seq + k * r.collective.seq_stride);
        }
      }
    }
  }
  // Records counted with their repeats.
  std::uint64_t event_count() const;
};

// Two records that describe the same event (all but index, time and sequence numbers equal).
bool same_event(const Trace& t, const Record& a, const Record& b);

}  // namespace commtrace
