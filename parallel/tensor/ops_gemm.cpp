// GEMM: the one entry every matrix product passes (DESIGN §1), recorded as mm, addmm or bmm with
// PyTorch's operand shapes, and the products built on it (mm, bmm, addmm, linear) with their
// backward formulas. Inputs are always (bias or undefined, a, b).
#include <atomic>

#include "parallel/tensor/ops_internal.h"

namespace commtrace {

using namespace ops;

namespace {

std::atomic<bool> g_allow_tf32{false};

// Logical op(x) shape: the last two dims swapped when transposed.
Shape op_shape(const Shape& s, bool trans) {
  Shape o = s;
  if (trans) std::swap(o[o.size() - 2], o[o.size() - 1]);
  return o;
}

// attrs: i[0] trans_a, i[1] trans_b.
void gemm_shapes(std::span<const Tensor> in, const OpAttrs& a, OutSpec* out) {
  const Shape oa = op_shape(in[1].shape(), a.i[0] != 0), ob = op_shape(in[2].shape(), a.i[1] != 0);
  out[0] =
      OutSpec{oa.size() == 3 ? Shape{oa[0], oa[1], ob[2]} : Shape{oa[0], ob[1]}, in[1].dtype()};
}

// Logical (out, op(a), op(b)) candidates in PyTorch's einsum order: replicate, batch,
// contracting (a Partial output), lhs free, rhs free; mapped to the stored operands.
void matmul_rule(const RuleArgs& r, Strategies& s) {
  const int rank = r.inputs[1].dim();
  const bool trans_a = r.attrs.i[0] != 0, trans_b = r.attrs.i[1] != 0;
  const int m = rank - 2, last = rank - 1;
  auto S = [](int d) { return Placement::shard(d); };
  const Placement R = Placement::replicate(), P = Placement::partial();
  std::array<std::array<Placement, 3>, 5> logical{};
  int n = 0;
  logical[std::size_t(n++)] = {R, R, R};
  if (rank == 3) logical[std::size_t(n++)] = {S(0), S(0), S(0)};
  logical[std::size_t(n++)] = {P, S(last), S(m)};
  logical[std::size_t(n++)] = {S(m), S(m), R};
  logical[std::size_t(n++)] = {S(last), R, S(last)};
  // A transposed operand stores its last two dims swapped.
  auto stored = [&](Placement p, bool trans) {
    if (trans && p.is_shard() && p.dim >= m) p.dim = p.dim == m ? last : m;
    return p;
  };
  const Tensor& bias = r.inputs[0];
  for (int i = 0; i < n; ++i) {
    const auto& [o, a, b] = logical[std::size_t(i)];
    DimStrategy& d = s.add();
    d.outputs[0] = o;
    if (bias.defined()) {
      // The bias broadcasts over the output: it holds a shard only on a real dim.
      Placement bp = o;
      if (o.is_shard()) {
        const int aligned = o.dim - (rank - bias.dim());
        bp =
            aligned >= 0 && bias.shape()[std::size_t(aligned)] != 1 ? Placement::shard(aligned) : R;
      }
      d.inputs[0] = bp;
    }
    d.inputs[1] = stored(a, trans_a);
    d.inputs[2] = stored(b, trans_b);
  }
}

void gemm_run(std::span<const Tensor> in, const OpAttrs& attrs, std::span<Tensor> out,
              const ShardInfo*) {
  const Tensor& A = in[1];
  const Tensor& B = in[2];
  const bool trans_a = attrs.i[0] != 0, trans_b = attrs.i[1] != 0;
  const i64 ar = A.size(-2), ac = A.size(-1), br = B.size(-2), bc = B.size(-1);
  const i64 m = trans_a ? ac : ar, k = trans_a ? ar : ac, n = trans_b ? br : bc;
  GemmArgs g;
  g.dt = out[0].dtype();
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.batch = A.dim() == 3 ? A.size(0) : 1;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = A.data_ptr();
  g.lda = ac;
  g.stride_a = ar * ac;
  g.b = B.data_ptr();
  g.ldb = bc;
  g.stride_b = br * bc;
  g.c = out[0].data_ptr();
  g.ldc = n;
  g.stride_c = m * n;
  if (in[0].defined()) {
    g.bias = in[0].data_ptr();
    g.bias_rows = in[0].numel() == m * n ? m : 1;
  }
  g.allow_tf32 = g_allow_tf32.load(std::memory_order_relaxed);
  kernels_of(out[0]).gemm(g);
}

const OpDef kMm{"mm", "default", EventKind::Gemm, 1, gemm_shapes, matmul_rule, gemm_run};
const OpDef kAddmm{"addmm", "default", EventKind::Gemm, 1, gemm_shapes, matmul_rule, gemm_run};
const OpDef kBmm{"bmm", "default", EventKind::Gemm, 1, gemm_shapes, matmul_rule, gemm_run};

// The backward of out = a @ b for the plain (untransposed) products mm and bmm.
std::vector<Tensor> matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, bool need_a,
                                    bool need_b) {
  return {need_a ? gemm(g, b, Tensor(), false, true) : Tensor(),
          need_b ? gemm(a, g, Tensor(), true, false) : Tensor()};
}

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& bias, bool trans_a, bool trans_b) {
  const int rank = a.dim();
  COMMTRACE_CHECK((rank == 2 || rank == 3) && b.dim() == rank, ErrorCode::ShapeMismatch,
                  "gemm: expected two 2-d or two 3-d tensors, got {} and {}", describe(a),
                  describe(b));
  check_same_dtype(a, b, "gemm");
  const bool has_bias = bias.defined();
  const OpDef& def = rank == 3 ? kBmm : has_bias ? kAddmm : kMm;
  const Shape op_a = op_shape(a.shape(), trans_a), op_b = op_shape(b.shape(), trans_b);
  COMMTRACE_CHECK(rank == 2 || op_a[0] == op_b[0], ErrorCode::ShapeMismatch,
                  "bmm: batch sizes differ: {} and {}", describe(a), describe(b));
  COMMTRACE_CHECK(op_a.back() == op_b[op_b.size() - 2], ErrorCode::ShapeMismatch,
                  "{}: cannot multiply {} by {} (inner dims {} and {})", def.name, shape_str(op_a),
                  shape_str(op_b), op_a.back(), op_b[op_b.size() - 2]);
  if (has_bias) {
    COMMTRACE_CHECK(rank == 2, ErrorCode::InvalidArgument, "bmm: no bias");
    check_same_dtype(a, bias, "addmm");
    const Shape& bs = bias.shape();
    const i64 m = op_a[0], n = op_b[1];
    COMMTRACE_CHECK((bs == Shape{n} || bs == Shape{1, n} || bs == Shape{m, n}),
                    ErrorCode::ShapeMismatch, "addmm: bias {} does not broadcast to [{}, {}]",
                    describe(bias), m, n);
  }
  OpAttrs attrs;
  attrs.i[0] = trans_a;
  attrs.i[1] = trans_b;
  attrs.transposed = (trans_a ? 2u : 0u) | (trans_b ? 4u : 0u);
  const Tensor in[] = {bias, a, b};
  return dispatch1(def, in, attrs);
}

