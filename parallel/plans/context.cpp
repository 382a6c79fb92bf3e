#include "parallel/plans/context.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "parallel/dtensor/dtensor.h"
#include "parallel/nn/models.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/ops.h"

namespace commtrace {

void ContextParallel::check() const {
  static const std::vector<std::string> kFamilies{"ulysses", "ring", "rsa"};
  COMMTRACE_CHECK(std::find(kFamilies.begin(), kFamilies.end(), family) != kFamilies.end(),
                  ErrorCode::InvalidArgument,
                  "context parallel family '{}'{}: ulysses, ring or rsa", family,
                  did_you_mean(family, kFamilies));
  COMMTRACE_CHECK(grad_reduction == "all_reduce" || grad_reduction == "reduce_scatter",
                  ErrorCode::InvalidArgument,
                  "context parallel grad_reduction '{}': all_reduce or reduce_scatter",
                  grad_reduction);
  COMMTRACE_CHECK(param_grad_reduction == "avg" || param_grad_reduction == "sum",
                  ErrorCode::InvalidArgument,
                  "context parallel param_grad_reduction '{}': avg or sum", param_grad_reduction);
  COMMTRACE_CHECK(fault.empty() || fault == "no_backward_all_to_all" || fault == "skip_ring_step",
                  ErrorCode::InvalidArgument, "context parallel fault '{}' is unknown", fault);
}

std::string ContextParallel::str() const {
  const std::string params = fmt::format("parameter gradients {} over cp", param_grad_reduction);
  if (family != "rsa") return fmt::format("{} ({})", family, params);
  return fmt::format(
      "rsa ({}, {}; {})", divide_by_world_size ? "divide_by_world_size" : "no division",
      grad_reduction == "all_reduce" ? "all_reduce + slice" : "reduce_scatter", params);
}

namespace {

// The context of collectives that serve no redistribution: a reason alone.
CollectiveContext because(const Reason& why) {
  CollectiveContext c;
  c.reason = why;
  return c;
}

// ---------------------------------------------------------------- ulysses

class UlyssesCore : public AttentionCore {
 public:
  UlyssesCore(std::shared_ptr<const DeviceMesh> cp, bool fault)
      : cp_(std::move(cp)), fault_(fault) {}

  // q, k, v (B, H, T/W, D) -> all_to_all -> (B, H/W, T, D); attention; all_to_all back.
  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v) const override {
    const Tensor qh = to_heads(q, q_), kh = to_heads(k, k_), vh = to_heads(v, v_);
    const Tensor o = scaled_dot_product_attention(qh, kh, vh, /*causal=*/true);
    Shape global = o.shape();
    global[1] *= cp_->size(0);
    if (fault_) return without_backward_all_to_all(o, global);
    return to_local(redistribute(from_local(o, cp_, {Placement::shard(1)}, global, out_),
                                 {Placement::shard(2)}, out_));
  }

 private:
  // The fault: the forward all_to_all, and a backward that keeps this rank's own block (its
  // heads at its positions) of the gradient, zeros elsewhere.
  Tensor without_backward_all_to_all(const Tensor& o, const Shape& global) const {
    Tensor out;
    {
      NoGradGuard no_grad;
      out = to_local(redistribute(from_local(o, cp_, {Placement::shard(1)}, global, out_),
                                  {Placement::shard(2)}, out_));
    }
    const int w = cp_->size(0), r = cp_->coordinate(0);
    attach_grad(out, "BrokenUlyssesBackward", {o}, [o_shape = o.shape(), w, r](const Tensor& g) {
      const std::int64_t heads = o_shape[1];
      const Tensor mine = narrow(g, 1, r * heads, heads);
      std::vector<Tensor> parts;
      for (int j = 0; j < w; ++j) {
        parts.push_back(j == r ? mine : zeros_like(mine));
      }
      return std::vector<Tensor>{cat(parts, 2)};
    });
    return out;
  }

  Tensor to_heads(const Tensor& x, const Reason& why) const {
    Shape global = x.shape();
    global[2] *= cp_->size(0);
    return to_local(redistribute(from_local(x, cp_, {Placement::shard(2)}, global, why),
                                 {Placement::shard(1)}, why));
  }

