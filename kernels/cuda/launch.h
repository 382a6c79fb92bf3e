// The CUDA kernels of the device seam, one family per .cu file, launched on a given stream. The
// CUDA backend (cuda_backend.cpp) is their only caller: it widens bf16 to f32 around them, as the
// CPU backend does, composes attention from these kernels and cuBLAS, and checks launch errors.
// Each kernel computes what the reference of the same name computes (kernels/reference.h): the
// same per-element expressions (kernels/math.h), row reductions accumulated in double, scatter
// sums in T and in index order. T is float or double; pointers are device pointers.
//
// No fmt and no exceptions here: nvcc compiles only this header and kernels/math.h. Kernels that
// validate an index record the first bad position in *bad (atomicMin; the caller resets it to
// kNoBadIndex and reports).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace commtrace::cuda {

using i64 = std::int64_t;
inline constexpr unsigned long long kNoBadIndex = ~0ull;
inline constexpr int kMaxRank = 8;  // broadcasting and permute: tensors of at most 8 dims

// Dims and strides of a tensor of rank <= kMaxRank, right-aligned (dims[kMaxRank - r..]).
struct Dims {
  int rank = 0;
  i64 size[kMaxRank] = {};
  i64 stride[kMaxRank] = {};  // elements; 0 where a dim broadcasts
};

// ---- elementwise.cu ----
enum class Unary : int { Scale, AddScalar, Relu, Gelu, Silu };
enum class UnaryGrad : int { Relu, Gelu, Silu };
template <typename T>
void unary(cudaStream_t s, Unary op, const T* x, double scalar, T* out, i64 n);
template <typename T>
void unary_backward(cudaStream_t s, UnaryGrad op, const T* grad_out, const T* x, T* grad_in, i64 n);
// op: 0 add, 1 sub, 2 mul, 3 div (BinaryOp). a, b strides are those of out's index space.
template <typename T>
void binary(cudaStream_t s, int op, const T* a, const Dims& a_dims, const T* b, const Dims& b_dims,
            T* out, const Dims& out_dims, i64 n);
template <typename T>
void dropout_forward(cudaStream_t s, const T* x, T* out, T* mask, i64 n, T p, std::uint64_t seed);
template <typename T>
void mul(cudaStream_t s, const T* a, const T* b, T* out, i64 n);  // dropout backward
// Any of f32, f64, bf16, i64 (DType values 0..3) to any other, as ref::convert.
void convert(cudaStream_t s, const void* in, int in_dt, void* out, int out_dt, i64 n);
// Every element of `elem_size` bytes (2, 4 or 8) set to the bits in `bits`.
void fill_bits(cudaStream_t s, void* out, int elem_size, std::uint64_t bits, i64 n);
template <typename T>
void sgd_step(cudaStream_t s, T* p, const T* g, T* m, i64 n, T lr, T momentum, T wd, bool first);
template <typename T>
void adamw_step(cudaStream_t s, T* p, const T* g, T* m, T* v, i64 n, T lr, T b1, T b2, T eps, T wd,
                T c1, T c2);

// ---- rowwise.cu: x is (rows, cols) ----
// softmax per row; with `causal`, row r sees columns j < (r % period) + 1 and the rest are 0
// (attention's mask; period = t).
template <typename T>
void softmax_forward(cudaStream_t s, const T* x, T* out, i64 rows, i64 cols, bool causal,
                     i64 period);
template <typename T>
void softmax_backward(cudaStream_t s, const T* grad_out, const T* out, T* grad_in, i64 rows,
                      i64 cols);
template <typename T>
void log_softmax_forward(cudaStream_t s, const T* x, T* out, i64 rows, i64 cols);
template <typename T>
void log_softmax_backward(cudaStream_t s, const T* grad_out, const T* out, T* grad_in, i64 rows,
                          i64 cols);
template <typename T>
void layernorm_forward(cudaStream_t s, const T* x, const T* w, const T* b, T* out, T* mean, T* rstd,
                       i64 rows, i64 cols, double eps);
template <typename T>
void layernorm_backward(cudaStream_t s, const T* grad_out, const T* x, const T* w, const T* mean,
                        const T* rstd, T* grad_x, T* grad_w, T* grad_b, i64 rows, i64 cols);
template <typename T>
void rmsnorm_forward(cudaStream_t s, const T* x, const T* w, T* out, T* rstd, i64 rows, i64 cols,
                     double eps);
template <typename T>
void rmsnorm_backward(cudaStream_t s, const T* grad_out, const T* x, const T* w, const T* rstd,
                      T* grad_x, T* grad_w, i64 rows, i64 cols);

