// Cross-entropy ops: PyTorch's decomposition (log_softmax, nll_loss and their backwards) and the
// vocab-parallel one over a class shard (max, statistics, loss, backward).
#include "parallel/tensor/ops_internal.h"

namespace commtrace {

using namespace ops;

namespace {

// ---- cross-entropy as PyTorch decomposes it: _log_softmax (x) over the last dim, its backward
// (grad, out); nll_loss_forward (logp, targets) -> a scalar, its backward (grad, logp, targets).
// The log-probabilities are saved for backward, so a class-sharded input is gathered once. ----

const OpDef kLogSoftmax{
    "_log_softmax",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::last_dim_whole,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).log_softmax_forward(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(),
                                             rows, cols);
    }};

const OpDef kLogSoftmaxBackward{
    "_log_softmax_backward_data",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::last_dim_whole,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).log_softmax_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                              out[0].data_ptr(), rows, cols);
    }};

const OpDef kNllLoss{
    "nll_loss_forward",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{Shape{}, in[0].dtype()};
    },
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).nll_loss_forward(out[0].dtype(), in[0].data_ptr(), index_data(in[1]), rows,
                                          cols, out[0].data_ptr());
    }};

const OpDef kNllLossBackward{
    "nll_loss_backward",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{in[1].shape(), in[1].dtype()};
    },
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[1].shape());
      kernels_of(out[0]).nll_loss_backward(out[0].dtype(), in[0].data_ptr(), index_data(in[2]),
                                           out[0].data_ptr(), rows, cols);
    }};

// ---- cross-entropy over a class shard: (logits) -> max; (logits, targets, max) -> (sumexp,
// picked), attrs i[0] col_begin, i[1] vocab; (max, sumexp, picked) -> loss, attrs i[0] its
// dtype; (grad, logits, targets, max, sumexp) -> grad logits, attrs i[0] col_begin ----

Shape rows_of(const Tensor& logits) {
  const Shape& s = logits.shape();
  return Shape(s.begin(), s.end() - 1);
}

const OpDef kCeShardMax{
    "amax",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{rows_of(in[0]), acc_dtype(in[0].dtype())};
    },
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).ce_shard_max(in[0].dtype(), in[0].data_ptr(), rows, cols,
                                      out[0].data_ptr());
    }};

const OpDef kCeShardStats{
    "ce_shard_stats",
    "default",
    EventKind::Compute,
    2,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = out[1] = OutSpec{rows_of(in[0]), acc_dtype(in[0].dtype())};
    },
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).ce_shard_stats(in[0].dtype(), in[0].data_ptr(), index_data(in[1]),
                                        in[2].data_ptr(), rows, cols, a.i[0], a.i[1],
                                        out[0].data_ptr(), out[1].data_ptr());
    }};

const OpDef kCeShardLoss{
    "ce_shard_loss",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor>, const OpAttrs& a, OutSpec* out) {
      out[0] = OutSpec{Shape{}, DType(a.i[0])};
    },
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).ce_shard_loss(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                       in[2].data_ptr(), in[0].numel(), out[0].data_ptr());
    }};

const OpDef kCeShardBackward{
    "ce_shard_backward",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{in[1].shape(), in[1].dtype()};
    },
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[1].shape());
      kernels_of(out[0]).ce_shard_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                           index_data(in[2]), in[3].data_ptr(), in[4].data_ptr(),
                                           rows, cols, a.i[0], out[0].data_ptr());
    }};

}  // namespace

Tensor ce_shard_max(const Tensor& logits) {
  COMMTRACE_CHECK(logits.dim() >= 1, ErrorCode::ShapeMismatch, "ce_shard_max: logits {} are 0-d",
                  describe(logits));
  const Tensor in[] = {logits};
  return dispatch1(kCeShardMax, in);
}

std::pair<Tensor, Tensor> ce_shard_stats(const Tensor& logits, const Tensor& targets,
                                         const Tensor& max, i64 col_begin, i64 vocab) {
  COMMTRACE_CHECK(targets.dtype() == DType::I64 && targets.numel() == max.numel() &&
                      max.shape() == rows_of(logits),
                  ErrorCode::ShapeMismatch,
                  "ce_shard_stats: logits {} need i64 targets and a max of one entry per row, "
                  "got {} and {}",
                  describe(logits), describe(targets), describe(max));
  OpAttrs a;
  a.i[0] = col_begin;
  a.i[1] = vocab;
  const Tensor in[] = {logits, targets, max};
  const OpOutputs r = dispatch(kCeShardStats, in, a);
  return {r[0], r[1]};
}

Tensor ce_shard_loss(const Tensor& max, const Tensor& sumexp, const Tensor& picked, DType dtype) {
  COMMTRACE_CHECK(sumexp.shape() == max.shape() && picked.shape() == max.shape(),
                  ErrorCode::ShapeMismatch, "ce_shard_loss: statistics {}, {}, {} differ",
                  describe(max), describe(sumexp), describe(picked));
  OpAttrs a;
  a.i[0] = i64(dtype);
  const Tensor in[] = {max, sumexp, picked};
  return dispatch1(kCeShardLoss, in, a);
}

Tensor ce_shard_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                         const Tensor& max, const Tensor& sumexp, i64 col_begin) {
  COMMTRACE_CHECK(grad_loss.numel() == 1 && grad_loss.dtype() == logits.dtype(),
                  ErrorCode::ShapeMismatch,
                  "ce_shard_backward: grad_loss {} must be one element of the logits' dtype",
                  describe(grad_loss));
  OpAttrs a;
  a.i[0] = col_begin;
  const Tensor in[] = {grad_loss, logits, targets, max, sumexp};
  return dispatch1(kCeShardBackward, in, a);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  COMMTRACE_CHECK(targets.dtype() == DType::I64, ErrorCode::InvalidArgument,
                  "cross_entropy: targets must be i64, got {}", describe(targets));
  const i64 c = last_dim(logits.shape()), n = c ? logits.numel() / c : 0;
  COMMTRACE_CHECK(logits.dim() >= 2 && targets.numel() == n, ErrorCode::ShapeMismatch,
                  "cross_entropy: logits {} give {} rows, targets {} have {}", describe(logits), n,
                  describe(targets), targets.numel());
  const Tensor in[] = {logits};
  Tensor logp = dispatch1(kLogSoftmax, in);
  attach_grad(logp, "LogSoftmaxBackward", in, [out = logp.detach()](const Tensor& g) {
    const Tensor gin[] = {g, out};
    return std::vector<Tensor>{dispatch1(kLogSoftmaxBackward, gin)};
  });
  const Tensor nll_in[] = {logp, targets};
  Tensor loss = dispatch1(kNllLoss, nll_in);
  const Tensor grad_of[] = {logp};
  attach_grad(loss, "NllLossBackward", grad_of, [logp = logp.detach(), targets](const Tensor& g) {
    const Tensor gin[] = {g, logp, targets};
    return std::vector<Tensor>{dispatch1(kNllLossBackward, gin)};
  });
  return loss;
}

}  // namespace commtrace
