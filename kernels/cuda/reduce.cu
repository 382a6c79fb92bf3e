// Reductions: sums over a dim, over everything, back to a broadcast shape, and the collectives'
// reduce across ranks' buffers. Scatter sums accumulate in T in the reference's index order (one
// thread per output element); sum_all accumulates in double.
#include "kernels/cuda/common.cuh"

namespace commtrace::cuda {
namespace {

template <typename T>
__global__ void sum_dim_kernel(const T* x, T* out, i64 outer, i64 dim, i64 inner) {
  COMMTRACE_GRID_STRIDE(k, outer * inner) {
    const i64 o = k / inner, i = k % inner;
    T acc = T(0);
    for (i64 j = 0; j < dim; ++j) acc += x[(o * dim + j) * inner + i];
    out[k] = acc;
  }
}

template <typename T>
__global__ void sum_all_kernel(const T* x, T* out, i64 n) {
  double s = 0;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = T(s);
}

// Output o fixes the kept dims (row-major over them); the summed dims are walked row-major, so
// the input is read in increasing index order, as the reference adds it.
template <typename T>
__global__ void sum_to_kernel(const T* in, Dims d, Dims summed, T* out, i64 out_n) {
  COMMTRACE_GRID_STRIDE(o, out_n) {
    i64 rest = o, base = 0, combos = 1;
    for (int k = kMaxRank - 1; k >= kMaxRank - d.rank; --k) {
      if (summed.size[k]) {
        combos *= d.size[k];
      } else {
        base += (rest % d.size[k]) * d.stride[k];
        rest /= d.size[k];
      }
    }
    T acc = T(0);
    for (i64 c = 0; c < combos; ++c) {
      i64 r = c, off = base;
      for (int k = kMaxRank - 1; k >= kMaxRank - d.rank; --k) {
        if (!summed.size[k]) continue;
        off += (r % d.size[k]) * d.stride[k];
        r /= d.size[k];
      }
      acc += in[off];
    }
    out[o] = acc;
  }
}

template <typename T, typename A>
__device__ A load(const void* p, i64 i) {
  if constexpr (std::is_same_v<T, Bf16>) {
    return bf16_bits_to_float(static_cast<const Bf16*>(p)[i].bits);
  } else {
    return static_cast<const T*>(p)[i];
  }
}
template <typename T, typename A>
__device__ void store(void* p, i64 i, A v) {
  if constexpr (std::is_same_v<T, Bf16>) {
    static_cast<Bf16*>(p)[i].bits = float_to_bf16_bits(v);
  } else {
    static_cast<T*>(p)[i] = v;
  }
}

// All sources of element i are read before its destinations are written: a dst may alias a src.
template <typename T, typename A>
__global__ void reduce_kernel(int op, Peers p, int n_srcs, int n_dsts, i64 begin, i64 end) {
  COMMTRACE_GRID_STRIDE(k, end - begin) {
    const i64 i = begin + k;
    A acc = load<T, A>(p.src[0], i);
    for (int s = 1; s < n_srcs; ++s) {
      const A v = load<T, A>(p.src[s], i);
      if (op == 3) {
        acc = v > acc ? v : acc;
      } else {
        acc += v;
      }
    }
    if (op == 2) acc /= A(n_srcs);
    for (int d = 0; d < n_dsts; ++d) store<T, A>(p.dst[d], i, acc);
  }
}

}  // namespace

template <typename T>
void sum_dim(cudaStream_t s, const T* x, T* out, i64 outer, i64 dim, i64 inner) {
  if (outer * inner > 0)
    sum_dim_kernel<<<grid_for(outer * inner), kThreads, 0, s>>>(x, out, outer, dim, inner);
}

template <typename T>
void sum_all(cudaStream_t s, const T* x, T* out, i64 n) {
  sum_all_kernel<<<1, kThreads, 0, s>>>(x, out, n);
}

template <typename T>
void sum_to(cudaStream_t s, const T* in, const Dims& d, const Dims& summed, T* out, i64 out_n) {
  if (out_n > 0) sum_to_kernel<<<grid_for(out_n), kThreads, 0, s>>>(in, d, summed, out, out_n);
}

void reduce(cudaStream_t s, int dt, int op, const Peers& p, int n_srcs, int n_dsts, i64 begin,
            i64 end) {
  if (end <= begin) return;
  const unsigned g = grid_for(end - begin);
  switch (dt) {
    case 0:
      return reduce_kernel<float, float><<<g, kThreads, 0, s>>>(op, p, n_srcs, n_dsts, begin, end);
    case 1:
      return reduce_kernel<double, double>
          <<<g, kThreads, 0, s>>>(op, p, n_srcs, n_dsts, begin, end);
    case 2:
      return reduce_kernel<Bf16, float><<<g, kThreads, 0, s>>>(op, p, n_srcs, n_dsts, begin, end);
    default:
      return reduce_kernel<i64, i64><<<g, kThreads, 0, s>>>(op, p, n_srcs, n_dsts, begin, end);
  }
}

#define COMMTRACE_REDUCE(T)                                            \
  template void sum_dim<T>(cudaStream_t, const T*, T*, i64, i64, i64); \
  template void sum_all<T>(cudaStream_t, const T*, T*, i64);           \
  template void sum_to<T>(cudaStream_t, const T*, const Dims&, const Dims&, T*, i64);
COMMTRACE_REDUCE(float)
COMMTRACE_REDUCE(double)

}  // namespace commtrace::cuda
