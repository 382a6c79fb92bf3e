// Neural-network ops: softmax, layer_norm, embedding, scaled-dot-product attention and
// cross-entropy, each forward returning what its backward saves as extra outputs (statistics,
// probabilities) so the DTensor layer lays them out beside the main result.
#include <cmath>

#include "parallel/tensor/ops_internal.h"

namespace commtrace {

using namespace ops;

namespace {

// ---- softmax over the last dim: forward (x), backward (grad, y) ----

const OpDef kSoftmax{
    "_softmax",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::last_dim_whole,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).softmax_forward(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(), rows,
                                         cols);
    }};
const OpDef kSoftmaxBackward{
    "_softmax_backward_data",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::last_dim_whole,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).softmax_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                          out[0].data_ptr(), rows, cols);
    }};

// ---- layer_norm: (x, weight?, bias?) -> (out, mean, rstd) with the statistics (x.shape[:-1])
// in acc_dtype; attrs f[0] eps. Backward: (grad, x, weight?, mean, rstd) -> (gx, gw?, gb?);
// attrs i[0] whether there is a bias. Affine gradients of a sharded input are partial sums.

void layer_norm_rule(const RuleArgs& r, Strategies& s) { rules::last_dim_whole(r, s); }

void layer_norm_backward_rule(const RuleArgs& r, Strategies& s) {
  static constexpr int kLast[] = {-1};
  rules::follow(r, kLast, false, /*prefix=*/true, s);
  DimStrategy& d = s[0];
  const Placement p = d.outputs[0];
  d.outputs[1] = d.outputs[2] = p.is_shard() ? Placement::partial() : p;
}

const OpDef kLayerNorm{
    "native_layer_norm",
    "default",
    EventKind::Compute,
    3,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      const Shape& s = in[0].shape();
      const Shape stat(s.begin(), s.end() - 1);
      out[0] = OutSpec{s, in[0].dtype()};
      out[1] = out[2] = OutSpec{stat, acc_dtype(in[0].dtype())};
    },
    layer_norm_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).layernorm_forward(
          out[0].dtype(), in[0].data_ptr(), data_or_null(in[1]), data_or_null(in[2]),
          out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr(), rows, cols, a.f[0]);
    }};

const OpDef kLayerNormBackward{
    "native_layer_norm_backward",
    "default",
    EventKind::Compute,
    3,
    [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
      const Shape cols{last_dim(in[0].shape())};
      out[0] = OutSpec{in[0].shape(), in[0].dtype()};
      out[1] = OutSpec{cols, in[0].dtype(), in[2].defined()};
      out[2] = OutSpec{cols, in[0].dtype(), a.i[0] != 0};
    },
    layer_norm_backward_rule,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).layernorm_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                            data_or_null(in[2]), in[3].data_ptr(), in[4].data_ptr(),
                                            out[0].data_ptr(), data_or_null(out[1]),
                                            data_or_null(out[2]), rows, cols);
    }};

// ---- rms_norm: (x, weight?) -> (out, rstd) with rstd (x.shape[:-1]) in acc_dtype; attrs f[0]
// eps. Backward: (grad, x, weight?, rstd) -> (gx, gw?). Sharded like layer_norm.

const OpDef kRmsNorm{
    "_fused_rms_norm",
    "default",
    EventKind::Compute,
    2,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      const Shape& s = in[0].shape();
      out[0] = OutSpec{s, in[0].dtype()};
      out[1] = OutSpec{Shape(s.begin(), s.end() - 1), acc_dtype(in[0].dtype())};
    },
    layer_norm_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).rmsnorm_forward(out[0].dtype(), in[0].data_ptr(), data_or_null(in[1]),
                                         out[0].data_ptr(), out[1].data_ptr(), rows, cols, a.f[0]);
    }};

const OpDef kRmsNormBackward{
    "_fused_rms_norm_backward",
    "default",
    EventKind::Compute,
    2,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{in[0].shape(), in[0].dtype()};
      out[1] = OutSpec{Shape{last_dim(in[0].shape())}, in[0].dtype(), in[2].defined()};
    },
    layer_norm_backward_rule,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const auto [rows, cols] = rows_cols(in[0].shape());
      kernels_of(out[0]).rmsnorm_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                          data_or_null(in[2]), in[3].data_ptr(), out[0].data_ptr(),
                                          data_or_null(out[1]), rows, cols);
    }};

// ---- embedding: (weight, idx) -> idx.shape + (dim); attrs i[0] the full table's rows ----

