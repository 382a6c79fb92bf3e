#include "parallel/ops.h"

#include <cmath>
#include <optional>
#include <tuple>

#include "kernels/backend.h"
#include "parallel/autograd.h"
#include "parallel/sharding.h"
#include "tracer/tracer.h"

namespace commtrace {

using detail::dispatch;
using detail::normalize_dim;
using detail::OpDef;
using detail::Transposed;
using i64 = std::int64_t;

namespace {

Tensor empty_as(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), like.device());
}

// A plain conversion outside the dispatcher.
Tensor convert_untraced(const Tensor& x, DType dt) {
  Tensor out = Tensor::empty(x.shape(), dt, x.device());
  kernels_for(x.device()).convert(x.data_ptr(), x.dtype(), out.data_ptr(), dt, x.numel());
  return out;
}

// The device buffer of an optional input (null when undefined).
void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
const i64* index_data(const Tensor& t) { return static_cast<const i64*>(t.data_ptr()); }

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

const ShardingRule& linear_pointwise() {
  static const ShardingRule r = pointwise_rule(true);
  return r;
}
const ShardingRule& nonlinear_pointwise() {
  static const ShardingRule r = pointwise_rule(false);
  return r;
}

// add and sub are linear in their inputs (Partial + Partial stays Partial); mul and div not.
Tensor binary_op(BinaryOp op, const OpDef& def, const Tensor& a, const Tensor& b) {
  check_same_dtype(a, b, def.name);
  broadcast_shapes(a.shape(), b.shape(), def.name);
  const bool linear = op == BinaryOp::Add || op == BinaryOp::Sub;
  return dispatch(
      def, {a, b},
      [op, name = def.name](const std::vector<Tensor>& in) {
        const Shape shape = broadcast_shapes(in[0].shape(), in[1].shape(), name);
        Tensor out = empty_as(shape, in[0]);
        kernels_for(out.device())
            .binary(out.dtype(), op, in[0].data_ptr(), in[0].shape(), in[1].data_ptr(),
                    in[1].shape(), out.data_ptr(), shape);
        return out;
      },
      {}, linear ? &linear_pointwise() : &nonlinear_pointwise());
}

// Elementwise op with a kernel(kernels, inputs, out) writing an output shaped like input 0.
template <class K>
Tensor unary_op(const OpDef& def, const std::vector<Tensor>& inputs, K kernel,
                const ShardingRule* rule) {
  return dispatch(
      def, inputs,
      [kernel](const std::vector<Tensor>& in) {
        Tensor out = empty_as(in[0].shape(), in[0]);
        kernel(kernels_for(out.device()), in, out);
        return out;
      },
      {}, rule);
}

// (rows, cols) of a row-wise op over the last dim. Callers bind it with std::tie: kernels
// lambdas capture the two, and clang 14 cannot capture structured bindings.
std::pair<i64, i64> rows_cols(const Tensor& x) {
  const i64 cols = last_dim(x);
  return {cols ? x.numel() / cols : 0, cols};
}

}  // namespace

namespace detail {

int normalize_dim(int dim, int rank, const char* op) {
  const int r = std::max(rank, 1);
  COMMTRACE_CHECK(dim >= -r && dim < r, ErrorCode::InvalidArgument,
                  "{}: dim {} out of range for a {}-d tensor", op, dim, rank);
  return dim < 0 ? dim + r : dim;
}

Tensor dispatch(const OpDef& op, const std::vector<Tensor>& inputs, const Compute& compute,
                const Transposed& transposed, const ShardingRule* rule) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.impl()->dist) {
      return dispatch_dtensor(op, inputs, compute, transposed, rule);
    }
  }
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
  }
  Tracer* tracer = Tracer::current();
  const std::uint64_t start = tracer ? tracer->now() : 0;

  Tensor out = compute(inputs);

  // A local shard keeps its origin through ops that keep its shape (relu, gelu, dropout, ...).
  if (first && first->impl()->origin && out.shape() == first->shape() && !out.impl()->origin) {
    out.impl()->origin = first->impl()->origin;
  }
  if (tracer) {
    const RecordedArgs args(inputs, transposed);
    const ArgView result{out.shape(), {}, {}};
    EventView e;
    e.kind = op.kind;
    e.name = op.name;
    e.overload = op.overload;
    e.dtype = first ? args.first_dtype() : out.dtype();
    e.inputs = args.views();
    e.outputs = {&result, 1};
    tracer->record(e, start);
  }
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------- creation and copies

namespace {
// *_like ops read only the input's shape: it stays where it is (no collective) and the output
// takes its layout, a Partial one becoming Replicate (PyTorch's create_like strategy).
const ShardingRule& like_rule() {
  static const ShardingRule r{
      [](const std::vector<Tensor>&, const std::vector<Placement>& cur, const DeviceMesh&, int) {
        const Placement out = cur[0].is_partial() ? Placement::replicate() : cur[0];
        return std::vector<DimStrategy>{{{cur[0]}, out}};
      },
      nullptr};
  return r;
}
}  // namespace

