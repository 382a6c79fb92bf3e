#include "parallel/plans/style.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "parallel/nn/models.h"
#include "parallel/tensor/ops.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

// Parameters already distributed by the running parallelize_module (tied weights).
struct Distributed {
  Placements placements;
  Tensor dtensor;
  std::string owner;
};
thread_local std::map<const TensorImpl*, Distributed>* g_distributed = nullptr;

// Swaps the module's parameter `name` for a leaf DTensor with `placements`, reusing the
// DTensor of a tied parameter distributed the same way.
void distribute_param(Module& m, const std::string& name,
                      const std::shared_ptr<const DeviceMesh>& mesh, Placements placements) {
  const Tensor p = m.param(name);
  if (is_dtensor(p)) {
    COMMTRACE_CHECK(dist_of(p).placements == normalize_placements(placements, p.dim(), "param"),
                    ErrorCode::InvalidArgument,
                    "{}.{} is already distributed as {}; a second style asks for {}", m.fqn(), name,
                    placements_str(dist_of(p).placements), placements_str(placements));
    return;
  }
  if (g_distributed) {
    if (auto it = g_distributed->find(p.impl()); it != g_distributed->end()) {
      COMMTRACE_CHECK(it->second.placements == normalize_placements(placements, p.dim(), "param"),
                      ErrorCode::InvalidArgument,
                      "{}.{} is tied to {} which is distributed as {}, not {}", m.fqn(), name,
                      it->second.owner, placements_str(it->second.placements),
                      placements_str(placements));
      m.set_param(name, it->second.dtensor);
      return;
    }
  }
  Tensor d = distribute_tensor(p, mesh, placements);  // keeps requires_grad (frozen: off)
  if (g_distributed) {
    (*g_distributed)[p.impl()] = {dist_of(d).placements, d, m.fqn() + "." + name};
  }
  m.set_param(name, d);
}

void distribute_all(Module& m, const std::shared_ptr<const DeviceMesh>& mesh,
                    const Placements& placements) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m.local_parameters()) names.push_back(name);
  for (const auto& name : names) distribute_param(m, name, mesh, placements);
}

bool is_linear(const Module& m) { return dynamic_cast<const Linear*>(&m) != nullptr; }
bool is_embedding(const Module& m) { return dynamic_cast<const Embedding*>(&m) != nullptr; }

// p with a negative shard dim counted from the end of a rank-`rank` tensor. InvalidArgument
// naming the module, style and layout (`who`) when the dim does not fit the tensor.
Placement normalized(Placement p, int rank, const Reason& who) {
  if (!p.is_shard()) return p;
  const int d = p.dim < 0 ? p.dim + rank : p.dim;
  COMMTRACE_CHECK(d >= 0 && d < rank, ErrorCode::InvalidArgument,
                  "{}: {} is out of range for a {}-d tensor", who.str(), p.str(), rank);
  p.dim = d;
  return p;
}

// The reasons a style's collectives carry, built once when the style is applied.
struct StyleReasons {
  StyleReasons(const std::string& who, const std::string& style)
      : input_grad(
            fmt::format("{} input grad (from_local backward, {} input_layouts)", who, style)),
        input(fmt::format("{} input ({} input_layouts)", who, style)),
        output(fmt::format("{} output ({} output_layouts)", who, style)) {}
  Reason input_grad, input, output;
};

// Input conversion shared by the styles: a plain tensor becomes from_local(layout), then the
// DTensor is redistributed to `desired` when the layouts differ (PyTorch compares the declared
// layouts, not the tensor's).
Tensor prepare_input(const Tensor& x, const std::shared_ptr<const DeviceMesh>& mesh,
                     Placement layout, Placement desired, const StyleReasons& why) {
  Tensor d = x;
  if (!is_dtensor(d)) {
    d = from_local(x, mesh, {normalized(layout, x.dim(), why.input)}, std::nullopt, why.input_grad);
  }
  const Placement want = normalized(desired, d.dim(), why.input);
  if (!(normalized(layout, d.dim(), why.input) == want)) {
    d = redistribute(d, {want}, why.input);
  }
  return d;
}

