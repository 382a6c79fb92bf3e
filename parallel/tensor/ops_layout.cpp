// Layout ops and copies: *_like, clone, dtype conversion, view, transposes, narrow (slice), cat
// and expand. Views share storage; the rest copy through the layout kernels.
#include <optional>

#include "parallel/tensor/ops_internal.h"

namespace commtrace {

using namespace ops;

namespace {

// *_like ops read only the input's shape: it stays where it is (no collective) and the output
// takes its layout, a Partial one becoming Replicate (PyTorch's create_like strategy).
void like_rule(const RuleArgs& r, Strategies& s) {
  DimStrategy& d = s.add();
  d.inputs[0] = r.current[0];
  d.outputs[0] = r.current[0].is_partial() ? Placement::replicate() : r.current[0];
}

void fill_run(std::span<Tensor> out, double value) {
  kernels_of(out[0]).fill(out[0].dtype(), out[0].data_ptr(), value, out[0].numel());
}

void convert_run(std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out,
                 const ShardInfo*) {
  kernels_of(out[0]).convert(in[0].data_ptr(), in[0].dtype(), out[0].data_ptr(), out[0].dtype(),
                             out[0].numel());
}

const OpDef kOnesLike{"ones_like",
                      "default",
                      EventKind::Compute,
                      1,
                      same_as_input0,
                      like_rule,
                      [](std::span<const Tensor>, const OpAttrs&, std::span<Tensor> out,
                         const ShardInfo*) { fill_run(out, 1.0); }};
const OpDef kZerosLike{"zeros_like",
                       "default",
                       EventKind::Compute,
                       1,
                       same_as_input0,
                       like_rule,
                       [](std::span<const Tensor>, const OpAttrs&, std::span<Tensor> out,
                          const ShardInfo*) { fill_run(out, 0.0); }};
const OpDef kClone{"clone",    "default",      EventKind::Compute,
                   1,          same_as_input0, rules::linear_pointwise,
                   convert_run};
// attrs: i[0] the target dtype.
const OpDef kToCopy{"_to_copy",
                    "default",
                    EventKind::Compute,
                    1,
                    [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
                      out[0] = OutSpec{in[0].shape(), DType(a.i[0])};
                    },
                    rules::linear_pointwise,
                    convert_run};

// ---- view: attrs.shape is the target (global) shape ----

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
void view_rule(const RuleArgs& r, Strategies& s) {
  const Placement p = r.current[0];
  DimStrategy& d = s.add();
  if (!p.is_shard()) {
    d.inputs[0] = p;
    d.outputs[0] = p;
    return;
  }
  const Shape& in_shape = r.inputs[0].shape();
  const Shape& out_shape = *r.attrs.shape;
  for (const ViewGroup& g : view_groups(in_shape, out_shape)) {
    if (p.dim < g.in_begin || p.dim >= g.in_end) continue;
    int first_in = g.in_begin, first_out = g.out_begin;
    while (first_in < g.in_end - 1 && in_shape[std::size_t(first_in)] == 1) ++first_in;
    while (first_out < g.out_end - 1 && out_shape[std::size_t(first_out)] == 1) ++first_out;
    if (p.dim != first_in) break;
    i64 inner_in = 1, inner_out = 1;
    for (int k = first_in + 1; k < g.in_end; ++k) inner_in *= in_shape[std::size_t(k)];
    for (int k = first_out + 1; k < g.out_end; ++k) inner_out *= out_shape[std::size_t(k)];
    // Rank q holds chunk q of dim first_in: chunk * inner_in elements of the group, which must
    // fill whole rows (inner_out elements each) of the output's first dim.
    const i64 n = in_shape[std::size_t(first_in)];
    bool whole = inner_out > 0;
    for (int q = 0; whole && q < r.mesh_dim_size; ++q) {
      whole = chunk_range(n, r.mesh_dim_size, q).size * inner_in % inner_out == 0;
    }
    if (!whole) break;
    d.inputs[0] = p;
    d.outputs[0] = Placement::shard(first_out);
    return;
  }
  // Gather first: the default strategy is all Replicate.
}

const OpDef kView{"view",
                  "default",
                  EventKind::Trivial,
                  1,
                  [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
                    out[0] = OutSpec{*a.shape, in[0].dtype()};
                  },
                  view_rule,
                  nullptr,
                  OpDef::Result::View};

// ---- transposes: attrs i[0], i[1] the swapped dims ----

void transpose_shapes(std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
  Shape s = in[0].shape();
  std::swap(s[std::size_t(a.i[0])], s[std::size_t(a.i[1])]);
  out[0] = OutSpec{s, in[0].dtype()};
}

void transpose_rule(const RuleArgs& r, Strategies& s) {
  DimStrategy& d = s.add();
  Placement p = r.current[0];
  d.inputs[0] = p;
  if (p.is_shard(int(r.attrs.i[0]))) {
    p.dim = int(r.attrs.i[1]);
  } else if (p.is_shard(int(r.attrs.i[1]))) {
    p.dim = int(r.attrs.i[0]);
  }
  d.outputs[0] = p;
}

void transpose_run(std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out,
                   const ShardInfo*) {
  std::array<int, 16> perm{};
  for (int i = 0; i < in[0].dim(); ++i) perm[std::size_t(i)] = i;
  std::swap(perm[std::size_t(a.i[0])], perm[std::size_t(a.i[1])]);
  kernels_of(out[0]).permute(out[0].dtype(), in[0].data_ptr(), in[0].shape(), perm.data(),
                             out[0].data_ptr());
}

const OpDef kT{"t",          "default", EventKind::Trivial, 1, transpose_shapes, transpose_rule,
               transpose_run};
const OpDef kTranspose{"transpose",      "int",          EventKind::Trivial, 1,
                       transpose_shapes, transpose_rule, transpose_run};

Tensor transpose_impl(const Tensor& x, int d0, int d1, const OpDef& def) {
  COMMTRACE_CHECK(x.dim() <= 16, ErrorCode::Unsupported, "{}: {} has more than 16 dims", def.name,
                  describe(x));
  OpAttrs a;
  a.i[0] = d0;
  a.i[1] = d1;
  const Tensor in[] = {x};
  Tensor out = dispatch1(def, in, a);
  attach_grad(out, "TransposeBackward", in, [d0, d1, &def](const Tensor& g) {
    return std::vector<Tensor>{transpose_impl(g, d0, d1, def)};
  });
  return out;
}

// ---- narrow (slice) and its backward: attrs i[0] dim, i[1] start, i[2] length / full size ----

void dim_whole_linear(const RuleArgs& r, Strategies& s) {
  const int whole[] = {int(r.attrs.i[0])};
  rules::follow(r, whole, true, false, s);
}

// Input 0's shape with dim i[0] of size i[2].
void dim_replaced_shape(std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
  Shape s = in[0].shape();
  s[std::size_t(a.i[0])] = a.i[2];
  out[0] = OutSpec{s, in[0].dtype()};
}

const OpDef kSlice{
    "slice",
    "Tensor",
    EventKind::Trivial,
    1,
    dim_replaced_shape,
    dim_whole_linear,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).narrow(out[0].dtype(), in[0].data_ptr(), in[0].shape(), int(a.i[0]),
                                a.i[1], a.i[2], out[0].data_ptr());
    }};

