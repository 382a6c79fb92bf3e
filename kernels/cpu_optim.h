// CPU optimizer kernels: one fused in-place update per parameter, as PyTorch's fused optimizers.
// T is float or double; all buffers have n elements.
#pragma once

#include <cstdint>

namespace commtrace::cpu {

// p -= lr * (g + weight_decay * p), with momentum buffer m when momentum > 0:
// m = momentum * m + g' (first step: m = g'), p -= lr * m.
template <typename T>
void sgd_step(T* p, const T* g, T* m, std::int64_t n, T lr, T momentum, T weight_decay,
              bool first_step);

// AdamW (decoupled weight decay), step counts from 1:
// p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
// p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps).
template <typename T>
void adamw_step(T* p, const T* g, T* m, T* v, std::int64_t n, T lr, T beta1, T beta2, T eps,
                T weight_decay, std::int64_t step);

}  // namespace commtrace::cpu