Tensor prepare_output(const Tensor& y, Placement layout, bool use_local, const StyleReasons& why) {
  Tensor d = y;
  const Placement want = normalized(layout, d.dim(), why.output);
  if (!(dist_of(d).placements == Placements{want})) d = redistribute(d, {want}, why.output);
  return use_local ? to_local(d) : d;
}

std::string args_str(const std::vector<std::pair<std::string, std::string>>& args) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : args) parts.push_back(k + "=" + v);
  return fmt::format("{}", fmt::join(parts, ", "));
}

void check_mesh(const std::shared_ptr<const DeviceMesh>& mesh, const char* style) {
  COMMTRACE_CHECK(mesh && mesh->ndim() == 1, ErrorCode::InvalidArgument,
                  "{}: styles apply on a 1-D mesh (take the 'tp' dim of a 2-D mesh)", style);
}

}  // namespace

// ---------------------------------------------------------------- styles

std::string ColwiseParallel::str() const {
  std::vector<std::pair<std::string, std::string>> a;
  if (!input_layout.is_replicate()) a.emplace_back("input_layouts", input_layout.str());
  if (!(output_layout == Placement::shard(-1)))
    a.emplace_back("output_layouts", output_layout.str());
  if (!use_local_output) a.emplace_back("use_local_output", "False");
  return "ColwiseParallel(" + args_str(a) + ")";
}

namespace {

// Fewer heads than ranks (grouped-query attention's kv projections): the parameters stay
// Replicate, and each call derives a weight of one head per rank, rank r holding head
// r / (ranks / heads): every head repeated ranks / heads times (expand, local) and sharded on
// dim 0 (a local chunk). Backward gathers the per-rank weight gradients over the mesh and sums
// each head's copies, so the parameters' gradients come out Replicate.
void duplicate_heads(Linear& lin, const std::shared_ptr<const DeviceMesh>& mesh) {
  distribute_all(lin, mesh, {Placement::replicate()});
  const std::int64_t heads = lin.heads, copies = mesh->size(0) / heads;
  const Reason why(fmt::format("{} weight: {} heads duplicated onto {} ranks (ColwiseParallel)",
                               lin.fqn(), heads, mesh->size(0)));
  auto dup = [heads, copies, why, fqn = lin.fqn()](const Tensor& t) {
    if (!t.defined()) return t;
    Shape grouped = t.shape(), repeated;
    COMMTRACE_CHECK(grouped[0] % heads == 0, ErrorCode::ShapeMismatch,
                    "{}: {} output features are not {} whole heads", fqn, grouped[0], heads);
    grouped[0] /= heads;
    grouped.insert(grouped.begin(), {heads, 1});
    repeated = grouped;
    repeated[1] = copies;
    Shape flat = t.shape();
    flat[0] *= copies;
    return redistribute(view(expand(view(t, grouped), repeated), flat), {Placement::shard(0)}, why);
  };
  lin.derive = [dup](const Tensor& w, const Tensor& b) { return std::pair{dup(w), dup(b)}; };
}

}  // namespace