const OpDef kSliceBackward{
    "slice_backward",
    "default",
    EventKind::Compute,
    1,
    dim_replaced_shape,
    dim_whole_linear,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const Kernels& k = kernels_of(out[0]);
      k.fill(out[0].dtype(), out[0].data_ptr(), 0.0, out[0].numel());
      k.narrow_scatter(out[0].dtype(), in[0].data_ptr(), in[0].shape(), int(a.i[0]), a.i[1],
                       out[0].data_ptr(), out[0].shape());
    }};

// ---- cat: attrs i[0] the dim ----

const OpDef kCat{
    "cat",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
      Shape s = in[0].shape();
      const auto d = std::size_t(a.i[0]);
      s[d] = 0;
      for (const Tensor& x : in) s[d] += x.shape()[d];
      out[0] = OutSpec{s, in[0].dtype()};
    },
    dim_whole_linear,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const Kernels& k = kernels_of(out[0]);
      const auto d = std::size_t(a.i[0]);
      i64 start = 0;
      for (const Tensor& x : in) {
        k.narrow_scatter(out[0].dtype(), x.data_ptr(), x.shape(), int(d), start, out[0].data_ptr(),
                         out[0].shape());
        start += x.shape()[d];
      }
    }};

// ---- expand: attrs.shape the target shape ----

// Broadcast of the input to a larger shape: shards shift right by the added leading dims;
// broadcast (size-1) dims must be Replicate.
void expand_rule(const RuleArgs& r, Strategies& s) {
  const int added = int(r.attrs.shape->size()) - r.inputs[0].dim();
  Placement p = r.current[0];
  if (p.is_shard() && r.inputs[0].shape()[std::size_t(p.dim)] == 1) p = Placement::replicate();
  DimStrategy& d = s.add();
  d.inputs[0] = p;
  d.outputs[0] = p.is_shard() ? Placement::shard(p.dim + added) : p;
}

