#include "parallel/nn/models.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>

#include "parallel/dtensor/dtensor.h"
#include "parallel/nn/decoder.h"
#include "parallel/tensor/ops.h"
#include "tracer/json_io.h"

namespace commtrace {

ToyModel::ToyModel(Generator& gen, const ModuleOptions& o) : Module("ToyModel") {
  in_proj = register_module("in_proj", std::make_shared<Linear>(10, 32, true, gen, o));
  relu = register_module("relu", std::make_shared<ReLU>());
  out_proj = register_module("out_proj", std::make_shared<Linear>(32, 5, true, gen, o));
}

Tensor ToyModel::forward(const Tensor& x) { return (*out_proj)((*relu)((*in_proj)(x))); }

MLPModule::MLPModule(Generator& gen, const ModuleOptions& o) : Module("MLPModule") {
  net1 = register_module("net1", std::make_shared<Linear>(10, 16, true, gen, o));
  relu = register_module("relu", std::make_shared<ReLU>());
  net2 = register_module("net2", std::make_shared<Linear>(16, 10, true, gen, o));
}

Tensor MLPModule::forward(const Tensor& x) { return (*net2)((*relu)((*net1)(x))); }

MLPStacked::MLPStacked(int n_layers, Generator& gen, const ModuleOptions& o)
    : Module("MLPStacked") {
  COMMTRACE_CHECK(n_layers > 0, ErrorCode::InvalidArgument, "MLPStacked: n_layers = {}", n_layers);
  auto layers = register_module("layers", std::make_shared<ModuleList>());
  for (int i = 0; i < n_layers; ++i) layers->append(std::make_shared<MLPModule>(gen, o));
}

Tensor MLPStacked::forward(const Tensor& x) {
  const auto& layers = static_cast<const ModuleList&>(*children()[0].second);
  Tensor h = x;
  for (std::size_t i = 0; i < layers.size(); ++i) h = layers.at(i)(h);
  return h;
}

void ModuleList::append(std::shared_ptr<Module> m) {
  register_module(std::to_string(size()), std::move(m));
}

Tensor ModuleList::forward(const Tensor&) {
  throw Error(ErrorCode::Unsupported, fmt::format("{}: a ModuleList is not callable", fqn()));
}

Attention::Attention(const ModelArgs& a, Generator& gen, const ModuleOptions& o)
    : Module("Attention"), n_heads_(a.n_heads), head_dim_(a.dim / a.n_heads) {
  COMMTRACE_CHECK(a.n_heads > 0 && a.dim % a.n_heads == 0, ErrorCode::InvalidArgument,
                  "Attention: dim {} is not divisible by n_heads {}", a.dim, a.n_heads);
  wq = register_module("wq", std::make_shared<Linear>(a.dim, a.dim, false, gen, o));
  wk = register_module("wk", std::make_shared<Linear>(a.dim, a.dim, false, gen, o));
  wv = register_module("wv", std::make_shared<Linear>(a.dim, a.dim, false, gen, o));
  wo = register_module("wo", std::make_shared<Linear>(a.dim, a.dim, false, gen, o));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(a.dropout_p, 1));
}

Tensor Attention::forward(const Tensor& x) {
  // x (B, T, C) -> q, k, v (B, H, T, D); H is -1 so a column-sharded projection keeps H/W heads.
  COMMTRACE_CHECK(x.dim() == 3, ErrorCode::ShapeMismatch, "{}: expected input (B, T, C), got {}",
                  fqn(), describe(x));
  const std::int64_t b = x.size(0), tt = x.size(1);
  auto heads = [&](Linear& proj) { return transpose(view(proj(x), {b, tt, -1, head_dim_}), 1, 2); };
  const Tensor q = heads(*wq);
  const Tensor k = heads(*wk);
  const Tensor v = heads(*wv);
  Tensor o;
  if (!core) {
    o = scaled_dot_product_attention(q, k, v, /*causal=*/true);
  } else if (!is_dtensor(q)) {
    o = (*core)(q, k, v);
  } else {  // TP: this rank's heads; the core talks over its own (cp) mesh
    const DistSpec& d = dist_of(q);
    o = from_local((*core)(to_local(q), to_local(k), to_local(v)), d.mesh, d.placements, q.shape());
  }
  o = view(transpose(o, 1, 2), {b, tt, -1});
  return (*resid_dropout)((*wo)(o));
}