void ColwiseParallel::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "ColwiseParallel");
  COMMTRACE_CHECK(is_linear(m) || is_embedding(m), ErrorCode::InvalidArgument,
                  "ColwiseParallel on '{}' ({}): only Linear and Embedding are supported", m.fqn(),
                  m.type());
  auto* lin = dynamic_cast<Linear*>(&m);
  const int ranks = mesh->size(0);
  if (lin && lin->heads > 0 && lin->heads % ranks != 0) {
    COMMTRACE_CHECK(ranks % lin->heads == 0, ErrorCode::InvalidArgument,
                    "ColwiseParallel on '{}': its {} heads can be neither split over nor "
                    "duplicated onto {} ranks (one count must divide the other)",
                    m.fqn(), lin->heads, ranks);
    duplicate_heads(*lin, mesh);
  } else if (is_linear(m)) {
    distribute_all(m, mesh, {Placement::shard(0)});
  } else {
    distribute_param(m, "weight", mesh, {Placement::shard(1)});
  }
  const StyleReasons why(m.fqn(), "ColwiseParallel");
  m.add_pre_hook([=, in = input_layout](Module&, const Tensor& x) {
    return prepare_input(x, mesh, in, Placement::replicate(), why);
  });
  m.add_post_hook(
      [=, out = output_layout, local = use_local_output](Module&, const Tensor&, const Tensor& y) {
        return prepare_output(y, out, local, why);
      });
}

std::string RowwiseParallel::str() const {
  std::vector<std::pair<std::string, std::string>> a;
  if (!(input_layout == Placement::shard(-1))) a.emplace_back("input_layouts", input_layout.str());
  if (!output_layout.is_replicate()) a.emplace_back("output_layouts", output_layout.str());
  if (!use_local_output) a.emplace_back("use_local_output", "False");
  return "RowwiseParallel(" + args_str(a) + ")";
}

void RowwiseParallel::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "RowwiseParallel");
  COMMTRACE_CHECK(is_linear(m) || is_embedding(m), ErrorCode::InvalidArgument,
                  "RowwiseParallel on '{}' ({}): only Linear and Embedding are supported", m.fqn(),
                  m.type());
  const bool linear = is_linear(m);
  if (linear) {
    distribute_param(m, "weight", mesh, {Placement::shard(1)});
    for (const auto& [name, p] : m.local_parameters()) {
      if (name == "bias") distribute_param(m, "bias", mesh, {Placement::replicate()});
    }
  } else {
    distribute_param(m, "weight", mesh, {Placement::shard(0)});
  }
  const StyleReasons why(m.fqn(), "RowwiseParallel");
  const Placement desired = linear ? Placement::shard(-1) : Placement::replicate();
  m.add_pre_hook([=, in = input_layout](Module&, const Tensor& x) {
    return prepare_input(x, mesh, in, desired, why);
  });
  m.add_post_hook(
      [=, out = output_layout, local = use_local_output](Module&, const Tensor&, const Tensor& y) {
        return prepare_output(y, out, local, why);
      });
}

std::string SequenceParallel::str() const {
  std::vector<std::pair<std::string, std::string>> a;
  if (sequence_dim != 1) a.emplace_back("sequence_dim", std::to_string(sequence_dim));
  if (use_local_output) a.emplace_back("use_local_output", "True");
  return "SequenceParallel(" + args_str(a) + ")";
}

void SequenceParallel::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "SequenceParallel");
  distribute_all(m, mesh, {Placement::replicate()});
  const Reason input_grad(
      fmt::format("{} input grad (from_local backward, SequenceParallel)", m.fqn()));
  const Reason input(fmt::format("{} input (SequenceParallel sequence_dim)", m.fqn()));
  m.add_pre_hook([=, dim = sequence_dim](Module&, const Tensor& x) {
    if (is_dtensor(x)) return x;
    return from_local(x, mesh, {normalized(Placement::shard(dim), x.dim(), input)}, std::nullopt,
                      input_grad);
  });
  if (use_local_output) {
    m.add_post_hook(
        [](Module&, const Tensor&, const Tensor& y) { return is_dtensor(y) ? to_local(y) : y; });
  }
}

std::string PrepareModuleInput::str() const {
  return fmt::format("PrepareModuleInput(input_layouts={}, desired_input_layouts={}{})",
                     input_layout.str(), desired_input_layout.str(),
                     use_local_output ? ", use_local_output=True" : "");
}