  std::shared_ptr<const DeviceMesh> cp_;
  bool fault_;
  Reason q_{"Ulysses: q from sequence- to head-sharded"};
  Reason k_{"Ulysses: k from sequence- to head-sharded"};
  Reason v_{"Ulysses: v from sequence- to head-sharded"};
  Reason out_{"Ulysses: attention output from head- to sequence-sharded"};
};

// ---------------------------------------------------------------- ring

// One ring step: every tensor of `xs` goes to the next rank and the previous rank's arrive, in
// one batch (sends first, then receives, as PyTorch's batch_isend_irecv lists them).
std::vector<Tensor> rotate(Communicator& c, const std::vector<Tensor>& xs, const Reason& why) {
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  std::vector<Tensor> got;
  std::vector<P2POp> ops;
  for (const Tensor& x : xs) {
    got.push_back(Tensor::empty(x.shape(), x.dtype(), x.device()));
    ops.push_back({P2POp::Kind::Send, x, next});
  }
  for (const Tensor& g : got) ops.push_back({P2POp::Kind::Recv, g, prev});
  const CollectiveScope scope(because(why));
  c.batch_p2p(ops);
  return got;
}

// Ring attention (context parallel): q stays, the k and v blocks go around the ring, each step
// one blockwise attention merged by log-sum-exp; with the causal mask a block from a later rank
// is skipped (it still travels). Backward sends k and v around again with the gradients of the
// block held (dk, dv), which accumulate every rank's share and arrive back at their owner after
// one more step.
class RingCore : public AttentionCore {
 public:
  RingCore(std::shared_ptr<const DeviceMesh> cp, std::int64_t q_pos, bool fault)
      : cp_(std::move(cp)), q_pos_(q_pos), fault_(fault) {}

  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v) const override {
    Communicator& c = cp_->comm(0);
    const int w = c.size(), r = c.rank();
    const std::int64_t tl = q.size(2);
    Tensor out, lse;
    {
      NoGradGuard no_grad;
      std::vector<Tensor> kv{k, v};
      for (int j = 0; j < w; ++j) {
        const int src = ((r - j) % w + w) % w;
        if (src <= r) {  // causal: later ranks' keys are all masked for these queries
          auto [o, l] = attention_block(q, kv[0], kv[1], true, q_pos_, src * tl);
          if (j == 0) {
            out = o;
            lse = l;
          } else {
            std::tie(out, lse) = attention_merge(out, lse, o, l);
          }
        }
        if (j + 1 < w && !(fault_ && j + 2 == w)) kv = rotate(c, kv, why_fwd_);
      }
    }
    attach_grad(out, "RingAttentionBackward", {q, k, v},
                [self = *this, q = q.detach(), k = k.detach(), v = v.detach(), out = out.detach(),
                 lse](const Tensor& g) { return self.backward(g, q, k, v, out, lse); });
    return out;
  }

 private:
  std::vector<Tensor> backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse) const {
    Communicator& c = cp_->comm(0);
    const int w = c.size(), r = c.rank();
    const std::int64_t tl = q.size(2);
    Tensor dq = zeros_like(q);
    std::vector<Tensor> kv{k, v}, dkv{zeros_like(k), zeros_like(v)};
    for (int j = 0; j < w; ++j) {
      const int src = ((r - j) % w + w) % w;
      if (src <= r) {
        const auto [gq, gk, gv] =
            attention_block_backward(g, q, kv[0], kv[1], out, lse, true, q_pos_, src * tl);
        dq = add(dq, gq);
        dkv = {add(dkv[0], gk), add(dkv[1], gv)};
      }
      if (j + 1 < w) {
        std::vector<Tensor> moved = rotate(c, {kv[0], kv[1], dkv[0], dkv[1]}, why_bwd_);
        kv = {moved[0], moved[1]};
        dkv = {moved[2], moved[3]};
      } else if (w > 1) {
        dkv = rotate(c, dkv, why_home_);  // the gradients of this rank's own k and v come home
      }
    }
    return {dq, dkv[0], dkv[1]};
  }

  std::shared_ptr<const DeviceMesh> cp_;
  std::int64_t q_pos_;
  bool fault_;
  Reason why_fwd_{"ring attention: k, v blocks to the next rank"};
  Reason why_bwd_{"ring attention backward: k, v blocks and their dk, dv to the next rank"};
  Reason why_home_{"ring attention backward: dk, dv home to their owner"};
};

// ---------------------------------------------------------------- rsa

// ColossalAI's ring_forward: x to the next rank, the previous rank's back.
Tensor ring_forward(Communicator& c, const Tensor& x, const Reason& why) {
  return rotate(c, {x}, why)[0];
}

// Where step i's chunk comes from: after i + 1 ring steps a rank holds rank - i - 1's.
int incoming(int rank, int step, int w) { return ((rank - step - 1) % w + w) % w; }

struct RsaRing {
  std::shared_ptr<const DeviceMesh> cp;
  ContextParallel opts;
  Reason why_fwd_k{"RSA RingQK: sub-k to the next rank"};
  Reason why_bwd_k{"RSA RingQK backward: sub-k to the next rank (for grad q)"};
  Reason why_grad_k{"RSA RingQK backward: grad of the full k over the sequence group"};
  Reason why_fwd_v{"RSA RingAV: sub-v to the next rank"};
  Reason why_bwd_v{"RSA RingAV backward: sub-v to the next rank (for grad attention)"};
  Reason why_grad_v{"RSA RingAV backward: grad of the full v over the sequence group"};