Tensor mm(const Tensor& a, const Tensor& b) {
  COMMTRACE_CHECK(a.dim() == 2 && b.dim() == 2, ErrorCode::ShapeMismatch,
                  "mm: expected 2-d tensors, got {} and {}", describe(a), describe(b));
  Tensor out = gemm(a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Tensor in[] = {a, b};
  attach_grad(out, "MmBackward", in, [a, b, need_a, need_b](const Tensor& g) {
    return matmul_backward(g, a, b, need_a, need_b);
  });
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  COMMTRACE_CHECK(a.dim() == 3 && b.dim() == 3, ErrorCode::ShapeMismatch,
                  "bmm: expected 3-d tensors, got {} and {}", describe(a), describe(b));
  Tensor out = gemm(a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Tensor in[] = {a, b};
  attach_grad(out, "BmmBackward", in, [a, b, need_a, need_b](const Tensor& g) {
    return matmul_backward(g, a, b, need_a, need_b);
  });
  return out;
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b) {
  COMMTRACE_CHECK(a.dim() == 2 && b.dim() == 2, ErrorCode::ShapeMismatch,
                  "addmm: expected 2-d tensors, got {} and {}", describe(a), describe(b));
  Tensor out = gemm(a, b, bias);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Tensor in[] = {bias, a, b};
  attach_grad(out, "AddmmBackward", in,
              [a, b, need_a, need_b, bias_shape = bias.shape()](const Tensor& g) {
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
  // The bias first: its gradient is final before the weight's, as in PyTorch (where the weight's
  // passes through a TBackward node); DDP buckets gradients in that order.
  const Tensor in[] = {b, x2, w};
  attach_grad(
      y, b.defined() ? "AddmmBackward" : "MmBackward", in,
      [x2, w, need_x, need_w, has_bias = b.defined()](const Tensor& g) {
        Tensor gx = need_x ? gemm(g, w) : Tensor();
        Tensor gw = need_w ? gemm(g, x2, Tensor(), true, false) : Tensor();
        return std::vector<Tensor>{has_bias ? sum(g, 0) : Tensor(), std::move(gx), std::move(gw)};
      });
  if (x.dim() == 2) return y;
  Shape out_shape = x.shape();
  out_shape.back() = w.size(0);
  return view(y, out_shape);
}

}  // namespace commtrace
