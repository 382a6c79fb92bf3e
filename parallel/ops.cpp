#include "parallel/ops.h"

#include <chrono>

#include "kernels/cpu.h"
#include "parallel/autograd.h"
#include "tracer/tracer.h"

namespace commtrace {

using detail::dispatch;
using detail::normalize_dim;
using detail::OpDef;
using detail::run_kernels;
using i64 = std::int64_t;

namespace {

// Calls f(T{}) with T = double for f64 and float otherwise (bf16 arrives widened to f32).
template <class F>
void by_float(DType dt, F&& f) {
  COMMTRACE_CHECK(is_floating(dt), ErrorCode::InvalidArgument, "expected a floating tensor, got {}",
                  dtype_name(dt));
  if (dt == DType::F64) {
    f(double{});
  } else {
    f(float{});
  }
}

Tensor empty_as(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), like.device());
}

// A plain conversion outside the dispatcher (bf16 widening inside dispatch itself).
Tensor convert_untraced(const Tensor& x, DType dt) {
  Tensor out = Tensor::empty(x.shape(), dt, x.device());
  if (run_kernels(x.device())) {
    cpu::convert(x.raw_data(dtype_size(x.dtype())), x.dtype(), out.raw_data(dtype_size(dt)), dt,
                 x.numel());
  }
  return out;
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  COMMTRACE_CHECK(a.dtype() == b.dtype(), ErrorCode::InvalidArgument,
                  "{}: dtypes differ: {} and {}", op, describe(a), describe(b));
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const i64 da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const i64 db = i < b.size() ? b[b.size() - 1 - i] : 1;
    COMMTRACE_CHECK(da == db || da == 1 || db == 1, ErrorCode::ShapeMismatch,
                    "{}: shapes {} and {} do not broadcast", op, shape_str(a), shape_str(b));
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

// (outer, dim, inner) split of `shape` around `d`.
struct Split3 {
  i64 outer = 1, dim = 1, inner = 1;
};
Split3 split_at(const Shape& shape, int d) {
  Split3 s;
  for (int i = 0; i < int(shape.size()); ++i) {
    if (i < d) s.outer *= shape[std::size_t(i)];
    if (i == d) s.dim = shape[std::size_t(i)];
    if (i > d) s.inner *= shape[std::size_t(i)];
  }
  return s;
}

i64 last_dim(const Tensor& x) { return x.dim() == 0 ? 1 : x.shape().back(); }

Tensor binary_op(cpu::BinaryOp op, const OpDef& def, const Tensor& a, const Tensor& b) {
  check_same_dtype(a, b, def.name);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), def.name);
  return dispatch(def, {a, b}, [&](const std::vector<Tensor>& in) {
    Tensor out = empty_as(shape, in[0]);
    if (run_kernels(out.device())) {
      by_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::binary<T>(op, in[0].data<T>(), in[0].shape(), in[1].data<T>(), in[1].shape(),
                       out.data<T>(), shape);
      });
    }
    return out;
  });
}

// Elementwise unary op with a kernel f(in, out, n).
template <class K>
Tensor unary_op(const OpDef& def, const std::vector<Tensor>& inputs, K kernel) {
  return dispatch(def, inputs, [&](const std::vector<Tensor>& in) {
    Tensor out = empty_as(in[0].shape(), in[0]);
    if (run_kernels(out.device())) {
      by_float(out.dtype(), [&](auto tag) { kernel(tag, in, out); });
    }
    return out;
  });
}

}  // namespace

namespace detail {

bool run_kernels(Device d) {
  switch (d) {
    case Device::CPU:
      return true;
    case Device::Meta:
      return false;
    case Device::CUDA:
      break;
  }
  throw Error(ErrorCode::Unsupported,
              "cuda: this build has no CUDA kernels yet (the CUDA backend is a later issue)");
}

int normalize_dim(int dim, int rank, const char* op) {
  const int r = std::max(rank, 1);
  COMMTRACE_CHECK(dim >= -r && dim < r, ErrorCode::InvalidArgument,
                  "{}: dim {} out of range for a {}-d tensor", op, dim, rank);
  return dim < 0 ? dim + r : dim;
}

Tensor dispatch(const OpDef& op, const std::vector<Tensor>& inputs, const Compute& compute,
                const std::vector<Shape>* recorded_shapes) {
  bool has_bf16 = false;
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (first) {
      COMMTRACE_CHECK(t.device() == first->device(), ErrorCode::InvalidArgument,
                      "{}: inputs on different devices: {} and {}", op.name, describe(*first),
                      describe(t));
    } else {
      first = &t;
    }
    has_bf16 = has_bf16 || t.dtype() == DType::BF16;
  }
  Tracer* tracer = Tracer::current();
  const auto start =
      tracer ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};

  Tensor out;
  if (has_bf16 && op.widen_bf16) {
    std::vector<Tensor> wide;
    wide.reserve(inputs.size());
    for (const Tensor& t : inputs) {
      wide.push_back(t.defined() && t.dtype() == DType::BF16 ? convert_untraced(t, DType::F32) : t);
    }
    out = compute(wide);
    if (out.dtype() == DType::F32) out = convert_untraced(out, DType::BF16);
  } else {
    out = compute(inputs);
  }

  if (tracer) {
    OpRecord r;
    r.kind = op.kind;
    r.name = op.name;
    r.overload = op.overload;
    r.dtype = first ? first->dtype() : out.dtype();
    std::size_t i = 0;
    for (const Tensor& t : inputs) {
      if (t.defined()) {
        const Shape& s = recorded_shapes ? (*recorded_shapes)[i] : t.shape();
        r.inputs.push_back(TensorMeta{s, s, {}});
      }
      ++i;
    }
    r.outputs.push_back(TensorMeta{out.shape(), out.shape(), {}});
    r.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tracer->record(std::move(r));
  }
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------- creation and copies

