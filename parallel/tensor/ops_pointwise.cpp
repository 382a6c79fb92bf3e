// Elementwise ops: the broadcasting binary ops, scalar ops, activations and dropout, with their
// backward formulas.
#include "parallel/tensor/ops_internal.h"

namespace commtrace {

using namespace ops;

namespace {

// ---- binary ops with broadcasting: attrs i[0] the BinaryOp ----

void binary_shapes(std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
  out[0] = OutSpec{broadcast_shapes(in[0].shape(), in[1].shape(), "binary op"), in[0].dtype()};
}

void binary_run(std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out,
                const ShardInfo*) {
  kernels_of(out[0]).binary(out[0].dtype(), BinaryOp(a.i[0]), in[0].data_ptr(), in[0].shape(),
                            in[1].data_ptr(), in[1].shape(), out[0].data_ptr(), out[0].shape());
}

// add and sub are linear in their inputs (Partial + Partial stays Partial); mul and div not.
const OpDef kAdd{"add",     "Tensor", EventKind::Compute, 1, binary_shapes, rules::linear_pointwise,
                 binary_run};
const OpDef kSub{"sub",     "Tensor", EventKind::Compute, 1, binary_shapes, rules::linear_pointwise,
                 binary_run};
const OpDef kMul{
    "mul", "Tensor", EventKind::Compute, 1, binary_shapes, rules::nonlinear_pointwise, binary_run};
const OpDef kDiv{
    "div", "Tensor", EventKind::Compute, 1, binary_shapes, rules::nonlinear_pointwise, binary_run};

Tensor binary(const OpDef& def, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_same_dtype(a, b, def.name);
  broadcast_shapes(a.shape(), b.shape(), def.name);
  OpAttrs attrs;
  attrs.i[0] = std::int64_t(op);
  const Tensor in[] = {a, b};
  return dispatch1(def, in, attrs);
}

// ---- scalar ops: attrs f[0] the scalar ----

const OpDef kMulScalar{
    "mul",
    "Scalar",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::linear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).scale(out[0].dtype(), in[0].data_ptr(), a.f[0], out[0].data_ptr(),
                               out[0].numel());
    }};
const OpDef kAddScalar{
    "add",
    "Scalar",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).add_scalar(out[0].dtype(), in[0].data_ptr(), a.f[0], out[0].data_ptr(),
                                    out[0].numel());
    }};

// ---- activations: forward (x) and backward (grad, x) ----

const OpDef kRelu{
    "relu",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).relu_forward(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(),
                                      out[0].numel());
    }};
const OpDef kReluBackward{
    "threshold_backward",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).relu_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                       out[0].data_ptr(), out[0].numel());
    }};
const OpDef kGelu{
    "gelu",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).gelu_forward(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(),
                                      out[0].numel());
    }};
const OpDef kSilu{
    "silu",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).silu_forward(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(),
                                      out[0].numel());
    }};
const OpDef kSiluBackward{
    "silu_backward",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).silu_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                       out[0].data_ptr(), out[0].numel());
    }};
const OpDef kGeluBackward{
    "gelu_backward",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).gelu_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                       out[0].data_ptr(), out[0].numel());
    }};

// ---- dropout: outputs (out, mask in acc); attrs f[0] p, u the seed. Each shard draws its own
// mask from the seed.

const OpDef kDropout{
    "native_dropout",
    "default",
    EventKind::Compute,
    2,
    [](std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
      out[0] = OutSpec{in[0].shape(), in[0].dtype()};
      out[1] = OutSpec{in[0].shape(), acc_dtype(in[0].dtype())};
    },
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).dropout_forward(out[0].dtype(), in[0].data_ptr(), out[0].data_ptr(),
                                         out[1].data_ptr(), out[0].numel(), a.f[0], a.u);
    }};
const OpDef kDropoutBackward{
    "native_dropout_backward",
    "default",
    EventKind::Compute,
    1,
    same_as_input0,
    rules::nonlinear_pointwise,
    [](std::span<const Tensor> in, const OpAttrs&, std::span<Tensor> out, const ShardInfo*) {
      kernels_of(out[0]).dropout_backward(out[0].dtype(), in[0].data_ptr(), in[1].data_ptr(),
                                          out[0].data_ptr(), out[0].numel());
    }};

