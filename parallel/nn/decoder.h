// A configurable decoder-only transformer (the model families users train: Llama-style with
// RMSNorm, SwiGLU, RoPE and grouped-query attention; GPT-style with LayerNorm, GELU, learned
// positions and biases). Module names follow torchtitan's Llama (tok_embeddings,
// layers.i.attention.wq, feed_forward.w1/w2/w3, norm, output) so its plans apply unchanged.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/nn/nn.h"

namespace commtrace {

struct DecoderArgs {
  int n_layers = 2;
  std::int64_t vocab_size = 32;
  std::int64_t dim = 32;
  std::int64_t n_heads = 4;
  std::int64_t n_kv_heads = 0;  // 0: n_heads (no grouping)
  std::int64_t hidden_dim = 0;  // feed-forward width; 0: 4 * dim
  std::int64_t max_seq_len = 16;
  bool rms_norm = true;  // else LayerNorm (with bias)
  double norm_eps = 1e-5;
  bool swiglu = true;  // w2(silu(w1 x) * w3 x); else w2(gelu(w1 x))
  bool rope = true;    // else learned position embeddings (pos_embeddings)
  double rope_theta = 10000.0;
  bool fused_qkv = false;      // one wqkv projection (Megatron's layout) instead of wq, wk, wv
  bool fused_gate_up = false;  // SwiGLU: one w13 (Megatron's linear_fc1) instead of w1 and w3
  bool bias = false;           // on every Linear
  bool tie_embeddings = false;
  bool causal = true;

  std::int64_t kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  std::int64_t head_dim() const { return dim / n_heads; }
  std::int64_t ffn_dim() const { return hidden_dim ? hidden_dim : 4 * dim; }
  // Throws InvalidArgument naming the first inconsistent argument.
  void check() const;
};

// The RoPE tables of one sequence length, shared by every attention layer of a model: cos and
// sin (T, 1, head_dim), the rotate-half convention (pairs i and i + head_dim / 2).
class RopeCache {
 public:
  RopeCache(std::int64_t head_dim, double theta) : head_dim_(head_dim), theta_(theta) {}
  // REQUIRES: t >= 1. Rebuilt when t, dtype or device change.
  const std::pair<Tensor, Tensor>& tables(std::int64_t t, DType dtype, Device device);

 private:
  std::int64_t head_dim_;
  double theta_;
  std::int64_t t_ = 0;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  std::pair<Tensor, Tensor> cos_sin_;
};

// x (B, T, dim) -> (B, T, dim). Separate wq (dim, H·D), wk, wv (dim, Hkv·D), or one wqkv whose
// output is grouped per kv head: for each of the Hkv groups, its H/Hkv query heads, then its key
// head, then its value head (Megatron's layout, so a column shard holds whole groups). Keys and
// values are repeated to H heads (torchtitan's repeat_kv); RoPE on q and k when enabled.
class DecoderAttention : public Module {
 public:
  DecoderAttention(const DecoderArgs& a, std::shared_ptr<RopeCache> rope, Generator& gen,
                   const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> wq, wk, wv, wqkv, wo;

 private:
  std::int64_t n_kv_heads_, n_rep_, head_dim_;
  bool causal_;
  std::shared_ptr<RopeCache> rope_;
};

// SwiGLU: w2(silu(w1 x) * w3 x); GELU: w2(gelu(w1 x)). A fused w13 interleaves the two per
// hidden unit (output 2j is unit j's gate, 2j + 1 its up projection), so a column shard holds
// whole units.
class DecoderFeedForward : public Module {
 public:
  DecoderFeedForward(const DecoderArgs& a, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> w1, w2, w3, w13;
};

// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).
class DecoderBlock : public Module {
 public:
  DecoderBlock(const DecoderArgs& a, std::shared_ptr<RopeCache> rope, Generator& gen,
               const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> attention_norm, ffn_norm;
  std::shared_ptr<DecoderAttention> attention;
  std::shared_ptr<DecoderFeedForward> feed_forward;
};

// tokens (B, T) i64 -> logits (B, T, vocab).
class Decoder : public Module {
 public:
  Decoder(const DecoderArgs& a, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& tokens) override;
  const DecoderArgs& args() const { return args_; }
  std::shared_ptr<Embedding> tok_embeddings, pos_embeddings;  // pos_embeddings: without RoPE
  std::shared_ptr<Module> norm;
  std::shared_ptr<Linear> output;

 private:
  DecoderArgs args_;
  std::vector<std::shared_ptr<DecoderBlock>> layers_;
};

}  // namespace commtrace