Tensor ones_like(const Tensor& x) {
  static const OpDef def{"ones_like", "default", EventKind::Compute, false};
  return dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    return Tensor::full(in[0].shape(), 1.0, in[0].dtype(), in[0].device());
  });
}

Tensor zeros_like(const Tensor& x) {
  static const OpDef def{"zeros_like", "default", EventKind::Compute, false};
  return dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    return Tensor::zeros(in[0].shape(), in[0].dtype(), in[0].device());
  });
}

Tensor clone(const Tensor& x) {
  static const OpDef def{"clone", "default", EventKind::Compute, false};
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    return convert_untraced(in[0], in[0].dtype());
  });
  attach_grad(out, "CloneBackward", {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  static const OpDef def{"_to_copy", "default", EventKind::Compute, false};
  Tensor out = dispatch(
      def, {x}, [&](const std::vector<Tensor>& in) { return convert_untraced(in[0], dtype); });
  if (is_floating(dtype)) {
    const DType src = x.dtype();
    attach_grad(out, "ToCopyBackward", {x},
                [src](const Tensor& g) { return std::vector<Tensor>{to_dtype(g, src)}; });
  }
  return out;
}

// ---------------------------------------------------------------- views and layout

Tensor view(const Tensor& x, Shape shape) {
  static const OpDef def{"view", "default", EventKind::Trivial, false};
  int infer = -1;
  i64 known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      COMMTRACE_CHECK(infer < 0, ErrorCode::InvalidArgument, "view: more than one -1 in {}",
                      shape_str(shape));
      infer = int(i);
    } else {
      COMMTRACE_CHECK(shape[i] >= 0, ErrorCode::InvalidArgument, "view: bad size in {}",
                      shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    COMMTRACE_CHECK(known > 0 && x.numel() % known == 0, ErrorCode::ShapeMismatch,
                    "view: cannot view {} as {}", describe(x), shape_str(shape));
    shape[std::size_t(infer)] = x.numel() / known;
  }
  COMMTRACE_CHECK(numel(shape) == x.numel(), ErrorCode::ShapeMismatch,
                  "view: cannot view {} ({} elements) as {}", describe(x), x.numel(),
                  shape_str(shape));
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    Tensor v = in[0].detach();
    v.impl()->shape = shape;
    return v;
  });
  const Shape src = x.shape();
  attach_grad(out, "ViewBackward", {x},
              [src](const Tensor& g) { return std::vector<Tensor>{view(g, src)}; });
  return out;
}

namespace {
Tensor transpose_impl(const Tensor& x, int d0, int d1, const OpDef& def) {
  Shape shape = x.shape();
  std::swap(shape[std::size_t(d0)], shape[std::size_t(d1)]);
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(shape, in[0]);
    if (run_kernels(o.device())) {
      std::vector<int> perm(std::size_t(in[0].dim()));
      for (int i = 0; i < in[0].dim(); ++i) perm[std::size_t(i)] = i;
      std::swap(perm[std::size_t(d0)], perm[std::size_t(d1)]);
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::permute<T>(in[0].data<T>(), in[0].shape(), perm, o.data<T>());
      });
    }
    return o;
  });
  attach_grad(out, "TransposeBackward", {x}, [d0, d1, &def](const Tensor& g) {
    return std::vector<Tensor>{transpose_impl(g, d0, d1, def)};
  });
  return out;
}
}  // namespace

Tensor t(const Tensor& x) {
  static const OpDef def{"t", "default", EventKind::Trivial};
  COMMTRACE_CHECK(x.dim() == 2, ErrorCode::InvalidArgument, "t: expected a 2-d tensor, got {}",
                  describe(x));
  return transpose_impl(x, 0, 1, def);
}