const OpDef kExpand{
    "expand",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
      out[0] = OutSpec{*a.shape, in[0].dtype()};
    },
    expand_rule,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      // A broadcast copy: x + 0 over the (local) target shape.
      const Tensor zero = Tensor::zeros({}, out[0].dtype(), out[0].device());
      kernels_of(out[0]).binary(out[0].dtype(), BinaryOp::Add, in[0].data_ptr(), in[0].shape(),
                                zero.data_ptr(), Shape{}, out[0].data_ptr(), out[0].shape());
    }};

}  // namespace

Tensor ones_like(const Tensor& x) {
  const Tensor in[] = {x};
  return dispatch1(kOnesLike, in);
}

Tensor zeros_like(const Tensor& x) {
  const Tensor in[] = {x};
  return dispatch1(kZerosLike, in);
}

Tensor clone(const Tensor& x) {
  const Tensor in[] = {x};
  Tensor out = dispatch1(kClone, in);
  attach_grad(out, "CloneBackward", in, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  OpAttrs a;
  a.i[0] = std::int64_t(dtype);
  const Tensor in[] = {x};
  Tensor out = dispatch1(kToCopy, in, a);
  if (is_floating(dtype)) {
    const DType src = x.dtype();
    attach_grad(out, "ToCopyBackward", in,
                [src](const Tensor& g) { return std::vector<Tensor>{to_dtype(g, src)}; });
  }
  return out;
}

Tensor view(const Tensor& x, Shape shape) {
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
  OpAttrs a;
  a.shape = &shape;
  const Tensor in[] = {x};
  Tensor out = dispatch1(kView, in, a);
  attach_grad(out, "ViewBackward", in,
              [src = x.shape()](const Tensor& g) { return std::vector<Tensor>{view(g, src)}; });
  return out;
}

Tensor t(const Tensor& x) {
  COMMTRACE_CHECK(x.dim() == 2, ErrorCode::InvalidArgument, "t: expected a 2-d tensor, got {}",
                  describe(x));
  return transpose_impl(x, 0, 1, kT);
}

Tensor transpose(const Tensor& x, int d0, int d1) {
  d0 = normalize_dim(d0, x.dim(), "transpose");
  d1 = normalize_dim(d1, x.dim(), "transpose");
  return transpose_impl(x, d0, d1, kTranspose);
}

Tensor narrow(const Tensor& x, int dim, i64 start, i64 len) {
  dim = normalize_dim(dim, x.dim(), "narrow");
  const i64 size = x.shape()[std::size_t(dim)];
  COMMTRACE_CHECK(start >= 0 && len >= 0 && start <= size && len <= size - start,
                  ErrorCode::InvalidArgument,
                  "narrow: [{}, {}) out of range [0, {}] on dim {} of {}", start, start + len, size,
                  dim, describe(x));
  OpAttrs a;
  a.i[0] = dim;
  a.i[1] = start;
  a.i[2] = len;
  const Tensor in[] = {x};
  Tensor out = dispatch1(kSlice, in, a);
  attach_grad(out, "SliceBackward", in, [a, size](const Tensor& g) {
    OpAttrs b = a;
    b.i[2] = size;
    const Tensor gin[] = {g};
    return std::vector<Tensor>{dispatch1(kSliceBackward, gin, b)};
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int dim) {
  COMMTRACE_CHECK(!xs.empty(), ErrorCode::InvalidArgument, "cat: no tensors");
  dim = normalize_dim(dim, xs[0].dim(), "cat");
  std::vector<i64> sizes;
  sizes.reserve(xs.size());
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
  OpAttrs a;
  a.i[0] = dim;
  Tensor out = dispatch1(kCat, xs, a);
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
  COMMTRACE_CHECK(broadcast_shapes(x.shape(), shape, "expand") == shape, ErrorCode::ShapeMismatch,
                  "expand: {} cannot expand to {}", describe(x), shape_str(shape));
  OpAttrs a;
  a.shape = &shape;
  const Tensor in[] = {x};
  Tensor out = dispatch1(kExpand, in, a);
  attach_grad(out, "ExpandBackward", in,
              [src = x.shape()](const Tensor& g) { return std::vector<Tensor>{sum_to(g, src)}; });
  return out;
}

}  // namespace commtrace
