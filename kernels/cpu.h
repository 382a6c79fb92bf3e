// CPU kernels: pure compute on raw, contiguous, row-major buffers. No tensors, no tracing, no
// allocation of outputs (callers own every buffer). T is float or double; bf16 is computed by the
// caller in f32. Backward kernels follow `<op>_backward`. Callers validate shapes; kernels only
// check what they alone can see (an embedding index out of range, a target out of range).
#pragma once

#include <cstdint>

#include "kernels/base.h"

namespace commtrace::cpu {

using i64 = std::int64_t;

// ---- GEMM (OpenBLAS cblas) ----
// C (M,N) = alpha * op(A) @ op(B) + beta * C; op(A) is (M,K), op(B) is (K,N); row-major with
// leading dimensions lda/ldb/ldc of the stored (untransposed) matrices.
template <typename T>
void gemm(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda, const T* b,
          i64 ldb, T beta, T* c, i64 ldc);

// ---- elementwise and broadcasting ----
enum class BinaryOp : int { Add = 0, Sub = 1, Mul = 2, Div = 3 };

// out = a (op) b with NumPy broadcasting. a_shape and b_shape are right-aligned against
// out_shape (rank of out >= both); a size-1 dim broadcasts.
template <typename T>
void binary(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
            const Shape& out_shape);

// out (target_shape) = sum of in (in_shape) over the dims that broadcasting expanded: the
// reverse of broadcasting target_shape to in_shape. Overwrites out.
template <typename T>
void sum_to(const T* in, const Shape& in_shape, T* out, const Shape& target_shape);

template <typename T>
void scale(const T* x, T s, T* out, i64 n);  // out = s * x
template <typename T>
void add_scalar(const T* x, T s, T* out, i64 n);  // out = x + s
template <typename T>
void fill(T* out, T value, i64 n);

template <typename T>
void relu_forward(const T* x, T* out, i64 n);
template <typename T>
void relu_backward(const T* grad_out, const T* x, T* grad_in, i64 n);  // grad where x > 0

// Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default.
template <typename T>
void gelu_forward(const T* x, T* out, i64 n);
template <typename T>
void gelu_backward(const T* grad_out, const T* x, T* grad_in, i64 n);

// ---- row-wise ops over the last dim: x is (rows, cols) ----
template <typename T>
void softmax_forward(const T* x, T* out, i64 rows, i64 cols);
// grad_in = out * (grad_out - sum(grad_out * out)) per row.
template <typename T>
void softmax_backward(const T* grad_out, const T* out, T* grad_in, i64 rows, i64 cols);

// out = (x - mean) * rstd * w + b; saves mean and rstd (rows each). w, b are (cols) or null.
template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* out, T* mean, T* rstd, i64 rows,
                       i64 cols, T eps);
// Overwrites grad_x; accumulates (+=) into grad_w and grad_b when not null.
template <typename T>
void layernorm_backward(const T* grad_out, const T* x, const T* w, const T* mean, const T* rstd,
                        T* grad_x, T* grad_w, T* grad_b, i64 rows, i64 cols);

// ---- reductions: x viewed as (outer, dim, inner) ----
template <typename T>
void sum_dim(const T* x, T* out, i64 outer, i64 dim, i64 inner);  // out is (outer, inner)
template <typename T>
T sum_all(const T* x, i64 n);  // pairwise-free plain sum in T; f32 accumulates in double
// out (outer, dim, inner) = x (outer, inner) repeated along dim: the backward of sum_dim.
template <typename T>
void expand_dim(const T* x, T* out, i64 outer, i64 dim, i64 inner);

// ---- embedding ----
// out (n, dim) = rows of weight for idx. weight holds the rows [row_begin, row_begin + rows) of
// the full table (row_begin = 0, rows = vocab for a whole table). An index outside that range
// gives a zero row (the masked lookup of a row-sharded table); an index < 0 or >= vocab throws.
template <typename T>
void embedding_forward(const i64* idx, i64 n, const T* weight, i64 row_begin, i64 rows, i64 vocab,
                       i64 dim, T* out);
// grad_weight (rows, dim) += scattered grad_out rows, masked the same way.
template <typename T>
void embedding_backward(const T* grad_out, const i64* idx, i64 n, T* grad_weight, i64 row_begin,
                        i64 rows, i64 dim);

// ---- causal scaled-dot-product attention ----
// q, k, v, out are (bh, t, d): bh = batch * heads. probs (bh, t, t) is saved for backward.
// scale = 1/sqrt(d) by the caller. causal: position i attends to j <= i.
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, i64 bh, i64 t, i64 d,
                       T scale, bool causal);
// Overwrites grad_q, grad_k, grad_v.
template <typename T>
void attention_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* probs,
                        T* grad_q, T* grad_k, T* grad_v, i64 bh, i64 t, i64 d, T scale);

// ---- cross-entropy (mean over n rows) ----
// logits (n, c), targets (n) in [0, c) (else throws). Returns the mean loss.
template <typename T>
T cross_entropy_forward(const T* logits, const i64* targets, i64 n, i64 c);
// grad_logits = grad_loss * (softmax(logits) - onehot(target)) / n.
template <typename T>
void cross_entropy_backward(T grad_loss, const T* logits, const i64* targets, T* grad_logits, i64 n,
                            i64 c);

// ---- dropout ----
// Counter-based: element i of stream `seed` is kept with probability 1 - p, scaled by 1/(1-p);
// the same (seed, i) always gives the same decision. mask holds the applied scale (0 or 1/(1-p)).
template <typename T>
void dropout_forward(const T* x, T* out, T* mask, i64 n, T p, std::uint64_t seed);

// ---- layout ----
// out = in permuted: out dim i is in dim perm[i]. Shapes are the input's.
template <typename T>
void permute(const T* in, const Shape& in_shape, const std::vector<int>& perm, T* out);
// out = in[..., start:start+len, ...] along dim (out has len there).
template <typename T>
void narrow(const T* in, const Shape& in_shape, int dim, i64 start, i64 len, T* out);
// dst[..., start:start+src_len, ...] = src along dim; the inverse of narrow.
template <typename T>
void narrow_scatter(const T* src, const Shape& src_shape, int dim, i64 start, T* dst,
                    const Shape& dst_shape);

// Element conversion between storage dtypes (f32, f64, bf16, i64); n elements.
void convert(const void* in, DType in_dt, void* out, DType out_dt, i64 n);

}  // namespace commtrace::cpu