void PrepareModuleInput::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "PrepareModuleInput");
  const StyleReasons why(m.fqn(), "PrepareModuleInput");
  m.add_pre_hook([=, in = input_layout, want = desired_input_layout, local = use_local_output](
                     Module&, const Tensor& x) {
    Tensor d = prepare_input(x, mesh, in, want, why);
    return local ? to_local(d) : d;
  });
}

std::string PrepareModuleOutput::str() const {
  return fmt::format("PrepareModuleOutput(output_layouts={}, desired_output_layouts={}{})",
                     output_layout.str(), desired_output_layout.str(),
                     use_local_output ? "" : ", use_local_output=False");
}

void PrepareModuleOutput::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "PrepareModuleOutput");
  const StyleReasons why(m.fqn(), "PrepareModuleOutput");
  m.add_post_hook([=, out = output_layout, want = desired_output_layout, local = use_local_output](
                      Module&, const Tensor&, const Tensor& y) {
    Tensor d = y;
    if (!is_dtensor(d)) d = from_local(y, mesh, {normalized(out, y.dim(), why.output)});
    return prepare_output(d, want, local, why);
  });
}

// ---------------------------------------------------------------- parallelize_module

std::vector<std::string> match_modules(Module& root, const std::string& pattern) {
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    std::stringstream ss(s);
    std::string part;
    while (std::getline(ss, part, '.')) parts.push_back(part);
    return parts;
  };
  const auto want = split(pattern);
  std::vector<std::string> out;
  for (const auto& [name, m] : root.named_modules()) {
    const auto have = split(name);
    if (have.size() != want.size() || name.empty()) continue;
    bool ok = true;
    for (std::size_t i = 0; ok && i < want.size(); ++i) ok = want[i] == "*" || want[i] == have[i];
    if (ok) out.push_back(name);
  }
  return out;
}

std::vector<std::string> parallelize_module(Module& model,
                                            const std::shared_ptr<const DeviceMesh>& mesh,
                                            const Plan& plan) {
  std::map<const TensorImpl*, Distributed> distributed;
  struct Scope {
    explicit Scope(std::map<const TensorImpl*, Distributed>* m) { g_distributed = m; }
    ~Scope() { g_distributed = nullptr; }
  } scope(&distributed);
  for (const auto& [pattern, style] : plan.styles) {
    const auto names = match_modules(model, pattern);
    const bool optional =
        std::find(plan.optional.begin(), plan.optional.end(), pattern) != plan.optional.end();
    COMMTRACE_CHECK(!names.empty() || optional, ErrorCode::InvalidArgument,
                    "plan '{}': pattern '{}' matches no module of {}", plan.name, pattern,
                    model.fqn());
    for (const auto& name : names) {
      try {
        style->apply(*model.find(name), mesh);
      } catch (const Error& e) {
        throw Error(e.code(),
                    fmt::format("plan '{}', pattern '{}': {}", plan.name, pattern, e.what()));
      }
    }
  }
  for (const std::string& pattern : plan.checkpoint) {
    const auto names = match_modules(model, pattern);
    COMMTRACE_CHECK(!names.empty(), ErrorCode::InvalidArgument,
                    "plan '{}': checkpoint pattern '{}' matches no module of {}", plan.name,
                    pattern, model.fqn());
    for (const auto& name : names) model.find(name)->set_checkpoint(true);
  }
  // A tied weight that a style distributed while another module still holds it plain.
  std::vector<std::string> untied;
  for (const auto& [path, m] : model.named_modules()) {
    for (const auto& [name, p] : m->local_parameters()) {
      const auto it = distributed.find(p.impl());
      if (it == distributed.end() || is_dtensor(p)) continue;
      untied.push_back(fmt::format(
          "the plan unties {}.{} from {}: {} is distributed as {}, {}.{} stays a plain tensor, "
          "so the parallel model trains two weights where the model has one (PyTorch's "
          "parallelize_module unties them alike); give both modules styles that distribute the "
          "weight the same way to keep it tied",
          m->fqn(), name, it->second.owner, it->second.owner, placements_str(it->second.placements),
          m->fqn(), name));
    }
  }
  return untied;
}

