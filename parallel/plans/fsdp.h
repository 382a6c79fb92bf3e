// FSDP2-style full sharding on one mesh dim (torch.distributed.fsdp.fully_shard), applied after
// the tensor-parallel plan, as torchtitan does for a dp × tp mesh.
//
// Units: every `layers.<i>` module of the root and the root itself, which owns the parameters no
// other unit owns (embeddings, final norm, output head). Each parameter's local tensor (the TP
// shard of a DTensor parameter, or the plain tensor) is chunked on its dim 0 over the dp group,
// padded to equal chunks (torch.chunk; FSDP2's _StridedShard when TP already sharded dim 0); the
// padded chunk is what the optimizer steps. Per iteration, per unit:
//   forward:  one all_gather of the unit's chunks before its forward;
//   backward: one all_gather before its backward when it was resharded after forward, issued by
//             the unit before it in backward order (FSDP2's backward prefetch: the root's
//             backward gathers the last block's parameters, and so on);
//             one reduce_scatter (average over dp) of its gradients once its backward is done
//             (the root's, and any unit whose input needs no gradient, in finish_backward()).
// A DTensor gradient is first redistributed to its parameter's placements (a Partial gradient
// of a SequenceParallel norm is all-reduced over tp there), as FSDP2 does.
// A resharded unit's parameter storage is overwritten with NaN on the CPU, so a computation that
// read it without the all_gather would show in verify.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/mesh.h"
#include "parallel/nn/nn.h"

namespace commtrace {

struct FsdpOptions {
  bool reshard_after_forward = true;  // free (and re-gather for backward) after forward
};

class FullyShard {
 public:
  // Shards the parameters of `root`'s units over mesh dim `dim` and installs the unit hooks.
  // REQUIRES: root parallelized already; every parameter of a unit has one dtype and dim >= 1.
  FullyShard(Module& root, std::shared_ptr<const DeviceMesh> mesh, int dim, FsdpOptions opts);
  FullyShard(const FullyShard&) = delete;
  FullyShard& operator=(const FullyShard&) = delete;

  // The padded chunks, one per parameter in root.named_parameters() order: the optimizer's.
  std::vector<Tensor> sharded_parameters() const;
  // After backward: reduce-scatters the units whose gradients are still unsharded (the root's;
  // FSDP2's final backward callback), in backward order, under each unit's module.
  void finish_backward();
  // The gradient of parameter `name` (root-relative) as its unsharded parameter holds it: every
  // dp chunk all-gathered (untraced use: verify), a DTensor like the parameter when it is one.
  // Undefined when no gradient reached it.
  Tensor unsharded_grad(const std::string& name) const;
  // Unit module names, root ("") last.
  std::vector<std::string> units() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace commtrace