// A row-sharded (vocab) table gives a Partial masked lookup; a column-sharded one shards the
// output's last dim; a replicated one follows the indices.
void embedding_rule(const RuleArgs& r, Strategies& s) {
  const Placement w = r.current[0], idx = r.current[1];
  const Placement R = Placement::replicate();
  DimStrategy& d = s.add();
  if (w.is_shard(0)) {
    d.inputs = {w, R};
    d.outputs[0] = Placement::partial();
  } else if (w.is_shard(1)) {
    d.inputs = {w, R};
    d.outputs[0] = Placement::shard(r.inputs[1].dim());
  } else if (idx.is_shard()) {
    d.inputs = {R, idx};
    d.outputs[0] = idx;
  }
}

const OpDef kEmbedding{
    "embedding",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      Shape s = in[1].shape();
      s.push_back(in[0].size(1));
      out[0] = OutSpec{s, in[0].dtype()};
    },
    embedding_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo* dist) {
      // A row-sharded table holds rows [begin, begin + rows) of the full one (Partial output).
      const i64 vocab = a.i[0];
      i64 begin = 0, rows = vocab;
      if (dist) {
        for (std::size_t d = 0; d < dist->sizes.size(); ++d) {
          if (!dist->outputs[d].is_partial()) continue;
          const ChunkRange c = chunk_range(rows, dist->sizes[d], dist->coords[d]);
          begin += c.begin;
          rows = c.size;
        }
      }
      kernels_of(out[0]).embedding_forward(out[0].dtype(), index_data(in[1]), in[1].numel(),
                                           in[0].data_ptr(), begin, rows, vocab, in[0].size(1),
                                           out[0].data_ptr());
    }};

// (grad, idx) -> (vocab, dim); attrs i[0] vocab. Indices sharded like the gradient's leading
// dims give partial sums.
void embedding_backward_rule(const RuleArgs& r, Strategies& s) {
  const Placement g = r.current[0], idx = r.current[1];
  if (g.is_shard() && g == idx && g.dim < r.inputs[1].dim()) {
    DimStrategy& d = s.add();
    d.inputs = {g, idx};
    d.outputs[0] = Placement::partial();
  }
  s.add();
}

const OpDef kEmbeddingBackward{
    "embedding_dense_backward",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
      out[0] = OutSpec{Shape{a.i[0], in[0].size(-1)}, in[0].dtype()};
    },
    embedding_backward_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).embedding_backward(out[0].dtype(), in[0].data_ptr(), index_data(in[1]),
                                            in[1].numel(), out[0].data_ptr(), 0, a.i[0],
                                            in[0].size(-1));
    }};

// ---- attention: (q, k, v) (B, H, T, D) -> (out, probs (B, H, T, T) in acc); attrs f[0] the
// scale, i[0] causal. Backward: (grad, q, k, v, probs) -> (gq, gk, gv). Batch and heads may be
// sharded; sequence and head dims must be whole.

void attention_rule(const RuleArgs& r, Strategies& s) {
  static constexpr int kWhole[] = {2, 3};
  rules::follow(r, kWhole, false, false, s);
}

const OpDef kAttention{
    "_scaled_dot_product_flash_attention_for_cpu",
    "default",
    EventKind::Compute,
    2,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      const Shape& s = in[0].shape();
      out[0] = OutSpec{s, in[0].dtype()};
      out[1] = OutSpec{Shape{s[0], s[1], s[2], s[2]}, acc_dtype(in[0].dtype())};
    },
    attention_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const Shape& s = in[0].shape();
      kernels_of(out[0]).attention_forward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                           in[2].data_ptr(), out[0].data_ptr(), out[1].data_ptr(),
                                           s[0] * s[1], s[2], s[3], a.f[0], a.i[0] != 0);
    }};

const OpDef kAttentionBackward{
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "default",
    EventKind::Compute,
    3,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = out[1] = out[2] = OutSpec{in[0].shape(), in[0].dtype()};
    },
    attention_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const Shape& s = in[0].shape();
      kernels_of(out[0]).attention_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                            in[2].data_ptr(), in[3].data_ptr(), in[4].data_ptr(),
                                            out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr(),
                                            s[0] * s[1], s[2], s[3], a.f[0]);
    }};

// ---- blockwise (ring) attention on plain tensors (B, H, T, D): attrs f[0] the scale, i[0]
// causal, i[1] q_pos, i[2] k_pos. Block: (q, k, v) -> (out, lse (B, H, Tq) acc); merge: (out,
// lse, out_b, lse_b) -> (out', lse'); backward: (grad, q, k, v, out, lse) -> (gq, gk, gv).

