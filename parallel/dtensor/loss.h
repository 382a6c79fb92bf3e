// Loss parallel (PyTorch's torch.distributed.tensor.parallel.loss_parallel): the mean
// cross-entropy of logits sharded on their class dim, computed without gathering them.
#pragma once

#include "parallel/dtensor/dtensor.h"

namespace commtrace {

// logits: a DTensor (..., C) that is Shard(last dim) on one mesh dim and Replicate on the others;
// targets: a plain i64 tensor with one class per row (the same on every rank). Returns the mean
// loss as a Replicate scalar DTensor. Forward, as PyTorch: the rows' max all-reduced (Max), their
// sum of exponentials all-reduced (Sum), the target logits all-reduced (Sum, each held by one
// shard); backward: no collective (the gradient is computed on each shard from those
// statistics). InvalidArgument for any other layout, naming it.
Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& targets);

}  // namespace commtrace
