// Plans from JSON files (the schema in README, errors naming the key and the bad value) and the
// built-in plans of the zoo's model families (style.h).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "parallel/plans/style.h"
#include "tracer/json_io.h"

namespace commtrace {

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
  if (megatron) {
    p.requires_model =
        "the megatron plans need fused QKV (a decoder model file with \"qkv\": \"fused\", e.g. "
        "samples/models/llama-tiny-megatron.json)";
  }
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
