// Sharding propagation: the DTensor path of the dispatcher. A rule lists candidate strategies
// (the placements every input must have and the output gets) for the inputs' global shapes and
// current placements; the dispatcher picks the one with the lowest redistribute cost (PyTorch's
// cost model; the first on ties), redistributes the inputs (traced collectives, outside
// autograd), runs the op on the local shards, and wraps the result. Rules are per mesh dim and
// expanded over the mesh (the Cartesian product), as DTensor's single-dim strategies are.
#pragma once

#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "parallel/dtensor.h"
#include "parallel/ops.h"
#include "tracer/tracer.h"

namespace commtrace {

// One candidate on ONE mesh dim. inputs[i] is ignored for inputs that are not DTensors.
struct DimStrategy {
  std::vector<Placement> inputs;
  Placement output;
};

// Candidates on mesh dim `mesh_dim` given each input's placement there (inputs that are not
// DTensors or are undefined get Replicate). Order matters: the first of equal cost wins.
using DimRule = std::function<std::vector<DimStrategy>(const std::vector<Tensor>& inputs,
                                                       const std::vector<Placement>& current,
                                                       const DeviceMesh& mesh, int mesh_dim)>;

struct ShardingRule {
  DimRule rule;
  // Runs on the local shards instead of the op's compute (e.g. a view to a local shape, a
  // masked embedding lookup); gets the chosen output placements.
  std::function<Tensor(const std::vector<Tensor>& locals, const Placements& out,
                       const DeviceMesh& mesh)>
      local_compute;
};

namespace detail {
// The DTensor path of dispatch(): REQUIRES some input is a DTensor.
Tensor dispatch_dtensor(const OpDef& op, const std::vector<Tensor>& inputs, const Compute& compute,
                        const Transposed& transposed, const ShardingRule* rule);
}  // namespace detail

// ---- rules of the op layer ----

// Elementwise with broadcasting: follows the input with the most shards; a Partial input stays
// Partial only for linear ops (else becomes Replicate).
ShardingRule pointwise_rule(bool linear);
// out = [bias +] op(a) @ op(b) for 2-d (mm/addmm) or 3-d (bmm) operands, transposes as flagged.
ShardingRule matmul_rule(int rank, bool trans_a, bool trans_b, bool has_bias);
// Keeps the first input's placements except on `dims` (made Replicate, Partial too unless
// linear); inputs of the same rank follow it, inputs of lower rank follow on their leading dims
// when `prefix` (e.g. layer_norm's mean) and are Replicate otherwise (parameters).
ShardingRule follow_rule(std::vector<int> replicate_dims, bool linear, bool prefix = false);
// Placements move with swapped dims d0, d1.
ShardingRule transpose_rule(int d0, int d1);
// Reduction of dims (sorted, of the input) with or without keepdim: sharded reduced dims make
// the output Partial(sum); other shards shift to their output dim.
ShardingRule reduce_rule(std::vector<int> dims, bool keepdim);
// Broadcast of the input to a larger shape: shards shift right by the added leading dims;
// broadcast (size-1) dims must be Replicate.
ShardingRule expand_rule(int added_dims);
// Everything Replicate (the safe default).
ShardingRule replicate_rule();

// The tracer's view of an op's defined inputs: local and global shape and placements, with the
// last two dims swapped where `transposed` says (a GEMM records op(b) = bᵀ, its shape and its
// placements, as PyTorch records the transposed operand). Views point into the tensors, which
// must outlive it; only transposed operands are copied.
class RecordedArgs {
 public:
  RecordedArgs(const std::vector<Tensor>& inputs, const detail::Transposed& transposed);
  std::span<const ArgView> views() const { return views_; }
  DType first_dtype() const { return first_dtype_; }  // of the first defined input; f32 if none

 private:
  struct Swapped {
    Shape shape, global;
    Placements placements;
  };
  std::vector<ArgView> views_;
  std::deque<Swapped> swapped_;  // a deque: views point into its elements
  DType first_dtype_ = DType::F32;
};

// The tracer's view of a result.
ArgView result_view(const Tensor& local, const Shape& global, const Placements& placements);

// Wraps an auxiliary local result of an op (a saved mean, a dropout mask) as a DTensor beside
// the op's DTensor output; a plain `like` leaves it plain.
Tensor wrap_like(const Tensor& aux_local, const Tensor& like, const Shape& global,
                 Placements placements);

}  // namespace commtrace
