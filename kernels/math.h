// Per-element math shared by every backend: exact GELU and its derivative, the counter-based
// dropout decision, and the SGD and Adam/AdamW element updates. Each function is small, inline and
// COMMTRACE_HD, so the CPU backend (and its tests) and a CUDA kernel run the same expression.
// T is float or double; the expressions keep their operation order (results are bit-stable).
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define COMMTRACE_HD __host__ __device__
#else
#define COMMTRACE_HD
#endif

namespace commtrace::math {

// The C functions of float and double, callable on host and device alike.
COMMTRACE_HD inline float erf_of(float x) { return ::erff(x); }
COMMTRACE_HD inline double erf_of(double x) { return ::erf(x); }
COMMTRACE_HD inline float exp_of(float x) { return ::expf(x); }
COMMTRACE_HD inline double exp_of(double x) { return ::exp(x); }
COMMTRACE_HD inline float sqrt_of(float x) { return ::sqrtf(x); }
COMMTRACE_HD inline double sqrt_of(double x) { return ::sqrt(x); }
COMMTRACE_HD inline float pow_of(float x, float y) { return ::powf(x, y); }
COMMTRACE_HD inline double pow_of(double x, double y) { return ::pow(x, y); }

// Exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default).
template <typename T>
COMMTRACE_HD inline T gelu(T x) {
  const T inv_sqrt2 = T(0.70710678118654752440);
  return T(0.5) * x * (T(1) + erf_of(x * inv_sqrt2));
}

// d/dx x Phi(x) = Phi(x) + x phi(x).
template <typename T>
COMMTRACE_HD inline T gelu_grad(T x) {
  const T inv_sqrt2 = T(0.70710678118654752440), inv_sqrt_2pi = T(0.39894228040143267794);
  const T cdf = T(0.5) * (T(1) + erf_of(x * inv_sqrt2));
  const T pdf = inv_sqrt_2pi * exp_of(T(-0.5) * x * x);
  return cdf + x * pdf;
}

// SiLU (swish), x * sigmoid(x); its derivative s (1 + x (1 - s)) with s = sigmoid(x).
template <typename T>
COMMTRACE_HD inline T silu(T x) {
  return x / (T(1) + exp_of(-x));
}
template <typename T>
COMMTRACE_HD inline T silu_grad(T x) {
  const T s = T(1) / (T(1) + exp_of(-x));
  return s * (T(1) + x * (T(1) - s));
}

COMMTRACE_HD inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of stream `seed` is kept when u_i = splitmix64(seed ^ (i * golden ratio)), as a
// uniform in [0, 1), is >= p. Depends on (seed, i) only, never on the element count.
COMMTRACE_HD inline bool dropout_keep(std::uint64_t seed, std::int64_t i, double p) {
  const std::uint64_t h = splitmix64(seed ^ (std::uint64_t(i) * 0x9e3779b97f4a7c15ull));
  return double(h >> 11) * 0x1.0p-53 >= p;
}

// The scale of a kept element: 1 / (1 - p) (exactly 1 for p == 0).
template <typename T>
COMMTRACE_HD inline T dropout_scale(T p) {
  return p == T(0) ? T(1) : T(1) / (T(1) - p);
}

// SGD of one element: d = g + wd * p; with momentum > 0: m = momentum * m + d (first step:
// m = d), d = m; then p -= lr * d. m is untouched without momentum.
template <typename T>
COMMTRACE_HD inline void sgd_update(T& p, T g, T& m, T lr, T momentum, T weight_decay,
                                    bool first_step) {
  T d = g + weight_decay * p;
  if (momentum > 0) {
    m = first_step ? d : momentum * m + d;
    d = m;
  }
  p -= lr * d;
}

// 1 - beta^step: Adam's bias correction of a moment at `step` (counted from 1).
template <typename T>
COMMTRACE_HD inline T adam_bias_correction(T beta, std::int64_t step) {
  return T(1) - pow_of(beta, T(step));
}

// AdamW of one element (decoupled weight decay); c1, c2 are the bias corrections of the step.
template <typename T>
COMMTRACE_HD inline void adamw_update(T& p, T g, T& m, T& v, T lr, T beta1, T beta2, T eps,
                                      T weight_decay, T c1, T c2) {
  p *= T(1) - lr * weight_decay;
  m = beta1 * m + (T(1) - beta1) * g;
  v = beta2 * v + (T(1) - beta2) * g * g;
  p -= lr * (m / c1) / (sqrt_of(v / c2) + eps);
}

}  // namespace commtrace::math