const OpDef kAttentionBlock{
    "_ring_attention_block",
    "default",
    EventKind::Compute,
    2,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      const Shape& s = in[0].shape();
      out[0] = OutSpec{s, in[0].dtype()};
      out[1] = OutSpec{Shape{s[0], s[1], s[2]}, acc_dtype(in[0].dtype())};
    },
    attention_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const Shape& q = in[0].shape();
      kernels_of(out[0]).attention_block_forward(
          out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(), in[2].data_ptr(), out[0].data_ptr(),
          out[1].data_ptr(), q[0] * q[1], q[2], in[1].size(2), q[3], a.f[0], a.i[0] != 0, a.i[1],
          a.i[2]);
    }};

const OpDef kAttentionMerge{
    "_ring_attention_merge",
    "default",
    EventKind::Compute,
    2,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{in[0].shape(), in[0].dtype()};
      out[1] = OutSpec{in[1].shape(), in[1].dtype()};
    },
    attention_rule,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      const Shape& s = in[0].shape();
      const Kernels& k = kernels_of(out[0]);
      k.copy(out[0].data_ptr(), in[0].data_ptr(),
             std::size_t(in[0].numel()) * dtype_size(in[0].dtype()));
      k.copy(out[1].data_ptr(), in[1].data_ptr(),
             std::size_t(in[1].numel()) * dtype_size(in[1].dtype()));
      k.attention_merge(out[0].dtype(), out[0].data_ptr(), out[1].data_ptr(), in[2].data_ptr(),
                        in[3].data_ptr(), s[0] * s[1] * s[2], s[3]);
    }};

const OpDef kAttentionBlockBackward{
    "_ring_attention_block_backward",
    "default",
    EventKind::Compute,
    3,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{in[1].shape(), in[1].dtype()};
      out[1] = out[2] = OutSpec{in[2].shape(), in[2].dtype()};
    },
    attention_rule,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const Shape& q = in[1].shape();
      kernels_of(out[0]).attention_block_backward(
          out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(), in[2].data_ptr(), in[3].data_ptr(),
          in[4].data_ptr(), in[5].data_ptr(), out[0].data_ptr(), out[1].data_ptr(),
          out[2].data_ptr(), q[0] * q[1], q[2], in[2].size(2), q[3], a.f[0], a.i[0] != 0, a.i[1],
          a.i[2]);
    }};

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

Tensor softmax(const Tensor& x) {
  const Tensor in[] = {x};
  Tensor out = dispatch1(kSoftmax, in);
  attach_grad(out, "SoftmaxBackward", in, [y = out.detach()](const Tensor& g) {
    const Tensor gin[] = {g, y};
    return std::vector<Tensor>{dispatch1(kSoftmaxBackward, gin)};
  });
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  COMMTRACE_CHECK(x.dim() >= 1, ErrorCode::ShapeMismatch, "layer_norm: input {} is 0-d",
                  describe(x));
  const i64 cols = last_dim(x.shape());
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    COMMTRACE_CHECK(p->shape() == Shape{cols}, ErrorCode::ShapeMismatch,
                    "layer_norm: affine parameter {} does not match normalized size {} of {}",
                    describe(*p), cols, describe(x));
    check_same_dtype(x, *p, "layer_norm");
  }
  OpAttrs a;
  a.f[0] = eps;
  const Tensor in[] = {x, weight, bias};
  const OpOutputs r = dispatch(kLayerNorm, in, a);
  Tensor out = r[0];
  attach_grad(out, "NativeLayerNormBackward", in,
              [x, weight, has_bias = bias.defined(), mean = r[1], rstd = r[2]](const Tensor& g) {
                OpAttrs b;
                b.i[0] = has_bias;
                const Tensor gin[] = {g, x, weight, mean, rstd};
                const OpOutputs grads = dispatch(kLayerNormBackward, gin, b);
                return std::vector<Tensor>{grads[0], grads[1], grads[2]};
              });
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  COMMTRACE_CHECK(x.dim() >= 1, ErrorCode::ShapeMismatch, "rms_norm: input {} is 0-d", describe(x));
  if (weight.defined()) {
    COMMTRACE_CHECK(weight.shape() == Shape{last_dim(x.shape())}, ErrorCode::ShapeMismatch,
                    "rms_norm: weight {} does not match normalized size {} of {}", describe(weight),
                    last_dim(x.shape()), describe(x));
    check_same_dtype(x, weight, "rms_norm");
  }
  OpAttrs a;
  a.f[0] = eps;
  const Tensor in[] = {x, weight};
  const OpOutputs r = dispatch(kRmsNorm, in, a);
  Tensor out = r[0];
  attach_grad(out, "FusedRmsNormBackward", in, [x, weight, rstd = r[1]](const Tensor& g) {
    const Tensor gin[] = {g, x, weight, rstd};
    const OpOutputs grads = dispatch(kRmsNormBackward, gin);
    return std::vector<Tensor>{grads[0], grads[1]};
  });
  return out;
}

