// CPU layout kernels on contiguous row-major N-d buffers: permute, narrow and its inverse
// narrow_scatter, and element conversion between the storage dtypes (f32, f64, bf16, i64).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu.h"

namespace commtrace::cpu {
namespace {

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

}  // namespace

template <typename T>
void permute(const T* in, const Shape& in_shape, const std::vector<int>& perm, T* out) {
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

#define COMMTRACE_INSTANTIATE(T)                                                 \
  template void permute<T>(const T*, const Shape&, const std::vector<int>&, T*); \
  template void narrow<T>(const T*, const Shape&, int, i64, i64, T*);            \
  template void narrow_scatter<T>(const T*, const Shape&, int, i64, T*, const Shape&);
COMMTRACE_INSTANTIATE(float)
COMMTRACE_INSTANTIATE(double)
#undef COMMTRACE_INSTANTIATE

}  // namespace commtrace::cpu