Tensor transpose(const Tensor& x, int d0, int d1) {
  static const OpDef def{"transpose", "int", EventKind::Trivial};
  d0 = normalize_dim(d0, x.dim(), "transpose");
  d1 = normalize_dim(d1, x.dim(), "transpose");
  return transpose_impl(x, d0, d1, def);
}

Tensor narrow(const Tensor& x, int dim, i64 start, i64 len) {
  static const OpDef def{"slice", "Tensor", EventKind::Trivial};
  static const OpDef back_def{"slice_backward", "default", EventKind::Compute};
  dim = normalize_dim(dim, x.dim(), "narrow");
  const i64 size = x.shape()[std::size_t(dim)];
  COMMTRACE_CHECK(start >= 0 && len >= 0 && start + len <= size, ErrorCode::InvalidArgument,
                  "narrow: [{}, {}) out of range [0, {}] on dim {} of {}", start, start + len, size,
                  dim, describe(x));
  Shape shape = x.shape();
  shape[std::size_t(dim)] = len;
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(shape, in[0]);
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::narrow<T>(in[0].data<T>(), in[0].shape(), dim, start, len, o.data<T>());
      });
    }
    return o;
  });
  const Shape full = x.shape();
  attach_grad(out, "SliceBackward", {x}, [full, dim, start](const Tensor& g) {
    Tensor gx = dispatch(back_def, {g}, [&](const std::vector<Tensor>& in) {
      Tensor o = Tensor::zeros(full, in[0].dtype(), in[0].device());
      if (run_kernels(o.device())) {
        by_float(o.dtype(), [&](auto tag) {
          using T = decltype(tag);
          cpu::narrow_scatter<T>(in[0].data<T>(), in[0].shape(), dim, start, o.data<T>(), full);
        });
      }
      return o;
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int dim) {
  static const OpDef def{"cat", "default", EventKind::Compute};
  COMMTRACE_CHECK(!xs.empty(), ErrorCode::InvalidArgument, "cat: no tensors");
  dim = normalize_dim(dim, xs[0].dim(), "cat");
  Shape shape = xs[0].shape();
  shape[std::size_t(dim)] = 0;
  std::vector<i64> sizes;
  for (const Tensor& x : xs) {
    check_same_dtype(xs[0], x, "cat");
    bool fits = x.dim() == xs[0].dim();
    for (int i = 0; fits && i < x.dim(); ++i) {
      fits = i == dim || x.shape()[std::size_t(i)] == xs[0].shape()[std::size_t(i)];
    }
    COMMTRACE_CHECK(fits, ErrorCode::ShapeMismatch, "cat: {} does not fit {} along dim {}",
                    describe(x), describe(xs[0]), dim);
    sizes.push_back(x.shape()[std::size_t(dim)]);
    shape[std::size_t(dim)] += sizes.back();
  }
  Tensor out = dispatch(def, xs, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(shape, in[0]);
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        i64 start = 0;
        for (const Tensor& x : in) {
          cpu::narrow_scatter<T>(x.data<T>(), x.shape(), dim, start, o.data<T>(), shape);
          start += x.shape()[std::size_t(dim)];
        }
      });
    }
    return o;
  });
  attach_grad(out, "CatBackward", xs, [sizes, dim](const Tensor& g) {
    std::vector<Tensor> grads;
    i64 start = 0;
    for (i64 s : sizes) {
      grads.push_back(narrow(g, dim, start, s));
      start += s;
    }
    return grads;
  });
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  static const OpDef def{"expand", "default", EventKind::Compute};
  COMMTRACE_CHECK(broadcast_shapes(x.shape(), shape, "expand") == shape, ErrorCode::ShapeMismatch,
                  "expand: {} cannot expand to {}", describe(x), shape_str(shape));
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(shape, in[0]);
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T zero = 0;  // broadcast copy: x + 0 over the target shape
        cpu::binary<T>(cpu::BinaryOp::Add, in[0].data<T>(), in[0].shape(), &zero, Shape{},
                       o.data<T>(), shape);
      });
    }
    return o;
  });
  const Shape src = x.shape();
  attach_grad(out, "ExpandBackward", {x},
              [src](const Tensor& g) { return std::vector<Tensor>{sum_to(g, src)}; });
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  static const OpDef def{"sum", "dim_IntList", EventKind::Compute};
  if (x.shape() == shape) return x;
  COMMTRACE_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(),
                  ErrorCode::ShapeMismatch, "sum_to: {} does not reduce to {}", describe(x),
                  shape_str(shape));
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(shape, in[0]);
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::sum_to<T>(in[0].data<T>(), in[0].shape(), o.data<T>(), shape);
      });
    }
    return o;
  });
  const Shape src = x.shape();
  attach_grad(out, "SumToBackward", {x},
              [src](const Tensor& g) { return std::vector<Tensor>{expand(g, src)}; });
  return out;
}

