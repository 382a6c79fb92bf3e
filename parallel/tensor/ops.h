// The op layer: every tensor op of the runtime, differentiable where it makes sense. Every op
// passes through one dispatcher (detail::dispatch) that records it into the current tracer and
// runs it on the inputs' device; every GEMM passes through gemm(). Shapes are checked here, where
// arguments enter, and errors name the op and the shapes. Ops never broadcast dtypes: both sides
// of a binary op share one dtype. Kernels run through kernels_for(device) (kernels/backend.h);
// bf16 is computed in f32 inside each kernel and stored back as bf16.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor/tensor.h"

namespace commtrace {

// ---- creation and copies ----
Tensor ones_like(const Tensor& x);
Tensor zeros_like(const Tensor& x);
Tensor clone(const Tensor& x);                  // differentiable copy
Tensor to_dtype(const Tensor& x, DType dtype);  // differentiable for floating dtypes

// ---- views and layout (recorded as trivial ops) ----
Tensor view(const Tensor& x, Shape shape);  // one dim may be -1; shares storage
Tensor t(const Tensor& x);                  // 2-d transpose (a copy: storage is contiguous)
Tensor transpose(const Tensor& x, int d0, int d1);
Tensor narrow(const Tensor& x, int dim, std::int64_t start, std::int64_t len);
Tensor cat(const std::vector<Tensor>& xs, int dim);
Tensor expand(const Tensor& x, const Shape& shape);  // broadcast copy
Tensor sum_to(const Tensor& x, const Shape& shape);  // the reverse of expand

// ---- GEMM: the one entry every matrix product passes (DESIGN §1) ----
// out = [bias +] op(a) @ op(b). a, b are 2-d (recorded as mm, or addmm with a bias) or 3-d with
// equal batch (recorded as bmm). op(x) transposes the last two dims when the flag is set. The
// bias broadcasts over rows. Not differentiable: the wrappers below attach the backward.
Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& bias = Tensor(), bool trans_a = false,
            bool trans_b = false);
// PyTorch's torch.backends.cuda.matmul.allow_tf32: f32 GEMMs on CUDA may round their inputs to
// TF32 (10-bit mantissa) on the tensor cores. Process-wide, off by default; the CPU ignores it.
void set_allow_tf32(bool allow);
bool allow_tf32();
Tensor mm(const Tensor& a, const Tensor& b);                         // (m,k) @ (k,n)
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b);  // bias + a @ b
Tensor bmm(const Tensor& a, const Tensor& b);                        // (B,m,k) @ (B,k,n)
// y = x @ wᵀ + b; x is (..., in), w is (out, in), b is (out) or undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);

// ---- elementwise (NumPy broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, double s);
Tensor add(const Tensor& a, double s);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);                                   // exact erf form
Tensor silu(const Tensor& x);                                   // x * sigmoid(x)
Tensor dropout(const Tensor& x, double p, std::uint64_t seed);  // p = 0: returns x unchanged

// ---- normalization, attention, embedding, losses ----
Tensor softmax(const Tensor& x);  // over the last dim
// Over the last dim; weight and bias are (last dim) or undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// x / sqrt(mean(x^2) + eps) * weight over the last dim; weight is (last dim) or undefined.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// Row lookup: idx is i64 of any shape, weight (vocab, dim); out is idx.shape + (dim).
Tensor embedding(const Tensor& idx, const Tensor& weight);
// q, k, v (B, H, T, D) -> (B, H, T, D); softmax(q kᵀ / sqrt(D)) v, causal when asked.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);
// Blockwise attention (ring attention's steps; not differentiable): q (B, H, Tq, D), k, v
// (B, H, Tk, D); query i at global position q_pos + i, key j at k_pos + j (causal: seen when
// k_pos + j <= q_pos + i), scale 1/sqrt(D). Returns the block's (out, lse (B, H, Tq) in acc
// dtype; -inf where a row sees no key); merge folds a block into running (out, lse); backward
// gives one block's (grad q, grad k, grad v) from the rows' final out and lse.
std::pair<Tensor, Tensor> attention_block(const Tensor& q, const Tensor& k, const Tensor& v,
                                          bool causal, std::int64_t q_pos, std::int64_t k_pos);
std::pair<Tensor, Tensor> attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_b,
                                          const Tensor& lse_b);
std::array<Tensor, 3> attention_block_backward(const Tensor& grad_out, const Tensor& q,
                                               const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& lse, bool causal, std::int64_t q_pos,
                                               std::int64_t k_pos);
// Mean cross-entropy of logits (N, C) (or (..., C), flattened) against i64 targets (N).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);

// ---- cross-entropy over a class shard: the local steps of loss parallel (dtensor/loss.h), not
// differentiable. logits (..., c) hold classes [col_begin, col_begin + c) of `vocab`; targets
// (i64) have one entry per row; statistics are (rows) in acc_dtype. ----
Tensor ce_shard_max(const Tensor& logits);
// {sumexp against the global max, the target's logit where this shard holds it (else 0)}.
std::pair<Tensor, Tensor> ce_shard_stats(const Tensor& logits, const Tensor& targets,
                                         const Tensor& max, std::int64_t col_begin,
                                         std::int64_t vocab);
// Mean over rows of max + log(sumexp) - picked: a scalar of `dtype`.
Tensor ce_shard_loss(const Tensor& max, const Tensor& sumexp, const Tensor& picked, DType dtype);
// The logits' gradient for a scalar grad_loss (logits' dtype).
Tensor ce_shard_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& targets,
                         const Tensor& max, const Tensor& sumexp, std::int64_t col_begin);

// ---- reductions ----
Tensor sum(const Tensor& x);  // all elements -> shape {}
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);

}  // namespace commtrace
