// Internal to the op families (ops_*.cpp): small helpers their entry checks, shape functions and
// kernel launches share. Not part of the public API.
#pragma once

#include <cstdint>
#include <utility>

#include "kernels/backend.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/op.h"
#include "parallel/tensor/ops.h"
#include "parallel/tensor/rules.h"

namespace commtrace::ops {

using i64 = std::int64_t;

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  COMMTRACE_CHECK(a.dtype() == b.dtype(), ErrorCode::InvalidArgument,
                  "{}: dtypes differ: {} and {}", op, describe(a), describe(b));
}

// The device buffer of an optional tensor (null when undefined).
inline void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
inline const i64* index_data(const Tensor& t) { return static_cast<const i64*>(t.data_ptr()); }
inline const Kernels& kernels_of(const Tensor& t) { return kernels_for(t.device()); }

inline i64 last_dim(const Shape& s) { return s.empty() ? 1 : s.back(); }
// (rows, cols) of a row-wise op over the last dim.
inline std::pair<i64, i64> rows_cols(const Shape& s) {
  const i64 cols = last_dim(s);
  return {cols ? numel(s) / cols : 0, cols};
}

// (outer, dim, inner) split of `shape` around dim d.
struct Split3 {
  i64 outer = 1, dim = 1, inner = 1;
};
inline Split3 split_at(const Shape& shape, int d) {
  Split3 s;
  for (int i = 0; i < int(shape.size()); ++i) {
    if (i < d) s.outer *= shape[std::size_t(i)];
    if (i == d) s.dim = shape[std::size_t(i)];
    if (i > d) s.inner *= shape[std::size_t(i)];
  }
  return s;
}

// Shape functions of the common cases.
inline void same_as_input0(std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
  out[0] = OutSpec{in[0].shape(), in[0].dtype()};
}

}  // namespace commtrace::ops