FeedForward::FeedForward(std::int64_t dim, std::int64_t hidden, double dropout_p, Generator& gen,
                         const ModuleOptions& o)
    : Module("FeedForward") {
  w1 = register_module("w1", std::make_shared<Linear>(dim, hidden, true, gen, o));
  gelu = register_module("gelu", std::make_shared<GELU>());
  w2 = register_module("w2", std::make_shared<Linear>(hidden, dim, true, gen, o));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(dropout_p, 2));
}

Tensor FeedForward::forward(const Tensor& x) { return (*resid_dropout)((*w2)((*gelu)((*w1)(x)))); }

TransformerBlock::TransformerBlock(const ModelArgs& a, Generator& gen, const ModuleOptions& o)
    : Module("TransformerBlock") {
  attention_norm = register_module("attention_norm", std::make_shared<LayerNorm>(a.dim, o));
  attention = register_module("attention", std::make_shared<Attention>(a, gen, o));
  ffn_norm = register_module("ffn_norm", std::make_shared<LayerNorm>(a.dim, o));
  feed_forward = register_module(
      "feed_forward", std::make_shared<FeedForward>(a.dim, 4 * a.dim, a.dropout_p, gen, o));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = add(x, (*attention)((*attention_norm)(x)));
  return add(h, (*feed_forward)((*ffn_norm)(h)));
}

Transformer::Transformer(const ModelArgs& a, Generator& gen, const ModuleOptions& o)
    : Module("Transformer"), args_(a) {
  COMMTRACE_CHECK(a.n_layers > 0 && a.vocab_size > 0 && a.max_seq_len > 0,
                  ErrorCode::InvalidArgument,
                  "Transformer: n_layers, vocab_size and max_seq_len must be positive");
  tok_embeddings =
      register_module("tok_embeddings", std::make_shared<Embedding>(a.vocab_size, a.dim, gen, o));
  pos_embeddings =
      register_module("pos_embeddings", std::make_shared<Embedding>(a.max_seq_len, a.dim, gen, o));
  dropout = register_module("dropout", std::make_shared<Dropout>(a.dropout_p, 3));
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int i = 0; i < a.n_layers; ++i) {
    auto block = std::make_shared<TransformerBlock>(a, gen, o);
    block->set_checkpoint(a.checkpoint_activations);
    layers->append(block);
  }
  norm = register_module("norm", std::make_shared<LayerNorm>(a.dim, o));
  output = register_module("output", std::make_shared<Linear>(a.dim, a.vocab_size, false, gen, o));
  if (a.weight_tying) output->set_param("weight", tok_embeddings->param("weight"));
}

Tensor Transformer::forward(const Tensor& tokens) {
  // tokens (B, T) i64 -> logits (B, T, vocab)
  COMMTRACE_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64, ErrorCode::InvalidArgument,
                  "{}: expected i64 tokens (B, T), got {}", fqn(), describe(tokens));
  const std::int64_t tt = tokens.size(1);
  COMMTRACE_CHECK(position_offset >= 0 && position_offset + tt <= args_.max_seq_len,
                  ErrorCode::InvalidArgument, "{}: positions [{}, {}) exceed max_seq_len {}", fqn(),
                  position_offset, position_offset + tt, args_.max_seq_len);
  std::vector<std::int64_t> positions(std::size_t(tt), 0);
  std::iota(positions.begin(), positions.end(), position_offset);
  const Tensor pos = Tensor::from_indices(positions, {tt}, tokens.device());
  Tensor h = (*tok_embeddings)(tokens);  // separate statements: modules run in PyTorch's order
  h = add(h, (*pos_embeddings)(pos));
  h = (*dropout)(h);
  for (std::size_t i = 0; i < layers->size(); ++i) h = layers->at(i)(h);
  return (*output)((*norm)(h));
}

// ---------------------------------------------------------------- registry