Tensor embedding(const Tensor& idx, const Tensor& weight) {
  COMMTRACE_CHECK(idx.dtype() == DType::I64, ErrorCode::InvalidArgument,
                  "embedding: indices must be i64, got {}", describe(idx));
  COMMTRACE_CHECK(weight.dim() == 2, ErrorCode::ShapeMismatch, "embedding: weight {} is not 2-d",
                  describe(weight));
  OpAttrs a;
  a.i[0] = weight.size(0);
  const Tensor in[] = {weight, idx};
  Tensor out = dispatch1(kEmbedding, in, a);
  const Tensor grad_of[] = {weight};
  attach_grad(out, "EmbeddingBackward", grad_of, [idx, a](const Tensor& g) {
    const Tensor gin[] = {g, idx};
    return std::vector<Tensor>{dispatch1(kEmbeddingBackward, gin, a)};
  });
  return out;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal) {
  COMMTRACE_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(),
                  ErrorCode::ShapeMismatch,
                  "scaled_dot_product_attention: q, k, v must share one (B, H, T, D) shape, got "
                  "{}, {}, {}",
                  describe(q), describe(k), describe(v));
  check_same_dtype(q, k, "scaled_dot_product_attention");
  check_same_dtype(q, v, "scaled_dot_product_attention");
  OpAttrs a;
  a.f[0] = 1.0 / std::sqrt(double(q.size(3)));
  a.i[0] = causal;
  const Tensor in[] = {q, k, v};
  const OpOutputs r = dispatch(kAttention, in, a);
  Tensor out = r[0];
  attach_grad(out, "ScaledDotProductAttentionBackward", in,
              [q, k, v, probs = r[1], a](const Tensor& g) {
                const Tensor gin[] = {g, q, k, v, probs};
                const OpOutputs grads = dispatch(kAttentionBackward, gin, a);
                return std::vector<Tensor>{grads[0], grads[1], grads[2]};
              });
  return out;
}

namespace {

OpAttrs block_attrs(const Tensor& q, bool causal, std::int64_t q_pos, std::int64_t k_pos) {
  OpAttrs a;
  a.f[0] = 1.0 / std::sqrt(double(q.size(3)));
  a.i[0] = causal;
  a.i[1] = q_pos;
  a.i[2] = k_pos;
  return a;
}

void check_block(const Tensor& q, const Tensor& k, const Tensor& v, const char* what) {
  COMMTRACE_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() &&
                      k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
                  ErrorCode::ShapeMismatch,
                  "{}: q (B, H, Tq, D) and k, v (B, H, Tk, D) expected, got {}, {}, {}", what,
                  describe(q), describe(k), describe(v));
  check_same_dtype(q, k, what);
  check_same_dtype(q, v, what);
}

}  // namespace

std::pair<Tensor, Tensor> attention_block(const Tensor& q, const Tensor& k, const Tensor& v,
                                          bool causal, std::int64_t q_pos, std::int64_t k_pos) {
  check_block(q, k, v, "attention_block");
  const Tensor in[] = {q, k, v};
  const OpOutputs r = dispatch(kAttentionBlock, in, block_attrs(q, causal, q_pos, k_pos));
  return {r[0], r[1]};
}

std::pair<Tensor, Tensor> attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                                          const Tensor& lse_b) {
  COMMTRACE_CHECK(out.dim() == 4 && out_b.shape() == out.shape() && lse_b.shape() == lse.shape() &&
                      lse.dim() == 3 && lse.size(2) == out.size(2),
                  ErrorCode::ShapeMismatch,
                  "attention_merge: out (B, H, T, D) and lse (B, H, T) twice expected, got {}, {}, "
                  "{}, {}",
                  describe(out), describe(lse), describe(out_b), describe(lse_b));
  const Tensor in[] = {out, lse, out_b, lse_b};
  const OpOutputs r = dispatch(kAttentionMerge, in);
  return {r[0], r[1]};
}

std::array<Tensor, 3> attention_block_backward(const Tensor& grad_out, const Tensor& q,
                                               const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& lse, bool causal, std::int64_t q_pos,
                                               std::int64_t k_pos) {
  check_block(q, k, v, "attention_block_backward");
  const Tensor in[] = {grad_out, q, k, v, out, lse};
  const OpOutputs r = dispatch(kAttentionBlockBackward, in, block_attrs(q, causal, q_pos, k_pos));
  return {r[0], r[1], r[2]};
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
