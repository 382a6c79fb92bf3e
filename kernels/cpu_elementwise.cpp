// CPU elementwise kernels: NumPy-broadcast binary ops and their reverse (sum_to), scalar ops,
// fill, and the ReLU / exact-erf GELU activations with their backward.
#include <cmath>
#include <functional>

#include "kernels/cpu.h"

namespace commtrace::cpu {
namespace {

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

}  // namespace

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
  fill(out, T(0), numel(target_shape));
  const std::vector<i64> zero(in_shape.size(), 0);
  for_each_broadcast(in_shape, broadcast_strides(target_shape, in_shape), zero,
                     [&](i64 i, i64 io, i64) { out[io] += in[i]; });
}

template <typename T>
void scale(const T* x, T s, T* out, i64 n) {
  for (i64 i = 0; i < n; ++i) out[i] = s * x[i];
}

template <typename T>
void add_scalar(const T* x, T s, T* out, i64 n) {
  for (i64 i = 0; i < n; ++i) out[i] = x[i] + s;
}

template <typename T>
void fill(T* out, T value, i64 n) {
  for (i64 i = 0; i < n; ++i) out[i] = value;
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
  const T inv_sqrt2 = T(0.70710678118654752440);
  for (i64 i = 0; i < n; ++i) out[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * inv_sqrt2));
}

// d/dx x Phi(x) = Phi(x) + x phi(x).
template <typename T>
void gelu_backward(const T* grad_out, const T* x, T* grad_in, i64 n) {
  const T inv_sqrt2 = T(0.70710678118654752440), inv_sqrt_2pi = T(0.39894228040143267794);
  for (i64 i = 0; i < n; ++i) {
    const T cdf = T(0.5) * (T(1) + std::erf(x[i] * inv_sqrt2));
    const T pdf = inv_sqrt_2pi * std::exp(T(-0.5) * x[i] * x[i]);
    grad_in[i] = grad_out[i] * (cdf + x[i] * pdf);
  }
}

#define COMMTRACE_INSTANTIATE(T)                                                        \
  template void binary<T>(BinaryOp, const T*, const Shape&, const T*, const Shape&, T*, \
                          const Shape&);                                                \
  template void sum_to<T>(const T*, const Shape&, T*, const Shape&);                    \
  template void scale<T>(const T*, T, T*, i64);                                         \
  template void add_scalar<T>(const T*, T, T*, i64);                                    \
  template void fill<T>(T*, T, i64);                                                    \
  template void relu_forward<T>(const T*, T*, i64);                                     \
  template void relu_backward<T>(const T*, const T*, T*, i64);                          \
  template void gelu_forward<T>(const T*, T*, i64);                                     \
  template void gelu_backward<T>(const T*, const T*, T*, i64);
COMMTRACE_INSTANTIATE(float)
COMMTRACE_INSTANTIATE(double)
#undef COMMTRACE_INSTANTIATE

}  // namespace commtrace::cpu
