// The naive reference of every kernel of the device seam (kernels/backend.h): plain loops on
// typed host buffers, the single reference every backend is tested against (as llm.c keeps
// matmul_forward_naive beside matmul_forward). The CPU backend runs these same templates, with
// OpenBLAS for the matrix products. Arguments and contracts are those of the Kernels method of
// the same name; T is float or double (acc buffers are T too); scalars arrive as double and are
// rounded to T first. Row reductions (softmax, layernorm statistics, cross-entropy, sum_all) and
// the naive matrix product accumulate in double; scatter sums (sum_to, sum_dim, the embedding and
// layernorm parameter gradients) and the collective reduce accumulate in T, in index order.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace commtrace::ref {

// ---- matrix products ----
// c (m, n) = alpha * op(a) @ op(b) + beta * c with BLAS semantics (beta == 0 does not read c; m,
// n or k == 0 are legal); lda/ldb/ldc are the leading dims of the stored matrices.
template <typename T>
using Matmul = void (*)(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, T alpha, const T* a,
                        i64 lda, const T* b, i64 ldb, T beta, T* c, i64 ldc);
// The naive triple loop, accumulating in double.
template <typename T>
void matmul(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda,
            const T* b, i64 ldb, T beta, T* c, i64 ldc);
// Kernels::gemm (g.dt is not read) on the product mm: bias rows are copied into C, then beta = 1.
template <typename T>
void gemm(const GemmArgs& g, Matmul<T> mm = matmul<T>);

// ---- elementwise ----
template <typename T>
void binary(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
            const Shape& out_shape);
template <typename T>
void sum_to(const T* in, const Shape& in_shape, T* out, const Shape& target_shape);
template <typename T>
void scale(const T* x, double s, T* out, i64 n);
template <typename T>
void add_scalar(const T* x, double s, T* out, i64 n);
template <typename T>
void relu_forward(const T* x, T* out, i64 n);
template <typename T>
void relu_backward(const T* grad_out, const T* x, T* grad_in, i64 n);
template <typename T>
void gelu_forward(const T* x, T* out, i64 n);
template <typename T>
void gelu_backward(const T* grad_out, const T* x, T* grad_in, i64 n);
template <typename T>
void silu_forward(const T* x, T* out, i64 n);
template <typename T>
void silu_backward(const T* grad_out, const T* x, T* grad_in, i64 n);
// REQUIRES: p in [0, 1) (else InvalidArgument).
template <typename T>
void dropout_forward(const T* x, T* out, T* mask, i64 n, double p, std::uint64_t seed);
template <typename T>
void dropout_backward(const T* grad_out, const T* mask, T* grad_in, i64 n);

// ---- row-wise, reductions ----
template <typename T>
void softmax_forward(const T* x, T* out, i64 rows, i64 cols);
template <typename T>
void softmax_backward(const T* grad_out, const T* out, T* grad_in, i64 rows, i64 cols);
template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* out, T* mean, T* rstd, i64 rows,
                       i64 cols, double eps);
template <typename T>
void layernorm_backward(const T* grad_out, const T* x, const T* w, const T* mean, const T* rstd,
                        T* grad_x, T* grad_w, T* grad_b, i64 rows, i64 cols);
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* out, T* rstd, i64 rows, i64 cols, double eps);
template <typename T>
void rmsnorm_backward(const T* grad_out, const T* x, const T* w, const T* rstd, T* grad_x,
                      T* grad_w, i64 rows, i64 cols);
template <typename T>
void sum_dim(const T* x, T* out, i64 outer, i64 dim, i64 inner);
template <typename T>
void sum_all(const T* x, T* out, i64 n);

// ---- embedding, attention, cross-entropy ----
template <typename T>
void embedding_forward(const i64* idx, i64 n, const T* weight, i64 row_begin, i64 rows, i64 vocab,
                       i64 dim, T* out);
template <typename T>
void embedding_backward(const T* grad_out, const i64* idx, i64 n, T* grad_weight, i64 row_begin,
                        i64 rows, i64 dim);
// Per head: S = scale * Q K^T, P = softmax(S) (j > i masked to 0 when causal), O = P V; the
// products go through mm.
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, i64 bh, i64 t, i64 d,
                       double scale, bool causal, Matmul<T> mm = matmul<T>);
