// Row-wise kernels over (rows, cols): softmax, log-softmax, layernorm and RMSNorm, forward and
// backward. One block of kThreads per row; row statistics in double (block_sum, block_max), each
// element by the reference's expression. Parameter gradients (grad_w, grad_b) are column sums in
// T over rows in order, one thread per column, as the reference adds them.
#include "kernels/cuda/common.cuh"

namespace commtrace::cuda {
namespace {

template <typename T>
__global__ void softmax_kernel(const T* x, T* out, i64 cols, bool causal, i64 period) {
  const i64 r = blockIdx.x;
  const T* xr = x + r * cols;
  T* yr = out + r * cols;
  const i64 valid = causal ? r % period + 1 : cols;
  double mx = -INFINITY;
  for (i64 j = threadIdx.x; j < valid; j += blockDim.x) mx = fmax(mx, double(xr[j]));
  const T m = T(block_max(mx));
  double sum = 0;
  for (i64 j = threadIdx.x; j < valid; j += blockDim.x) sum += double(math::exp_of(T(xr[j] - m)));
  const T inv = T(1.0 / block_sum(sum));
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    yr[j] = j < valid ? T(math::exp_of(T(xr[j] - m)) * inv) : T(0);
  }
}

// grad_in may alias grad_out: every element is read for the dot before any is written.
template <typename T>
__global__ void softmax_backward_kernel(const T* g, const T* y, T* gi, i64 cols) {
  const i64 off = i64(blockIdx.x) * cols;
  double dot = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) dot += double(g[off + j]) * y[off + j];
  const T d = T(block_sum(dot));
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) gi[off + j] = y[off + j] * (g[off + j] - d);
}

template <typename T>
__global__ void log_softmax_kernel(const T* x, T* out, i64 cols) {
  const i64 off = i64(blockIdx.x) * cols;
  double mx = -INFINITY;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) mx = fmax(mx, double(x[off + j]));
  mx = block_max(mx);
  double sum = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) sum += exp(double(x[off + j]) - mx);
  const double lse = mx + log(block_sum(sum));
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) out[off + j] = T(double(x[off + j]) - lse);
}

template <typename T>
__global__ void log_softmax_backward_kernel(const T* g, const T* y, T* gi, i64 cols) {
  const i64 off = i64(blockIdx.x) * cols;
  double sum = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) sum += g[off + j];
  sum = block_sum(sum);
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    gi[off + j] = T(double(g[off + j]) - exp(double(y[off + j])) * sum);
  }
}

template <typename T>
__global__ void layernorm_kernel(const T* x, const T* w, const T* b, T* out, T* mean, T* rstd,
                                 i64 cols, double e) {
  const i64 r = blockIdx.x, off = r * cols;
  double mu = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) mu += x[off + j];
  mu = block_sum(mu) / double(cols);
  double var = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    var += (x[off + j] - mu) * (x[off + j] - mu);
  }
  var = block_sum(var) / double(cols);
  const double rs = 1.0 / sqrt(var + e);
  if (threadIdx.x == 0) {
    mean[r] = T(mu);
    rstd[r] = T(rs);
  }
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    T y = T((x[off + j] - mu) * rs);
    if (w) y *= w[j];
    if (b) y += b[j];
    out[off + j] = y;
  }
}

template <typename T>
__global__ void layernorm_backward_kernel(const T* go, const T* x, const T* w, const T* mean,
                                          const T* rstd, T* gx, i64 cols) {
  const i64 r = blockIdx.x, off = r * cols;
  double sum_g = 0, sum_gx = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    const T xhat = (x[off + j] - mean[r]) * rstd[r];
    const T g = w ? go[off + j] * w[j] : go[off + j];
    sum_g += g;
    sum_gx += double(g) * xhat;
  }
  const T mean_g = T(block_sum(sum_g) / double(cols));
  const T mean_gx = T(block_sum(sum_gx) / double(cols));
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    const T xhat = (x[off + j] - mean[r]) * rstd[r];
    const T g = w ? go[off + j] * w[j] : go[off + j];
    gx[off + j] = rstd[r] * (g - mean_g - xhat * mean_gx);
  }
}

// grad_w[j] = sum over rows of go * xhat; grad_b[j] = sum of go (mean null: RMSNorm's xhat).
template <typename T>
__global__ void norm_param_grad_kernel(const T* go, const T* x, const T* mean, const T* rstd, T* gw,
                                       T* gb, i64 rows, i64 cols) {
  COMMTRACE_GRID_STRIDE(j, cols) {
    T sw = T(0), sb = T(0);
    for (i64 r = 0; r < rows; ++r) {
      const T xv = x[r * cols + j];
      const T xhat = mean ? (xv - mean[r]) * rstd[r] : xv * rstd[r];
      sw += go[r * cols + j] * xhat;
      sb += go[r * cols + j];
    }
    if (gw) gw[j] = sw;
    if (gb) gb[j] = sb;
  }
}

template <typename T>
__global__ void rmsnorm_kernel(const T* x, const T* w, T* out, T* rstd, i64 cols, double e) {
  const i64 r = blockIdx.x, off = r * cols;
  double ms = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) ms += double(x[off + j]) * x[off + j];
  ms = block_sum(ms);
  ms = cols ? ms / double(cols) : 0.0;
  const double rs = 1.0 / sqrt(ms + e);
  if (threadIdx.x == 0) rstd[r] = T(rs);
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    T y = T(x[off + j] * rs);
    if (w) y *= w[j];
    out[off + j] = y;
  }
}