// One unary op, and its backward on (grad, saved) when it has one.
Tensor unary(const OpDef& def, const Tensor& x, const OpAttrs& a = {}) {
  const Tensor in[] = {x};
  return dispatch1(def, in, a);
}
Tensor backward_of(const OpDef& def, const Tensor& g, const Tensor& saved) {
  const Tensor in[] = {g, saved};
  return dispatch1(def, in);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary(kAdd, BinaryOp::Add, a, b);
  const Tensor in[] = {a, b};
  attach_grad(out, "AddBackward", in, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary(kSub, BinaryOp::Sub, a, b);
  const Tensor in[] = {a, b};
  attach_grad(out, "SubBackward", in, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, sa), sum_to(mul(g, -1.0), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary(kMul, BinaryOp::Mul, a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Tensor in[] = {a, b};
  attach_grad(out, "MulBackward", in, [a, b, need_a, need_b](const Tensor& g) {
    return std::vector<Tensor>{need_a ? sum_to(mul(g, b), a.shape()) : Tensor(),
                               need_b ? sum_to(mul(g, a), b.shape()) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary(kDiv, BinaryOp::Div, a, b);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  const Tensor in[] = {a, b};
  attach_grad(out, "DivBackward", in, [a, b, need_a, need_b](const Tensor& g) {
    // d(a/b)/db = -a / b²
    return std::vector<Tensor>{
        need_a ? sum_to(div(g, b), a.shape()) : Tensor(),
        need_b ? sum_to(mul(div(mul(g, a), mul(b, b)), -1.0), b.shape()) : Tensor()};
  });
  return out;
}

Tensor mul(const Tensor& a, double s) {
  OpAttrs attrs;
  attrs.f[0] = s;
  Tensor out = unary(kMulScalar, a, attrs);
  const Tensor in[] = {a};
  attach_grad(out, "MulBackward", in,
              [s](const Tensor& g) { return std::vector<Tensor>{mul(g, s)}; });
  return out;
}

Tensor add(const Tensor& a, double s) {
  OpAttrs attrs;
  attrs.f[0] = s;
  Tensor out = unary(kAddScalar, a, attrs);
  const Tensor in[] = {a};
  attach_grad(out, "AddBackward", in, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = unary(kRelu, x);
  const Tensor in[] = {x};
  attach_grad(out, "ReluBackward", in, [x](const Tensor& g) {
    return std::vector<Tensor>{backward_of(kReluBackward, g, x)};
  });
  return out;
}

Tensor gelu(const Tensor& x) {
  Tensor out = unary(kGelu, x);
  const Tensor in[] = {x};
  attach_grad(out, "GeluBackward", in, [x](const Tensor& g) {
    return std::vector<Tensor>{backward_of(kGeluBackward, g, x)};
  });
  return out;
}

Tensor silu(const Tensor& x) {
  Tensor out = unary(kSilu, x);
  const Tensor in[] = {x};
  attach_grad(out, "SiluBackward", in, [x](const Tensor& g) {
    return std::vector<Tensor>{backward_of(kSiluBackward, g, x)};
  });
  return out;
}

Tensor dropout(const Tensor& x, double p, std::uint64_t seed) {
  COMMTRACE_CHECK(p >= 0.0 && p < 1.0, ErrorCode::InvalidArgument,
                  "dropout: p = {} out of range [0, 1)", p);
  if (p == 0.0) return x;
  OpAttrs a;
  a.f[0] = p;
  a.u = seed;
  const Tensor in[] = {x};
  const OpOutputs r = dispatch(kDropout, in, a);
  Tensor out = r[0];
  attach_grad(out, "NativeDropoutBackward", in, [mask = r[1]](const Tensor& g) {
    return std::vector<Tensor>{backward_of(kDropoutBackward, g, mask)};
  });
  return out;
}

}  // namespace commtrace
