// Attention ops: scaled-dot-product attention (its probabilities an extra output, saved for
// backward) and the blockwise attention of ring attention on plain tensors (block, merge of two
// partial results by their log-sum-exp, backward).
#include <cmath>

#include "parallel/tensor/ops_internal.h"

namespace commtrace {

using namespace ops;

namespace {

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

}  // namespace

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

}  // namespace commtrace
