#include "parallel/nn/decoder.h"

#include <cmath>
#include <numeric>

#include "parallel/nn/models.h"
#include "parallel/tensor/ops.h"

namespace commtrace {

void DecoderArgs::check() const {
  auto fail = [](const std::string& msg) { throw Error(ErrorCode::InvalidArgument, msg); };
  if (n_layers < 1 || vocab_size < 1 || dim < 1 || n_heads < 1 || max_seq_len < 1) {
    fail("decoder: n_layers, vocab_size, dim, n_heads and max_seq_len must be positive");
  }
  if (dim % n_heads != 0) {
    fail(fmt::format("decoder: dim {} is not divisible by n_heads {}", dim, n_heads));
  }
  if (n_kv_heads < 0 || kv_heads() > n_heads || n_heads % kv_heads() != 0) {
    fail(
        fmt::format("decoder: n_heads {} is not a multiple of n_kv_heads {}", n_heads, kv_heads()));
  }
  if (rope && head_dim() % 2 != 0) {
    fail(fmt::format("decoder: RoPE needs an even head dim, got {} (dim {} / n_heads {})",
                     head_dim(), dim, n_heads));
  }
  if (fused_gate_up && !swiglu) fail("decoder: a fused gate/up projection needs the SwiGLU MLP");
  if (hidden_dim < 0 || !(norm_eps > 0) || !(rope_theta > 1)) {
    fail("decoder: hidden_dim must be >= 0 (0: 4 * dim), norm_eps > 0 and rope_theta > 1");
  }
}

const std::pair<Tensor, Tensor>& RopeCache::tables(std::int64_t t, DType dtype, Device device) {
  if (t == t_ && dtype == dtype_ && device == device_) return cos_sin_;
  const std::int64_t half = head_dim_ / 2;
  std::vector<double> c(std::size_t(t * head_dim_)), s(c.size());
  if (device != Device::Meta) {
    for (std::int64_t p = 0; p < t; ++p) {
      for (std::int64_t i = 0; i < half; ++i) {
        const double angle = double(p) * std::pow(theta_, -2.0 * double(i) / double(head_dim_));
        for (std::int64_t k : {i, i + half}) {
          c[std::size_t(p * head_dim_ + k)] = std::cos(angle);
          s[std::size_t(p * head_dim_ + k)] = std::sin(angle);
        }
      }
    }
  }
  const Shape shape{t, 1, head_dim_};
  cos_sin_ = {Tensor::from_vector(c, shape, dtype, device),
              Tensor::from_vector(s, shape, dtype, device)};
  t_ = t;
  dtype_ = dtype;
  device_ = device;
  return cos_sin_;
}

namespace {

std::shared_ptr<Linear> linear_of(std::int64_t in, std::int64_t out, const DecoderArgs& a,
                                  Generator& gen, const ModuleOptions& o) {
  return std::make_shared<Linear>(in, out, a.bias, gen, o);
}

// x (B, T, H, D): x cos + rotate_half(x) sin, rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]).
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const std::int64_t half = x.size(3) / 2;
  const Tensor rotated = cat({mul(narrow(x, 3, half, half), -1.0), narrow(x, 3, 0, half)}, 3);
  return add(mul(x, cos), mul(rotated, sin));
}

// (B, T, Hkv, D) -> (B, T, Hkv · n_rep, D): kv head j serves query heads j·n_rep .. +n_rep.
Tensor repeat_kv(const Tensor& x, std::int64_t n_rep) {
  if (n_rep == 1) return x;
  const std::int64_t b = x.size(0), t = x.size(1), h = x.size(2), d = x.size(3);
  return view(expand(view(x, {b, t, h, 1, d}), {b, t, h, n_rep, d}), {b, t, h * n_rep, d});
}

std::shared_ptr<Module> norm_of(const DecoderArgs& a, const ModuleOptions& o) {
  if (a.rms_norm) return std::make_shared<RMSNorm>(a.dim, o, a.norm_eps);
  return std::make_shared<LayerNorm>(a.dim, o, a.norm_eps);
}

}  // namespace