  Communicator& comm() const { return cp->comm(0); }

  // full (BH, T, D): every rank's contribution to the gradient of the whole sequence, summed
  // over cp; returns this rank's chunk (BH, T/W, D), divided by W when asked.
  Tensor reduce_to_owner(Tensor full, const Reason& why) const {
    Communicator& c = comm();
    const std::int64_t tl = full.size(1) / c.size();
    const CollectiveScope scope(because(why));
    Tensor mine;
    if (opts.grad_reduction == "all_reduce") {
      c.all_reduce(full, ReduceOp::Sum);
      mine = clone(narrow(full, 1, c.rank() * tl, tl));
    } else {  // the sequence dim leads for the reduce_scatter's chunks
      const Tensor seq_major = transpose(full, 0, 1);
      Shape shape = seq_major.shape();
      shape[0] = tl;
      Tensor out = Tensor::empty(shape, full.dtype(), full.device());
      c.reduce_scatter(seq_major, out, ReduceOp::Sum);
      mine = transpose(out, 0, 1);
    }
    return divided(mine);
  }
  Tensor divided(const Tensor& x) const {
    return opts.divide_by_world_size ? mul(x, 1.0 / comm().size()) : x;
  }

  // RingQK: q, k (BH, T/W, D) -> scores q kᵀ (BH, T/W, T), key chunks in sequence order.
  Tensor qk(const Tensor& q, const Tensor& k) const {
    Communicator& c = comm();
    const int w = c.size(), r = c.rank();
    Tensor scores;
    {
      NoGradGuard no_grad;
      std::vector<Tensor> parts(static_cast<std::size_t>(w));
      parts[std::size_t(r)] = gemm(q, k, {}, false, true);
      Tensor sub_k = k;
      for (int i = 0; i < w - 1; ++i) {
        if (i == w - 2 && opts.fault == "skip_ring_step") {
          parts[std::size_t(incoming(r, i, w))] = zeros_like(parts[std::size_t(r)]);
          continue;
        }
        sub_k = ring_forward(c, sub_k, why_fwd_k);
        parts[std::size_t(incoming(r, i, w))] = gemm(q, sub_k, {}, false, true);
      }
      scores = w == 1 ? parts[0] : cat(parts, 2);
    }
    attach_grad(scores, "RingQKBackward", {q, k},
                [self = *this, q = q.detach(), k = k.detach()](const Tensor& g) {
                  return self.qk_backward(g, q, k);
                });
    return scores;
  }
  std::vector<Tensor> qk_backward(const Tensor& g, const Tensor& q, const Tensor& k) const {
    Communicator& c = comm();
    const int w = c.size(), r = c.rank();
    const std::int64_t tl = q.size(1);
    const Tensor grad_k = reduce_to_owner(gemm(g, q, {}, true, false), why_grad_k);
    Tensor grad_q = gemm(narrow(g, 2, r * tl, tl), k);
    Tensor sub_k = k;
    for (int i = 0; i < w - 1; ++i) {
      sub_k = ring_forward(c, sub_k, why_bwd_k);
      grad_q = add(grad_q, gemm(narrow(g, 2, incoming(r, i, w) * tl, tl), sub_k));
    }
    return {divided(grad_q), grad_k};
  }

  // RingAV: attention (BH, T/W, T), v (BH, T/W, D) -> (BH, T/W, D).
  Tensor av(const Tensor& attn, const Tensor& v) const {
    Communicator& c = comm();
    const int w = c.size(), r = c.rank();
    const std::int64_t tl = v.size(1);
    Tensor out;
    {
      NoGradGuard no_grad;
      out = gemm(narrow(attn, 2, r * tl, tl), v);
      Tensor sub_v = v;
      for (int i = 0; i < w - 1; ++i) {
        sub_v = ring_forward(c, sub_v, why_fwd_v);
        out = add(out, gemm(narrow(attn, 2, incoming(r, i, w) * tl, tl), sub_v));
      }
    }
    attach_grad(out, "RingAVBackward", {attn, v},
                [self = *this, attn = attn.detach(), v = v.detach()](const Tensor& g) {
                  return self.av_backward(g, attn, v);
                });
    return out;
  }
  std::vector<Tensor> av_backward(const Tensor& g, const Tensor& attn, const Tensor& v) const {
    Communicator& c = comm();
    const int w = c.size(), r = c.rank();
    const Tensor grad_v = reduce_to_owner(gemm(attn, g, {}, true, false), why_grad_v);
    std::vector<Tensor> parts(static_cast<std::size_t>(w));
    parts[std::size_t(r)] = gemm(g, v, {}, false, true);
    Tensor sub_v = v;
    for (int i = 0; i < w - 1; ++i) {
      sub_v = ring_forward(c, sub_v, why_bwd_v);
      parts[std::size_t(incoming(r, i, w))] = gemm(g, sub_v, {}, false, true);
    }
    return {w == 1 ? parts[0] : cat(parts, 2), grad_v};
  }
};

