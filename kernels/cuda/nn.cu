// The model kernels that are not elementwise: embedding lookup and its scatter-sum gradient, the
// losses (nll, the class-sharded cross-entropy), and blockwise attention's row steps. Index and
// target checks record the first bad position in *bad; the backend reports it.
#include "kernels/cuda/common.cuh"

namespace commtrace::cuda {
namespace {

__device__ inline void flag_bad(unsigned long long* bad, i64 pos) {
  atomicMin(bad, static_cast<unsigned long long>(pos));
}

template <typename T>
__global__ void embedding_kernel(const i64* idx, i64 n, const T* w, i64 row_begin, i64 rows,
                                 i64 vocab, i64 dim, T* out, unsigned long long* bad) {
  COMMTRACE_GRID_STRIDE(k, n * dim) {
    const i64 i = k / dim, j = k % dim, id = idx[i];
    if (id < 0 || id >= vocab) {
      if (j == 0) flag_bad(bad, i);
      out[k] = T(0);
    } else {
      out[k] = id >= row_begin && id < row_begin + rows ? w[(id - row_begin) * dim + j] : T(0);
    }
  }
}

// One thread per column: the tokens' rows are added in token order, as the reference does.
template <typename T>
__global__ void embedding_backward_kernel(const T* go, const i64* idx, i64 n, T* gw, i64 row_begin,
                                          i64 rows, i64 dim, unsigned long long* bad) {
  COMMTRACE_GRID_STRIDE(j, dim) {
    for (i64 r = 0; r < rows; ++r) gw[r * dim + j] = T(0);
    for (i64 i = 0; i < n; ++i) {
      const i64 id = idx[i];
      if (id < 0) {
        if (j == 0) flag_bad(bad, i);
        continue;
      }
      if (id >= row_begin && id < row_begin + rows)
        gw[(id - row_begin) * dim + j] += go[i * dim + j];
    }
  }
}

template <typename T>
__global__ void nll_kernel(const T* logp, const i64* t, i64 n, i64 c, T* loss,
                           unsigned long long* bad) {
  double sum = 0;
  for (i64 r = threadIdx.x; r < n; r += blockDim.x) {
    if (t[r] < 0 || t[r] >= c) {
      flag_bad(bad, r);
    } else {
      sum -= double(logp[r * c + t[r]]);
    }
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) *loss = T(sum / double(n));
}

template <typename T>
__global__ void nll_backward_kernel(const T* grad_loss, const i64* t, T* g, i64 n, i64 c,
                                    unsigned long long* bad) {
  const T v = T(-double(*grad_loss) / double(n));
  COMMTRACE_GRID_STRIDE(k, n * c) {
    const i64 r = k / c, j = k % c;
    if (j == 0 && (t[r] < 0 || t[r] >= c)) flag_bad(bad, r);
    g[k] = j == t[r] ? v : T(0);
  }
}

template <typename T>
__global__ void ce_max_kernel(const T* x, i64 c, T* max) {
  const i64 r = blockIdx.x;
  double m = -INFINITY;
  for (i64 j = threadIdx.x; j < c; j += blockDim.x) m = fmax(m, double(x[r * c + j]));
  m = block_max(m);
  if (threadIdx.x == 0) max[r] = T(m);
}

template <typename T>
__global__ void ce_stats_kernel(const T* x, const i64* t, const T* max, i64 c, i64 col_begin,
                                i64 vocab, T* sumexp, T* picked, unsigned long long* bad) {
  const i64 r = blockIdx.x;
  double s = 0;
  for (i64 j = threadIdx.x; j < c; j += blockDim.x) s += exp(double(x[r * c + j]) - double(max[r]));
  s = block_sum(s);
  if (threadIdx.x == 0) {
    if (t[r] < 0 || t[r] >= vocab) flag_bad(bad, r);
    sumexp[r] = T(s);
    const i64 k = t[r] - col_begin;
    picked[r] = k >= 0 && k < c ? x[r * c + k] : T(0);
  }
}

template <typename T>
__global__ void ce_loss_kernel(const T* max, const T* sumexp, const T* picked, i64 n, T* loss) {
  double sum = 0;
  for (i64 r = threadIdx.x; r < n; r += blockDim.x) {
    sum += double(max[r]) + log(double(sumexp[r])) - double(picked[r]);
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) *loss = T(sum / double(n));
}

template <typename T>
__global__ void ce_backward_kernel(const T* grad_loss, const T* x, const i64* t, const T* max,
                                   const T* sumexp, i64 n, i64 c, i64 col_begin, T* g) {
  const double gl = double(*grad_loss) / double(n);
  COMMTRACE_GRID_STRIDE(k, n * c) {
    const i64 r = k / c, j = k % c;
    const double p = exp(double(x[k]) - double(max[r])) / double(sumexp[r]);
    g[k] = T(gl * (p - (j == t[r] - col_begin ? 1.0 : 0.0)));
  }
}

__device__ inline i64 seen_keys(i64 i, i64 tk, bool causal, i64 q_pos, i64 k_pos) {
  if (!causal) return tk;
  const i64 s = q_pos + i - k_pos + 1;
  return s < 0 ? 0 : s > tk ? tk : s;
}

// lse first (in double, as ref's log_sum_exp), then the row's softmax in T (as softmax_row).
template <typename T>
__global__ void block_softmax_kernel(T* p, T* lse, i64 tq, i64 tk, bool causal, i64 q_pos,
                                     i64 k_pos) {
  const i64 r = blockIdx.x;
  T* row = p + r * tk;
  const i64 seen = seen_keys(r % tq, tk, causal, q_pos, k_pos);
  double mx = -INFINITY;
  for (i64 j = threadIdx.x; j < seen; j += blockDim.x) mx = fmax(mx, double(row[j]));
  mx = block_max(mx);
  const T m = T(mx);
  double sum_d = 0, sum_t = 0;
  for (i64 j = threadIdx.x; j < seen; j += blockDim.x) {
    sum_d += exp(double(row[j]) - mx);
    sum_t += double(math::exp_of(T(row[j] - m)));
  }
  sum_d = block_sum(sum_d);
  const T inv = T(1.0 / block_sum(sum_t));
  if (threadIdx.x == 0) lse[r] = seen == 0 ? T(-INFINITY) : T(mx + log(sum_d));
  for (i64 j = threadIdx.x; j < tk; j += blockDim.x) {
    row[j] = j < seen ? T(math::exp_of(T(row[j] - m)) * inv) : T(0);
  }
}

template <typename T>
__global__ void block_probs_kernel(T* p, const T* lse, i64 rows, i64 tq, i64 tk, bool causal,
                                   i64 q_pos, i64 k_pos) {
  COMMTRACE_GRID_STRIDE(k, rows * tk) {
    const i64 r = k / tk, j = k % tk;
    const i64 seen = seen_keys(r % tq, tk, causal, q_pos, k_pos);
    p[k] = j < seen ? T(exp(double(p[k]) - double(lse[r]))) : T(0);
  }
}

template <typename T>
__global__ void block_grad_scores_kernel(const T* go, const T* out, const T* p, T* ds, i64 tk,
                                         i64 d) {
  const i64 r = blockIdx.x;
  double dot = 0;
  for (i64 j = threadIdx.x; j < d; j += blockDim.x)
    dot += double(go[r * d + j]) * double(out[r * d + j]);
  dot = block_sum(dot);
  for (i64 j = threadIdx.x; j < tk; j += blockDim.x) {
    ds[r * tk + j] = T(double(p[r * tk + j]) * (double(ds[r * tk + j]) - dot));
  }
}

template <typename T>
__global__ void merge_kernel(T* out, T* lse, const T* out_b, const T* lse_b, i64 d) {
  const i64 r = blockIdx.x;
  const double a = double(lse[r]), b = double(lse_b[r]);
  if (b == -INFINITY) return;  // the block saw nothing
  const double m = fmax(a, b);
  const double total = m + log(exp(a - m) + exp(b - m));
  const double wa = exp(a - total), wb = exp(b - total);
  for (i64 j = threadIdx.x; j < d; j += blockDim.x) {
    out[r * d + j] = T(wa * double(out[r * d + j]) + wb * double(out_b[r * d + j]));
  }
  __syncthreads();  // every thread has read lse[r]
  if (threadIdx.x == 0) lse[r] = T(total);
}

}  // namespace

template <typename T>
void embedding_forward(cudaStream_t s, const i64* idx, i64 n, const T* w, i64 row_begin, i64 rows,
                       i64 vocab, i64 dim, T* out, unsigned long long* bad) {
  if (n * dim > 0) {
    embedding_kernel<<<grid_for(n * dim), kThreads, 0, s>>>(idx, n, w, row_begin, rows, vocab, dim,
                                                            out, bad);
  }
}

template <typename T>
void embedding_backward(cudaStream_t s, const T* go, const i64* idx, i64 n, T* gw, i64 row_begin,
                        i64 rows, i64 dim, unsigned long long* bad) {
  if (dim > 0) {
    embedding_backward_kernel<<<grid_for(dim), kThreads, 0, s>>>(go, idx, n, gw, row_begin, rows,
                                                                 dim, bad);
  }
}

template <typename T>
void nll_loss_forward(cudaStream_t s, const T* logp, const i64* t, i64 n, i64 c, T* loss,
                      unsigned long long* bad) {
  nll_kernel<<<1, kThreads, 0, s>>>(logp, t, n, c, loss, bad);
}

template <typename T>
void nll_loss_backward(cudaStream_t s, const T* grad_loss, const i64* t, T* g, i64 n, i64 c,
                       unsigned long long* bad) {
  if (n * c > 0)
    nll_backward_kernel<<<grid_for(n * c), kThreads, 0, s>>>(grad_loss, t, g, n, c, bad);
}

template <typename T>
void ce_shard_max(cudaStream_t s, const T* x, i64 n, i64 c, T* max) {
  if (n > 0) ce_max_kernel<<<grid_rows(n), kThreads, 0, s>>>(x, c, max);
}

template <typename T>
void ce_shard_stats(cudaStream_t s, const T* x, const i64* t, const T* max, i64 n, i64 c,
                    i64 col_begin, i64 vocab, T* sumexp, T* picked, unsigned long long* bad) {
  if (n > 0) {
    ce_stats_kernel<<<grid_rows(n), kThreads, 0, s>>>(x, t, max, c, col_begin, vocab, sumexp,
                                                      picked, bad);
  }
}

template <typename T>
void ce_shard_loss(cudaStream_t s, const T* max, const T* sumexp, const T* picked, i64 n, T* loss) {
  ce_loss_kernel<<<1, kThreads, 0, s>>>(max, sumexp, picked, n, loss);
}

template <typename T>
void ce_shard_backward(cudaStream_t s, const T* grad_loss, const T* x, const i64* t, const T* max,
                       const T* sumexp, i64 n, i64 c, i64 col_begin, T* g) {
  if (n * c > 0) {
    ce_backward_kernel<<<grid_for(n * c), kThreads, 0, s>>>(grad_loss, x, t, max, sumexp, n, c,
                                                            col_begin, g);
  }
}

template <typename T>
void block_softmax(cudaStream_t s, T* p, T* lse, i64 bh, i64 tq, i64 tk, bool causal, i64 q_pos,
                   i64 k_pos) {
  if (bh * tq > 0) {
    block_softmax_kernel<<<grid_rows(bh * tq), kThreads, 0, s>>>(p, lse, tq, tk, causal, q_pos,
                                                                 k_pos);
  }
}

template <typename T>
void block_probs(cudaStream_t s, T* p, const T* lse, i64 bh, i64 tq, i64 tk, bool causal, i64 q_pos,
                 i64 k_pos) {
  const i64 n = bh * tq * tk;
  if (n > 0) {
    block_probs_kernel<<<grid_for(n), kThreads, 0, s>>>(p, lse, bh * tq, tq, tk, causal, q_pos,
                                                        k_pos);
  }
}

template <typename T>
void block_grad_scores(cudaStream_t s, const T* go, const T* out, const T* p, T* ds, i64 rows,
                       i64 tk, i64 d) {
  if (rows > 0)
    block_grad_scores_kernel<<<grid_rows(rows), kThreads, 0, s>>>(go, out, p, ds, tk, d);
}

template <typename T>
void attention_merge(cudaStream_t s, T* out, T* lse, const T* out_b, const T* lse_b, i64 rows,
                     i64 d) {
  if (rows > 0) merge_kernel<<<grid_rows(rows), kThreads, 0, s>>>(out, lse, out_b, lse_b, d);
}

#define COMMTRACE_NN(T)                                                                           \
  template void embedding_forward<T>(cudaStream_t, const i64*, i64, const T*, i64, i64, i64, i64, \
                                     T*, unsigned long long*);                                    \
  template void embedding_backward<T>(cudaStream_t, const T*, const i64*, i64, T*, i64, i64, i64, \
                                      unsigned long long*);                                       \
  template void nll_loss_forward<T>(cudaStream_t, const T*, const i64*, i64, i64, T*,             \
                                    unsigned long long*);                                         \
  template void nll_loss_backward<T>(cudaStream_t, const T*, const i64*, T*, i64, i64,            \
                                     unsigned long long*);                                        \
  template void ce_shard_max<T>(cudaStream_t, const T*, i64, i64, T*);                            \
  template void ce_shard_stats<T>(cudaStream_t, const T*, const i64*, const T*, i64, i64, i64,    \
                                  i64, T*, T*, unsigned long long*);                              \
  template void ce_shard_loss<T>(cudaStream_t, const T*, const T*, const T*, i64, T*);            \
  template void ce_shard_backward<T>(cudaStream_t, const T*, const T*, const i64*, const T*,      \
                                     const T*, i64, i64, i64, T*);                                \
  template void block_softmax<T>(cudaStream_t, T*, T*, i64, i64, i64, bool, i64, i64);            \
  template void block_probs<T>(cudaStream_t, T*, const T*, i64, i64, i64, bool, i64, i64);        \
  template void block_grad_scores<T>(cudaStream_t, const T*, const T*, const T*, T*, i64, i64,    \
                                     i64);                                                        \
  template void attention_merge<T>(cudaStream_t, T*, T*, const T*, const T*, i64, i64);
COMMTRACE_NN(float)
COMMTRACE_NN(double)

}  // namespace commtrace::cuda
