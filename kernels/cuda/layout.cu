// Data movement by element size (any dtype: bits are moved, never converted): strided gathers
// (permute), block copies (narrow and its scatter), and the bias rows a GEMM starts from.
#include "kernels/cuda/common.cuh"

namespace commtrace::cuda {
namespace {

template <typename U>
__global__ void gather_kernel(const U* in, Dims space, U* out, i64 n) {
  COMMTRACE_GRID_STRIDE(o, n) {
    i64 rest = o, src = 0;
    for (int d = kMaxRank - 1; d >= kMaxRank - space.rank; --d) {
      src += (rest % space.size[d]) * space.stride[d];
      rest /= space.size[d];
    }
    out[o] = in[src];
  }
}

template <typename U>
__global__ void blocks_kernel(const U* src, i64 sp, U* dst, i64 dp, i64 outer, i64 len) {
  COMMTRACE_GRID_STRIDE(k, outer * len) {
    const i64 o = k / len, j = k % len;
    dst[o * dp + j] = src[o * sp + j];
  }
}

template <typename T>
__global__ void fill_c_kernel(T* c, i64 batch, i64 m, i64 n, i64 ldc, i64 sc, const T* bias,
                              i64 bias_rows) {
  COMMTRACE_GRID_STRIDE(k, batch * m * n) {
    const i64 b = k / (m * n), i = k / n % m, j = k % n;
    c[b * sc + i * ldc + j] = bias ? bias[(bias_rows == 1 ? 0 : i) * n + j] : T(0);
  }
}

template <typename F>
void by_size(int elem_size, F f) {
  switch (elem_size) {
    case 2:
      return f(std::uint16_t{});
    case 4:
      return f(std::uint32_t{});
    default:
      return f(std::uint64_t{});
  }
}

}  // namespace

void gather_strided(cudaStream_t s, int elem_size, const void* in, const Dims& space, void* out,
                    i64 n) {
  if (n == 0) return;
  by_size(elem_size, [&](auto tag) {
    using U = decltype(tag);
    gather_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<const U*>(in), space,
                                                   static_cast<U*>(out), n);
  });
}

void copy_blocks(cudaStream_t s, int elem_size, const void* src, i64 sp, void* dst, i64 dp,
                 i64 outer, i64 len) {
  if (outer * len == 0) return;
  by_size(elem_size, [&](auto tag) {
    using U = decltype(tag);
    blocks_kernel<<<grid_for(outer * len), kThreads, 0, s>>>(static_cast<const U*>(src), sp,
                                                             static_cast<U*>(dst), dp, outer, len);
  });
}

template <typename T>
void fill_gemm_c(cudaStream_t s, T* c, i64 batch, i64 m, i64 n, i64 ldc, i64 sc, const T* bias,
                 i64 bias_rows) {
  const i64 total = batch * m * n;
  if (total > 0)
    fill_c_kernel<<<grid_for(total), kThreads, 0, s>>>(c, batch, m, n, ldc, sc, bias, bias_rows);
}

template void fill_gemm_c<float>(cudaStream_t, float*, i64, i64, i64, i64, i64, const float*, i64);
template void fill_gemm_c<double>(cudaStream_t, double*, i64, i64, i64, i64, i64, const double*,
                                  i64);
template void fill_gemm_c<std::uint16_t>(cudaStream_t, std::uint16_t*, i64, i64, i64, i64, i64,
                                         const std::uint16_t*, i64);

}  // namespace commtrace::cuda