// ---------------------------------------------------------------- plans

namespace {

// A placement string ("Shard(0)"), or a list of one.
Placement layout_of(const JsonReader& rd, const Json& v, const JsonPath& where) {
  if (v.is_array()) {
    if (v.size() != 1)
      rd.fail(where, "expected a placement string like \"Shard(0)\" (or a list of one)");
    return layout_of(rd, v[0], where.index(0));
  }
  if (!v.is_string()) {
    rd.fail(where, "expected a placement string like \"Shard(0)\" (or a list of one)");
  }
  return rd.parse_with(v, where, [](const std::string& s) { return parse_placement(s); });
}

std::shared_ptr<ParallelStyle> style_from_json(const JsonReader& rd, const Json& j,
                                               const JsonPath& where) {
  rd.object(j, where);
  const std::string kind = rd.str(rd.at(j, "style", where), where.key("style"));
  auto get_bool = [&](const char* key, bool def) {
    const Json* v = rd.find(j, key);
    return v ? rd.boolean(*v, where.key(key)) : def;
  };
  auto get_layout = [&](const char* key, Placement def) {
    const Json* v = rd.find(j, key);
    return v ? layout_of(rd, *v, where.key(key)) : def;
  };
  if (kind == "ColwiseParallel" || kind == "RowwiseParallel") {
    rd.check_keys(j, where, {"style", "input_layouts", "output_layouts", "use_local_output"});
    if (kind == "ColwiseParallel") {
      auto s = std::make_shared<ColwiseParallel>();
      s->input_layout = get_layout("input_layouts", s->input_layout);
      s->output_layout = get_layout("output_layouts", s->output_layout);
      s->use_local_output = get_bool("use_local_output", true);
      return s;
    }
    auto s = std::make_shared<RowwiseParallel>();
    s->input_layout = get_layout("input_layouts", s->input_layout);
    s->output_layout = get_layout("output_layouts", s->output_layout);
    s->use_local_output = get_bool("use_local_output", true);
    return s;
  }
  if (kind == "SequenceParallel") {
    rd.check_keys(j, where, {"style", "sequence_dim", "use_local_output"});
    auto s = std::make_shared<SequenceParallel>();
    if (const Json* d = rd.find(j, "sequence_dim")) {
      s->sequence_dim = rd.int32(*d, where.key("sequence_dim"), -64, 63);
    }
    s->use_local_output = get_bool("use_local_output", false);
    return s;
  }
  if (kind == "PrepareModuleInput") {
    rd.check_keys(j, where,
                  {"style", "input_layouts", "desired_input_layouts", "use_local_output"});
    auto s = std::make_shared<PrepareModuleInput>();
    s->input_layout = get_layout("input_layouts", s->input_layout);
    s->desired_input_layout = get_layout("desired_input_layouts", s->desired_input_layout);
    s->use_local_output = get_bool("use_local_output", false);
    return s;
  }
  if (kind == "PrepareModuleOutput") {
    rd.check_keys(j, where,
                  {"style", "output_layouts", "desired_output_layouts", "use_local_output"});
    auto s = std::make_shared<PrepareModuleOutput>();
    s->output_layout = get_layout("output_layouts", s->output_layout);
    s->desired_output_layout = get_layout("desired_output_layouts", s->desired_output_layout);
    s->use_local_output = get_bool("use_local_output", true);
    return s;
  }
  rd.fail(where.key("style"),
          fmt::format("unknown style \"{}\" (ColwiseParallel, RowwiseParallel, SequenceParallel, "
                      "PrepareModuleInput, PrepareModuleOutput)",
                      kind));
}

ContextParallel context_parallel_of(const JsonReader& rd, const Json& j, const JsonPath& path) {
  rd.object(j, path);
  rd.check_keys(j, path,
                {"family", "divide_by_world_size", "grad_reduction", "param_grad_reduction"});
  ContextParallel cp;
  cp.family = rd.str(rd.at(j, "family", path), path.key("family"));
  if (const Json* v = rd.find(j, "divide_by_world_size")) {
    cp.divide_by_world_size = rd.boolean(*v, path.key("divide_by_world_size"));
  }
  if (const Json* v = rd.find(j, "grad_reduction")) {
    cp.grad_reduction = rd.str(*v, path.key("grad_reduction"));
  }
  if (const Json* v = rd.find(j, "param_grad_reduction")) {
    cp.param_grad_reduction = rd.str(*v, path.key("param_grad_reduction"));
  }
  try {
    cp.check();
  } catch (const Error& e) {
    rd.fail(path, e.what());
  }
  return cp;
}

}  // namespace

