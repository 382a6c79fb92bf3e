// Neural-network ops: softmax, layer_norm, rms_norm and embedding, each forward returning what
// its backward saves as extra outputs (statistics) so the DTensor layer lays them out beside the
// main result.
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

}  // namespace

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

}  // namespace commtrace
