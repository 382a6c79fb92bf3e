// Elementwise kernels: unary ops and their gradients, broadcasting binary ops, dropout, dtype
// conversion and fill, the optimizers' fused updates. Each element runs the expression the
// reference runs (kernels/math.h), so f32 and f64 results equal the CPU backend's bit for bit.
#include "kernels/cuda/common.cuh"

namespace commtrace::cuda {
namespace {

template <typename T>
__global__ void unary_kernel(Unary op, const T* x, T s, T* out, i64 n) {
  COMMTRACE_GRID_STRIDE(i, n) {
    const T v = x[i];
    switch (op) {
      case Unary::Scale:
        out[i] = s * v;
        break;
      case Unary::AddScalar:
        out[i] = v + s;
        break;
      case Unary::Relu:
        out[i] = v > T(0) ? v : T(0);
        break;
      case Unary::Gelu:
        out[i] = math::gelu(v);
        break;
      case Unary::Silu:
        out[i] = math::silu(v);
        break;
    }
  }
}

template <typename T>
__global__ void unary_backward_kernel(UnaryGrad op, const T* g, const T* x, T* out, i64 n) {
  COMMTRACE_GRID_STRIDE(i, n) {
    const T v = x[i];
    switch (op) {
      case UnaryGrad::Relu:
        out[i] = v > T(0) ? g[i] : T(0);
        break;
      case UnaryGrad::Gelu:
        out[i] = g[i] * math::gelu_grad(v);
        break;
      case UnaryGrad::Silu:
        out[i] = g[i] * math::silu_grad(v);
        break;
    }
  }
}

template <typename T>
__device__ T apply(int op, T a, T b) {
  switch (op) {
    case 0:
      return a + b;
    case 1:
      return a - b;
    case 2:
      return a * b;
    default:
      return a / b;
  }
}

template <typename T>
__global__ void binary_same_kernel(int op, const T* a, const T* b, T* out, i64 n) {
  COMMTRACE_GRID_STRIDE(i, n) { out[i] = apply(op, a[i], b[i]); }
}

// Offsets into a and b of out's linear index i (out contiguous, dims right-aligned).
template <typename T>
__global__ void binary_bcast_kernel(int op, const T* a, Dims ad, const T* b, Dims bd, T* out,
                                    Dims od, i64 n) {
  COMMTRACE_GRID_STRIDE(i, n) {
    i64 rest = i, ia = 0, ib = 0;
    for (int d = kMaxRank - 1; d >= kMaxRank - od.rank; --d) {
      const i64 idx = rest % od.size[d];
      rest /= od.size[d];
      ia += idx * ad.stride[d];
      ib += idx * bd.stride[d];
    }
    out[i] = apply(op, a[ia], b[ib]);
  }
}

template <typename T>
__global__ void dropout_kernel(const T* x, T* out, T* mask, i64 n, T p, std::uint64_t seed) {
  const T keep_scale = math::dropout_scale(p);
  COMMTRACE_GRID_STRIDE(i, n) {
    mask[i] = math::dropout_keep(seed, i, double(p)) ? keep_scale : T(0);
    out[i] = x[i] * mask[i];
  }
}

template <typename T>
__global__ void mul_kernel(const T* a, const T* b, T* out, i64 n) {
  COMMTRACE_GRID_STRIDE(i, n) { out[i] = a[i] * b[i]; }
}

// ---- conversion: the casts of ref::convert ----

template <typename Dst, typename Src>
__device__ Dst cast(Src v) {
  if constexpr (std::is_same_v<Src, Bf16>) {
    return cast<Dst>(bf16_bits_to_float(v.bits));
  } else if constexpr (std::is_same_v<Dst, Bf16>) {
    return Bf16{float_to_bf16_bits(float(v))};
  } else if constexpr (std::is_same_v<Dst, i64> && !std::is_same_v<Src, i64>) {
    const double d = double(v);  // truncation toward zero; NaN 0; saturating
    if (isnan(d)) return 0;
    if (d >= 0x1.0p63) return INT64_MAX;
    if (d < -0x1.0p63) return INT64_MIN;
    return i64(d);
  } else {
    return Dst(v);
  }
}

template <typename Src, typename Dst>
__global__ void convert_kernel(const Src* in, Dst* out, i64 n) {
  COMMTRACE_GRID_STRIDE(i, n) { out[i] = cast<Dst>(in[i]); }
}

template <typename Src>
void convert_from(cudaStream_t s, const Src* in, void* out, int out_dt, i64 n) {
  switch (out_dt) {
    case 0:
      return convert_kernel<<<grid_for(n), kThreads, 0, s>>>(in, static_cast<float*>(out), n);
    case 1:
      return convert_kernel<<<grid_for(n), kThreads, 0, s>>>(in, static_cast<double*>(out), n);
    case 2:
      return convert_kernel<<<grid_for(n), kThreads, 0, s>>>(in, static_cast<Bf16*>(out), n);
    default:
      return convert_kernel<<<grid_for(n), kThreads, 0, s>>>(in, static_cast<i64*>(out), n);
  }
}

template <typename U>
__global__ void fill_kernel(U* out, U v, i64 n) {
  COMMTRACE_GRID_STRIDE(i, n) { out[i] = v; }
}

template <typename T>
__global__ void sgd_kernel(T* p, const T* g, T* m, i64 n, T lr, T momentum, T wd, bool first) {
  COMMTRACE_GRID_STRIDE(i, n) {
    T unused = T(0);
    math::sgd_update(p[i], g[i], m ? m[i] : unused, lr, momentum, wd, first);
  }
}

template <typename T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, i64 n, T lr, T b1, T b2, T eps, T wd,
                             T c1, T c2) {
  COMMTRACE_GRID_STRIDE(i, n) {
    math::adamw_update(p[i], g[i], m[i], v[i], lr, b1, b2, eps, wd, c1, c2);
  }
}

}  // namespace