Plan plan_from_json_text(const std::string& text, const std::string& source) {
  JsonReader rd(source);
  const Json j = rd.parse(text, "a JSON object with \"schema\": \"commtrace.plan\"");
  const JsonPath top;
  rd.check_header(j, "commtrace.plan", {{1, 3}}, "plan");
  rd.check_keys(j, top,
                {"schema", "version", "name", "plan", "model_input", "model_output",
                 "loss_parallel", "coalesce_partial_grads", "context_parallel", "checkpoint"});
  Plan plan;
  if (const Json* v = rd.find(j, "checkpoint"))
    plan.checkpoint = rd.strings(*v, top.key("checkpoint"));
  const Json* name = rd.find(j, "name");
  plan.name = name ? rd.str(*name, top.key("name")) : source;
  if (const Json* v = rd.find(j, "model_input")) {
    plan.model_input = layout_of(rd, *v, top.key("model_input"));
  }
  if (const Json* v = rd.find(j, "model_output")) {
    plan.model_output = layout_of(rd, *v, top.key("model_output"));
  }
  if (const Json* v = rd.find(j, "loss_parallel")) {
    plan.loss_parallel = rd.boolean(*v, top.key("loss_parallel"));
    if (plan.loss_parallel && !plan.model_output.is_shard(-1)) {
      rd.fail(top.key("loss_parallel"),
              fmt::format("loss parallel needs \"model_output\": \"Shard(-1)\" (the output "
                          "sharded on its class dim), got {}",
                          plan.model_output.str()));
    }
  }
  if (const Json* v = rd.find(j, "coalesce_partial_grads")) {
    plan.coalesce_partial_grads = rd.boolean(*v, top.key("coalesce_partial_grads"));
  }
  if (const Json* v = rd.find(j, "context_parallel")) {
    plan.context_parallel = context_parallel_of(rd, *v, top.key("context_parallel"));
    if (!rd.find(j, "model_input")) plan.model_input = Placement::shard(1);
    if (!plan.model_input.is_shard(1)) {
      rd.fail(top.key("model_input"),
              fmt::format("context parallel shards the sequence: \"model_input\" must be "
                          "\"Shard(1)\", got {}",
                          plan.model_input.str()));
    }
  }
  const JsonPath ppath = top.key("plan");
  const Json* styles_json = rd.find(j, "plan");
  // A family alone, or checkpointing alone.
  if (!styles_json && (plan.context_parallel || !plan.checkpoint.empty())) return plan;
  const Json& styles = rd.object(rd.at(j, "plan", top), ppath);
  if (styles.empty() && !plan.context_parallel && plan.checkpoint.empty()) {
    rd.fail(ppath, "no styles (a plan maps module patterns to styles)");
  }
  for (const auto& [pattern, style] : styles.items()) {
    plan.styles.emplace_back(pattern, style_from_json(rd, style, ppath.key(pattern.c_str())));
  }
  return plan;
}

Plan load_plan_file(const std::string& path) {
  return plan_from_json_text(read_text_file(path, "plan file"), path);
}