DecoderAttention::DecoderAttention(const DecoderArgs& a, std::shared_ptr<RopeCache> rope,
                                   Generator& gen, const ModuleOptions& o)
    : Module("Attention"),
      n_kv_heads_(a.kv_heads()),
      n_rep_(a.n_heads / a.kv_heads()),
      head_dim_(a.head_dim()),
      causal_(a.causal),
      rope_(std::move(rope)) {
  const std::int64_t q_out = a.n_heads * head_dim_, kv_out = a.kv_heads() * head_dim_;
  if (a.fused_qkv) {
    wqkv = register_module("wqkv", linear_of(a.dim, q_out + 2 * kv_out, a, gen, o));
  } else {
    wq = register_module("wq", linear_of(a.dim, q_out, a, gen, o));
    wk = register_module("wk", linear_of(a.dim, kv_out, a, gen, o));
    wv = register_module("wv", linear_of(a.dim, kv_out, a, gen, o));
    wk->heads = wv->heads = a.kv_heads();  // duplicated onto ranks when fewer than the TP degree
  }
  wo = register_module("wo", linear_of(q_out, a.dim, a, gen, o));
}

Tensor DecoderAttention::forward(const Tensor& x) {
  COMMTRACE_CHECK(x.dim() == 3, ErrorCode::ShapeMismatch, "{}: expected input (B, T, C), got {}",
                  fqn(), describe(x));
  const std::int64_t b = x.size(0), t = x.size(1);
  // Heads are -1 everywhere: a column-sharded projection holds its share of them: whole kv
  // groups, or with fewer kv heads than ranks (separate wk/wv duplicate them) part of one group.
  auto whole = [&](const Tensor& y, std::int64_t unit, const char* what) {
    const bool query = std::string_view(what) == "query";
    COMMTRACE_CHECK(y.size(-1) % unit == 0, ErrorCode::InvalidArgument,
                    "{}: the {} projection holds {} features on this rank, not whole {} of {}: "
                    "{} must be divisible by the tensor-parallel degree{}",
                    fqn(), what, y.size(-1), query ? "heads" : "kv groups", unit,
                    query ? fmt::format("n_heads ({})", n_rep_ * n_kv_heads_)
                          : fmt::format("n_kv_heads ({})", n_kv_heads_),
                    query || !wqkv ? "" : " (separate wq/wk/wv also take a divisor of it)");
    return y;
  };
  Tensor q, k, v;
  if (wqkv) {
    const std::int64_t group = (n_rep_ + 2) * head_dim_;
    const Tensor qkv =
        view(whole((*wqkv)(x), group, "fused qkv"), {b, t, -1, n_rep_ + 2, head_dim_});
    const std::int64_t groups = qkv.size(2);
    q = view(narrow(qkv, 3, 0, n_rep_), {b, t, groups * n_rep_, head_dim_});
    k = view(narrow(qkv, 3, n_rep_, 1), {b, t, groups, head_dim_});
    v = view(narrow(qkv, 3, n_rep_ + 1, 1), {b, t, groups, head_dim_});
  } else {
    q = view(whole((*wq)(x), head_dim_, "query"), {b, t, -1, head_dim_});
    k = view(whole((*wk)(x), head_dim_, "key"), {b, t, -1, head_dim_});
    v = view(whole((*wv)(x), head_dim_, "value"), {b, t, -1, head_dim_});
  }
  // Query heads per kv head here: n_rep, or with one duplicated kv head the rank's query heads
  // (a divisor of n_rep: they all belong to that head's group).
  const std::int64_t rep = k.size(2) == 1 && q.size(2) < n_rep_ ? q.size(2) : n_rep_;
  COMMTRACE_CHECK(q.size(2) == k.size(2) * rep && n_rep_ % rep == 0, ErrorCode::ShapeMismatch,
                  "{}: {} query heads do not match {} kv heads × {} (a plan that shards q and kv "
                  "projections differently)",
                  fqn(), q.size(2), k.size(2), n_rep_);
  if (rope_) {
    const auto& [cos, sin] = rope_->tables(t, q.dtype(), q.device());
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
  }
  k = repeat_kv(k, rep);
  v = repeat_kv(v, rep);
  Tensor o = scaled_dot_product_attention(transpose(q, 1, 2), transpose(k, 1, 2),
                                          transpose(v, 1, 2), causal_);
  o = view(transpose(o, 1, 2), {b, t, -1});
  return (*wo)(o);
}