template <typename T>
__global__ void rmsnorm_backward_kernel(const T* go, const T* x, const T* w, const T* rstd, T* gx,
                                        i64 cols) {
  const i64 r = blockIdx.x, off = r * cols;
  double sum_gx = 0;
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    const T xhat = x[off + j] * rstd[r];
    const T g = w ? go[off + j] * w[j] : go[off + j];
    sum_gx += double(g) * xhat;
  }
  const T mean_gx = T(block_sum(sum_gx) / double(cols));
  for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
    const T xhat = x[off + j] * rstd[r];
    const T g = w ? go[off + j] * w[j] : go[off + j];
    gx[off + j] = rstd[r] * (g - xhat * mean_gx);
  }
}

}  // namespace

template <typename T>
void softmax_forward(cudaStream_t s, const T* x, T* out, i64 rows, i64 cols, bool causal,
                     i64 period) {
  if (rows > 0 && cols > 0) {
    softmax_kernel<<<grid_rows(rows), kThreads, 0, s>>>(x, out, cols, causal, period);
  }
}

template <typename T>
void softmax_backward(cudaStream_t s, const T* g, const T* y, T* gi, i64 rows, i64 cols) {
  if (rows > 0 && cols > 0)
    softmax_backward_kernel<<<grid_rows(rows), kThreads, 0, s>>>(g, y, gi, cols);
}

template <typename T>
void log_softmax_forward(cudaStream_t s, const T* x, T* out, i64 rows, i64 cols) {
  if (rows > 0 && cols > 0) log_softmax_kernel<<<grid_rows(rows), kThreads, 0, s>>>(x, out, cols);
}

template <typename T>
void log_softmax_backward(cudaStream_t s, const T* g, const T* y, T* gi, i64 rows, i64 cols) {
  if (rows > 0 && cols > 0) {
    log_softmax_backward_kernel<<<grid_rows(rows), kThreads, 0, s>>>(g, y, gi, cols);
  }
}

template <typename T>
void layernorm_forward(cudaStream_t s, const T* x, const T* w, const T* b, T* out, T* mean, T* rstd,
                       i64 rows, i64 cols, double eps) {
  if (rows == 0) return;
  layernorm_kernel<<<grid_rows(rows), kThreads, 0, s>>>(x, w, b, out, mean, rstd, cols,
                                                        double(T(eps)));
}

template <typename T>
void layernorm_backward(cudaStream_t s, const T* go, const T* x, const T* w, const T* mean,
                        const T* rstd, T* gx, T* gw, T* gb, i64 rows, i64 cols) {
  if (cols == 0) return;
  if (rows > 0) {
    layernorm_backward_kernel<<<grid_rows(rows), kThreads, 0, s>>>(go, x, w, mean, rstd, gx, cols);
  }
  if (gw || gb) {
    norm_param_grad_kernel<<<grid_for(cols), kThreads, 0, s>>>(go, x, mean, rstd, gw, gb, rows,
                                                               cols);
  }
}

template <typename T>
void rmsnorm_forward(cudaStream_t s, const T* x, const T* w, T* out, T* rstd, i64 rows, i64 cols,
                     double eps) {
  if (rows > 0) {
    rmsnorm_kernel<<<grid_rows(rows), kThreads, 0, s>>>(x, w, out, rstd, cols, double(T(eps)));
  }
}

template <typename T>
void rmsnorm_backward(cudaStream_t s, const T* go, const T* x, const T* w, const T* rstd, T* gx,
                      T* gw, i64 rows, i64 cols) {
  if (cols == 0) return;
  if (rows > 0)
    rmsnorm_backward_kernel<<<grid_rows(rows), kThreads, 0, s>>>(go, x, w, rstd, gx, cols);
  if (gw) {
    norm_param_grad_kernel<<<grid_for(cols), kThreads, 0, s>>>(
        go, x, static_cast<const T*>(nullptr), rstd, gw, static_cast<T*>(nullptr), rows, cols);
  }
}

#define COMMTRACE_ROWWISE(T)                                                                      \
  template void softmax_forward<T>(cudaStream_t, const T*, T*, i64, i64, bool, i64);              \
  template void softmax_backward<T>(cudaStream_t, const T*, const T*, T*, i64, i64);              \
  template void log_softmax_forward<T>(cudaStream_t, const T*, T*, i64, i64);                     \
  template void log_softmax_backward<T>(cudaStream_t, const T*, const T*, T*, i64, i64);          \
  template void layernorm_forward<T>(cudaStream_t, const T*, const T*, const T*, T*, T*, T*, i64, \
                                     i64, double);                                                \
  template void layernorm_backward<T>(cudaStream_t, const T*, const T*, const T*, const T*,       \
                                      const T*, T*, T*, T*, i64, i64);                            \
  template void rmsnorm_forward<T>(cudaStream_t, const T*, const T*, T*, T*, i64, i64, double);   \
  template void rmsnorm_backward<T>(cudaStream_t, const T*, const T*, const T*, const T*, T*, T*, \
                                    i64, i64);
COMMTRACE_ROWWISE(float)
COMMTRACE_ROWWISE(double)

}  // namespace commtrace::cuda