// ---------------------------------------------------------------- GEMM

Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& bias, bool trans_a, bool trans_b) {
  static const OpDef mm_def{"mm", "default", EventKind::Gemm};
  static const OpDef addmm_def{"addmm", "default", EventKind::Gemm};
  static const OpDef bmm_def{"bmm", "default", EventKind::Gemm};
  const int rank = a.dim();
  COMMTRACE_CHECK((rank == 2 || rank == 3) && b.dim() == rank, ErrorCode::ShapeMismatch,
                  "gemm: expected two 2-d or two 3-d tensors, got {} and {}", describe(a),
                  describe(b));
  check_same_dtype(a, b, "gemm");
  const char* name = rank == 3 ? "bmm" : bias.defined() ? "addmm" : "mm";
  const i64 batch = rank == 3 ? a.size(0) : 1;
  COMMTRACE_CHECK(rank == 2 || b.size(0) == batch, ErrorCode::ShapeMismatch,
                  "bmm: batch sizes differ: {} and {}", describe(a), describe(b));
  const i64 ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bc = b.size(-1);
  const i64 m = trans_a ? ac : ar, k = trans_a ? ar : ac;
  const i64 kb = trans_b ? bc : br, n = trans_b ? br : bc;
  Shape op_a = rank == 3 ? Shape{batch, m, k} : Shape{m, k};
  Shape op_b = rank == 3 ? Shape{batch, kb, n} : Shape{kb, n};
  COMMTRACE_CHECK(k == kb, ErrorCode::ShapeMismatch,
                  "{}: cannot multiply {} by {} (inner dims {} and {})", name, shape_str(op_a),
                  shape_str(op_b), k, kb);
  Shape out_shape = rank == 3 ? Shape{batch, m, n} : Shape{m, n};
  std::vector<Tensor> inputs{a, b};
  std::vector<Shape> recorded{op_a, op_b};
  if (bias.defined()) {
    COMMTRACE_CHECK(rank == 2, ErrorCode::InvalidArgument, "bmm: no bias");
    check_same_dtype(a, bias, "addmm");
    const Shape& bs = bias.shape();
    COMMTRACE_CHECK((bs == Shape{n} || bs == Shape{1, n} || bs == Shape{m, n}),
                    ErrorCode::ShapeMismatch, "addmm: bias {} does not broadcast to {}",
                    describe(bias), shape_str(out_shape));
    inputs.insert(inputs.begin(), bias);
    recorded.insert(recorded.begin(), bs);
  }
  const OpDef& def = rank == 3 ? bmm_def : bias.defined() ? addmm_def : mm_def;
  return dispatch(
      def, inputs,
      [&](const std::vector<Tensor>& in) {
        const Tensor& A = in[bias.defined() ? 1 : 0];
        const Tensor& B = in[bias.defined() ? 2 : 1];
        Tensor o = empty_as(out_shape, A);
        if (!run_kernels(o.device())) return o;
        by_float(o.dtype(), [&](auto tag) {
          using T = decltype(tag);
          T* c = o.data<T>();
          T beta = 0;
          if (bias.defined()) {
            const T* pb = in[0].data<T>();
            const bool full = in[0].numel() == m * n;
            for (i64 i = 0; i < m; ++i) {
              std::copy(pb + (full ? i * n : 0), pb + (full ? i * n : 0) + n, c + i * n);
            }
            beta = 1;
          }
          for (i64 bi = 0; bi < batch; ++bi) {
            cpu::gemm<T>(trans_a, trans_b, m, n, k, T(1), A.data<T>() + bi * ar * ac, ac,
                         B.data<T>() + bi * br * bc, bc, beta, c + bi * m * n, n);
          }
        });
        return o;
      },
      &recorded);
}

