// Reductions: sum over all elements or one dim, mean, and sum_to (the reverse of broadcasting,
// recorded as PyTorch's sum.dim_IntList).
#include "parallel/tensor/ops_internal.h"

namespace commtrace {

using namespace ops;

namespace {

void sum_all_rule(const RuleArgs& r, Strategies& s) {
  std::array<int, 16> dims{};
  for (int d = 0; d < r.inputs[0].dim() && d < 16; ++d) dims[std::size_t(d)] = d;
  rules::reduce(r, std::span<const int>(dims.data(), std::size_t(r.inputs[0].dim())), false, 0, s);
}

const OpDef kSum{
    "sum",
    "default",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{Shape{}, in[0].dtype()};
    },
    sum_all_rule,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).sum_all(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(),
                                 in[0].numel());
    }};

// attrs: i[0] the dim, i[1] keepdim.
const OpDef kSumDim{
    "sum",
    "dim_IntList",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
      Shape s = in[0].shape();
      if (!s.empty()) {
        s[std::size_t(a.i[0])] = 1;
        if (a.i[1] == 0) s.erase(s.begin() + a.i[0]);
      }
      out[0] = OutSpec{s, in[0].dtype()};
    },
    [](const RuleArgs& r, Strategies& s) {
      const int dims[] = {int(r.attrs.i[0])};
      rules::reduce(r, dims, r.attrs.i[1] != 0, 0, s);
    },
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      const Split3 s = split_at(in[0].shape(), int(a.i[0]));
      kernels_of(out[0]).sum_dim(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(), s.outer,
                                 s.dim, s.inner);
    }};

// sum_to: attrs.shape the target. The reduced dims of x are the leading ones the target lacks
// (dropped) and its size-1 ones (kept); kept shards shift left by the dropped count.
const OpDef kSumTo{
    "sum",
    "dim_IntList",
    EventKind::Compute,
    1,
    [](std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
      out[0] = OutSpec{*a.shape, in[0].dtype()};
    },
    [](const RuleArgs& r, Strategies& s) {
      const Shape& x = r.inputs[0].shape();
      const Shape& target = *r.attrs.shape;
      const int added = int(x.size()) - int(target.size());
      std::array<int, 16> reduced{};
      std::size_t n = 0;
      for (int d = 0; d < int(x.size()) && n < reduced.size(); ++d) {
        if (d < added || (target[std::size_t(d - added)] == 1 && x[std::size_t(d)] != 1)) {
          reduced[n++] = d;
        }
      }
      rules::reduce(r, std::span<const int>(reduced.data(), n), true, added, s);
    },
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).sum_to(out[0].dtype(), in[0].data_ptr(), in[0].shape(), out[0].data_ptr(),
                                out[0].shape());
    }};

}  // namespace

Tensor sum(const Tensor& x) {
  COMMTRACE_CHECK(x.dim() <= 16, ErrorCode::Unsupported, "sum: {} has more than 16 dims",
                  describe(x));
  const Tensor in[] = {x};
  Tensor out = dispatch1(kSum, in);
  attach_grad(out, "SumBackward", in,
              [s = x.shape()](const Tensor& g) { return std::vector<Tensor>{expand(g, s)}; });
  return out;
}

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  dim = normalize_dim(dim, x.dim(), "sum");
  Shape kept = x.shape();
  if (x.dim() > 0) kept[std::size_t(dim)] = 1;
  OpAttrs a;
  a.i[0] = dim;
  a.i[1] = keepdim;
  const Tensor in[] = {x};
  Tensor out = dispatch1(kSumDim, in, a);
  attach_grad(out, "SumBackward", in, [kept, full = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{expand(g.shape() == kept ? g : view(g, kept), full)};
  });
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  COMMTRACE_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(),
                  ErrorCode::ShapeMismatch, "sum_to: {} does not reduce to {}", describe(x),
                  shape_str(shape));
  COMMTRACE_CHECK(x.dim() <= 16, ErrorCode::Unsupported, "sum_to: {} has more than 16 dims",
                  describe(x));
  OpAttrs a;
  a.shape = &shape;
  const Tensor in[] = {x};
  Tensor out = dispatch1(kSumTo, in, a);
  attach_grad(out, "SumToBackward", in,
              [src = x.shape()](const Tensor& g) { return std::vector<Tensor>{expand(g, src)}; });
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
