#include "parallel/dtensor/loss.h"

#include <tuple>

#include "parallel/tensor/autograd.h"
#include "parallel/tensor/ops.h"

namespace commtrace {

Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& targets) {
  COMMTRACE_CHECK(is_dtensor(logits) && logits.dim() >= 2, ErrorCode::InvalidArgument,
                  "loss parallel: logits must be a DTensor (..., classes), got {}",
                  describe(logits));
  const DistSpec& spec = dist_of(logits);
  const DeviceMesh& mesh = *spec.mesh;
  const int class_dim = logits.dim() - 1;
  int mesh_dim = -1;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const Placement p = spec.placements[std::size_t(d)];
    COMMTRACE_CHECK(p.is_replicate() || (p.is_shard(class_dim) && mesh_dim < 0),
                    ErrorCode::InvalidArgument,
                    "loss parallel: logits {} must be Shard({}) on one mesh dim and Replicate on "
                    "the others, got {} on mesh dim {}",
                    describe(logits), class_dim, p.str(), d);
    if (p.is_shard()) mesh_dim = d;
  }
  COMMTRACE_CHECK(mesh_dim >= 0, ErrorCode::InvalidArgument,
                  "loss parallel: logits {} are not sharded on their class dim {}",
                  describe(logits), class_dim);
  const std::int64_t vocab = logits.size(class_dim);
  const std::int64_t rows = logits.numel() / std::max<std::int64_t>(vocab, 1);
  COMMTRACE_CHECK(!is_dtensor(targets) && targets.dtype() == DType::I64 && targets.numel() == rows,
                  ErrorCode::InvalidArgument,
                  "loss parallel: targets must be a plain i64 tensor of {} rows, got {}", rows,
                  describe(targets));

  const Tensor local = spec.local;
  const std::int64_t col_begin =
      chunk_range(vocab, mesh.size(mesh_dim), mesh.coordinate(mesh_dim)).begin;
  const Tensor flat_targets = view(targets, {rows});
  Communicator& comm = mesh.comm(mesh_dim);
  static const Reason kMax("loss_parallel: max of each row over the class shards");
  static const Reason kSum("loss_parallel: sum of exp over the class shards");
  static const Reason kPick("loss_parallel: the target logit, from the shard that holds it");
  // Each statistic is reduced under its own reason; the placements are the logits'.
  auto reduce = [&](Tensor& t, ReduceOp op, const Reason& reason) {
    const CollectiveScope scope(CollectiveContext{reason, spec.placements, spec.placements,
                                                  &mesh.info(), mesh.uid(), logits.shape()});
    comm.all_reduce(t, op);
  };
  Tensor max, sumexp, picked, loss;
  {
    NoGradGuard no_grad;
    max = ce_shard_max(local);
    reduce(max, ReduceOp::Max, kMax);
    std::tie(sumexp, picked) = ce_shard_stats(local, flat_targets, max, col_begin, vocab);
    reduce(sumexp, ReduceOp::Sum, kSum);
    reduce(picked, ReduceOp::Sum, kPick);
    loss = ce_shard_loss(max, sumexp, picked, logits.dtype());
  }
  Tensor out = wrap_dtensor(loss, spec.mesh,
                            Placements(std::size_t(mesh.ndim()), Placement::replicate()), Shape{});
  attach_grad(out, "LossParallelCrossEntropyBackward", {logits},
              [local, flat_targets, max, sumexp, col_begin, mesh = spec.mesh,
               placements = spec.placements, global = logits.shape()](const Tensor& g) {
                const Tensor g_local = is_dtensor(g) ? dist_of(g).local : g;
                const Tensor grad =
                    ce_shard_backward(g_local, local, flat_targets, max, sumexp, col_begin);
                return std::vector<Tensor>{wrap_dtensor(grad, mesh, placements, global)};
              });
  return out;
}

}  // namespace commtrace