namespace {

Tensor mse(const Tensor& out, const Batch& b) {
  const Tensor d = sub(out, b.target);
  return mean(mul(d, d));
}

ModelEntry dense_entry(
    std::string name, std::string description, std::int64_t rows, std::int64_t in, std::int64_t out,
    std::function<std::shared_ptr<Module>(Generator&, const ModuleOptions&)> make) {
  ModelEntry e;
  e.family = name;
  e.name = std::move(name);
  e.description = std::move(description);
  e.input = fmt::format("f32 ({}, {})", rows, in);
  e.build = [make](std::uint64_t seed, const ModuleOptions& o) {
    Generator gen(seed);
    return make(gen, o);
  };
  e.batch = [rows, in, out](std::uint64_t seed, const ModuleOptions& o, std::int64_t scale) {
    Generator gen(seed ^ 0x5eedba7c4ull);
    Batch b;
    b.input = rand_uniform({rows * scale, in}, 0.0, 1.0, gen, o.dtype, o.device);
    b.target = randn({rows * scale, out}, gen, o.dtype, o.device);
    return b;
  };
  e.output_shape = [rows, out](std::int64_t scale) { return Shape{rows * scale, out}; };
  e.loss = mse;
  return e;
}

// A language model on random tokens (batch, seq_len) of `vocab` classes, trained with
// cross-entropy against random targets.
void set_token_model(
    ModelEntry& e, std::int64_t vocab, std::int64_t batch, std::int64_t seq,
    std::function<std::shared_ptr<Module>(Generator&, const ModuleOptions&)> make) {
  e.input = fmt::format("i64 tokens ({}, {})", batch, seq);
  e.build = [make = std::move(make)](std::uint64_t seed, const ModuleOptions& o) {
    Generator gen(seed);
    return make(gen, o);
  };
  e.batch = [vocab, batch, seq](std::uint64_t seed, const ModuleOptions& o, std::int64_t scale) {
    Generator gen(seed ^ 0x5eedba7c4ull);
    Batch b;
    b.input = randint({batch * scale, seq}, 0, vocab, gen, o.device);
    b.target = randint({batch * scale, seq}, 0, vocab, gen, o.device);
    return b;
  };
  e.output_shape = [vocab, batch, seq](std::int64_t scale) {
    return Shape{batch * scale, seq, vocab};
  };
  e.loss_name = "cross_entropy";
  e.loss = [](const Tensor& out, const Batch& b) { return cross_entropy(out, b.target); };
  e.cross_entropy_loss = true;
}

// A model file's "loss": the loss and a batch whose target fits it, drawn after the base's
// batch from its own stream (the base's input is unchanged).
void set_loss(ModelEntry& e, const std::string& name) {
  if (name == e.loss_name) return;
  e.loss_name = name;
  e.cross_entropy_loss = name == "cross_entropy";
  if (name == "sum") {
    e.loss = [](const Tensor& out, const Batch&) { return sum(out); };
  } else if (name == "mse") {
    e.loss = mse;
  } else {
    e.loss = [](const Tensor& out, const Batch& b) { return cross_entropy(out, b.target); };
  }
  e.batch = [base = e.batch, shape_of = e.output_shape, name](
                std::uint64_t seed, const ModuleOptions& o, std::int64_t scale) {
    Batch b = base(seed, o, scale);
    Generator gen(seed ^ 0x1055ull);
    Shape out = shape_of(scale);
    if (name == "sum") {
      b.target = Tensor();
    } else if (name == "mse") {
      b.target = randn(out, gen, o.dtype, o.device);
    } else {  // class indices over the output's last dim
      const std::int64_t classes = out.back();
      out.pop_back();
      b.target = randint(out, 0, classes, gen, o.device);
    }
    return b;
  };
}

// A model file's "freeze": every parameter matching a pattern is built without requires_grad.
// REQUIRES: each pattern matches a parameter of the model (else the file fails naming it).
void set_freeze(ModelEntry& e, std::vector<std::string> patterns, JsonReader& rd,
                const JsonPath& path) {
  std::vector<std::string> names;
  for (const auto& [name, p] :
       e.build(0, ModuleOptions{DType::F32, Device::Meta})->named_parameters()) {
    names.push_back(name);
  }
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    const bool hit = std::any_of(names.begin(), names.end(),
                                 [&](const std::string& n) { return glob_match(patterns[i], n); });
    if (!hit) {
      rd.fail(path.index(i), fmt::format("'{}' matches no parameter of {}{}", patterns[i], e.name,
                                         did_you_mean(patterns[i], names)));
    }
  }
  e.freeze = patterns;
  e.build = [base = e.build, patterns = std::move(patterns)](std::uint64_t seed,
                                                             const ModuleOptions& o) {
    std::shared_ptr<Module> m = base(seed, o);
    for (auto& [name, p] : m->named_parameters()) {
      for (const std::string& pat : patterns) {
        if (glob_match(pat, name)) p.set_requires_grad(false);
      }
    }
    return m;
  };
}