namespace {
// The backward of out = op(a) @ op(b) for the plain (untransposed) products mm and bmm.
std::vector<Tensor> matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, bool need_a,
                                    bool need_b) {
  return {need_a ? gemm(g, b, Tensor(), false, true) : Tensor(),
          need_b ? gemm(a, g, Tensor(), true, false) : Tensor()};
}
}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  COMMTRACE_CHECK(a.dim() == 2 && b.dim() == 2, ErrorCode::ShapeMismatch,
                  "mm: expected 2-d tensors, got {} and {}", describe(a), describe(b));
  Tensor out = gemm(a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  attach_grad(out, "MmBackward", {a, b}, [a, b, need_a, need_b](const Tensor& g) {
    return matmul_backward(g, a, b, need_a, need_b);
  });
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  COMMTRACE_CHECK(a.dim() == 3 && b.dim() == 3, ErrorCode::ShapeMismatch,
                  "bmm: expected 3-d tensors, got {} and {}", describe(a), describe(b));
  Tensor out = gemm(a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  attach_grad(out, "BmmBackward", {a, b}, [a, b, need_a, need_b](const Tensor& g) {
    return matmul_backward(g, a, b, need_a, need_b);
  });
  return out;
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b) {
  COMMTRACE_CHECK(a.dim() == 2 && b.dim() == 2, ErrorCode::ShapeMismatch,
                  "addmm: expected 2-d tensors, got {} and {}", describe(a), describe(b));
  Tensor out = gemm(a, b, bias);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Shape bias_shape = bias.shape();
  attach_grad(out, "AddmmBackward", {bias, a, b},
              [a, b, need_a, need_b, bias_shape](const Tensor& g) {
                std::vector<Tensor> ab = matmul_backward(g, a, b, need_a, need_b);
                return std::vector<Tensor>{sum_to(g, bias_shape), ab[0], ab[1]};
              });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  COMMTRACE_CHECK(w.dim() == 2, ErrorCode::ShapeMismatch, "linear: weight {} is not 2-d",
                  describe(w));
  COMMTRACE_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), ErrorCode::ShapeMismatch,
                  "linear: input {} has {} features, weight {} expects {}", describe(x),
                  x.dim() ? x.size(-1) : 0, describe(w), w.size(1));
  COMMTRACE_CHECK(!b.defined() || b.shape() == Shape{w.size(0)}, ErrorCode::ShapeMismatch,
                  "linear: bias {} does not match weight {}", describe(b), describe(w));
  // x (..., in) is flattened to (N, in); y (N, out) = x wᵀ + b, recorded as addmm / mm.
  const Tensor x2 = x.dim() == 2 ? x : view(x, {-1, w.size(1)});
  Tensor y = gemm(x2, w, b, false, true);
  const bool need_x = x2.requires_grad(), need_w = w.requires_grad();
  attach_grad(y, b.defined() ? "AddmmBackward" : "MmBackward", {x2, w, b},
              [x2, w, need_x, need_w, has_bias = b.defined()](const Tensor& g) {
                return std::vector<Tensor>{need_x ? gemm(g, w) : Tensor(),
                                           need_w ? gemm(g, x2, Tensor(), true, false) : Tensor(),
                                           has_bias ? sum(g, 0) : Tensor()};
              });
  if (x.dim() == 2) return y;
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  return view(y, out_shape);
}

// ---------------------------------------------------------------- elementwise