class RsaCore : public AttentionCore {
 public:
  RsaCore(std::shared_ptr<const DeviceMesh> cp, const ContextParallel& opts, std::int64_t q_offset)
      : ring_{std::move(cp), opts}, q_offset_(q_offset) {}

  // q, k, v (B, H, T/W, D): scores = RingQK(q, k) / sqrt(D), causal mask on global positions,
  // softmax, RingAV(probs, v).
  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v) const override {
    const Shape shape = q.shape();
    const std::int64_t b = shape[0], h = shape[1], tl = shape[2], d = shape[3];
    const std::int64_t t = tl * ring_.comm().size();
    auto flat = [&](const Tensor& x) { return view(x, {b * h, tl, d}); };
    Tensor scores = mul(ring_.qk(flat(q), flat(k)), 1.0 / std::sqrt(double(d)));
    scores = add(scores, causal_mask(tl, t, q.dtype(), q.device()));
    const Tensor out = ring_.av(softmax(scores), flat(v));
    return view(out, shape);
  }

 private:
  // (T/W, T): 0 where key j is at or before query i's global position, -inf after it.
  Tensor causal_mask(std::int64_t tl, std::int64_t t, DType dt, Device dev) const {
    std::vector<double> m(std::size_t(tl * t), 0.0);
    for (std::int64_t i = 0; i < tl; ++i) {
      for (std::int64_t j = q_offset_ + i + 1; j < t; ++j) {
        m[std::size_t(i * t + j)] = -std::numeric_limits<double>::infinity();
      }
    }
    return Tensor::from_vector(m, {tl, t}, dt, dev);
  }

  RsaRing ring_;
  std::int64_t q_offset_;
};

}  // namespace

std::shared_ptr<const AttentionCore> make_context_core(const std::shared_ptr<const DeviceMesh>& cp,
                                                       const ContextParallel& opts,
                                                       std::int64_t q_offset) {
  opts.check();
  COMMTRACE_CHECK(cp->ndim() == 1, ErrorCode::Internal, "context parallel: a 1-D mesh expected");
  if (opts.family == "ulysses") {
    return std::make_shared<UlyssesCore>(cp, opts.fault == "no_backward_all_to_all");
  }
  if (opts.family == "ring") {
    return std::make_shared<RingCore>(cp, q_offset, opts.fault == "skip_ring_step");
  }
  return std::make_shared<RsaCore>(cp, opts, q_offset);
}

void apply_context_parallel(Module& model, const std::shared_ptr<const DeviceMesh>& cp,
                            const ContextParallel& opts, std::int64_t seq_len, int tp_size) {
  opts.check();
  COMMTRACE_CHECK(cp->ndim() == 1, ErrorCode::Internal, "context parallel: a 1-D mesh expected");
  auto* root = dynamic_cast<Transformer*>(&model);
  COMMTRACE_CHECK(root, ErrorCode::InvalidArgument,
                  "context parallel ({}): runs on the transformer family, not on {}", opts.family,
                  model.type());
  const int w = cp->size(0);
  COMMTRACE_CHECK(seq_len % w == 0, ErrorCode::InvalidArgument,
                  "context parallel ({}): the sequence length {} is not divisible by the cp size "
                  "{}",
                  opts.family, seq_len, w);
  const std::int64_t offset = seq_len / w * cp->coordinate(0);
  root->position_offset = offset;
  for (auto& [path, m] : model.named_modules()) {
    auto* attn = dynamic_cast<Attention*>(m);
    if (!attn) continue;
    if (opts.family == "ulysses") {
      const std::int64_t heads = attn->n_heads();
      COMMTRACE_CHECK(heads % (std::int64_t(tp_size) * w) == 0, ErrorCode::InvalidArgument,
                      "ulysses: {} has {} heads{}, not divisible by the cp size {} (the "
                      "all_to_all gives each rank whole heads)",
                      attn->fqn(), heads,
                      tp_size > 1 ? fmt::format(", {} per tp rank", heads / tp_size) : "", w);
    }
    attn->core = make_context_core(cp, opts, offset);
  }
}

}  // namespace commtrace
