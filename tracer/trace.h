// The trace model as plain data: op records (collectives, GEMMs, other ops) and the module tree
// they belong to. No logic beyond small lookups; readers live in report/. Enum values are
// serialized, so they are explicit and never renumbered.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/base.h"

namespace commtrace {

enum class Phase : int { Forward = 0, Backward = 1, Optimizer = 2, Recompute = 3 };
enum class EventKind : int { Collective = 0, Gemm = 1, Compute = 2, Trivial = 3 };

const char* phase_name(Phase p);  // "forward", "backward", "optimizer", "recompute"
const char* event_kind_name(EventKind k);
Phase parse_phase(const std::string& s);
EventKind parse_event_kind(const std::string& s);
ReduceOp parse_reduce_op(const std::string& s);

// One tensor argument or result as the tracer sees it. For a plain tensor global_shape equals
// shape and placements is empty; for a DTensor shape is the local shard.
struct TensorMeta {
  Shape shape;
  Shape global_shape;
  std::string placements;  // e.g. "(Shard(dim=0),)"; empty for a plain tensor
};

// The collective-only fields of a record (DESIGN §1).
struct CollectiveInfo {
  std::uint64_t seq = 0;  // per communicator; equal on every rank for one collective
  std::string group;      // mesh dim name, e.g. "tp"
  int group_size = 0;
  int group_rank = 0;
  std::uint64_t bytes = 0;  // nccl-tests convention: total buffer for all_gather/reduce_scatter
  ReduceOp reduce_op = ReduceOp::None;
  std::string placements_before;
  std::string placements_after;
};

struct OpRecord {
  std::uint64_t index = 0;  // order of recording within one tracer
  EventKind kind = EventKind::Compute;
  std::string name;                  // "all_reduce", "addmm", "relu", "t", ...
  std::string overload = "default";  // PyTorch overload: "default", "dim_IntList", "Tensor"
  Phase phase = Phase::Forward;
  int module = 0;  // index into Trace::modules; 0 is Global
  DType dtype = DType::F32;
  std::vector<TensorMeta> inputs;
  std::vector<TensorMeta> outputs;
  bool sharded = false;       // an op on DTensor arguments (shown at noise >= 1)
  std::string mesh;           // the mesh of a sharded op or collective
  std::string reason;         // why it happened (redistribute, style, op)
  CollectiveInfo collective;  // meaningful when kind == Collective
  double time_s = 0.0;
};

struct ParamInfo {
  std::string name;        // local name: "weight"
  std::string placements;  // "(Shard(dim=0),)"; empty for a plain parameter
};

// Node 0 is always "Global" with parent -1. Children keep first-call order.
struct ModuleNode {
  std::string fqn;
  std::string type;
  int parent = -1;
  int depth = 0;
  std::vector<int> children;
  std::vector<ParamInfo> params;
};

struct Trace {
  int rank = 0;
  std::vector<ModuleNode> modules{ModuleNode{"Global", "", -1, 0, {}, {}}};
  std::vector<OpRecord> records;
  std::map<std::string, std::string> metadata;  // model, plan, world size, mesh, device, ...

  int find_module(const std::string& fqn) const;  // -1 when absent
  // True when `module` is `ancestor` or lies below it.
  bool is_within(int module, int ancestor) const;
};

}  // namespace commtrace