DecoderFeedForward::DecoderFeedForward(const DecoderArgs& a, Generator& gen, const ModuleOptions& o)
    : Module("FeedForward") {
  if (a.fused_gate_up) {
    w13 = register_module("w13", linear_of(a.dim, 2 * a.ffn_dim(), a, gen, o));
  } else {
    w1 = register_module("w1", linear_of(a.dim, a.ffn_dim(), a, gen, o));
  }
  w2 = register_module("w2", linear_of(a.ffn_dim(), a.dim, a, gen, o));
  if (a.swiglu && !a.fused_gate_up) {
    w3 = register_module("w3", linear_of(a.dim, a.ffn_dim(), a, gen, o));
  }
}

Tensor DecoderFeedForward::forward(const Tensor& x) {
  if (w13) {
    const Tensor h = (*w13)(x);
    const Shape& s = h.shape();
    Shape units(s.begin(), s.end() - 1);
    units.push_back(-1);
    units.push_back(2);
    const Tensor pairs = view(h, units);  // (..., hidden units here, [gate, up])
    Shape out(s.begin(), s.end() - 1);
    out.push_back(-1);
    const Tensor gate = silu(view(narrow(pairs, -1, 0, 1), out));
    return (*w2)(mul(gate, view(narrow(pairs, -1, 1, 1), out)));
  }
  if (!w3) return (*w2)(gelu((*w1)(x)));
  const Tensor gate = silu((*w1)(x));  // separate statements: w1 runs before w3, as in PyTorch
  return (*w2)(mul(gate, (*w3)(x)));
}

DecoderBlock::DecoderBlock(const DecoderArgs& a, std::shared_ptr<RopeCache> rope, Generator& gen,
                           const ModuleOptions& o)
    : Module("TransformerBlock") {
  attention_norm = register_module("attention_norm", norm_of(a, o));
  attention =
      register_module("attention", std::make_shared<DecoderAttention>(a, std::move(rope), gen, o));
  ffn_norm = register_module("ffn_norm", norm_of(a, o));
  feed_forward = register_module("feed_forward", std::make_shared<DecoderFeedForward>(a, gen, o));
}

Tensor DecoderBlock::forward(const Tensor& x) {
  const Tensor h = add(x, (*attention)((*attention_norm)(x)));
  return add(h, (*feed_forward)((*ffn_norm)(h)));
}

Decoder::Decoder(const DecoderArgs& a, Generator& gen, const ModuleOptions& o)
    : Module("Transformer"), args_(a) {
  a.check();
  auto rope = a.rope ? std::make_shared<RopeCache>(a.head_dim(), a.rope_theta) : nullptr;
  tok_embeddings =
      register_module("tok_embeddings", std::make_shared<Embedding>(a.vocab_size, a.dim, gen, o));
  if (!a.rope) {
    pos_embeddings = register_module("pos_embeddings",
                                     std::make_shared<Embedding>(a.max_seq_len, a.dim, gen, o));
  }
  auto layers = register_module("layers", std::make_shared<ModuleList>());
  for (int i = 0; i < a.n_layers; ++i) {
    layers_.push_back(std::make_shared<DecoderBlock>(a, rope, gen, o));
    layers->append(layers_.back());
  }
  norm = register_module("norm", norm_of(a, o));
  output = register_module("output", linear_of(a.dim, a.vocab_size, a, gen, o));
  if (a.tie_embeddings) output->set_param("weight", tok_embeddings->param("weight"));
}

Tensor Decoder::forward(const Tensor& tokens) {
  COMMTRACE_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64, ErrorCode::InvalidArgument,
                  "{}: expected i64 tokens (B, T), got {}", fqn(), describe(tokens));
  const std::int64_t t = tokens.size(1);
  COMMTRACE_CHECK(t <= args_.max_seq_len, ErrorCode::InvalidArgument,
                  "{}: sequence length {} exceeds max_seq_len {}", fqn(), t, args_.max_seq_len);
  Tensor h = (*tok_embeddings)(tokens);
  if (pos_embeddings) {
    std::vector<std::int64_t> positions(std::size_t(t), 0);
    std::iota(positions.begin(), positions.end(), 0);
    h = add(h, (*pos_embeddings)(Tensor::from_indices(positions, {t}, tokens.device())));
  }
  for (const auto& layer : layers_) h = (*layer)(h);
  return (*output)((*norm)(h));
}

}  // namespace commtrace