Tensor add(const Tensor& a, const Tensor& b) {
  static const OpDef def{"add", "Tensor", EventKind::Compute};
  Tensor out = binary_op(cpu::BinaryOp::Add, def, a, b);
  attach_grad(out, "AddBackward", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  static const OpDef def{"sub", "Tensor", EventKind::Compute};
  Tensor out = binary_op(cpu::BinaryOp::Sub, def, a, b);
  attach_grad(out, "SubBackward", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(mul(g, -1.0), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  static const OpDef def{"mul", "Tensor", EventKind::Compute};
  Tensor out = binary_op(cpu::BinaryOp::Mul, def, a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  attach_grad(out, "MulBackward", {a, b}, [a, b, need_a, need_b](const Tensor& g) {
    return std::vector<Tensor>{need_a ? sum_to(mul(g, b), a.shape()) : Tensor(),
                               need_b ? sum_to(mul(g, a), b.shape()) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  static const OpDef def{"div", "Tensor", EventKind::Compute};
  Tensor out = binary_op(cpu::BinaryOp::Div, def, a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  attach_grad(out, "DivBackward", {a, b}, [a, b, need_a, need_b](const Tensor& g) {
    // d(a/b)/db = -a / b²
    return std::vector<Tensor>{
        need_a ? sum_to(div(g, b), a.shape()) : Tensor(),
        need_b ? sum_to(mul(div(mul(g, a), mul(b, b)), -1.0), b.shape()) : Tensor()};
  });
  return out;
}

Tensor mul(const Tensor& a, double s) {
  static const OpDef def{"mul", "Scalar", EventKind::Compute};
  Tensor out = unary_op(def, {a}, [s](auto tag, const std::vector<Tensor>& in, Tensor& o) {
    using T = decltype(tag);
    cpu::scale<T>(in[0].data<T>(), T(s), o.data<T>(), o.numel());
  });
  attach_grad(out, "MulBackward", {a},
              [s](const Tensor& g) { return std::vector<Tensor>{mul(g, s)}; });
  return out;
}

Tensor add(const Tensor& a, double s) {
  static const OpDef def{"add", "Scalar", EventKind::Compute};
  Tensor out = unary_op(def, {a}, [s](auto tag, const std::vector<Tensor>& in, Tensor& o) {
    using T = decltype(tag);
    cpu::add_scalar<T>(in[0].data<T>(), T(s), o.data<T>(), o.numel());
  });
  attach_grad(out, "AddBackward", {a}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor relu(const Tensor& x) {
  static const OpDef def{"relu", "default", EventKind::Compute};
  static const OpDef back{"threshold_backward", "default", EventKind::Compute};
  Tensor out = unary_op(def, {x}, [](auto tag, const std::vector<Tensor>& in, Tensor& o) {
    using T = decltype(tag);
    cpu::relu_forward<T>(in[0].data<T>(), o.data<T>(), o.numel());
  });
  attach_grad(out, "ReluBackward", {x}, [x](const Tensor& g) {
    return std::vector<Tensor>{
        unary_op(back, {g, x}, [](auto tag, const std::vector<Tensor>& in, Tensor& o) {
          using T = decltype(tag);
          cpu::relu_backward<T>(in[0].data<T>(), in[1].data<T>(), o.data<T>(), o.numel());
        })};
  });
  return out;
}

Tensor gelu(const Tensor& x) {
  static const OpDef def{"gelu", "default", EventKind::Compute};
  static const OpDef back{"gelu_backward", "default", EventKind::Compute};
  Tensor out = unary_op(def, {x}, [](auto tag, const std::vector<Tensor>& in, Tensor& o) {
    using T = decltype(tag);
    cpu::gelu_forward<T>(in[0].data<T>(), o.data<T>(), o.numel());
  });
  attach_grad(out, "GeluBackward", {x}, [x](const Tensor& g) {
    return std::vector<Tensor>{
        unary_op(back, {g, x}, [](auto tag, const std::vector<Tensor>& in, Tensor& o) {
          using T = decltype(tag);
          cpu::gelu_backward<T>(in[0].data<T>(), in[1].data<T>(), o.data<T>(), o.numel());
        })};
  });
  return out;
}

Tensor dropout(const Tensor& x, double p, std::uint64_t seed) {
  static const OpDef def{"native_dropout", "default", EventKind::Compute};
  static const OpDef back{"native_dropout_backward", "default", EventKind::Compute};
  COMMTRACE_CHECK(p >= 0.0 && p < 1.0, ErrorCode::InvalidArgument,
                  "dropout: p = {} out of range [0, 1)", p);
  if (p == 0.0) return x;
  Tensor mask;
  Tensor out = unary_op(def, {x}, [&](auto tag, const std::vector<Tensor>& in, Tensor& o) {
    using T = decltype(tag);
    mask = empty_as(o.shape(), o);
    cpu::dropout_forward<T>(in[0].data<T>(), o.data<T>(), mask.data<T>(), o.numel(), T(p), seed);
  });
  if (!mask.defined()) mask = empty_as(x.shape(), out);  // meta: shape only
  attach_grad(out, "NativeDropoutBackward", {x}, [mask](const Tensor& g) {
    return std::vector<Tensor>{binary_op(cpu::BinaryOp::Mul, back, g, to_dtype(mask, g.dtype()))};
  });
  return out;
}

// ---------------------------------------------------------------- normalization, attention

Tensor softmax(const Tensor& x) {
  static const OpDef def{"_softmax", "default", EventKind::Compute};
  static const OpDef back{"_softmax_backward_data", "default", EventKind::Compute};
  const i64 cols = last_dim(x), rows = cols ? x.numel() / cols : 0;
  Tensor out = unary_op(def, {x}, [&](auto tag, const std::vector<Tensor>& in, Tensor& o) {
    using T = decltype(tag);
    cpu::softmax_forward<T>(in[0].data<T>(), o.data<T>(), rows, cols);
  });
  attach_grad(out, "SoftmaxBackward", {x}, [y = out.detach(), rows, cols](const Tensor& g) {
    return std::vector<Tensor>{
        unary_op(back, {g, y}, [&](auto tag, const std::vector<Tensor>& in, Tensor& o) {
          using T = decltype(tag);
          cpu::softmax_backward<T>(in[0].data<T>(), in[1].data<T>(), o.data<T>(), rows, cols);
        })};
  });
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  static const OpDef def{"native_layer_norm", "default", EventKind::Compute};
  static const OpDef back{"native_layer_norm_backward", "default", EventKind::Compute};
  const i64 cols = last_dim(x), rows = cols ? x.numel() / cols : 0;
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    COMMTRACE_CHECK(p->shape() == Shape{cols}, ErrorCode::ShapeMismatch,
                    "layer_norm: affine parameter {} does not match normalized size {} of {}",
                    describe(*p), cols, describe(x));
    check_same_dtype(x, *p, "layer_norm");
  }
  // Saved statistics are f32 for f32/bf16 inputs and f64 for f64 inputs.
  Tensor mean, rstd;
  Tensor out = dispatch(def, {x, weight, bias}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(in[0].shape(), in[0]);
    mean = Tensor::empty({rows}, o.dtype(), o.device());
    rstd = Tensor::empty({rows}, o.dtype(), o.device());
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::layernorm_forward<T>(in[0].data<T>(), in[1].defined() ? in[1].data<T>() : nullptr,
                                  in[2].defined() ? in[2].data<T>() : nullptr, o.data<T>(),
                                  mean.data<T>(), rstd.data<T>(), rows, cols, T(eps));
      });
    }
    return o;
  });
  attach_grad(
      out, "NativeLayerNormBackward", {x, weight, bias},
      [x, weight, has_bias = bias.defined(), mean, rstd, rows, cols](const Tensor& g) {
        Tensor gw, gb;
        Tensor gx = dispatch(back, {g, x, weight, mean, rstd}, [&](const std::vector<Tensor>& in) {
          Tensor o = empty_as(in[0].shape(), in[0]);
          const bool affine = in[2].defined();
          if (affine) gw = Tensor::zeros({cols}, o.dtype(), o.device());
          if (has_bias) gb = Tensor::zeros({cols}, o.dtype(), o.device());
          if (run_kernels(o.device())) {
            by_float(o.dtype(), [&](auto tag) {
              using T = decltype(tag);
              cpu::layernorm_backward<T>(
                  in[0].data<T>(), in[1].data<T>(), affine ? in[2].data<T>() : nullptr,
                  in[3].data<T>(), in[4].data<T>(), o.data<T>(), affine ? gw.data<T>() : nullptr,
                  has_bias ? gb.data<T>() : nullptr, rows, cols);
            });
          }
          return o;
        });
        // Affine gradients come back in the dispatch dtype; match the parameters' dtype.
        if (gw.defined() && gw.dtype() != weight.dtype()) gw = to_dtype(gw, weight.dtype());
        if (gb.defined() && gb.dtype() != g.dtype()) gb = to_dtype(gb, g.dtype());
        return std::vector<Tensor>{gx, gw, gb};
      });
  return out;
}

Tensor embedding(const Tensor& idx, const Tensor& weight) {
  static const OpDef def{"embedding", "default", EventKind::Compute};
  static const OpDef back{"embedding_dense_backward", "default", EventKind::Compute};
  COMMTRACE_CHECK(idx.dtype() == DType::I64, ErrorCode::InvalidArgument,
                  "embedding: indices must be i64, got {}", describe(idx));
  COMMTRACE_CHECK(weight.dim() == 2, ErrorCode::ShapeMismatch, "embedding: weight {} is not 2-d",
                  describe(weight));
  const i64 vocab = weight.size(0), dim = weight.size(1), n = idx.numel();
  Shape shape = idx.shape();
  shape.push_back(dim);
  Tensor out = dispatch(def, {weight, idx}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(shape, in[0]);
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::embedding_forward<T>(in[1].data<i64>(), n, in[0].data<T>(), 0, vocab, vocab, dim,
                                  o.data<T>());
      });
    }
    return o;
  });
  attach_grad(out, "EmbeddingBackward", {weight}, [idx, vocab, dim, n](const Tensor& g) {
    Tensor gw = dispatch(back, {g, idx}, [&](const std::vector<Tensor>& in) {
      Tensor o = Tensor::zeros({vocab, dim}, in[0].dtype(), in[0].device());
      if (run_kernels(o.device())) {
        by_float(o.dtype(), [&](auto tag) {
          using T = decltype(tag);
          cpu::embedding_backward<T>(in[0].data<T>(), in[1].data<i64>(), n, o.data<T>(), 0, vocab,
                                     dim);
        });
      }
      return o;
    });
    return std::vector<Tensor>{gw};
  });
  return out;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal) {
  static const OpDef def{"_scaled_dot_product_flash_attention_for_cpu", "default",
                         EventKind::Compute};
  static const OpDef back{"_scaled_dot_product_flash_attention_for_cpu_backward", "default",
                          EventKind::Compute};
  COMMTRACE_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(),
                  ErrorCode::ShapeMismatch,
                  "scaled_dot_product_attention: q, k, v must share one (B, H, T, D) shape, got "
                  "{}, {}, {}",
                  describe(q), describe(k), describe(v));
  check_same_dtype(q, k, "scaled_dot_product_attention");
  check_same_dtype(q, v, "scaled_dot_product_attention");
  const i64 bh = q.size(0) * q.size(1), tt = q.size(2), d = q.size(3);
  const double scale = 1.0 / std::sqrt(double(d));
  Tensor probs;
  Tensor out = dispatch(def, {q, k, v}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(in[0].shape(), in[0]);
    probs = Tensor::empty({bh, tt, tt}, o.dtype(), o.device());
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::attention_forward<T>(in[0].data<T>(), in[1].data<T>(), in[2].data<T>(), o.data<T>(),
                                  probs.data<T>(), bh, tt, d, T(scale), causal);
      });
    }
    return o;
  });
  attach_grad(out, "ScaledDotProductAttentionBackward", {q, k, v},
              [q, k, v, probs, bh, tt, d, scale](const Tensor& g) {
                Tensor gk, gv;
                Tensor gq = dispatch(back, {g, q, k, v, probs}, [&](const std::vector<Tensor>& in) {
                  Tensor o = empty_as(in[0].shape(), in[0]);
                  gk = empty_as(o.shape(), o);
                  gv = empty_as(o.shape(), o);
                  if (run_kernels(o.device())) {
                    by_float(o.dtype(), [&](auto tag) {
                      using T = decltype(tag);
                      cpu::attention_backward<T>(in[0].data<T>(), in[1].data<T>(), in[2].data<T>(),
                                                 in[3].data<T>(), in[4].data<T>(), o.data<T>(),
                                                 gk.data<T>(), gv.data<T>(), bh, tt, d, T(scale));
                    });
                  }
                  return o;
                });
                if (gk.dtype() != g.dtype()) {
                  gk = to_dtype(gk, g.dtype());
                  gv = to_dtype(gv, g.dtype());
                }
                return std::vector<Tensor>{gq, gk, gv};
              });
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  static const OpDef def{"cross_entropy_loss", "default", EventKind::Compute};
  static const OpDef back{"cross_entropy_loss_backward", "default", EventKind::Compute};
  COMMTRACE_CHECK(targets.dtype() == DType::I64, ErrorCode::InvalidArgument,
                  "cross_entropy: targets must be i64, got {}", describe(targets));
  const i64 c = last_dim(logits), n = c ? logits.numel() / c : 0;
  COMMTRACE_CHECK(logits.dim() >= 2 && targets.numel() == n, ErrorCode::ShapeMismatch,
                  "cross_entropy: logits {} give {} rows, targets {} have {}", describe(logits), n,
                  describe(targets), targets.numel());
  Tensor out = dispatch(def, {logits, targets}, [&](const std::vector<Tensor>& in) {
    Tensor o = Tensor::empty({}, in[0].dtype(), in[0].device());
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        *o.data<T>() = cpu::cross_entropy_forward<T>(in[0].data<T>(), in[1].data<i64>(), n, c);
      });
    }
    return o;
  });
  attach_grad(out, "CrossEntropyBackward", {logits}, [logits, targets, n, c](const Tensor& g) {
    Tensor gl = dispatch(back, {g, logits, targets}, [&](const std::vector<Tensor>& in) {
      Tensor o = empty_as(in[1].shape(), in[1]);
      if (run_kernels(o.device())) {
        by_float(o.dtype(), [&](auto tag) {
          using T = decltype(tag);
          cpu::cross_entropy_backward<T>(*in[0].data<T>(), in[1].data<T>(), in[2].data<i64>(),
                                         o.data<T>(), n, c);
        });
      }
      return o;
    });
    return std::vector<Tensor>{gl};
  });
  return out;
}