template <typename T>
void unary(cudaStream_t s, Unary op, const T* x, double scalar, T* out, i64 n) {
  if (n > 0) unary_kernel<<<grid_for(n), kThreads, 0, s>>>(op, x, T(scalar), out, n);
}

template <typename T>
void unary_backward(cudaStream_t s, UnaryGrad op, const T* g, const T* x, T* out, i64 n) {
  if (n > 0) unary_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(op, g, x, out, n);
}

template <typename T>
void binary(cudaStream_t s, int op, const T* a, const Dims& ad, const T* b, const Dims& bd, T* out,
            const Dims& od, i64 n) {
  if (n == 0) return;
  bool same = true;  // both operands laid out as out (size-1 dims aside): no index arithmetic
  i64 st = 1;
  for (int d = kMaxRank - 1; d >= kMaxRank - od.rank; --d) {
    if (od.size[d] == 1) continue;
    same = same && ad.stride[d] == st && bd.stride[d] == st;
    st *= od.size[d];
  }
  if (same) {
    binary_same_kernel<<<grid_for(n), kThreads, 0, s>>>(op, a, b, out, n);
  } else {
    binary_bcast_kernel<<<grid_for(n), kThreads, 0, s>>>(op, a, ad, b, bd, out, od, n);
  }
}

template <typename T>
void dropout_forward(cudaStream_t s, const T* x, T* out, T* mask, i64 n, T p, std::uint64_t seed) {
  if (n > 0) dropout_kernel<<<grid_for(n), kThreads, 0, s>>>(x, out, mask, n, p, seed);
}

template <typename T>
void mul(cudaStream_t s, const T* a, const T* b, T* out, i64 n) {
  if (n > 0) mul_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, out, n);
}

void convert(cudaStream_t s, const void* in, int in_dt, void* out, int out_dt, i64 n) {
  if (n == 0) return;
  switch (in_dt) {
    case 0:
      return convert_from(s, static_cast<const float*>(in), out, out_dt, n);
    case 1:
      return convert_from(s, static_cast<const double*>(in), out, out_dt, n);
    case 2:
      return convert_from(s, static_cast<const Bf16*>(in), out, out_dt, n);
    default:
      return convert_from(s, static_cast<const i64*>(in), out, out_dt, n);
  }
}

void fill_bits(cudaStream_t s, void* out, int elem_size, std::uint64_t bits, i64 n) {
  if (n == 0) return;
  switch (elem_size) {
    case 2:
      return fill_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<std::uint16_t*>(out),
                                                          std::uint16_t(bits), n);
    case 4:
      return fill_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<std::uint32_t*>(out),
                                                          std::uint32_t(bits), n);
    default:
      return fill_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<std::uint64_t*>(out), bits,
                                                          n);
  }
}

template <typename T>
void sgd_step(cudaStream_t s, T* p, const T* g, T* m, i64 n, T lr, T momentum, T wd, bool first) {
  if (n > 0) sgd_kernel<<<grid_for(n), kThreads, 0, s>>>(p, g, m, n, lr, momentum, wd, first);
}

template <typename T>
void adamw_step(cudaStream_t s, T* p, const T* g, T* m, T* v, i64 n, T lr, T b1, T b2, T eps, T wd,
                T c1, T c2) {
  if (n > 0) {
    adamw_kernel<<<grid_for(n), kThreads, 0, s>>>(p, g, m, v, n, lr, b1, b2, eps, wd, c1, c2);
  }
}

#define COMMTRACE_ELEMENTWISE(T)                                                               \
  template void unary<T>(cudaStream_t, Unary, const T*, double, T*, i64);                      \
  template void unary_backward<T>(cudaStream_t, UnaryGrad, const T*, const T*, T*, i64);       \
  template void binary<T>(cudaStream_t, int, const T*, const Dims&, const T*, const Dims&, T*, \
                          const Dims&, i64);                                                   \
  template void dropout_forward<T>(cudaStream_t, const T*, T*, T*, i64, T, std::uint64_t);     \
  template void mul<T>(cudaStream_t, const T*, const T*, T*, i64);                             \
  template void sgd_step<T>(cudaStream_t, T*, const T*, T*, i64, T, T, T, bool);               \
  template void adamw_step<T>(cudaStream_t, T*, const T*, T*, T*, i64, T, T, T, T, T, T, T);
COMMTRACE_ELEMENTWISE(float)
COMMTRACE_ELEMENTWISE(double)

}  // namespace commtrace::cuda
