#include "parallel/nn/optim.h"

#include "kernels/backend.h"
#include "parallel/dtensor/dtensor.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/op.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {
void same_shape(std::span<const Tensor> in, const OpAttrs&, OutSpec* out) {
  out[0] = OutSpec{in[0].shape(), in[0].dtype()};
}

// In-place fused updates of a parameter's local tensor: inputs (p, g, state...), attrs.args the
// hyper-parameters of this step.
const OpDef kFusedSgd{
    "_fused_sgd_",
    "default",
    EventKind::Compute,
    1,
    same_shape,
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor>, const ShardInfo*) {
      kernels_for(in[0].device())
          .sgd_step(in[0].dtype(), in[0].data_ptr(), in[1].data_ptr(), in[2].data_ptr(),
                    in[0].numel(), *static_cast<const SgdArgs*>(a.args));
    },
    OpDef::Result::InPlace};
const OpDef kFusedAdamW{
    "_fused_adamw_",
    "default",
    EventKind::Compute,
    1,
    same_shape,
    nullptr,
    [](std::span<const Tensor> in, const OpAttrs& a, std::span<Tensor>, const ShardInfo*) {
      kernels_for(in[0].device())
          .adamw_step(in[0].dtype(), in[0].data_ptr(), in[1].data_ptr(), in[2].data_ptr(),
                      in[3].data_ptr(), in[0].numel(), *static_cast<const AdamWArgs*>(a.args));
    },
    OpDef::Result::InPlace};

Tensor local_of(const Tensor& t) { return is_dtensor(t) ? dist_of(t).local : t; }

// The gradient's local part laid out like the parameter: a Partial gradient of a Replicate
// parameter (a SequenceParallel norm) is all-reduced here, in the optimizer phase.
Tensor grad_like_param(const Tensor& p, const Tensor& g) {
  if (!is_dtensor(p)) return g;
  const DistSpec& ps = dist_of(p);
  COMMTRACE_CHECK(is_dtensor(g), ErrorCode::Internal,
                  "optimizer: DTensor parameter {} has a "
                  "plain gradient",
                  describe(p));
  const DistSpec& gs = dist_of(g);
  if (gs.placements == ps.placements) return gs.local;
  return redistribute_local(
      gs.local, g.shape(), *ps.mesh, gs.placements, ps.placements,
      fmt::format("optimizer: gradient {} of a {} parameter", placements_str(gs.placements),
                  placements_str(ps.placements)));
}
// A loop: shapes are short, and std::equal calls memcmp.
bool same_dims(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// Same dtype and shape; for DTensors, the same mesh, placements and local shape.
bool same_layout(const TensorImpl& a, const TensorImpl& b) {
  if (a.dtype != b.dtype || !same_dims(a.shape, b.shape) || !a.dist != !b.dist) return false;
  return !a.dist || (a.dist->mesh == b.dist->mesh && a.dist->placements == b.dist->placements &&
                     same_dims(a.dist->local.shape(), b.dist->local.shape()));
}
}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  for (const Tensor& p : params_) {
    COMMTRACE_CHECK(is_floating(p.dtype()), ErrorCode::Unsupported,
                    "optimizer: parameter {} is {}; parameters are f32, f64 or bf16", describe(p),
                    dtype_name(p.dtype()));
  }
}

void Optimizer::step() {
  PhaseScope phase(Phase::Optimizer);
  NoGradGuard no_grad;
  ++steps_;
  KeyedRegion region(Tracer::current() ? events_key() : 0);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (g.defined()) update(i, grad_like_param(params_[i], g));
  }
  region.end();
}

std::uint64_t Optimizer::events_key() {
  // Parameters keep their layouts (no tensor's ever changes): the gradients' are compared, as one
  // word each when laid out like their parameter (the usual case) or missing.
  scratch_.clear();
  for (const Tensor& p : params_) {
    const TensorImpl& pi = *p.impl();
    const TensorImpl* g = pi.grad.get();
    if (!g) {
      scratch_.push_back(0);
    } else if (same_layout(pi, *g)) {
      scratch_.push_back(1);
    } else {
      scratch_.push_back(2);
      const Tensor gt = p.grad();
      append_layout(gt, scratch_);
      if (g->dist) scratch_.push_back(std::int64_t(g->dist->mesh->uid()));
    }
  }
  if (key_ == 0 || scratch_ != layouts_) {
    layouts_.swap(scratch_);
    key_ = new_trace_key();
  }
  return key_;
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.set_grad(Tensor());
}

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double weight_decay)
    : Optimizer(std::move(params)), lr_(lr), momentum_(momentum), weight_decay_(weight_decay) {
  COMMTRACE_CHECK(lr > 0 && momentum >= 0 && weight_decay >= 0, ErrorCode::InvalidArgument,
                  "SGD: lr {} must be > 0, momentum {} and weight_decay {} >= 0", lr, momentum,
                  weight_decay);
  momentum_buf_.resize(params_.size());
}

void SGD::update(std::size_t i, const Tensor& g) {
  const Tensor p = local_of(params_[i]);
  const bool first = !momentum_buf_[i].defined();
  if (first) momentum_buf_[i] = Tensor::zeros(p.shape(), acc_dtype(p.dtype()), p.device());
  const SgdArgs args{lr_, momentum_, weight_decay_, first};
  OpAttrs a;
  a.args = &args;
  const Tensor in[] = {p, g, momentum_buf_[i]};
  dispatch(kFusedSgd, in, a);
}

AdamW::AdamW(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : Optimizer(std::move(params)),
      lr_(lr),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay) {
  COMMTRACE_CHECK(lr > 0 && beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps > 0,
                  ErrorCode::InvalidArgument,
                  "AdamW: need lr > 0, betas in [0, 1), eps > 0; got lr {}, betas ({}, {}), eps {}",
                  lr, beta1, beta2, eps);
  for (const Tensor& param : params_) {
    const Tensor p = local_of(param);
    m_.push_back(Tensor::zeros(p.shape(), acc_dtype(p.dtype()), p.device()));
    v_.push_back(Tensor::zeros(p.shape(), acc_dtype(p.dtype()), p.device()));
  }
}

void AdamW::update(std::size_t i, const Tensor& g) {
  const Tensor p = local_of(params_[i]);
  const AdamWArgs args{lr_, beta1_, beta2_, eps_, weight_decay_, steps_};
  OpAttrs a;
  a.args = &args;
  const Tensor in[] = {p, g, m_[i], v_[i]};
  dispatch(kFusedAdamW, in, a);
}

}  // namespace commtrace