// ---- reduce.cu ----
template <typename T>
void sum_dim(cudaStream_t s, const T* x, T* out, i64 outer, i64 dim, i64 inner);
template <typename T>
void sum_all(cudaStream_t s, const T* x, T* out, i64 n);
// out (out_n elements) = in summed over the dims broadcasting expanded: in_dims holds the input's
// sizes and contiguous strides; summed[d] marks the dims the target lacks or has as 1.
template <typename T>
void sum_to(cudaStream_t s, const T* in, const Dims& in_dims, const Dims& summed, T* out,
            i64 out_n);
// The collectives' reduce over up to kMaxPeers buffers, dt 0..3 (bf16 in f32, i64 exactly);
// op 1 sum, 2 avg, 3 max.
inline constexpr int kMaxPeers = 64;
struct Peers {
  const void* src[kMaxPeers];
  void* dst[kMaxPeers];
};
void reduce(cudaStream_t s, int dt, int op, const Peers& p, int n_srcs, int n_dsts, i64 begin,
            i64 end);

// ---- nn.cu: embedding, losses, attention's row steps ----
template <typename T>
void embedding_forward(cudaStream_t s, const i64* idx, i64 n, const T* weight, i64 row_begin,
                       i64 rows, i64 vocab, i64 dim, T* out, unsigned long long* bad);
template <typename T>
void embedding_backward(cudaStream_t s, const T* grad_out, const i64* idx, i64 n, T* grad_weight,
                        i64 row_begin, i64 rows, i64 dim, unsigned long long* bad);
template <typename T>
void nll_loss_forward(cudaStream_t s, const T* logp, const i64* targets, i64 n, i64 c, T* loss,
                      unsigned long long* bad);
template <typename T>
void nll_loss_backward(cudaStream_t s, const T* grad_loss, const i64* targets, T* grad_logp, i64 n,
                       i64 c, unsigned long long* bad);
template <typename T>
void ce_shard_max(cudaStream_t s, const T* logits, i64 n, i64 c, T* max);
template <typename T>
void ce_shard_stats(cudaStream_t s, const T* logits, const i64* targets, const T* max, i64 n, i64 c,
                    i64 col_begin, i64 vocab, T* sumexp, T* picked, unsigned long long* bad);
template <typename T>
void ce_shard_loss(cudaStream_t s, const T* max, const T* sumexp, const T* picked, i64 n, T* loss);
template <typename T>
void ce_shard_backward(cudaStream_t s, const T* grad_loss, const T* logits, const i64* targets,
                       const T* max, const T* sumexp, i64 n, i64 c, i64 col_begin, T* grad_logits);
// Blockwise attention's row steps on scores p (bh * tq rows of tk), row i of head h seeing keys
// j < clamp(q_pos + i - k_pos + 1, 0, tk) when causal:
//   forward: lse = log-sum-exp of the seen scores (-inf if none), p = their softmax, 0 elsewhere;
//   backward: p = exp(p - lse) where seen, else 0.
template <typename T>
void block_softmax(cudaStream_t s, T* p, T* lse, i64 bh, i64 tq, i64 tk, bool causal, i64 q_pos,
                   i64 k_pos);
template <typename T>
void block_probs(cudaStream_t s, T* p, const T* lse, i64 bh, i64 tq, i64 tk, bool causal, i64 q_pos,
                 i64 k_pos);
// ds = p * (ds - rowsum(grad_out * out)) per row (rows of tk scores, d outputs).
template <typename T>
void block_grad_scores(cudaStream_t s, const T* grad_out, const T* out, const T* p, T* ds, i64 rows,
                       i64 tk, i64 d);
template <typename T>
void attention_merge(cudaStream_t s, T* out, T* lse, const T* out_b, const T* lse_b, i64 rows,
                     i64 d);

// ---- layout.cu: data movement by element size (2, 4 or 8 bytes) ----
// out[o] = in[sum over d of idx_d * space.stride[d]], idx the coordinates of o in space.size
// (out contiguous, n elements): permute's gather.
void gather_strided(cudaStream_t s, int elem_size, const void* in, const Dims& space, void* out,
                    i64 n);
// Copies `outer` blocks of `len` elements from src (pitch src_pitch) to dst (pitch dst_pitch).
void copy_blocks(cudaStream_t s, int elem_size, const void* src, i64 src_pitch, void* dst,
                 i64 dst_pitch, i64 outer, i64 len);
// C's (batch, m, n) blocks set to bias rows (bias_rows 1: broadcast) or zero when bias is null.
// T is float, double or std::uint16_t (bf16 bits).
template <typename T>
void fill_gemm_c(cudaStream_t s, T* c, i64 batch, i64 m, i64 n, i64 ldc, i64 stride_c,
                 const T* bias, i64 bias_rows);

}  // namespace commtrace::cuda
