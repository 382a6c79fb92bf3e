// CPU neural-network kernels: softmax, layernorm, dim reductions, embedding lookup, causal
// attention, cross-entropy and counter-based dropout, each with the backward the autograd needs.
// Reductions over a row accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu.h"

namespace commtrace::cpu {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Softmax of one row in place; entries at j >= valid are set to 0 (the causal mask).
template <typename T>
void softmax_row(T* row, i64 cols, i64 valid) {
  T mx = -std::numeric_limits<T>::infinity();
  for (i64 j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
  double sum = 0;
  for (i64 j = 0; j < valid; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  const T inv = T(1.0 / sum);
  for (i64 j = 0; j < valid; ++j) row[j] *= inv;
  for (i64 j = valid; j < cols; ++j) row[j] = T(0);
}

// log(sum(exp(row))), stable.
template <typename T>
double log_sum_exp(const T* row, i64 cols) {
  double mx = -std::numeric_limits<double>::infinity();
  for (i64 j = 0; j < cols; ++j) mx = std::max(mx, double(row[j]));
  double sum = 0;
  for (i64 j = 0; j < cols; ++j) sum += std::exp(double(row[j]) - mx);
  return mx + std::log(sum);
}

void check_target(const char* op, i64 target, i64 pos, i64 c) {
  COMMTRACE_CHECK(target >= 0 && target < c, ErrorCode::InvalidArgument,
                  "{}: target {} at position {} is out of range [0, {})", op, target, pos, c);
}

}  // namespace

template <typename T>
void softmax_forward(const T* x, T* out, i64 rows, i64 cols) {
  std::copy(x, x + rows * cols, out);
  for (i64 r = 0; r < rows; ++r) softmax_row(out + r * cols, cols, cols);
}

// grad_in may alias grad_out.
template <typename T>
void softmax_backward(const T* grad_out, const T* out, T* grad_in, i64 rows, i64 cols) {
  for (i64 r = 0; r < rows; ++r) {
    const T* g = grad_out + r * cols;
    const T* y = out + r * cols;
    double dot = 0;
    for (i64 j = 0; j < cols; ++j) dot += double(g[j]) * y[j];
    for (i64 j = 0; j < cols; ++j) grad_in[r * cols + j] = y[j] * (g[j] - T(dot));
  }
}

template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* out, T* mean, T* rstd, i64 rows,
                       i64 cols, T eps) {
  for (i64 r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    double mu = 0, var = 0;
    for (i64 j = 0; j < cols; ++j) mu += xr[j];
    mu /= double(cols);
    for (i64 j = 0; j < cols; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= double(cols);
    const double rs = 1.0 / std::sqrt(var + double(eps));
    mean[r] = T(mu);
    rstd[r] = T(rs);
    for (i64 j = 0; j < cols; ++j) {
      T y = T((xr[j] - mu) * rs);
      if (w) y *= w[j];
      if (b) y += b[j];
      out[r * cols + j] = y;
    }
  }
}

// With g = grad_out * w and xhat the normalized x:
// grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <typename T>
void layernorm_backward(const T* grad_out, const T* x, const T* w, const T* mean, const T* rstd,
                        T* grad_x, T* grad_w, T* grad_b, i64 rows, i64 cols) {
  for (i64 r = 0; r < rows; ++r) {
    const T* go = grad_out + r * cols;
    const T* xr = x + r * cols;
    double sum_g = 0, sum_gx = 0;
    for (i64 j = 0; j < cols; ++j) {
      const T xhat = (xr[j] - mean[r]) * rstd[r];
      const T g = w ? go[j] * w[j] : go[j];
      sum_g += g;
      sum_gx += double(g) * xhat;
      if (grad_w) grad_w[j] += go[j] * xhat;
      if (grad_b) grad_b[j] += go[j];
    }
    const T mean_g = T(sum_g / double(cols)), mean_gx = T(sum_gx / double(cols));
    for (i64 j = 0; j < cols; ++j) {
      const T xhat = (xr[j] - mean[r]) * rstd[r];
      const T g = w ? go[j] * w[j] : go[j];
      grad_x[r * cols + j] = rstd[r] * (g - mean_g - xhat * mean_gx);
    }
  }
}

template <typename T>
void sum_dim(const T* x, T* out, i64 outer, i64 dim, i64 inner) {
  for (i64 o = 0; o < outer; ++o) {
    T* dst = out + o * inner;
    std::fill(dst, dst + inner, T(0));
    for (i64 j = 0; j < dim; ++j) {
      const T* src = x + (o * dim + j) * inner;
      for (i64 i = 0; i < inner; ++i) dst[i] += src[i];
    }
  }
}

template <typename T>
T sum_all(const T* x, i64 n) {
  double s = 0;
  for (i64 i = 0; i < n; ++i) s += x[i];
  return T(s);
}

template <typename T>
void expand_dim(const T* x, T* out, i64 outer, i64 dim, i64 inner) {
  for (i64 o = 0; o < outer; ++o) {
    for (i64 j = 0; j < dim; ++j)
      std::copy(x + o * inner, x + (o + 1) * inner, out + (o * dim + j) * inner);
  }
}

template <typename T>
void embedding_forward(const i64* idx, i64 n, const T* weight, i64 row_begin, i64 rows, i64 vocab,
                       i64 dim, T* out) {
  for (i64 i = 0; i < n; ++i) {
    const i64 id = idx[i];
    COMMTRACE_CHECK(id >= 0 && id < vocab, ErrorCode::InvalidArgument,
                    "embedding_forward: index {} at position {} is out of range [0, {})", id, i,
                    vocab);
    T* dst = out + i * dim;
    if (id >= row_begin && id < row_begin + rows) {
      std::copy(weight + (id - row_begin) * dim, weight + (id - row_begin + 1) * dim, dst);
    } else {
      std::fill(dst, dst + dim, T(0));
    }
  }
}

// vocab is not known here; forward has checked the upper bound, a negative index still throws.
template <typename T>
void embedding_backward(const T* grad_out, const i64* idx, i64 n, T* grad_weight, i64 row_begin,
                        i64 rows, i64 dim) {
  for (i64 i = 0; i < n; ++i) {
    const i64 id = idx[i];
    COMMTRACE_CHECK(id >= 0, ErrorCode::InvalidArgument,
                    "embedding_backward: index {} at position {} is negative", id, i);
    if (id < row_begin || id >= row_begin + rows) continue;
    T* dst = grad_weight + (id - row_begin) * dim;
    for (i64 j = 0; j < dim; ++j) dst[j] += grad_out[i * dim + j];
  }
}

// Per head: S = scale * Q K^T, P = softmax(S) with j > i masked to 0 when causal, O = P V.
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, i64 bh, i64 t, i64 d,
                       T scale, bool causal) {
  for (i64 h = 0; h < bh; ++h) {
    const i64 off = h * t * d;
    T* p = probs + h * t * t;
    gemm<T>(false, true, t, t, d, scale, q + off, d, k + off, d, T(0), p, t);
    for (i64 i = 0; i < t; ++i) softmax_row(p + i * t, t, causal ? i + 1 : t);
    gemm<T>(false, false, t, d, t, T(1), p, t, v + off, d, T(0), out + off, d);
  }
}

// dP = dO V^T, dV = P^T dO, dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q.
// Masked entries have P = 0, so they get no gradient without knowing `causal`.
template <typename T>
void attention_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* probs,
                        T* grad_q, T* grad_k, T* grad_v, i64 bh, i64 t, i64 d, T scale) {
  std::vector<T> ds(t * t);
  for (i64 h = 0; h < bh; ++h) {
    const i64 off = h * t * d;
    const T* p = probs + h * t * t;
    gemm<T>(false, true, t, t, d, T(1), grad_out + off, d, v + off, d, T(0), ds.data(), t);
    gemm<T>(true, false, t, d, t, T(1), p, t, grad_out + off, d, T(0), grad_v + off, d);
    softmax_backward(ds.data(), p, ds.data(), t, t);
    gemm<T>(false, false, t, d, t, scale, ds.data(), t, k + off, d, T(0), grad_q + off, d);
    gemm<T>(true, false, t, d, t, scale, ds.data(), t, q + off, d, T(0), grad_k + off, d);
  }
}

