// The naive reference kernels (see reference.h), instantiated for float and double (the layout
// kernels also for the unsigned integers the CPU backend moves bits with, reduce also for i64).
#include "kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/math.h"

namespace commtrace::ref {
namespace {

// ---- broadcasting ----

// Element strides of `shape` right-aligned against `full`; 0 on the dims that broadcast.
std::vector<i64> broadcast_strides(const Shape& shape, const Shape& full) {
  std::vector<i64> st(full.size(), 0);
  const std::size_t off = full.size() - shape.size();
  i64 s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    st[off + i] = shape[i] == 1 ? 0 : s;
    s *= shape[i];
  }
  return st;
}

// Calls f(i, a_off, b_off) for every linear index i of `full` in row-major order, with the
// matching offsets into two operands of strides sa and sb (as from broadcast_strides).
template <typename F>
void for_each_broadcast(const Shape& full, const std::vector<i64>& sa, const std::vector<i64>& sb,
                        F f) {
  const i64 total = numel(full);
  if (total == 0) return;
  const int r = static_cast<int>(full.size());
  if (r == 0) {
    f(0, 0, 0);
    return;
  }
  const i64 inner = full[r - 1], ia_in = sa[r - 1], ib_in = sb[r - 1];
  std::vector<i64> idx(r, 0);
  i64 ia = 0, ib = 0;
  for (i64 o = 0; o < total; o += inner) {
    for (i64 j = 0; j < inner; ++j) f(o + j, ia + j * ia_in, ib + j * ib_in);
    for (int d = r - 2; d >= 0; --d) {
      ++idx[d];
      ia += sa[d];
      ib += sb[d];
      if (idx[d] < full[d]) break;
      ia -= sa[d] * full[d];
      ib -= sb[d] * full[d];
      idx[d] = 0;
    }
  }
}

template <typename T, typename Op>
void binary_impl(Op op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
                 const Shape& out_shape) {
  if (a_shape == out_shape && b_shape == out_shape) {
    const i64 n = numel(out_shape);
    for (i64 i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
    return;
  }
  for_each_broadcast(out_shape, broadcast_strides(a_shape, out_shape),
                     broadcast_strides(b_shape, out_shape),
                     [&](i64 i, i64 ia, i64 ib) { out[i] = op(a[ia], b[ib]); });
}

// ---- row helpers ----

// Softmax of one row in place; entries at j >= valid are set to 0 (the causal mask).
template <typename T>
void softmax_row(T* row, i64 cols, i64 valid) {
  T mx = -std::numeric_limits<T>::infinity();
  for (i64 j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
  double sum = 0;
  for (i64 j = 0; j < valid; ++j) {
    row[j] = math::exp_of(T(row[j] - mx));
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

// ---- layout and conversion helpers ----

// Product of shape[begin, end).
i64 span(const Shape& shape, std::size_t begin, std::size_t end) {
  i64 n = 1;
  for (std::size_t i = begin; i < end; ++i) n *= shape[i];
  return n;
}

// Truncates toward zero; NaN gives 0 and out-of-range values saturate.
i64 to_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 0x1.0p63) return std::numeric_limits<i64>::max();
  if (v < -0x1.0p63) return std::numeric_limits<i64>::min();
  return static_cast<i64>(v);
}

template <typename Dst, typename Src>
Dst cast(Src v) {
  if constexpr (std::is_same_v<Src, BF16>) {
    return cast<Dst>(bf16_to_float(v));
  } else if constexpr (std::is_same_v<Dst, BF16>) {
    return float_to_bf16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Dst, i64> && std::is_floating_point_v<Src>) {
    return to_i64(v);
  } else {
    return static_cast<Dst>(v);
  }
}

template <typename Src, typename Dst>
void convert_typed(const Src* in, Dst* out, i64 n) {
  for (i64 i = 0; i < n; ++i) out[i] = cast<Dst>(in[i]);
}

template <typename Src>
void convert_from(const Src* in, void* out, DType out_dt, i64 n) {
  switch (out_dt) {
    case DType::F32:
      return convert_typed(in, static_cast<float*>(out), n);
    case DType::F64:
      return convert_typed(in, static_cast<double*>(out), n);
    case DType::BF16:
      return convert_typed(in, static_cast<BF16*>(out), n);
    case DType::I64:
      return convert_typed(in, static_cast<i64*>(out), n);
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("convert: unknown dtype {}", int(out_dt)));
}

template <typename U>
void fill_bits(void* out, const void* one, i64 n) {
  U v;
  std::memcpy(&v, one, sizeof v);
  std::fill_n(static_cast<U*>(out), n, v);
}

}  // namespace

// ---------------------------------------------------------------- matrix products

template <typename T>
void matmul(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda,
            const T* b, i64 ldb, T beta, T* c, i64 ldc) {
  for (i64 i = 0; i < m; ++i) {
    for (i64 j = 0; j < n; ++j) {
      double s = 0;
      for (i64 p = 0; p < k; ++p) {
        s += double(trans_a ? a[p * lda + i] : a[i * lda + p]) *
             double(trans_b ? b[j * ldb + p] : b[p * ldb + j]);
      }
      T& cij = c[i * ldc + j];
      cij = beta == T(0) ? T(double(alpha) * s) : T(double(alpha) * s + double(beta) * cij);
    }
  }
}

template <typename T>
void gemm(const GemmArgs& g, Matmul<T> mm) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  const T* bias = static_cast<const T*>(g.bias);
  T* c = static_cast<T*>(g.c);
  for (i64 bi = 0; bi < g.batch; ++bi) {
    T* cb = c + bi * g.stride_c;
    if (bias) {
      for (i64 i = 0; i < g.m; ++i) {
        const T* row = bias + (g.bias_rows == 1 ? 0 : i * g.n);
        std::copy(row, row + g.n, cb + i * g.ldc);
      }
    }
    mm(g.trans_a, g.trans_b, g.m, g.n, g.k, T(1), a + bi * g.stride_a, g.lda, b + bi * g.stride_b,
       g.ldb, bias ? T(1) : T(0), cb, g.ldc);
  }
}

// ---------------------------------------------------------------- elementwise

template <typename T>
void binary(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
            const Shape& out_shape) {
  switch (op) {
    case BinaryOp::Add:
      return binary_impl(std::plus<T>(), a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::Sub:
      return binary_impl(std::minus<T>(), a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::Mul:
      return binary_impl(std::multiplies<T>(), a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::Div:
      return binary_impl(std::divides<T>(), a, a_shape, b, b_shape, out, out_shape);
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("binary: unknown op {}", int(op)));
}

template <typename T>
void sum_to(const T* in, const Shape& in_shape, T* out, const Shape& target_shape) {
  std::fill_n(out, numel(target_shape), T(0));
  const std::vector<i64> zero(in_shape.size(), 0);
  for_each_broadcast(in_shape, broadcast_strides(target_shape, in_shape), zero,
                     [&](i64 i, i64 io, i64) { out[io] += in[i]; });
}

template <typename T>
void scale(const T* x, double s, T* out, i64 n) {
  const T st = T(s);
  for (i64 i = 0; i < n; ++i) out[i] = st * x[i];
}

template <typename T>
void add_scalar(const T* x, double s, T* out, i64 n) {
  const T st = T(s);
  for (i64 i = 0; i < n; ++i) out[i] = x[i] + st;
}

template <typename T>
void relu_forward(const T* x, T* out, i64 n) {
  for (i64 i = 0; i < n; ++i) out[i] = x[i] > T(0) ? x[i] : T(0);
}

template <typename T>
void relu_backward(const T* grad_out, const T* x, T* grad_in, i64 n) {
  for (i64 i = 0; i < n; ++i) grad_in[i] = x[i] > T(0) ? grad_out[i] : T(0);
}

template <typename T>
void gelu_forward(const T* x, T* out, i64 n) {
  for (i64 i = 0; i < n; ++i) out[i] = math::gelu(x[i]);
}

template <typename T>
void gelu_backward(const T* grad_out, const T* x, T* grad_in, i64 n) {
  for (i64 i = 0; i < n; ++i) grad_in[i] = grad_out[i] * math::gelu_grad(x[i]);
}

template <typename T>
void silu_forward(const T* x, T* out, i64 n) {
  for (i64 i = 0; i < n; ++i) out[i] = math::silu(x[i]);
}

template <typename T>
void silu_backward(const T* grad_out, const T* x, T* grad_in, i64 n) {
  for (i64 i = 0; i < n; ++i) grad_in[i] = grad_out[i] * math::silu_grad(x[i]);
}

template <typename T>
void dropout_forward(const T* x, T* out, T* mask, i64 n, double p, std::uint64_t seed) {
  const T pt = T(p);
  COMMTRACE_CHECK(pt >= T(0) && pt < T(1), ErrorCode::InvalidArgument,
                  "dropout_forward: p = {} is out of range [0, 1)", p);
  const T keep_scale = math::dropout_scale(pt);
  for (i64 i = 0; i < n; ++i) {
    mask[i] = math::dropout_keep(seed, i, double(pt)) ? keep_scale : T(0);
    out[i] = x[i] * mask[i];
  }
}

template <typename T>
void dropout_backward(const T* grad_out, const T* mask, T* grad_in, i64 n) {
  for (i64 i = 0; i < n; ++i) grad_in[i] = grad_out[i] * mask[i];
}

// ---------------------------------------------------------------- row-wise, reductions

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
                       i64 cols, double eps) {
  const double e = double(T(eps));
  for (i64 r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    double mu = 0, var = 0;
    for (i64 j = 0; j < cols; ++j) mu += xr[j];
    mu /= double(cols);
    for (i64 j = 0; j < cols; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= double(cols);
    const double rs = 1.0 / std::sqrt(var + e);
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
// grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)); grad_w = sum over rows of grad_out *
// xhat, grad_b = sum of grad_out.
template <typename T>
void layernorm_backward(const T* grad_out, const T* x, const T* w, const T* mean, const T* rstd,
                        T* grad_x, T* grad_w, T* grad_b, i64 rows, i64 cols) {
  if (grad_w) std::fill_n(grad_w, cols, T(0));
  if (grad_b) std::fill_n(grad_b, cols, T(0));
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
void rmsnorm_forward(const T* x, const T* w, T* out, T* rstd, i64 rows, i64 cols, double eps) {
  const double e = double(T(eps));
  for (i64 r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    double ms = 0;
    for (i64 j = 0; j < cols; ++j) ms += double(xr[j]) * xr[j];
    ms = cols ? ms / double(cols) : 0.0;
    const double rs = 1.0 / std::sqrt(ms + e);
    rstd[r] = T(rs);
    for (i64 j = 0; j < cols; ++j) {
      T y = T(xr[j] * rs);
      if (w) y *= w[j];
      out[r * cols + j] = y;
    }
  }
}

// With g = grad_out * w and xhat = x * rstd: grad_x = rstd * (g - xhat * mean(g * xhat));
// grad_w = sum over rows of grad_out * xhat.
template <typename T>
void rmsnorm_backward(const T* grad_out, const T* x, const T* w, const T* rstd, T* grad_x,
                      T* grad_w, i64 rows, i64 cols) {
  if (grad_w) std::fill_n(grad_w, cols, T(0));
  for (i64 r = 0; r < rows; ++r) {
    const T* go = grad_out + r * cols;
    const T* xr = x + r * cols;
    double sum_gx = 0;
    for (i64 j = 0; j < cols; ++j) {
      const T xhat = xr[j] * rstd[r];
      const T g = w ? go[j] * w[j] : go[j];
      sum_gx += double(g) * xhat;
      if (grad_w) grad_w[j] += go[j] * xhat;
    }
    const T mean_gx = T(sum_gx / double(cols));
    for (i64 j = 0; j < cols; ++j) {
      const T xhat = xr[j] * rstd[r];
      const T g = w ? go[j] * w[j] : go[j];
      grad_x[r * cols + j] = rstd[r] * (g - xhat * mean_gx);
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
void sum_all(const T* x, T* out, i64 n) {
  double s = 0;
  for (i64 i = 0; i < n; ++i) s += x[i];
  *out = T(s);
}

// ---------------------------------------------------------------- embedding, attention, loss

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
  std::fill_n(grad_weight, rows * dim, T(0));
  for (i64 i = 0; i < n; ++i) {
    const i64 id = idx[i];
    COMMTRACE_CHECK(id >= 0, ErrorCode::InvalidArgument,
                    "embedding_backward: index {} at position {} is negative", id, i);
    if (id < row_begin || id >= row_begin + rows) continue;
    T* dst = grad_weight + (id - row_begin) * dim;
    for (i64 j = 0; j < dim; ++j) dst[j] += grad_out[i * dim + j];
  }
}

template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, i64 bh, i64 t, i64 d,
                       double scale, bool causal, Matmul<T> mm) {
  for (i64 h = 0; h < bh; ++h) {
    const i64 off = h * t * d;
    T* p = probs + h * t * t;
    mm(false, true, t, t, d, T(scale), q + off, d, k + off, d, T(0), p, t);
    for (i64 i = 0; i < t; ++i) softmax_row(p + i * t, t, causal ? i + 1 : t);
    mm(false, false, t, d, t, T(1), p, t, v + off, d, T(0), out + off, d);
  }
}

// dP = dO V^T, dV = P^T dO, dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q.
// Masked entries have P = 0, so they get no gradient without knowing `causal`.
template <typename T>
void attention_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* probs,
                        T* grad_q, T* grad_k, T* grad_v, i64 bh, i64 t, i64 d, double scale,
                        Matmul<T> mm) {
  const T s = T(scale);
  std::vector<T> ds(std::size_t(t * t));
  for (i64 h = 0; h < bh; ++h) {
    const i64 off = h * t * d;
    const T* p = probs + h * t * t;
    mm(false, true, t, t, d, T(1), grad_out + off, d, v + off, d, T(0), ds.data(), t);
    mm(true, false, t, d, t, T(1), p, t, grad_out + off, d, T(0), grad_v + off, d);
    softmax_backward(ds.data(), p, ds.data(), t, t);
    mm(false, false, t, d, t, s, ds.data(), t, k + off, d, T(0), grad_q + off, d);
    mm(true, false, t, d, t, s, ds.data(), t, q + off, d, T(0), grad_k + off, d);
  }
}

template <typename T>
void attention_block_forward(const T* q, const T* k, const T* v, T* out, T* lse, i64 bh, i64 tq,
                             i64 tk, i64 d, double scale, bool causal, i64 q_pos, i64 k_pos,
                             Matmul<T> mm) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  std::vector<T> p(std::size_t(tq * tk));
  for (i64 h = 0; h < bh; ++h) {
    const T* qh = q + h * tq * d;
    const T* kh = k + h * tk * d;
    mm(false, true, tq, tk, d, T(scale), qh, d, kh, d, T(0), p.data(), tk);
    for (i64 i = 0; i < tq; ++i) {
      T* row = p.data() + i * tk;
      // Keys j < seen are visible: k_pos + j <= q_pos + i.
      const i64 seen = causal ? std::clamp<i64>(q_pos + i - k_pos + 1, 0, tk) : tk;
      lse[h * tq + i] = seen == 0 ? kNegInf : T(log_sum_exp(row, seen));
      softmax_row(row, tk, seen);
      if (seen == 0) std::fill(row, row + tk, T(0));
    }
    mm(false, false, tq, d, tk, T(1), p.data(), tk, v + h * tk * d, d, T(0), out + h * tq * d, d);
  }
}

template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, i64 rows, i64 d) {
  for (i64 r = 0; r < rows; ++r) {
    const double a = double(lse[r]), b = double(lse_b[r]);
    if (b == -std::numeric_limits<double>::infinity()) continue;  // the block saw nothing
    const double m = std::max(a, b);
    const double total = m + std::log(std::exp(a - m) + std::exp(b - m));
    const double wa = std::exp(a - total), wb = std::exp(b - total);
    for (i64 j = 0; j < d; ++j) {
      out[r * d + j] = T(wa * double(out[r * d + j]) + wb * double(out_b[r * d + j]));
    }
    lse[r] = T(total);
  }
}

template <typename T>
void attention_block_backward(const T* grad_out, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, T* grad_q, T* grad_k, T* grad_v, i64 bh, i64 tq, i64 tk,
                              i64 d, double scale, bool causal, i64 q_pos, i64 k_pos,
                              Matmul<T> mm) {
  const T s = T(scale);
  std::vector<T> p(std::size_t(tq * tk)), ds(std::size_t(tq * tk));
  for (i64 h = 0; h < bh; ++h) {
    const i64 qo = h * tq * d, ko = h * tk * d;
    mm(false, true, tq, tk, d, s, q + qo, d, k + ko, d, T(0), p.data(), tk);
    for (i64 i = 0; i < tq; ++i) {
      const i64 seen = causal ? std::clamp<i64>(q_pos + i - k_pos + 1, 0, tk) : tk;
      const double l = double(lse[h * tq + i]);
      T* row = p.data() + i * tk;
      for (i64 j = 0; j < tk; ++j) row[j] = j < seen ? T(std::exp(double(row[j]) - l)) : T(0);
    }
    mm(true, false, tk, d, tq, T(1), p.data(), tk, grad_out + qo, d, T(0), grad_v + ko, d);
    mm(false, true, tq, tk, d, T(1), grad_out + qo, d, v + ko, d, T(0), ds.data(), tk);
    for (i64 i = 0; i < tq; ++i) {
      double dot = 0;  // rowsum(dO ∘ O): the softmax's correction over every block of the row
      for (i64 j = 0; j < d; ++j)
        dot += double(grad_out[qo + i * d + j]) * double(out[qo + i * d + j]);
      for (i64 j = 0; j < tk; ++j) {
        ds[std::size_t(i * tk + j)] =
            T(double(p[std::size_t(i * tk + j)]) * (double(ds[std::size_t(i * tk + j)]) - dot));
      }
    }
    mm(false, false, tq, d, tk, s, ds.data(), tk, k + ko, d, T(0), grad_q + qo, d);
    mm(true, false, tk, d, tq, s, ds.data(), tk, q + qo, d, T(0), grad_k + ko, d);
  }
}

template <typename T>
void log_softmax_forward(const T* x, T* out, i64 rows, i64 cols) {
  for (i64 r = 0; r < rows; ++r) {
    const double lse = log_sum_exp(x + r * cols, cols);
    for (i64 j = 0; j < cols; ++j) out[r * cols + j] = T(double(x[r * cols + j]) - lse);
  }
}

// grad_in may alias grad_out.
template <typename T>
void log_softmax_backward(const T* grad_out, const T* out, T* grad_in, i64 rows, i64 cols) {
  for (i64 r = 0; r < rows; ++r) {
    double sum = 0;
    for (i64 j = 0; j < cols; ++j) sum += grad_out[r * cols + j];
    for (i64 j = 0; j < cols; ++j) {
      const i64 k = r * cols + j;
      grad_in[k] = T(double(grad_out[k]) - std::exp(double(out[k])) * sum);
    }
  }
}

template <typename T>
void nll_loss_forward(const T* logp, const i64* targets, i64 n, i64 c, T* loss) {
  double sum = 0;
  for (i64 r = 0; r < n; ++r) {
    check_target("nll_loss_forward", targets[r], r, c);
    sum -= double(logp[r * c + targets[r]]);
  }
  *loss = T(sum / double(n));
}

template <typename T>
void nll_loss_backward(const T* grad_loss, const i64* targets, T* grad_logp, i64 n, i64 c) {
  const T g = T(-double(*grad_loss) / double(n));
  std::fill_n(grad_logp, n * c, T(0));
  for (i64 r = 0; r < n; ++r) {
    check_target("nll_loss_backward", targets[r], r, c);
    grad_logp[r * c + targets[r]] = g;
  }
}

template <typename T>
void ce_shard_max(const T* logits, i64 n, i64 c, T* max) {
  for (i64 r = 0; r < n; ++r) {
    T m = -std::numeric_limits<T>::infinity();
    for (i64 j = 0; j < c; ++j) m = std::max(m, logits[r * c + j]);
    max[r] = m;
  }
}

template <typename T>
void ce_shard_stats(const T* logits, const i64* targets, const T* max, i64 n, i64 c, i64 col_begin,
                    i64 vocab, T* sumexp, T* picked) {
  for (i64 r = 0; r < n; ++r) {
    check_target("ce_shard_stats", targets[r], r, vocab);
    double s = 0;
    for (i64 j = 0; j < c; ++j) s += std::exp(double(logits[r * c + j]) - double(max[r]));
    sumexp[r] = T(s);
    const i64 t = targets[r] - col_begin;
    picked[r] = t >= 0 && t < c ? logits[r * c + t] : T(0);
  }
}

template <typename T>
void ce_shard_loss(const T* max, const T* sumexp, const T* picked, i64 n, T* loss) {
  double sum = 0;
  for (i64 r = 0; r < n; ++r) {
    sum += double(max[r]) + std::log(double(sumexp[r])) - double(picked[r]);
  }
  *loss = T(sum / double(n));
}

template <typename T>
void ce_shard_backward(const T* grad_loss, const T* logits, const i64* targets, const T* max,
                       const T* sumexp, i64 n, i64 c, i64 col_begin, T* grad_logits) {
  const double g = double(*grad_loss) / double(n);
  for (i64 r = 0; r < n; ++r) {
    const i64 t = targets[r] - col_begin;
    for (i64 j = 0; j < c; ++j) {
      const double p = std::exp(double(logits[r * c + j]) - double(max[r])) / double(sumexp[r]);
      grad_logits[r * c + j] = T(g * (p - (j == t ? 1.0 : 0.0)));
    }
  }
}

// ---------------------------------------------------------------- layout

template <typename T>
void permute(const T* in, const Shape& in_shape, const int* perm, T* out) {
  const int r = static_cast<int>(in_shape.size());
  const i64 total = numel(in_shape);
  if (total == 0) return;
  std::vector<i64> in_stride(r, 1), shape(r), stride(r);
  for (int i = r - 2; i >= 0; --i) in_stride[i] = in_stride[i + 1] * in_shape[i + 1];
  for (int i = 0; i < r; ++i) {
    shape[i] = in_shape[perm[i]];
    stride[i] = in_stride[perm[i]];
  }
  std::vector<i64> idx(r, 0);
  i64 src = 0;
  for (i64 o = 0; o < total; ++o) {
    out[o] = in[src];
    for (int d = r - 1; d >= 0; --d) {
      src += stride[d];
      if (++idx[d] < shape[d]) break;
      src -= stride[d] * shape[d];
      idx[d] = 0;
    }
  }
}

template <typename T>
void narrow(const T* in, const Shape& in_shape, int dim, i64 start, i64 len, T* out) {
  const i64 outer = span(in_shape, 0, dim), inner = span(in_shape, dim + 1, in_shape.size());
  const i64 full = in_shape[dim];
  for (i64 o = 0; o < outer; ++o) {
    const T* src = in + (o * full + start) * inner;
    std::copy(src, src + len * inner, out + o * len * inner);
  }
}

template <typename T>
void narrow_scatter(const T* src, const Shape& src_shape, int dim, i64 start, T* dst,
                    const Shape& dst_shape) {
  const i64 outer = span(src_shape, 0, dim), inner = span(src_shape, dim + 1, src_shape.size());
  const i64 len = src_shape[dim], full = dst_shape[dim];
  for (i64 o = 0; o < outer; ++o) {
    const T* s = src + o * len * inner;
    std::copy(s, s + len * inner, dst + (o * full + start) * inner);
  }
}

void convert(const void* in, DType in_dt, void* out, DType out_dt, i64 n) {
  if (n == 0) return;
  if (in_dt == out_dt) {
    std::memcpy(out, in, std::size_t(n) * dtype_size(in_dt));
    return;
  }
  switch (in_dt) {
    case DType::F32:
      return convert_from(static_cast<const float*>(in), out, out_dt, n);
    case DType::F64:
      return convert_from(static_cast<const double*>(in), out, out_dt, n);
    case DType::BF16:
      return convert_from(static_cast<const BF16*>(in), out, out_dt, n);
    case DType::I64:
      return convert_from(static_cast<const i64*>(in), out, out_dt, n);
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("convert: unknown dtype {}", int(in_dt)));
}

void fill(DType dt, void* out, double value, i64 n) {
  unsigned char one[8];
  convert(&value, DType::F64, one, dt, 1);
  switch (dtype_size(dt)) {
    case 2:
      return fill_bits<std::uint16_t>(out, one, n);
    case 4:
      return fill_bits<std::uint32_t>(out, one, n);
    case 8:
      return fill_bits<std::uint64_t>(out, one, n);
  }
  throw Error(ErrorCode::Internal, fmt::format("fill: unexpected dtype {}", dtype_name(dt)));
}

// ---------------------------------------------------------------- optimizers

template <typename T>
void sgd_step(T* p, const T* g, T* momentum_buf, i64 n, const SgdArgs& a) {
  const T lr = T(a.lr), momentum = T(a.momentum), wd = T(a.weight_decay);
  T unused = T(0);
  for (i64 i = 0; i < n; ++i) {
    math::sgd_update(p[i], g[i], momentum_buf ? momentum_buf[i] : unused, lr, momentum, wd,
                     a.first_step);
  }
}

template <typename T>
void adamw_step(T* p, const T* g, T* m, T* v, i64 n, const AdamWArgs& a) {
  const T lr = T(a.lr), beta1 = T(a.beta1), beta2 = T(a.beta2), eps = T(a.eps),
          wd = T(a.weight_decay);
  const T c1 = math::adam_bias_correction(beta1, a.step);
  const T c2 = math::adam_bias_correction(beta2, a.step);
  for (i64 i = 0; i < n; ++i) {
    math::adamw_update(p[i], g[i], m[i], v[i], lr, beta1, beta2, eps, wd, c1, c2);
  }
}

// ---------------------------------------------------------------- collectives' arithmetic

// Element by element: all sources of element i are read before any destination of it is
// written, so a destination may alias a source.
template <typename T>
void reduce(ReduceOp op, const T* const* srcs, int n_srcs, T* const* dsts, int n_dsts, i64 begin,
            i64 end) {
  COMMTRACE_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Max,
                  ErrorCode::InvalidArgument,
                  "reduce: op {} is not a reduction (expected sum, avg or max)", int(op));
  COMMTRACE_CHECK(n_srcs >= 1, ErrorCode::InvalidArgument, "reduce: {} sources, expected >= 1",
                  n_srcs);
  for (i64 i = begin; i < end; ++i) {
    T acc = srcs[0][i];
    for (int s = 1; s < n_srcs; ++s) {
      const T v = srcs[s][i];
      if (op == ReduceOp::Max) {
        acc = v > acc ? v : acc;
      } else {
        acc += v;
      }
    }
    if (op == ReduceOp::Avg) acc /= T(n_srcs);
    for (int d = 0; d < n_dsts; ++d) dsts[d][i] = acc;
  }
}

// ---------------------------------------------------------------- instantiations

#define COMMTRACE_FLOATING(T)                                                                      \
  template void matmul<T>(bool, bool, i64, i64, i64, T, const T*, i64, const T*, i64, T, T*, i64); \
  template void gemm<T>(const GemmArgs&, Matmul<T>);                                               \
  template void binary<T>(BinaryOp, const T*, const Shape&, const T*, const Shape&, T*,            \
                          const Shape&);                                                           \
  template void sum_to<T>(const T*, const Shape&, T*, const Shape&);                               \
  template void scale<T>(const T*, double, T*, i64);                                               \
  template void add_scalar<T>(const T*, double, T*, i64);                                          \
  template void relu_forward<T>(const T*, T*, i64);                                                \
  template void relu_backward<T>(const T*, const T*, T*, i64);                                     \
  template void gelu_forward<T>(const T*, T*, i64);                                                \
  template void gelu_backward<T>(const T*, const T*, T*, i64);                                     \
  template void silu_forward<T>(const T*, T*, i64);                                                \
  template void silu_backward<T>(const T*, const T*, T*, i64);                                     \
  template void dropout_forward<T>(const T*, T*, T*, i64, double, std::uint64_t);                  \
  template void dropout_backward<T>(const T*, const T*, T*, i64);                                  \
  template void softmax_forward<T>(const T*, T*, i64, i64);                                        \
  template void softmax_backward<T>(const T*, const T*, T*, i64, i64);                             \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, T*, T*, i64, i64, double);  \
  template void layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,    \
                                      T*, i64, i64);                                               \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, i64, i64, double);                  \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, i64, i64);     \
  template void sum_dim<T>(const T*, T*, i64, i64, i64);                                           \
  template void sum_all<T>(const T*, T*, i64);                                                     \
  template void embedding_forward<T>(const i64*, i64, const T*, i64, i64, i64, i64, T*);           \
  template void embedding_backward<T>(const T*, const i64*, i64, T*, i64, i64, i64);               \
  template void attention_forward<T>(const T*, const T*, const T*, T*, T*, i64, i64, i64, double,  \
                                     bool, Matmul<T>);                                             \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,    \
                                      T*, i64, i64, i64, double, Matmul<T>);                       \
  template void attention_block_forward<T>(const T*, const T*, const T*, T*, T*, i64, i64, i64,    \
                                           i64, double, bool, i64, i64, Matmul<T>);                \
  template void attention_merge<T>(T*, T*, const T*, const T*, i64, i64);                          \
  template void attention_block_backward<T>(const T*, const T*, const T*, const T*, const T*,      \
                                            const T*, T*, T*, T*, i64, i64, i64, i64, double,      \
                                            bool, i64, i64, Matmul<T>);                            \
  template void log_softmax_forward<T>(const T*, T*, i64, i64);                                    \
  template void log_softmax_backward<T>(const T*, const T*, T*, i64, i64);                         \
  template void nll_loss_forward<T>(const T*, const i64*, i64, i64, T*);                           \
  template void nll_loss_backward<T>(const T*, const i64*, T*, i64, i64);                          \
  template void ce_shard_max<T>(const T*, i64, i64, T*);                                           \
  template void ce_shard_stats<T>(const T*, const i64*, const T*, i64, i64, i64, i64, T*, T*);     \
  template void ce_shard_loss<T>(const T*, const T*, const T*, i64, T*);                           \
  template void ce_shard_backward<T>(const T*, const T*, const i64*, const T*, const T*, i64, i64, \
                                     i64, T*);                                                     \
  template void sgd_step<T>(T*, const T*, T*, i64, const SgdArgs&);                                \
  template void adamw_step<T>(T*, const T*, T*, T*, i64, const AdamWArgs&);
COMMTRACE_FLOATING(float)
COMMTRACE_FLOATING(double)
#undef COMMTRACE_FLOATING

#define COMMTRACE_LAYOUT(T)                                           \
  template void permute<T>(const T*, const Shape&, const int*, T*);   \
  template void narrow<T>(const T*, const Shape&, int, i64, i64, T*); \
  template void narrow_scatter<T>(const T*, const Shape&, int, i64, T*, const Shape&);
COMMTRACE_LAYOUT(float)
COMMTRACE_LAYOUT(double)
COMMTRACE_LAYOUT(std::uint16_t)
COMMTRACE_LAYOUT(std::uint32_t)
COMMTRACE_LAYOUT(std::uint64_t)
#undef COMMTRACE_LAYOUT

template void reduce<float>(ReduceOp, const float* const*, int, float* const*, int, i64, i64);
template void reduce<double>(ReduceOp, const double* const*, int, double* const*, int, i64, i64);
template void reduce<i64>(ReduceOp, const i64* const*, int, i64* const*, int, i64, i64);

}  // namespace commtrace::ref