// ---------------------------------------------------------------- reductions

Tensor sum(const Tensor& x) {
  static const OpDef def{"sum", "default", EventKind::Compute};
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    Tensor o = Tensor::empty({}, in[0].dtype(), in[0].device());
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        *o.data<T>() = cpu::sum_all<T>(in[0].data<T>(), in[0].numel());
      });
    }
    return o;
  });
  attach_grad(out, "SumBackward", {x},
              [s = x.shape()](const Tensor& g) { return std::vector<Tensor>{expand(g, s)}; });
  return out;
}

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  static const OpDef def{"sum", "dim_IntList", EventKind::Compute};
  dim = normalize_dim(dim, x.dim(), "sum");
  const Split3 s = split_at(x.shape(), dim);
  Shape kept = x.shape();
  if (x.dim() > 0) kept[std::size_t(dim)] = 1;
  Shape shape = kept;
  if (!keepdim && x.dim() > 0) shape.erase(shape.begin() + dim);
  Tensor out = dispatch(def, {x}, [&](const std::vector<Tensor>& in) {
    Tensor o = empty_as(shape, in[0]);
    if (run_kernels(o.device())) {
      by_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        cpu::sum_dim<T>(in[0].data<T>(), o.data<T>(), s.outer, s.dim, s.inner);
      });
    }
    return o;
  });
  attach_grad(out, "SumBackward", {x}, [kept, full = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{expand(g.shape() == kept ? g : view(g, kept), full)};
  });
  return out;
}

Tensor mean(const Tensor& x) {
  const i64 n = x.numel();
  COMMTRACE_CHECK(n > 0, ErrorCode::InvalidArgument, "mean: empty tensor {}", describe(x));
  return mul(sum(x), 1.0 / double(n));
}

Tensor mean(const Tensor& x, int dim, bool keepdim) {
  const int d = normalize_dim(dim, x.dim(), "mean");
  const i64 n = x.dim() ? x.shape()[std::size_t(d)] : 1;
  COMMTRACE_CHECK(n > 0, ErrorCode::InvalidArgument, "mean: empty dim {} of {}", d, describe(x));
  return mul(sum(x, d, keepdim), 1.0 / double(n));
}

}  // namespace commtrace