std::vector<std::string> builtin_plan_names(const std::string& model) {
  if (model == "mlp-stacked") return {"tp"};
  if (model == "decoder") return {"tp", "sp", "torchtitan", "megatron", "megatron-sp"};
  if (model == "transformer") return {"tp", "sp", "ulysses", "ring", "rsa"};
  return {"tp", "sp"};
}

namespace {

std::shared_ptr<ColwiseParallel> colwise(Placement in, Placement out, bool local) {
  auto s = std::make_shared<ColwiseParallel>();
  s->input_layout = in;
  s->output_layout = out;
  s->use_local_output = local;
  return s;
}

std::shared_ptr<RowwiseParallel> rowwise(Placement in, Placement out) {
  auto s = std::make_shared<RowwiseParallel>();
  s->input_layout = in;
  s->output_layout = out;
  return s;
}

// torchtitan's Llama plan (parallelize_llama's apply_tp): "tp" without sequence parallelism;
// "sp" and "torchtitan" with it (torchtitan always shards the sequence); "torchtitan" leaves the
// logits vocab-sharded for loss parallel. Works on separate or fused QKV, SwiGLU or GELU,
// RoPE or learned positions: the patterns for parts a model lacks are optional.
// Megatron-LM's tensor parallelism on its fused QKV (wqkv required; SwiGLU's fc1 is fused as
// w13 in Megatron's models, a GELU fc1 is w1): "megatron"
// without and "megatron-sp" with sequence parallelism. Its conjugate operators are the styles'
// conversions: f (identity forward, all_reduce backward; with SP all_gather / reduce_scatter) is
// a column-parallel module's input, g (all_reduce forward, identity backward; with SP
// reduce_scatter / all_gather) a row-parallel module's output; the output layer keeps the logits
// vocab-sharded for its vocab-parallel cross-entropy (loss parallel); with SP, the norms'
// gradients are all-reduced over tp in one coalesced call after backward (finalize_model_grads).
Plan decoder_plan(const std::string& name) {
  const Placement R = Placement::replicate();
  auto S = [](int d) { return Placement::shard(d); };
  const bool megatron = name == "megatron" || name == "megatron-sp";
  const bool sp = name != "tp" && name != "megatron";
  Plan p;
  p.name = "decoder " + name;
  auto add = [&](std::string pattern, std::shared_ptr<ParallelStyle> style, bool optional) {
    if (optional) p.optional.push_back(pattern);
    p.styles.emplace_back(std::move(pattern), std::move(style));
  };
  auto prepare = [&]() {
    auto s = std::make_shared<PrepareModuleInput>();
    s->input_layout = S(1);
    s->desired_input_layout = R;
    return s;
  };
  add("tok_embeddings", rowwise(R, sp ? S(1) : R), false);
  add("pos_embeddings", rowwise(R, sp ? S(0) : R), true);
  if (sp) {
    add("norm", std::make_shared<SequenceParallel>(), false);
    add("layers.*.attention_norm", std::make_shared<SequenceParallel>(), false);
    add("layers.*.attention", prepare(), false);
  }
  for (const char* w : {"wq", "wk", "wv", "wqkv"}) {
    const bool fused = std::string(w) == "wqkv";
    if (megatron && !fused) continue;
    add(std::string("layers.*.attention.") + w, colwise(R, S(-1), true), !megatron);
  }
  add("layers.*.attention.wo", rowwise(S(-1), sp ? S(1) : R), false);
  if (sp) {
    add("layers.*.ffn_norm", std::make_shared<SequenceParallel>(), false);
    add("layers.*.feed_forward", prepare(), false);
  }
  for (const char* w : {"w1", "w3", "w13"}) {
    add(std::string("layers.*.feed_forward.") + w, colwise(R, S(-1), true), true);
  }
  add("layers.*.feed_forward.w2", rowwise(S(-1), sp ? S(1) : R), false);
  p.coalesce_partial_grads = name == "megatron-sp";
  if (name == "torchtitan" || megatron) {
    add("output", colwise(sp ? S(1) : R, S(-1), false), false);
    p.model_output = S(-1);
    p.loss_parallel = true;
  } else {
    add("output", colwise(sp ? S(1) : R, R, true), false);
  }
  return p;
}

}  // namespace