template <typename T>
T cross_entropy_forward(const T* logits, const i64* targets, i64 n, i64 c) {
  double loss = 0;
  for (i64 r = 0; r < n; ++r) {
    check_target("cross_entropy_forward", targets[r], r, c);
    loss += log_sum_exp(logits + r * c, c) - double(logits[r * c + targets[r]]);
  }
  return T(loss / double(n));
}

template <typename T>
void cross_entropy_backward(T grad_loss, const T* logits, const i64* targets, T* grad_logits, i64 n,
                            i64 c) {
  const double g = double(grad_loss) / double(n);
  for (i64 r = 0; r < n; ++r) {
    check_target("cross_entropy_backward", targets[r], r, c);
    const double lse = log_sum_exp(logits + r * c, c);
    for (i64 j = 0; j < c; ++j) {
      const double y = std::exp(double(logits[r * c + j]) - lse) - (j == targets[r] ? 1.0 : 0.0);
      grad_logits[r * c + j] = T(g * y);
    }
  }
}

// u_i = splitmix64(seed ^ (i * golden ratio)) as a uniform in [0, 1); element i is kept if u >= p.
template <typename T>
void dropout_forward(const T* x, T* out, T* mask, i64 n, T p, std::uint64_t seed) {
  COMMTRACE_CHECK(p >= T(0) && p < T(1), ErrorCode::InvalidArgument,
                  "dropout_forward: p = {} is out of range [0, 1)", p);
  const T keep_scale = p == T(0) ? T(1) : T(1) / (T(1) - p);
  for (i64 i = 0; i < n; ++i) {
    const std::uint64_t h = splitmix64(seed ^ (std::uint64_t(i) * 0x9e3779b97f4a7c15ull));
    const double u = double(h >> 11) * 0x1.0p-53;
    mask[i] = u >= double(p) ? keep_scale : T(0);
    out[i] = x[i] * mask[i];
  }
}

