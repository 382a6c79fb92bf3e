// Fused optimizer updates on the CPU (see cpu_optim.h for the formulas).
#include "kernels/cpu_optim.h"

#include <cmath>

namespace commtrace::cpu {

template <typename T>
void sgd_step(T* p, const T* g, T* m, std::int64_t n, T lr, T momentum, T weight_decay,
              bool first_step) {
  for (std::int64_t i = 0; i < n; ++i) {
    T d = g[i] + weight_decay * p[i];
    if (momentum > 0) {
      m[i] = first_step ? d : momentum * m[i] + d;
      d = m[i];
    }
    p[i] -= lr * d;
  }
}

template <typename T>
void adamw_step(T* p, const T* g, T* m, T* v, std::int64_t n, T lr, T beta1, T beta2, T eps,
                T weight_decay, std::int64_t step) {
  const T c1 = T(1) - std::pow(beta1, T(step));
  const T c2 = T(1) - std::pow(beta2, T(step));
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] *= T(1) - lr * weight_decay;
    m[i] = beta1 * m[i] + (T(1) - beta1) * g[i];
    v[i] = beta2 * v[i] + (T(1) - beta2) * g[i] * g[i];
    p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
  }
}

template void sgd_step<float>(float*, const float*, float*, std::int64_t, float, float, float,
                              bool);
template void sgd_step<double>(double*, const double*, double*, std::int64_t, double, double,
                               double, bool);
template void adamw_step<float>(float*, const float*, float*, float*, std::int64_t, float, float,
                                float, float, float, std::int64_t);
template void adamw_step<double>(double*, const double*, double*, double*, std::int64_t, double,
                                 double, double, double, double, std::int64_t);

}  // namespace commtrace::cpu