Plan builtin_plan(const std::string& model, const std::string& name) {
  const Placement R = Placement::replicate();
  auto S = [](int d) { return Placement::shard(d); };
  Plan p;
  p.name = model + " " + name;
  if (model == "decoder") {
    const auto names = builtin_plan_names(model);
    if (std::find(names.begin(), names.end(), name) != names.end()) return decoder_plan(name);
  }
  const bool known_model = model == "toy" || model == "mlp" || model == "mlp-stacked" ||
                           model == "transformer" || model == "decoder";
  COMMTRACE_CHECK(known_model, ErrorCode::InvalidArgument, "no built-in plans for model '{}'",
                  model);
  if (model == "toy" || model == "mlp" || model == "mlp-stacked") {
    const std::string a = model == "toy" ? "in_proj" : "net1";
    const std::string b = model == "toy" ? "out_proj" : "net2";
    const std::string prefix = model == "mlp-stacked" ? "layers.*." : "";
    if (name == "tp") {
      p.styles = {{prefix + a, colwise(R, S(-1), true)}, {prefix + b, rowwise(S(-1), R)}};
      return p;
    }
    if (name == "sp" && model != "mlp-stacked") {
      p.styles = {{a, colwise(S(0), S(-1), true)}, {b, rowwise(S(-1), S(0))}};
      p.model_input = S(0);
      p.model_output = S(0);
      return p;
    }
  }
  if (model == "transformer" && (name == "tp" || name == "sp")) {
    const bool sp = name == "sp";
    p.styles.emplace_back("tok_embeddings", rowwise(R, sp ? S(1) : R));
    p.styles.emplace_back("pos_embeddings", rowwise(R, sp ? S(0) : R));
    if (sp) {
      p.styles.emplace_back("norm", std::make_shared<SequenceParallel>());
      p.styles.emplace_back("layers.*.attention_norm", std::make_shared<SequenceParallel>());
      auto prep = std::make_shared<PrepareModuleInput>();
      prep->input_layout = S(1);
      prep->desired_input_layout = R;
      p.styles.emplace_back("layers.*.attention", prep);
    }
    for (const char* w : {"wq", "wk", "wv"}) {
      p.styles.emplace_back(std::string("layers.*.attention.") + w, colwise(R, S(-1), false));
    }
    p.styles.emplace_back("layers.*.attention.wo", rowwise(S(-1), sp ? S(1) : R));
    if (sp) p.styles.emplace_back("layers.*.ffn_norm", std::make_shared<SequenceParallel>());
    p.styles.emplace_back("layers.*.feed_forward.w1", colwise(sp ? S(1) : R, S(-1), true));
    p.styles.emplace_back("layers.*.feed_forward.w2", rowwise(S(-1), sp ? S(1) : R));
    p.styles.emplace_back("output", colwise(sp ? S(1) : R, R, true));
    return p;
  }
  if (model == "transformer" && (name == "ulysses" || name == "ring" || name == "rsa")) {
    ContextParallel cp;
    cp.family = name;
    p.context_parallel = cp;
    p.model_input = S(1);
    return p;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("model '{}' has no built-in plan '{}'{} (built-in: {}; or give a JSON "
                          "plan file)",
                          model, name, did_you_mean(name, builtin_plan_names(model)),
                          fmt::join(builtin_plan_names(model), ", ")));
}

Plan resolve_plan(const std::string& model, const std::string& plan_or_file) {
  if (names_a_file(plan_or_file)) return load_plan_file(plan_or_file);
  return builtin_plan(model, plan_or_file);
}

}  // namespace commtrace