void set_transformer(ModelEntry& t, const ModelArgs& a, std::int64_t batch, std::int64_t seq) {
  set_token_model(t, a.vocab_size, batch, seq, [a](Generator& gen, const ModuleOptions& o) {
    return std::make_shared<Transformer>(a, gen, o);
  });
}

void set_decoder(ModelEntry& e, const DecoderArgs& a, std::int64_t batch, std::int64_t seq) {
  a.check();
  set_token_model(e, a.vocab_size, batch, seq, [a](Generator& gen, const ModuleOptions& o) {
    return std::make_shared<Decoder>(a, gen, o);
  });
}

std::string decoder_description(const DecoderArgs& a) {
  return fmt::format(
      "Decoder: {} layers, vocab {}, dim {}, {} heads ({} kv), ffn {}, {}, {}{}, {}, {} qkv{}{}",
      a.n_layers, a.vocab_size, a.dim, a.n_heads, a.kv_heads(), a.ffn_dim(),
      a.rms_norm ? "RMSNorm" : "LayerNorm", a.swiglu ? "SwiGLU" : "GELU",
      a.fused_gate_up ? " (fused gate/up)" : "", a.rope ? "RoPE" : "learned positions",
      a.fused_qkv ? "fused" : "separate", a.bias ? ", biases" : "",
      a.tie_embeddings ? ", tied output" : "");
}

std::vector<ModelEntry> build_zoo() {
  std::vector<ModelEntry> zoo;
  zoo.push_back(dense_entry(
      "toy", "ToyModel: in_proj Linear(10,32), relu, out_proj Linear(32,5)", 20, 10, 5,
      [](Generator& g, const ModuleOptions& o) { return std::make_shared<ToyModel>(g, o); }));
  zoo.push_back(dense_entry(
      "mlp", "MLPModule: net1 Linear(10,16), relu, net2 Linear(16,10)", 8, 10, 10,
      [](Generator& g, const ModuleOptions& o) { return std::make_shared<MLPModule>(g, o); }));
  zoo.push_back(dense_entry(
      "mlp-stacked", "MLPStacked: layers.0, layers.1 = MLPModule", 8, 10, 10,
      [](Generator& g, const ModuleOptions& o) { return std::make_shared<MLPStacked>(2, g, o); }));

  ModelEntry t;
  t.name = "transformer";
  t.family = "transformer";
  t.description =
      "Transformer(ModelArgs): 2 layers, vocab 8, max_seq_len 16, dim 16, 4 heads, tied output";
  set_transformer(t, ModelArgs{}, 8, 8);
  zoo.push_back(std::move(t));

  // A tiny Llama-style decoder; model files resize and reshape it (samples/models/).
  ModelEntry d;
  d.name = "decoder";
  d.family = "decoder";
  const DecoderArgs da;
  d.description = decoder_description(da);
  set_decoder(d, da, 4, 8);
  zoo.push_back(std::move(d));
  return zoo;
}

}  // namespace

const std::vector<ModelEntry>& model_zoo() {
  static const std::vector<ModelEntry> zoo = build_zoo();
  return zoo;
}

const ModelEntry& find_model(const std::string& name) {
  std::vector<std::string> names;
  for (const ModelEntry& e : model_zoo()) {
    if (e.name == name) return e;
    names.push_back(e.name);
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("unknown model '{}'{} (known: {}; or a model JSON file)", name,
                          did_you_mean(name, names), fmt::join(names, ", ")));
}

