// The model zoo of DESIGN §4, defined as PyTorch defines them (same modules, FQNs, call order
// and initial distributions; the values come from our own seeded generator), plus the registry
// the CLI and tests use: a name, a batch maker and a loss per model.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/nn/nn.h"

namespace commtrace {

// pytorch/examples ToyModel: in_proj Linear(10,32), relu, out_proj Linear(32,5).
class ToyModel : public Module {
 public:
  ToyModel(Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> in_proj;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Linear> out_proj;
};

// common_dtensor MLPModule: net1 Linear(10,16), relu, net2 Linear(16,10).
class MLPModule : public Module {
 public:
  MLPModule(Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> net1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Linear> net2;
};

// layers.i = MLPModule.
class MLPStacked : public Module {
 public:
  MLPStacked(int n_layers, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
};

// A container module (nn.ModuleList): holds children, has no forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void append(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;  // throws: a ModuleList is not callable
  Module& at(std::size_t i) const { return *children()[i].second; }
  std::size_t size() const { return children().size(); }
};

struct ModelArgs {
  int n_layers = 2;
  std::int64_t vocab_size = 8;
  std::int64_t max_seq_len = 16;
  std::int64_t dim = 16;
  std::int64_t n_heads = 4;
  double dropout_p = 0.0;
  bool weight_tying = true;
  // Every TransformerBlock is a checkpoint region (Module::set_checkpoint), as PyTorch's
  // ModelArgs(checkpoint_activations=True) wraps each block in torch.utils.checkpoint.
  bool checkpoint_activations = false;
};

// Core attention: q, k, v (B, H, T, D) -> (B, H, T, D), causal over the sequence. The default
// (no core set) is scaled_dot_product_attention on this rank's tensors; a sequence-parallel
// family (plans/context.h) replaces it, and then T is this rank's sub-sequence.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  virtual Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v) const = 0;
};

// x (B, T, dim) -> (B, T, dim); wq, wk, wv, wo without bias, causal SDPA over n_heads.
class Attention : public Module {
 public:
  Attention(const ModelArgs& a, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::int64_t n_heads() const { return n_heads_; }
  std::shared_ptr<Linear> wq, wk, wv, wo;
  std::shared_ptr<Dropout> resid_dropout;
  std::shared_ptr<const AttentionCore> core;  // null: SDPA

 private:
  std::int64_t n_heads_, head_dim_;
};

// w1 Linear(dim, hidden), gelu, w2 Linear(hidden, dim), resid_dropout.
class FeedForward : public Module {
 public:
  FeedForward(std::int64_t dim, std::int64_t hidden, double dropout_p, Generator& gen,
              const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> w1;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Linear> w2;
  std::shared_ptr<Dropout> resid_dropout;
};

// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).
class TransformerBlock : public Module {
 public:
  TransformerBlock(const ModelArgs& a, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<LayerNorm> attention_norm;
  std::shared_ptr<Attention> attention;
  std::shared_ptr<LayerNorm> ffn_norm;
  std::shared_ptr<FeedForward> feed_forward;
};

// tokens (B, T) i64 -> logits (B, T, vocab). output.weight is tok_embeddings.weight when tied.
class Transformer : public Module {
 public:
  Transformer(const ModelArgs& a, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& tokens) override;
  const ModelArgs& args() const { return args_; }
  // The global position of the first token of the input: a sequence-sharded rank's offset.
  std::int64_t position_offset = 0;
  std::shared_ptr<Embedding> tok_embeddings, pos_embeddings;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> output;

 private:
  ModelArgs args_;
};

// ---- registry ----

struct Batch {
  Tensor input;
  Tensor target;
};

struct ModelEntry {
  std::string name;         // "toy", "mlp", "mlp-stacked", "transformer", or a model file's name
  std::string family;       // the zoo model it is built like: built-in plans are per family
  std::string description;  // one line
  std::string input;        // "f32 (20, 10)"
  std::function<std::shared_ptr<Module>(std::uint64_t seed, const ModuleOptions&)> build;
  // The same batch for the same seed. `rows` multiplies the leading (batch) dim: a data- or
  // sequence-parallel run builds the global batch that the ranks then split.
  std::function<Batch(std::uint64_t seed, const ModuleOptions&, std::int64_t rows)> batch;
  // The loss of an output and its batch, by name: "mse" (mean squared error to a fixed random
  // target shaped like the output; toy, mlp), "cross_entropy" (against random class indices
  // over the output's last dim; transformer, decoder) or "sum" (the output's sum, no target).
  // A model file may choose another ("loss").
  std::string loss_name = "mse";
  std::function<Tensor(const Tensor& output, const Batch& batch)> loss;
  bool cross_entropy_loss = false;  // the loss is cross_entropy(output, target) (loss parallel)
  std::function<Shape(std::int64_t rows)> output_shape;  // the output of batch(.., rows)
  // Glob patterns ('*' any run of characters, '?' one) of parameters built without
  // requires_grad (a model file's "freeze"); each matches at least one parameter.
  std::vector<std::string> freeze;
};

// Whether `name` matches the glob `pattern` ('*': any run of characters, dots too; '?': one).
bool glob_match(std::string_view pattern, std::string_view name);

const std::vector<ModelEntry>& model_zoo();
// REQUIRES: a zoo name (else InvalidArgument listing the names).
const ModelEntry& find_model(const std::string& name);
// A zoo name, or a model JSON file (schema in README): {"schema": "commtrace.model",
// "version": "1.0", "name": "...", "base": "transformer" or "decoder", "args": {"n_layers": 4,
// ...}}.
// Entries loaded from files live until exit.
const ModelEntry& resolve_model(const std::string& name_or_file);
// The same from JSON text; `source` names it in errors.
ModelEntry model_from_json_text(const std::string& text, const std::string& source);

}  // namespace commtrace
