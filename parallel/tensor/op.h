// The op table and its one dispatcher. Every op of the runtime is one static OpDef: its aten
// name and overload, its kind, its output count, a shape function, a sharding rule and a kernel
// launch. dispatch() runs an op on plain tensors (recording it when a tracer is current) or hands
// it to the one extension point for tensors that carry a distribution (DistHooks, installed by
// the DTensor layer), which reads the same rule and shape function. The op layer knows nothing
// of DTensor beyond that hook. Each function of a def runs once per call.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include <vector>

#include "parallel/tensor/tensor.h"
#include "tracer/trace.h"
#include "tracer/tracer.h"

namespace commtrace {

inline constexpr int kMaxOpOutputs = 3;
// The inputs a sharding rule handles; an op on more DTensors (a long cat) is refused.
inline constexpr int kMaxRuleInputs = 8;
inline constexpr int kMaxStrategies = 6;

// The scalars of one call: dims, flags, eps, p, seed, and a target shape borrowed for the call.
// Plain data, so a call allocates nothing for its arguments.
struct OpAttrs {
  std::int64_t i[4] = {};
  double f[2] = {};
  std::uint64_t u = 0;
  const Shape* shape = nullptr;
  const void* args = nullptr;  // an op-specific argument struct, borrowed for the call
  // Bit k set: input k is recorded with its last two dims swapped (a GEMM records op(b) = bᵀ,
  // with its shape and placements, as PyTorch records the transposed operand).
  std::uint32_t transposed = 0;
};

// One output: its shape (global on the DTensor path) and dtype; an absent output (an optional
// gradient nobody needs) stays undefined.
struct OutSpec {
  Shape shape;
  DType dtype = DType::F32;
  bool present = true;
};

// What a sharding rule sees on one mesh dim: the inputs (DTensors by their global shapes; plain
// and undefined ones count as Replicate) and each input's placement there.
struct RuleArgs {
  std::span<const Tensor> inputs;
  std::span<const Placement> current;
  int mesh_dim_size = 1;
  const OpAttrs& attrs;
};

// One candidate on one mesh dim: the placement every input must have, and every output gets.
struct DimStrategy {
  std::array<Placement, kMaxRuleInputs> inputs{};
  std::array<Placement, kMaxOpOutputs> outputs{};
};

// Candidates in preference order: the first of equal redistribute cost wins.
class Strategies {
 public:
  Strategies() {}      // NOLINT: the slots stay unconstructed until add()
  DimStrategy& add();  // a new candidate: every placement Replicate
  DimStrategy& operator[](int i) { return items_[i]; }
  const DimStrategy& operator[](int i) const { return items_[i]; }
  int size() const { return size_; }

 private:
  union {
    DimStrategy items_[kMaxStrategies];  // [0, size_) constructed; trivially destructible
  };
  int size_ = 0;
};

// The shard a local run computes, for the run functions that need it (the masked lookup of a
// row-sharded embedding): per mesh dim, its size, this rank's coordinate and output 0's placement.
struct ShardInfo {
  std::span<const int> sizes, coords;
  std::span<const Placement> outputs;
};

struct OpDef {
  const char* name;      // PyTorch's aten name: "addmm"
  const char* overload;  // "default", "Tensor", "dim_IntList"
  EventKind kind;
  int n_outputs = 1;
  // shapes and rule are pure functions of the inputs' shapes, dtypes and placements and of the
  // attrs' i, shape and transposed (never f, u or args: per-call values such as a scale, a seed
  // or an optimizer's step): the DTensor layer caches their results by those.
  // out[0 .. n_outputs): shapes and dtypes for these inputs (global ones on the DTensor path).
  void (*shapes)(std::span<const Tensor> in, const OpAttrs& a, OutSpec* out);
  // Candidates on one mesh dim; null: every input Replicate, every output Replicate.
  void (*rule)(const RuleArgs& r, Strategies& s);
  // Fills the outputs (allocated by the dispatcher on input 0's device) from the inputs. dist is
  // null on plain tensors.
  void (*run)(std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out,
              const ShardInfo* dist);
  // Views share input 0's storage (no run); in-place ops return input 0 updated by run.
  enum class Result { Fresh, View, InPlace };
  Result result = Result::Fresh;
};

using OpOutputs = std::array<Tensor, kMaxOpOutputs>;

// Sees every dispatch() on its thread while in scope (activation checkpointing: which ops a
// region ran, and where its recomputation stops). before() may throw to stop the caller.
class DispatchObserver {
 public:
  virtual ~DispatchObserver() = default;
  virtual void before(const OpDef& op) = 0;
  virtual void after(const OpOutputs& out) = 0;
};
class DispatchObserverScope {
 public:
  explicit DispatchObserverScope(DispatchObserver& o);
  ~DispatchObserverScope();
  DispatchObserverScope(const DispatchObserverScope&) = delete;
  DispatchObserverScope& operator=(const DispatchObserverScope&) = delete;

 private:
  DispatchObserver* previous_;
};

// The one dispatcher. Undefined inputs are skipped by the record; inputs must share a device.
OpOutputs dispatch(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a = {});
inline Tensor dispatch1(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a = {}) {
  return dispatch(op, in, a)[0];
}

// Runs op on local (plain) tensors with outputs of the given specs: the plain path of
// dispatch(), and the DTensor path's step on the local shards. Records the local op.
// The specs' shapes are moved into the outputs.
OpOutputs run_local(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a, OutSpec* specs,
                    const ShardInfo* dist);

// Describes an op's defined inputs to a tracer's sink in order, as `view(tensor)` shows each;
// input k with bit k of `transposed` set (OpAttrs::transposed) is shown with its last two dims
// swapped in its shapes and shard placements (PyTorch records op(b) = bᵀ).
template <class Sink, class View>
void describe_inputs(Sink& sink, std::span<const Tensor> in, std::uint32_t transposed,
                     View&& view) {
  for (std::size_t k = 0; k < in.size(); ++k) {
    const Tensor& t = in[k];
    if (!t.defined()) continue;
    const ArgView v = view(t);
    if (k < 32 && ((transposed >> k) & 1u)) {
      sink.input(ArgView{v.shape, v.global, v.placements, nullptr, nullptr, true});
    } else {
      sink.input(v);
    }
  }
}

// The extension point for tensors that carry a distribution (TensorImpl::dist). The op layer
// never looks inside one: it calls these.
struct DistHooks {
  OpOutputs (*dispatch)(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a);
  // True when nothing but this handle holds the tensor's local data (autograd may take it).
  bool (*local_unique)(const Tensor& t);
};
void install_dist_hooks(const DistHooks& hooks);
const DistHooks& dist_hooks();  // REQUIRES: installed (Internal otherwise)

// Dim d of a rank-`rank` tensor, negative counting from the end; InvalidArgument naming op.
int normalize_dim(int dim, int rank, const char* op);
// NumPy broadcasting of two shapes; ShapeMismatch naming op otherwise.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace commtrace