ModelEntry model_from_json_text(const std::string& text, const std::string& source) {
  JsonReader rd(source);
  const Json j = rd.parse(text, "a JSON object with \"schema\": \"commtrace.model\"");
  const JsonPath top;
  rd.check_header(j, "commtrace.model", {{1, 1}}, "model");
  rd.check_keys(j, top, {"schema", "version", "name", "base", "args", "loss", "freeze"});
  ModelEntry e = rd.parse_with(rd.at(j, "base", top), top.key("base"),
                               [](const std::string& base) { return find_model(base); });
  const Json* name = rd.find(j, "name");
  e.name = name ? rd.str(*name, top.key("name")) : source;
  static const Json kNoArgs = Json::object();
  const Json* found = rd.find(j, "args");
  const JsonPath apath = top.key("args");
  const Json& args = found ? rd.object(*found, apath) : kNoArgs;
  auto get_int = [&](const char* key, std::int64_t def, std::int64_t hi) {
    const Json* v = rd.find(args, key);
    return v ? rd.integer(*v, apath.key(key), 1, hi) : def;
  };
  // Sizes a model file may ask for; larger ones would overflow element counts.
  constexpr std::int64_t kMaxDim = std::int64_t(1) << 31;
  // The largest tensors must fit a tensor's element limit with room for a 4096-way data-
  // parallel batch; each factor is below 2^31, so no product of two overflows.
  constexpr std::int64_t kMaxElements = kMaxNumel >> 12;
  auto fits = [&](const char* what, const char* factors, std::initializer_list<std::int64_t> f) {
    std::int64_t n = 1;
    for (std::int64_t x : f) {
      if (__builtin_mul_overflow(n, x, &n) || n > kMaxElements) {
        rd.fail(apath, fmt::format("{} ({}) hold more than 2^47 elements", what, factors));
      }
    }
  };
  if (e.family == "transformer") {
    rd.check_keys(args, apath,
                  {"n_layers", "vocab_size", "max_seq_len", "dim", "n_heads", "weight_tying",
                   "checkpoint_activations", "batch", "seq_len"});
    ModelArgs a;
    a.n_layers = int(get_int("n_layers", a.n_layers, 100000));
    a.vocab_size = get_int("vocab_size", a.vocab_size, kMaxDim);
    a.max_seq_len = get_int("max_seq_len", a.max_seq_len, kMaxDim);
    a.dim = get_int("dim", a.dim, kMaxDim);
    a.n_heads = get_int("n_heads", a.n_heads, kMaxDim);
    if (const Json* tying = rd.find(args, "weight_tying")) {
      a.weight_tying = rd.boolean(*tying, apath.key("weight_tying"));
    }
    if (const Json* ck = rd.find(args, "checkpoint_activations")) {
      a.checkpoint_activations = rd.boolean(*ck, apath.key("checkpoint_activations"));
    }
    if (a.dim % a.n_heads != 0) {
      rd.fail(apath, fmt::format("dim {} is not divisible by n_heads {}", a.dim, a.n_heads));
    }
    const std::int64_t seq = get_int("seq_len", 8, kMaxDim);
    if (seq > a.max_seq_len) {
      rd.fail(apath.key("seq_len"),
              fmt::format("seq_len {} exceeds max_seq_len {}", seq, a.max_seq_len));
    }
    const std::int64_t batch = get_int("batch", 8, kMaxDim);
    fits("the logits", "batch × seq_len × vocab_size", {batch, seq, a.vocab_size});
    fits("the feed-forward activations", "batch × seq_len × 4 × dim", {batch, seq, 4, a.dim});
    fits("the token embedding", "vocab_size × dim", {a.vocab_size, a.dim});
    fits("the position embedding", "max_seq_len × dim", {a.max_seq_len, a.dim});
    fits("the feed-forward weights", "4 × dim × dim", {4, a.dim, a.dim});
    set_transformer(e, a, batch, seq);
    e.description = fmt::format("Transformer: {} layers, vocab {}, dim {}, {} heads ({})",
                                a.n_layers, a.vocab_size, a.dim, a.n_heads, source);
  } else if (e.family == "decoder") {
    rd.check_keys(args, apath,
                  {"n_layers", "vocab_size", "dim", "n_heads", "n_kv_heads", "hidden_dim",
                   "max_seq_len", "norm", "norm_eps", "mlp", "position", "rope_theta", "qkv",
                   "gate_up", "bias", "tie_embeddings", "causal", "batch", "seq_len"});
    DecoderArgs a;
    a.n_layers = int(get_int("n_layers", a.n_layers, 100000));
    a.vocab_size = get_int("vocab_size", a.vocab_size, kMaxDim);
    a.dim = get_int("dim", a.dim, kMaxDim);
    a.n_heads = get_int("n_heads", a.n_heads, kMaxDim);
    a.n_kv_heads = get_int("n_kv_heads", a.n_heads, kMaxDim);
    a.hidden_dim = get_int("hidden_dim", 4 * a.dim, kMaxDim);
    a.max_seq_len = get_int("max_seq_len", a.max_seq_len, kMaxDim);
    // A string key with two allowed values; returns whether it is the first.
    auto choice = [&](const char* key, const char* first, const char* second, bool def) {
      const Json* v = rd.find(args, key);
      if (!v) return def;
      const std::string got = rd.str(*v, apath.key(key));
      if (got != first && got != second) {
        rd.fail(apath.key(key),
                fmt::format("'{}' is neither \"{}\" nor \"{}\"", got, first, second));
      }
      return got == first;
    };
    auto flag = [&](const char* key, bool def) {
      const Json* v = rd.find(args, key);
      return v ? rd.boolean(*v, apath.key(key)) : def;
    };
    auto positive = [&](const char* key, double def) {
      const Json* v = rd.find(args, key);
      if (!v) return def;
      const double x = rd.number(*v, apath.key(key));
      if (!(x > 0)) rd.fail(apath.key(key), fmt::format("{} must be positive", x));
      return x;
    };
    a.rms_norm = choice("norm", "rmsnorm", "layernorm", a.rms_norm);
    a.norm_eps = positive("norm_eps", a.norm_eps);
    a.swiglu = choice("mlp", "swiglu", "gelu", a.swiglu);
    a.rope = choice("position", "rope", "learned", a.rope);
    a.rope_theta = positive("rope_theta", a.rope_theta);
    a.fused_qkv = choice("qkv", "fused", "separate", a.fused_qkv);
    a.fused_gate_up = choice("gate_up", "fused", "separate", a.fused_gate_up);
    a.bias = flag("bias", a.bias);
    a.tie_embeddings = flag("tie_embeddings", a.tie_embeddings);
    a.causal = flag("causal", a.causal);
    try {
      a.check();
    } catch (const Error& err) {
      rd.fail(apath, err.what());
    }
    const std::int64_t seq = get_int("seq_len", 8, kMaxDim);
    if (seq > a.max_seq_len) {
      rd.fail(apath.key("seq_len"),
              fmt::format("seq_len {} exceeds max_seq_len {}", seq, a.max_seq_len));
    }
    const std::int64_t batch = get_int("batch", 4, kMaxDim);
    fits("the logits", "batch × seq_len × vocab_size", {batch, seq, a.vocab_size});
    fits("the feed-forward activations", "batch × seq_len × hidden_dim", {batch, seq, a.ffn_dim()});
    fits("the attention probabilities", "batch × n_heads × seq_len²", {batch, a.n_heads, seq, seq});
    fits("the token embedding", "vocab_size × dim", {a.vocab_size, a.dim});
    fits("the position embedding", "max_seq_len × dim", {a.max_seq_len, a.dim});
    fits("the feed-forward weights", "hidden_dim × dim", {a.ffn_dim(), a.dim});
    set_decoder(e, a, batch, seq);
    e.description = decoder_description(a) + fmt::format(" ({})", source);
  } else if (e.family == "mlp-stacked") {
    rd.check_keys(args, apath, {"n_layers"});
    const int layers = int(get_int("n_layers", 2, 100000));
    e.build = [layers](std::uint64_t seed, const ModuleOptions& o) {
      Generator gen(seed);
      return std::shared_ptr<Module>(std::make_shared<MLPStacked>(layers, gen, o));
    };
    e.description = fmt::format("MLPStacked: {} layers ({})", layers, source);
  } else {
    rd.check_keys(args, apath, {});
  }
  if (const Json* loss = rd.find(j, "loss")) {
    const std::string name = rd.str(*loss, top.key("loss"));
    if (name != "mse" && name != "sum" && name != "cross_entropy") {
      rd.fail(top.key("loss"),
              fmt::format("unknown loss '{}' (known: mse, sum, cross_entropy)", name));
    }
    set_loss(e, name);
  }
  if (const Json* freeze = rd.find(j, "freeze")) {
    const JsonPath fpath = top.key("freeze");
    set_freeze(e, rd.strings(*freeze, fpath), rd, fpath);
  }
  return e;
}

bool glob_match(std::string_view pattern, std::string_view name) {
  // Iterative wildcard matching: on a mismatch after a '*', let that '*' take one more char.
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const ModelEntry& resolve_model(const std::string& name_or_file) {
  if (!names_a_file(name_or_file)) return find_model(name_or_file);
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<ModelEntry>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = loaded[name_or_file];
  if (!slot) {
    slot = std::make_unique<ModelEntry>(
        model_from_json_text(read_text_file(name_or_file, "model file"), name_or_file));
  }
  return *slot;
}

}  // namespace commtrace