#define COMMTRACE_INSTANTIATE(T)                                                                \
  template void softmax_forward<T>(const T*, T*, i64, i64);                                     \
  template void softmax_backward<T>(const T*, const T*, T*, i64, i64);                          \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, T*, T*, i64, i64, T);    \
  template void layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, \
                                      T*, i64, i64);                                            \
  template void sum_dim<T>(const T*, T*, i64, i64, i64);                                        \
  template T sum_all<T>(const T*, i64);                                                         \
  template void expand_dim<T>(const T*, T*, i64, i64, i64);                                     \
  template void embedding_forward<T>(const i64*, i64, const T*, i64, i64, i64, i64, T*);        \
  template void embedding_backward<T>(const T*, const i64*, i64, T*, i64, i64, i64);            \
  template void attention_forward<T>(const T*, const T*, const T*, T*, T*, i64, i64, i64, T,    \
                                     bool);                                                     \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, \
                                      T*, i64, i64, i64, T);                                    \
  template T cross_entropy_forward<T>(const T*, const i64*, i64, i64);                          \
  template void cross_entropy_backward<T>(T, const T*, const i64*, T*, i64, i64);               \
  template void dropout_forward<T>(const T*, T*, T*, i64, T, std::uint64_t);
COMMTRACE_INSTANTIATE(float)
COMMTRACE_INSTANTIATE(double)
#undef COMMTRACE_INSTANTIATE

}  // namespace commtrace::cpu