Tensor ones_like(const Tensor& x) {
  static const OpDef def{"ones_like", "default", EventKind::Compute};
  return dispatch(
      def, {x},
      [](const std::vector<Tensor>& in) {
        return Tensor::full(in[0].shape(), 1.0, in[0].dtype(), in[0].device());
      },
      {}, &like_rule());
}

Tensor zeros_like(const Tensor& x) {
  static const OpDef def{"zeros_like", "default", EventKind::Compute};
  return dispatch(
      def, {x},
      [](const std::vector<Tensor>& in) {
        return Tensor::zeros(in[0].shape(), in[0].dtype(), in[0].device());
      },
      {}, &like_rule());
}

Tensor clone(const Tensor& x) {
  static const OpDef def{"clone", "default", EventKind::Compute};
  Tensor out = dispatch(
      def, {x},
      [](const std::vector<Tensor>& in) { return convert_untraced(in[0], in[0].dtype()); }, {},
      &linear_pointwise());
  attach_grad(out, "CloneBackward", {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  static const OpDef def{"_to_copy", "default", EventKind::Compute};
  Tensor out = dispatch(
      def, {x}, [dtype](const std::vector<Tensor>& in) { return convert_untraced(in[0], dtype); },
      {}, &linear_pointwise());
  if (is_floating(dtype)) {
    const DType src = x.dtype();
    attach_grad(out, "ToCopyBackward", {x},
                [src](const Tensor& g) { return std::vector<Tensor>{to_dtype(g, src)}; });
  }
  return out;
}

// ---------------------------------------------------------------- views and layout

namespace {

// Groups of dims whose products match between two shapes of equal numel: each group is
// [in_begin, in_end) x [out_begin, out_end). Size-1 dims join the group they stand in.
struct ViewGroup {
  int in_begin, in_end, out_begin, out_end;
};
std::vector<ViewGroup> view_groups(const Shape& in, const Shape& out) {
  std::vector<ViewGroup> groups;
  int i = 0, o = 0;
  const int ni = int(in.size()), no = int(out.size());
  while (i < ni || o < no) {
    ViewGroup g{i, i, o, o};
    i64 pi = 1, po = 1;
    do {
      if (pi <= po && g.in_end < ni) {
        pi *= in[std::size_t(g.in_end++)];
      } else if (g.out_end < no) {
        po *= out[std::size_t(g.out_end++)];
      } else {
        pi *= in[std::size_t(g.in_end++)];
      }
    } while ((pi != po || g.in_end == g.in_begin || g.out_end == g.out_begin) &&
             (g.in_end < ni || g.out_end < no));
    groups.push_back(g);
    i = g.in_end;
    o = g.out_end;
  }
  return groups;
}

// A view keeps Shard(d) when d is the outermost non-trivial dim of its group and every rank's
// chunk of it splits evenly into the group's inner output dims; the shard moves to the group's
// outermost non-trivial output dim. Otherwise the input is gathered first.
ShardingRule view_rule(const Shape& in_shape, const Shape& out_shape) {
  const auto groups = view_groups(in_shape, out_shape);
  ShardingRule r;
  r.rule = [=](const std::vector<Tensor>&, const std::vector<Placement>& cur,
               const DeviceMesh& mesh, int mesh_dim) {
    const Placement p = cur[0];
    if (!p.is_shard()) return std::vector<DimStrategy>{{{p}, p}};
    const Placement R = Placement::replicate();
    for (const ViewGroup& g : groups) {
      if (p.dim < g.in_begin || p.dim >= g.in_end) continue;
      int first_in = g.in_begin, first_out = g.out_begin;
      while (first_in < g.in_end - 1 && in_shape[std::size_t(first_in)] == 1) ++first_in;
      while (first_out < g.out_end - 1 && out_shape[std::size_t(first_out)] == 1) ++first_out;
      if (p.dim != first_in) break;
      i64 inner_in = 1, inner_out = 1;
      for (int d = first_in + 1; d < g.in_end; ++d) inner_in *= in_shape[std::size_t(d)];
      for (int d = first_out + 1; d < g.out_end; ++d) inner_out *= out_shape[std::size_t(d)];
      // Rank r holds chunk r of dim first_in: chunk * inner_in elements of the group, which
      // must fill whole rows (inner_out elements each) of the output's first dim.
      const i64 n = in_shape[std::size_t(first_in)];
      bool whole = inner_out > 0;
      for (int r = 0; whole && r < mesh.size(mesh_dim); ++r) {
        whole = chunk_range(n, mesh.size(mesh_dim), r).size * inner_in % inner_out == 0;
      }
      if (!whole) break;
      return std::vector<DimStrategy>{{{p}, Placement::shard(first_out)}};
    }
    return std::vector<DimStrategy>{{{R}, R}};
  };
  r.local_compute = [out_shape](const std::vector<Tensor>& in, const Placements& out,
                                const DeviceMesh& mesh) {
    Tensor v = in[0].detach();
    v.impl()->shape = local_shape_of(out_shape, out, mesh);
    COMMTRACE_CHECK(numel(v.impl()->shape) == in[0].numel(), ErrorCode::ShapeMismatch,
                    "view: local shard {} cannot be viewed as {} (global {} under {})",
                    describe(in[0]), shape_str(v.impl()->shape), shape_str(out_shape),
                    placements_str(out));
    return v;
  };
  return r;
}

}  // namespace

Tensor view(const Tensor& x, Shape shape) {
  static const OpDef def{"view", "default", EventKind::Trivial};
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
  std::optional<ShardingRule> rule;
  if (x.impl()->dist) rule = view_rule(x.shape(), shape);
  Tensor out = dispatch(
      def, {x},
      [shape](const std::vector<Tensor>& in) {
        Tensor v = in[0].detach();
        v.impl()->shape = shape;
        return v;
      },
      {}, rule ? &*rule : nullptr);
  const Shape src = x.shape();
  attach_grad(out, "ViewBackward", {x},
              [src](const Tensor& g) { return std::vector<Tensor>{view(g, src)}; });
  return out;
}

namespace {
Tensor transpose_impl(const Tensor& x, int d0, int d1, const OpDef& def) {
  const ShardingRule rule = transpose_rule(d0, d1);
  Tensor out = dispatch(
      def, {x},
      [d0, d1](const std::vector<Tensor>& in) {
        Shape shape = in[0].shape();
        std::swap(shape[std::size_t(d0)], shape[std::size_t(d1)]);
        Tensor o = empty_as(shape, in[0]);
        std::vector<int> perm(std::size_t(in[0].dim()));
        for (int i = 0; i < in[0].dim(); ++i) perm[std::size_t(i)] = i;
        std::swap(perm[std::size_t(d0)], perm[std::size_t(d1)]);
        kernels_for(o.device())
            .permute(o.dtype(), in[0].data_ptr(), in[0].shape(), perm.data(), o.data_ptr());
        return o;
      },
      {}, &rule);
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
  const ShardingRule rule = follow_rule({dim}, true);
  Tensor out = dispatch(
      def, {x},
      [dim, start, len](const std::vector<Tensor>& in) {
        Shape shape = in[0].shape();
        shape[std::size_t(dim)] = len;
        Tensor o = empty_as(shape, in[0]);
        kernels_for(o.device())
            .narrow(o.dtype(), in[0].data_ptr(), in[0].shape(), dim, start, len, o.data_ptr());
        return o;
      },
      {}, &rule);
  attach_grad(out, "SliceBackward", {x}, [full = size, dim, start, rule](const Tensor& g) {
    Tensor gx = dispatch(
        back_def, {g},
        [&](const std::vector<Tensor>& in) {
          Shape shape = in[0].shape();
          shape[std::size_t(dim)] = full;
          Tensor o = Tensor::zeros(shape, in[0].dtype(), in[0].device());
          kernels_for(o.device())
              .narrow_scatter(o.dtype(), in[0].data_ptr(), in[0].shape(), dim, start, o.data_ptr(),
                              shape);
          return o;
        },
        {}, &rule);
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int dim) {
  static const OpDef def{"cat", "default", EventKind::Compute};
  COMMTRACE_CHECK(!xs.empty(), ErrorCode::InvalidArgument, "cat: no tensors");
  dim = normalize_dim(dim, xs[0].dim(), "cat");
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
  }
  const ShardingRule rule = follow_rule({dim}, true);
  Tensor out = dispatch(
      def, xs,
      [dim](const std::vector<Tensor>& in) {
        Shape shape = in[0].shape();
        shape[std::size_t(dim)] = 0;
        for (const Tensor& x : in) shape[std::size_t(dim)] += x.shape()[std::size_t(dim)];
        Tensor o = empty_as(shape, in[0]);
        const Kernels& k = kernels_for(o.device());
        i64 start = 0;
        for (const Tensor& x : in) {
          k.narrow_scatter(o.dtype(), x.data_ptr(), x.shape(), dim, start, o.data_ptr(), shape);
          start += x.shape()[std::size_t(dim)];
        }
        return o;
      },
      {}, &rule);
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
  const int added = int(shape.size()) - x.dim();
  const ShardingRule rule = expand_rule(added);
  Tensor out = dispatch(
      def, {x},
      [shape, added](const std::vector<Tensor>& in) {
        // A dim the input holds whole (not broadcast) keeps its local size.
        Shape local = shape;
        for (int d = 0; d < in[0].dim(); ++d) {
          const i64 s = in[0].shape()[std::size_t(d)];
          if (s != 1) local[std::size_t(d + added)] = s;
        }
        Tensor o = empty_as(local, in[0]);
        const Tensor zero = Tensor::zeros({}, o.dtype(), o.device());  // broadcast copy: x + 0
        kernels_for(o.device())
            .binary(o.dtype(), BinaryOp::Add, in[0].data_ptr(), in[0].shape(), zero.data_ptr(),
                    Shape{}, o.data_ptr(), local);
        return o;
      },
      {}, &rule);
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
  // Reduced dims of x: the leading ones target lacks (dropped) and the size-1 ones (kept).
  const int added = x.dim() - int(shape.size());
  std::vector<int> reduced;
  for (int d = 0; d < x.dim(); ++d) {
    if (d < added || (shape[std::size_t(d - added)] == 1 && x.shape()[std::size_t(d)] != 1)) {
      reduced.push_back(d);
    }
  }
  ShardingRule rule = reduce_rule(reduced, true);
  if (added > 0) {
    // Leading dims are dropped: shift the kept shards left by `added`.
    rule.rule = [inner = reduce_rule(reduced, true).rule, added](
                    const std::vector<Tensor>& in, const std::vector<Placement>& cur,
                    const DeviceMesh& mesh, int mesh_dim) {
      auto s = inner(in, cur, mesh, mesh_dim);
      for (auto& c : s) {
        if (c.output.is_shard()) c.output.dim -= added;
      }
      return s;
    };
  }
  Tensor out = dispatch(
      def, {x},
      [shape, added](const std::vector<Tensor>& in) {
        Shape local = shape;
        for (std::size_t d = 0; d < shape.size(); ++d) {
          if (shape[d] != 1) local[d] = in[0].shape()[d + std::size_t(added)];
        }
        Tensor o = empty_as(local, in[0]);
        kernels_for(o.device())
            .sum_to(o.dtype(), in[0].data_ptr(), in[0].shape(), o.data_ptr(), local);
        return o;
      },
      {}, &rule);
  const Shape src = x.shape();
  attach_grad(out, "SumToBackward", {x},
              [src](const Tensor& g) { return std::vector<Tensor>{expand(g, src)}; });
  return out;
}

// ---------------------------------------------------------------- GEMM

namespace {
// Logical op(x) shape: the last two dims swapped when transposed.
Shape op_shape(const Shape& s, bool trans) {
  Shape o = s;
  if (trans) std::swap(o[o.size() - 2], o[o.size() - 1]);
  return o;
}
}  // namespace

Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& bias, bool trans_a, bool trans_b) {
  static const OpDef mm_def{"mm", "default", EventKind::Gemm};
  static const OpDef addmm_def{"addmm", "default", EventKind::Gemm};
  static const OpDef bmm_def{"bmm", "default", EventKind::Gemm};
  const int rank = a.dim();
  COMMTRACE_CHECK((rank == 2 || rank == 3) && b.dim() == rank, ErrorCode::ShapeMismatch,
                  "gemm: expected two 2-d or two 3-d tensors, got {} and {}", describe(a),
                  describe(b));
  check_same_dtype(a, b, "gemm");
  const bool has_bias = bias.defined();
  const char* name = rank == 3 ? "bmm" : has_bias ? "addmm" : "mm";
  const Shape op_a = op_shape(a.shape(), trans_a), op_b = op_shape(b.shape(), trans_b);
  COMMTRACE_CHECK(rank == 2 || op_a[0] == op_b[0], ErrorCode::ShapeMismatch,
                  "bmm: batch sizes differ: {} and {}", describe(a), describe(b));
  COMMTRACE_CHECK(op_a.back() == op_b[op_b.size() - 2], ErrorCode::ShapeMismatch,
                  "{}: cannot multiply {} by {} (inner dims {} and {})", name, shape_str(op_a),
                  shape_str(op_b), op_a.back(), op_b[op_b.size() - 2]);
  std::vector<Tensor> inputs{a, b};
  if (has_bias) {
    COMMTRACE_CHECK(rank == 2, ErrorCode::InvalidArgument, "bmm: no bias");
    check_same_dtype(a, bias, "addmm");
    const Shape& bs = bias.shape();
    const i64 m = op_a[0], n = op_b[1];
    COMMTRACE_CHECK((bs == Shape{n} || bs == Shape{1, n} || bs == Shape{m, n}),
                    ErrorCode::ShapeMismatch, "addmm: bias {} does not broadcast to [{}, {}]",
                    describe(bias), m, n);
    inputs.insert(inputs.begin(), bias);
  }
  const OpDef& def = rank == 3 ? bmm_def : has_bias ? addmm_def : mm_def;
  const ShardingRule rule = matmul_rule(rank, trans_a, trans_b, has_bias);
  Transposed transposed{trans_a, trans_b};
  if (has_bias) transposed.insert(transposed.begin(), false);
  return dispatch(
      def, inputs,
      [=](const std::vector<Tensor>& in) {
        const Tensor& A = in[has_bias ? 1 : 0];
        const Tensor& B = in[has_bias ? 2 : 1];
        const i64 batch = rank == 3 ? A.size(0) : 1;
        const i64 ar = A.size(-2), ac = A.size(-1), br = B.size(-2), bc = B.size(-1);
        const i64 m = trans_a ? ac : ar, k = trans_a ? ar : ac, n = trans_b ? br : bc;
        Tensor o = empty_as(rank == 3 ? Shape{batch, m, n} : Shape{m, n}, A);
        GemmArgs g;
        g.dt = o.dtype();
        g.trans_a = trans_a;
        g.trans_b = trans_b;
        g.batch = batch;
        g.m = m;
        g.n = n;
        g.k = k;
        g.a = A.data_ptr();
        g.lda = ac;
        g.stride_a = ar * ac;
        g.b = B.data_ptr();
        g.ldb = bc;
        g.stride_b = br * bc;
        g.c = o.data_ptr();
        g.ldc = n;
        g.stride_c = m * n;
        if (has_bias) {
          g.bias = in[0].data_ptr();
          g.bias_rows = in[0].numel() == m * n ? m : 1;
        }
        kernels_for(o.device()).gemm(g);
        return o;
      },
      transposed, &rule);
}

namespace {
// The backward of out = a @ b for the plain (untransposed) products mm and bmm.
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
  Tensor out = binary_op(BinaryOp::Add, def, a, b);
  attach_grad(out, "AddBackward", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  static const OpDef def{"sub", "Tensor", EventKind::Compute};
  Tensor out = binary_op(BinaryOp::Sub, def, a, b);
  attach_grad(out, "SubBackward", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(mul(g, -1.0), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  static const OpDef def{"mul", "Tensor", EventKind::Compute};
  Tensor out = binary_op(BinaryOp::Mul, def, a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  attach_grad(out, "MulBackward", {a, b}, [a, b, need_a, need_b](const Tensor& g) {
    return std::vector<Tensor>{need_a ? sum_to(mul(g, b), a.shape()) : Tensor(),
                               need_b ? sum_to(mul(g, a), b.shape()) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  static const OpDef def{"div", "Tensor", EventKind::Compute};
  Tensor out = binary_op(BinaryOp::Div, def, a, b);
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
  Tensor out = unary_op(
      def, {a},
      [s](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
        k.scale(o.dtype(), in[0].data_ptr(), s, o.data_ptr(), o.numel());
      },
      &linear_pointwise());
  attach_grad(out, "MulBackward", {a},
              [s](const Tensor& g) { return std::vector<Tensor>{mul(g, s)}; });
  return out;
}

Tensor add(const Tensor& a, double s) {
  static const OpDef def{"add", "Scalar", EventKind::Compute};
  Tensor out = unary_op(
      def, {a},
      [s](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
        k.add_scalar(o.dtype(), in[0].data_ptr(), s, o.data_ptr(), o.numel());
      },
      &nonlinear_pointwise());
  attach_grad(out, "AddBackward", {a}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor relu(const Tensor& x) {
  static const OpDef def{"relu", "default", EventKind::Compute};
  static const OpDef back{"threshold_backward", "default", EventKind::Compute};
  Tensor out = unary_op(
      def, {x},
      [](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
        k.relu_forward(o.dtype(), in[0].data_ptr(), o.data_ptr(), o.numel());
      },
      &nonlinear_pointwise());
  attach_grad(out, "ReluBackward", {x}, [x](const Tensor& g) {
    return std::vector<Tensor>{unary_op(
        back, {g, x},
        [](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
          k.relu_backward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(), o.data_ptr(), o.numel());
        },
        &nonlinear_pointwise())};
  });
  return out;
}

Tensor gelu(const Tensor& x) {
  static const OpDef def{"gelu", "default", EventKind::Compute};
  static const OpDef back{"gelu_backward", "default", EventKind::Compute};
  Tensor out = unary_op(
      def, {x},
      [](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
        k.gelu_forward(o.dtype(), in[0].data_ptr(), o.data_ptr(), o.numel());
      },
      &nonlinear_pointwise());
  attach_grad(out, "GeluBackward", {x}, [x](const Tensor& g) {
    return std::vector<Tensor>{unary_op(
        back, {g, x},
        [](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
          k.gelu_backward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(), o.data_ptr(), o.numel());
        },
        &nonlinear_pointwise())};
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
  Tensor out = unary_op(
      def, {x},
      [&mask, p, seed](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
        mask = Tensor::empty(o.shape(), acc_dtype(o.dtype()), o.device());
        k.dropout_forward(o.dtype(), in[0].data_ptr(), o.data_ptr(), mask.data_ptr(), o.numel(), p,
                          seed);
      },
      &nonlinear_pointwise());
  // The mask is the local one (each shard draws its own); meta gets a shape-only mask.
  Tensor local_out = is_dtensor(out) ? dist_of(out).local : out;
  if (!mask.defined() || mask.shape() != local_out.shape()) {
    mask = Tensor::zeros(local_out.shape(), acc_dtype(local_out.dtype()), local_out.device());
  }
  mask =
      wrap_like(mask, out, out.shape(), is_dtensor(out) ? dist_of(out).placements : Placements{});
  attach_grad(out, "NativeDropoutBackward", {x}, [mask](const Tensor& g) {
    return std::vector<Tensor>{unary_op(
        back, {g, mask},
        [](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
          k.dropout_backward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(), o.data_ptr(),
                             o.numel());
        },
        &nonlinear_pointwise())};
  });
  return out;
}

// ---------------------------------------------------------------- normalization, attention

namespace {
// Row-wise ops over the last dim keep other shards; the last dim must be whole.
const ShardingRule& last_dim_rule() {
  static const ShardingRule r = follow_rule({-1}, false);
  return r;
}
}  // namespace

Tensor softmax(const Tensor& x) {
  static const OpDef def{"_softmax", "default", EventKind::Compute};
  static const OpDef back{"_softmax_backward_data", "default", EventKind::Compute};
  Tensor out = unary_op(
      def, {x},
      [](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
        i64 rows = 0, cols = 0;
        std::tie(rows, cols) = rows_cols(in[0]);
        k.softmax_forward(o.dtype(), in[0].data_ptr(), o.data_ptr(), rows, cols);
      },
      &last_dim_rule());
  attach_grad(out, "SoftmaxBackward", {x}, [y = out.detach()](const Tensor& g) {
    return std::vector<Tensor>{unary_op(
        back, {g, y},
        [](const Kernels& k, const std::vector<Tensor>& in, Tensor& o) {
          i64 rows = 0, cols = 0;
          std::tie(rows, cols) = rows_cols(in[0]);
          k.softmax_backward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(), o.data_ptr(), rows,
                             cols);
        },
        &last_dim_rule())};
  });
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  static const OpDef def{"native_layer_norm", "default", EventKind::Compute};
  static const OpDef back{"native_layer_norm_backward", "default", EventKind::Compute};
  static const ShardingRule fwd_rule = follow_rule({-1}, false);
  static const ShardingRule back_rule = follow_rule({-1}, false, /*prefix=*/true);
  const i64 cols = last_dim(x);
  COMMTRACE_CHECK(x.dim() >= 1, ErrorCode::ShapeMismatch, "layer_norm: input {} is 0-d",
                  describe(x));
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    COMMTRACE_CHECK(p->shape() == Shape{cols}, ErrorCode::ShapeMismatch,
                    "layer_norm: affine parameter {} does not match normalized size {} of {}",
                    describe(*p), cols, describe(x));
    check_same_dtype(x, *p, "layer_norm");
  }
  // mean and rstd (x.shape[:-1]) are saved in acc_dtype (f32 for f32/bf16).
  Tensor mean, rstd;
  Tensor out = dispatch(
      def, {x, weight, bias},
      [&mean, &rstd, eps](const std::vector<Tensor>& in) {
        i64 rows = 0, cols = 0;
        std::tie(rows, cols) = rows_cols(in[0]);
        Shape stat_shape(in[0].shape().begin(), in[0].shape().end() - 1);
        Tensor o = empty_as(in[0].shape(), in[0]);
        mean = Tensor::empty(stat_shape, acc_dtype(o.dtype()), o.device());
        rstd = Tensor::empty(stat_shape, acc_dtype(o.dtype()), o.device());
        kernels_for(o.device())
            .layernorm_forward(o.dtype(), in[0].data_ptr(), data_or_null(in[1]),
                               data_or_null(in[2]), o.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                               rows, cols, eps);
        return o;
      },
      {}, &fwd_rule);
  if (is_dtensor(out)) {
    const Shape stat_global(x.shape().begin(), x.shape().end() - 1);
    mean = wrap_like(mean, out, stat_global, dist_of(out).placements);
    rstd = wrap_like(rstd, out, stat_global, dist_of(out).placements);
  }
  attach_grad(out, "NativeLayerNormBackward", {x, weight, bias},
              [x, weight, has_bias = bias.defined(), mean, rstd](const Tensor& g) {
                Tensor gw, gb;
                Tensor gx = dispatch(
                    back, {g, x, weight, mean, rstd},
                    [&](const std::vector<Tensor>& in) {
                      i64 rows = 0, cols = 0;
                      std::tie(rows, cols) = rows_cols(in[0]);
                      Tensor o = empty_as(in[0].shape(), in[0]);
                      const bool affine = in[2].defined();
                      gw = affine ? Tensor::empty({cols}, o.dtype(), o.device()) : Tensor();
                      gb = has_bias ? Tensor::empty({cols}, o.dtype(), o.device()) : Tensor();
                      kernels_for(o.device())
                          .layernorm_backward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                              data_or_null(in[2]), in[3].data_ptr(),
                                              in[4].data_ptr(), o.data_ptr(), data_or_null(gw),
                                              data_or_null(gb), rows, cols);
                      return o;
                    },
                    {}, &back_rule);
                // Affine gradients of a sharded input are partial sums over its rows.
                if (is_dtensor(gx)) {
                  Placements pl = dist_of(gx).placements;
                  for (Placement& p : pl) p = p.is_shard() ? Placement::partial() : p;
                  if (gw.defined()) gw = wrap_like(gw, gx, weight.shape(), pl);
                  if (gb.defined()) gb = wrap_like(gb, gx, weight.shape(), pl);
                }
                return std::vector<Tensor>{gx, gw, gb};
              });
  return out;
}

namespace {
// embedding(weight, idx): a row-sharded (vocab) table gives a Partial masked lookup; a
// column-sharded one shards the output's last dim; a replicated one follows the indices.
ShardingRule embedding_rule(i64 vocab) {
  ShardingRule r;
  r.rule = [](const std::vector<Tensor>& in, const std::vector<Placement>& cur, const DeviceMesh&,
              int) {
    const Placement w = cur[0], idx = cur[1];
    const Placement R = Placement::replicate();
    if (w.is_shard(0)) return std::vector<DimStrategy>{{{w, R}, Placement::partial()}};
    if (w.is_shard(1)) return std::vector<DimStrategy>{{{w, R}, Placement::shard(in[1].dim())}};
    if (idx.is_shard()) return std::vector<DimStrategy>{{{R, idx}, idx}};
    return std::vector<DimStrategy>{{{R, R}, R}};
  };
  r.local_compute = [vocab](const std::vector<Tensor>& in, const Placements& out,
                            const DeviceMesh& mesh) {
    // The local table holds rows [begin, begin + rows) of the full one when row-sharded.
    i64 begin = 0, rows = vocab;
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (!out[std::size_t(d)].is_partial()) continue;
      const ChunkRange c = chunk_range(rows, mesh.size(d), mesh.coordinate(d));
      begin += c.begin;
      rows = c.size;
    }
    const i64 dim = in[0].size(1), n = in[1].numel();
    Shape shape = in[1].shape();
    shape.push_back(dim);
    Tensor o = empty_as(shape, in[0]);
    kernels_for(o.device())
        .embedding_forward(o.dtype(), index_data(in[1]), n, in[0].data_ptr(), begin, rows, vocab,
                           dim, o.data_ptr());
    return o;
  };
  return r;
}

// embedding_dense_backward(g, idx): indices sharded like g's leading dims give partial sums.
ShardingRule embedding_backward_rule() {
  ShardingRule r;
  r.rule = [](const std::vector<Tensor>& in, const std::vector<Placement>& cur, const DeviceMesh&,
              int) {
    const Placement g = cur[0], idx = cur[1], R = Placement::replicate();
    if (g.is_shard() && g == idx && g.dim < in[1].dim()) {
      return std::vector<DimStrategy>{{{g, idx}, Placement::partial()}, {{R, R}, R}};
    }
    return std::vector<DimStrategy>{{{R, R}, R}};
  };
  return r;
}
}  // namespace

Tensor embedding(const Tensor& idx, const Tensor& weight) {
  static const OpDef def{"embedding", "default", EventKind::Compute};
  static const OpDef back{"embedding_dense_backward", "default", EventKind::Compute};
  static const ShardingRule back_rule = embedding_backward_rule();
  COMMTRACE_CHECK(idx.dtype() == DType::I64, ErrorCode::InvalidArgument,
                  "embedding: indices must be i64, got {}", describe(idx));
  COMMTRACE_CHECK(weight.dim() == 2, ErrorCode::ShapeMismatch, "embedding: weight {} is not 2-d",
                  describe(weight));
  const i64 vocab = weight.size(0);
  const ShardingRule rule = embedding_rule(vocab);
  Tensor out = dispatch(
      def, {weight, idx},
      [vocab](const std::vector<Tensor>& in) {
        const i64 dim = in[0].size(1), n = in[1].numel();
        Shape shape = in[1].shape();
        shape.push_back(dim);
        Tensor o = empty_as(shape, in[0]);
        kernels_for(o.device())
            .embedding_forward(o.dtype(), index_data(in[1]), n, in[0].data_ptr(), 0, vocab, vocab,
                               dim, o.data_ptr());
        return o;
      },
      {}, &rule);
  attach_grad(out, "EmbeddingBackward", {weight}, [idx, vocab](const Tensor& g) {
    Tensor gw = dispatch(
        back, {g, idx},
        [vocab](const std::vector<Tensor>& in) {
          const i64 dim = in[0].size(-1), n = in[1].numel();
          Tensor o = Tensor::empty({vocab, dim}, in[0].dtype(), in[0].device());
          kernels_for(o.device())
              .embedding_backward(o.dtype(), in[0].data_ptr(), index_data(in[1]), n, o.data_ptr(),
                                  0, vocab, dim);
          return o;
        },
        {}, &back_rule);
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
  // Batch and heads may be sharded; sequence and head dims must be whole.
  static const ShardingRule rule = follow_rule({2, 3}, false);
  COMMTRACE_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(),
                  ErrorCode::ShapeMismatch,
                  "scaled_dot_product_attention: q, k, v must share one (B, H, T, D) shape, got "
                  "{}, {}, {}",
                  describe(q), describe(k), describe(v));
  check_same_dtype(q, k, "scaled_dot_product_attention");
  check_same_dtype(q, v, "scaled_dot_product_attention");
  const double scale = 1.0 / std::sqrt(double(q.size(3)));
  // probs (B, H, T, T) are saved for backward.
  Tensor probs;
  Tensor out = dispatch(
      def, {q, k, v},
      [&probs, scale, causal](const std::vector<Tensor>& in) {
        const Shape& s = in[0].shape();
        Tensor o = empty_as(s, in[0]);
        probs = Tensor::empty({s[0], s[1], s[2], s[2]}, acc_dtype(o.dtype()), o.device());
        kernels_for(o.device())
            .attention_forward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(), in[2].data_ptr(),
                               o.data_ptr(), probs.data_ptr(), s[0] * s[1], s[2], s[3], scale,
                               causal);
        return o;
      },
      {}, &rule);
  if (is_dtensor(out)) {
    probs = wrap_like(probs, out, {q.size(0), q.size(1), q.size(2), q.size(2)},
                      dist_of(out).placements);
  }
  attach_grad(out, "ScaledDotProductAttentionBackward", {q, k, v},
              [q, k, v, probs, scale](const Tensor& g) {
                Tensor gk, gv;
                Tensor gq = dispatch(
                    back, {g, q, k, v, probs},
                    [&](const std::vector<Tensor>& in) {
                      const Shape& s = in[0].shape();
                      Tensor o = empty_as(s, in[0]);
                      gk = empty_as(s, o);
                      gv = empty_as(s, o);
                      kernels_for(o.device())
                          .attention_backward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                              in[2].data_ptr(), in[3].data_ptr(), in[4].data_ptr(),
                                              o.data_ptr(), gk.data_ptr(), gv.data_ptr(),
                                              s[0] * s[1], s[2], s[3], scale);
                      return o;
                    },
                    {}, &rule);
                if (is_dtensor(gq)) {
                  gk = wrap_like(gk, gq, gq.shape(), dist_of(gq).placements);
                  gv = wrap_like(gv, gq, gq.shape(), dist_of(gq).placements);
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
  Tensor out = dispatch(def, {logits, targets}, [](const std::vector<Tensor>& in) {
    i64 rows = 0, cols = 0;
    std::tie(rows, cols) = rows_cols(in[0]);
    Tensor o = Tensor::empty({}, in[0].dtype(), in[0].device());
    kernels_for(o.device())
        .cross_entropy_forward(o.dtype(), in[0].data_ptr(), index_data(in[1]), rows, cols,
                               o.data_ptr());
    return o;
  });
  attach_grad(out, "CrossEntropyBackward", {logits}, [logits, targets](const Tensor& g) {
    Tensor gl = dispatch(back, {g, logits, targets}, [](const std::vector<Tensor>& in) {
      i64 rows = 0, cols = 0;
      std::tie(rows, cols) = rows_cols(in[1]);
      Tensor o = empty_as(in[1].shape(), in[1]);
      kernels_for(o.device())
          .cross_entropy_backward(o.dtype(), in[0].data_ptr(), in[1].data_ptr(), index_data(in[2]),
                                  o.data_ptr(), rows, cols);
      return o;
    });
    return std::vector<Tensor>{gl};
  });
  return out;
}

// ---------------------------------------------------------------- reductions

Tensor sum(const Tensor& x) {
  static const OpDef def{"sum", "default", EventKind::Compute};
  std::vector<int> all(std::size_t(x.dim()));
  for (int d = 0; d < x.dim(); ++d) all[std::size_t(d)] = d;
  const ShardingRule rule = reduce_rule(all, false);
  Tensor out = dispatch(
      def, {x},
      [](const std::vector<Tensor>& in) {
        Tensor o = Tensor::empty({}, in[0].dtype(), in[0].device());
        kernels_for(o.device()).sum_all(o.dtype(), in[0].data_ptr(), o.data_ptr(), in[0].numel());
        return o;
      },
      {}, &rule);
  attach_grad(out, "SumBackward", {x},
              [s = x.shape()](const Tensor& g) { return std::vector<Tensor>{expand(g, s)}; });
  return out;
}

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  static const OpDef def{"sum", "dim_IntList", EventKind::Compute};
  dim = normalize_dim(dim, x.dim(), "sum");
  Shape kept = x.shape();
  if (x.dim() > 0) kept[std::size_t(dim)] = 1;
  const ShardingRule rule = reduce_rule({dim}, keepdim);
  Tensor out = dispatch(
      def, {x},
      [dim, keepdim](const std::vector<Tensor>& in) {
        const Split3 s = split_at(in[0].shape(), dim);
        Shape shape = in[0].shape();
        if (in[0].dim() > 0) {
          shape[std::size_t(dim)] = 1;
          if (!keepdim) shape.erase(shape.begin() + dim);
        }
        Tensor o = empty_as(shape, in[0]);
        kernels_for(o.device())
            .sum_dim(o.dtype(), in[0].data_ptr(), o.data_ptr(), s.outer, s.dim, s.inner);
        return o;
      },
      {}, &rule);
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