template <typename T>
void attention_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* probs,
                        T* grad_q, T* grad_k, T* grad_v, i64 bh, i64 t, i64 d, double scale,
                        Matmul<T> mm = matmul<T>);
// One block of blockwise (ring) attention: q (bh, tq, d), k and v (bh, tk, d); query i sits at
// global position q_pos + i, key j at k_pos + j, and with `causal` a key is seen when
// k_pos + j <= q_pos + i. out (bh, tq, d) is the block's own softmax-weighted sum, lse (bh, tq,
// acc) the log-sum-exp of its scaled scores: -inf, and out 0, for a row that sees no key.
template <typename T>
void attention_block_forward(const T* q, const T* k, const T* v, T* out, T* lse, i64 bh, i64 tq,
                             i64 tk, i64 d, double scale, bool causal, i64 q_pos, i64 k_pos,
                             Matmul<T> mm = matmul<T>);
// Folds block b into the running (out, lse) of the same rows, in place: lse' = log(e^lse +
// e^lse_b), out' = out e^(lse - lse') + out_b e^(lse_b - lse'). out (rows, d), lse (rows).
template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, i64 rows, i64 d);
// One block's share of the gradients, given the rows' final out and lse (over every block):
// P = e^(scale q kᵀ - lse) (0 where masked), dV = Pᵀ dO, dS = P (dO Vᵀ - rowsum(dO out)),
// dQ = scale dS K, dK = scale dSᵀ Q. Overwrites grad_q (bh, tq, d), grad_k and grad_v (bh, tk, d).
template <typename T>
void attention_block_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, T* grad_q, T* grad_k, T* grad_v, i64 bh, i64 tq, i64 tk,
                              i64 d, double scale, bool causal, i64 q_pos, i64 k_pos,
                              Matmul<T> mm = matmul<T>);
template <typename T>
void log_softmax_forward(const T* x, T* out, i64 rows, i64 cols);
template <typename T>
void log_softmax_backward(const T* grad_out, const T* out, T* grad_in, i64 rows, i64 cols);
template <typename T>
void nll_loss_forward(const T* logp, const i64* targets, i64 n, i64 c, T* loss);
template <typename T>
void nll_loss_backward(const T* grad_loss, const i64* targets, T* grad_logp, i64 n, i64 c);
template <typename T>
void ce_shard_max(const T* logits, i64 n, i64 c, T* max);
template <typename T>
void ce_shard_stats(const T* logits, const i64* targets, const T* max, i64 n, i64 c, i64 col_begin,
                    i64 vocab, T* sumexp, T* picked);
template <typename T>
void ce_shard_loss(const T* max, const T* sumexp, const T* picked, i64 n, T* loss);
template <typename T>
void ce_shard_backward(const T* grad_loss, const T* logits, const i64* targets, const T* max,
                       const T* sumexp, i64 n, i64 c, i64 col_begin, T* grad_logits);

// ---- layout: T is any element type (the CPU backend moves bits as unsigned integers) ----
template <typename T>
void permute(const T* in, const Shape& in_shape, const int* perm, T* out);
template <typename T>
void narrow(const T* in, const Shape& in_shape, int dim, i64 start, i64 len, T* out);
template <typename T>
void narrow_scatter(const T* src, const Shape& src_shape, int dim, i64 start, T* dst,
                    const Shape& dst_shape);
// Between any two storage dtypes: bf16 rounds to nearest even, floating to i64 truncates toward
// zero (NaN gives 0, out-of-range values saturate).
void convert(const void* in, DType in_dt, void* out, DType out_dt, i64 n);
void fill(DType dt, void* out, double value, i64 n);  // value converted as convert() does

// ---- optimizers ----
template <typename T>
void sgd_step(T* p, const T* g, T* momentum_buf, i64 n, const SgdArgs& a);
template <typename T>
void adamw_step(T* p, const T* g, T* m, T* v, i64 n, const AdamWArgs& a);

// ---- collectives' arithmetic: T is float, double or i64 (bf16 is reduced in float) ----
// REQUIRES: op is Sum, Avg or Max (else InvalidArgument).
template <typename T>
void reduce(ReduceOp op, const T* const* srcs, int n_srcs, T* const* dsts, int n_dsts, i64 begin,
            i64 end);

}  // namespace commtrace::ref
