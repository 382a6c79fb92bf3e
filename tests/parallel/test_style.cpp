// Parallel styles, plans and verify: pattern matching and its errors, plan JSON parsing and its
// errors, SequenceParallel's Partial gradients reduced in the optimizer phase, and verify's
// comparison (passing configurations, and a wrong plan reported with its constant factor).
#include <mutex>
#include <string>

#include "parallel/nn/models.h"
#include "parallel/plans/style.h"
#include "parallel/run/runner.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"
#include "tracer/tracer.h"

using namespace commtrace;
using namespace commtrace::testing;

namespace {
template <class F>
std::string error_text(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// parallelize_module on every rank of a 1-D mesh; returns rank 0's error text ("" if none).
std::string parallelize_error(const std::string& model, const Plan& plan, int world = 2) {
  std::string err;
  std::mutex mu;
  launch(world, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{world});
    auto m = find_model(model).build(0, {});
    const std::string e = error_text([&] { parallelize_module(*m, mesh, plan); });
    std::lock_guard<std::mutex> lock(mu);
    if (ctx.rank() == 0) err = e;
  });
  return err;
}
}  // namespace

TEST_CASE("'*' matches one path segment", "[style]") {
  auto m = find_model("transformer").build(0, {});
  REQUIRE(match_modules(*m, "layers.*.attention.wq") ==
          std::vector<std::string>{"layers.0.attention.wq", "layers.1.attention.wq"});
  REQUIRE(match_modules(*m, "layers.*.wq").empty());
  REQUIRE(match_modules(*m, "*") == std::vector<std::string>{"tok_embeddings", "pos_embeddings",
                                                             "dropout", "layers", "norm",
                                                             "output"});
  REQUIRE(match_modules(*m, "output") == std::vector<std::string>{"output"});
}

TEST_CASE("plans that do not fit the model are errors naming the pattern", "[style]") {
  Plan missing = builtin_plan("toy", "tp");
  missing.styles.emplace_back("decoder", std::make_shared<ColwiseParallel>());
  const std::string e1 = parallelize_error("toy", missing);
  REQUIRE(contains(e1, "pattern 'decoder' matches no module"));

  Plan wrong_type;
  wrong_type.name = "bad";
  wrong_type.styles.emplace_back("relu", std::make_shared<ColwiseParallel>());
  const std::string e2 = parallelize_error("toy", wrong_type);
  REQUIRE(contains(e2, "pattern 'relu'"));
  REQUIRE(contains(e2, "'ToyModel.relu' (ReLU): only Linear and Embedding"));

  REQUIRE(contains(error_text([] { builtin_plan("mlp-stacked", "sp"); }), "no built-in plan 'sp'"));
  REQUIRE(contains(error_text([] { builtin_plan("resnet", "tp"); }), "no built-in plans"));
}

// The transformer ties output.weight to tok_embeddings.weight. Its TP plan distributes both
// alike and keeps them tied; a plan that distributes only output unties them, as PyTorch does,
// and says so.
TEST_CASE("a plan that unties a tied weight says so", "[style]") {
  auto untied_by = [](const Plan& plan) {
    std::vector<std::string> notes;
    std::mutex mu;
    launch(2, [&](RankContext& ctx) {
      auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{2});
      auto m = find_model("transformer").build(0, {});
      auto mine = parallelize_module(*m, mesh, plan);
      std::lock_guard<std::mutex> lock(mu);
      if (ctx.rank() == 0) notes = mine;
    });
    return notes;
  };
  REQUIRE(untied_by(builtin_plan("transformer", "tp")).empty());
  Plan only_output;
  only_output.name = "only-output";
  only_output.styles.emplace_back("output", std::make_shared<ColwiseParallel>());
  const auto notes = untied_by(only_output);
  REQUIRE(notes.size() == 1);
  REQUIRE(contains(notes[0],
                   "unties Transformer.tok_embeddings.weight from "
                   "Transformer.output.weight"));
  REQUIRE(contains(notes[0], "distributed as (Shard(dim=0),)"));
}

TEST_CASE("plan JSON: schema, styles, layouts and errors", "[style]") {
  const Plan p = plan_from_json_text(R"j({
    "schema": "commtrace.plan", "version": "1.0", "name": "toy-sp",
    "model_input": "Shard(0)", "model_output": "Shard(0)",
    "plan": {
      "in_proj": {"style": "ColwiseParallel", "input_layouts": "Shard(0)"},
      "out_proj": {"style": "RowwiseParallel", "output_layouts": ["Shard(0)"]}
    }})j",
                                     "toy-sp.json");
  REQUIRE(p.name == "toy-sp");
  REQUIRE(p.styles.size() == 2);
  REQUIRE(p.styles[0].first == "in_proj");
  REQUIRE(p.styles[0].second->str() == "ColwiseParallel(input_layouts=Shard(dim=0))");
  REQUIRE(p.styles[1].second->str() == "RowwiseParallel(output_layouts=Shard(dim=0))");
  REQUIRE(p.model_input == Placement::shard(0));

  auto err = [](const std::string& text) {
    return error_text([&] { plan_from_json_text(text, "p.json"); });
  };
  const std::string head = R"j("schema": "commtrace.plan", "version": "1.0", )j";
  REQUIRE(contains(err("{"), "p.json: not valid JSON"));
  REQUIRE(contains(err(R"j({"schema": "x", "version": "1.0", "plan": {}})j"), "schema"));
  REQUIRE(contains(err(R"j({"schema": "commtrace.plan", "version": "2.0", "plan": {"a": 1}})j"),
                   "plan version 2.0 is not supported"));
  REQUIRE(contains(err(R"j({"schema": "commtrace.plan", "version": "1.banana", "plan": {}})j"),
                   "version '1.banana' is not of the form <major>.<minor>"));
  REQUIRE(contains(err("{" + head + R"j("name": 7, "plan": {"a": {"style": "ColwiseParallel"}}})j"),
                   "p.json: name: expected a string, got number"));
  REQUIRE(contains(err("{" + head + R"j("plan": {"a": {"style": "Diagonal"}}})j"),
                   "unknown style \"Diagonal\""));
  REQUIRE(contains(err("{" + head + R"j("plan": {"a": {"style": "ColwiseParallel", "bias": 1}}})j"),
                   "p.json: plan.a: unknown key 'bias'"));
  REQUIRE(
      contains(err("{" + head +
                   R"j("plan": {"a": {"style": "ColwiseParallel", "input_layouts": "Z(1)"}}})j"),
               "plan.a.input_layouts: unknown placement 'Z(1)'"));
  REQUIRE(contains(err("{" + head + R"j("plan": {}})j"), "p.json: plan: no styles"));
  REQUIRE(contains(error_text([] { load_plan_file("/nonexistent/plan.json"); }),
                   "cannot open plan file"));
}

TEST_CASE("placements parse in short and PyTorch forms", "[style]") {
  REQUIRE(parse_placement("S(0)") == Placement::shard(0));
  REQUIRE(parse_placement("Shard(dim=-1)") == Placement::shard(-1));
  REQUIRE(parse_placement("Replicate()") == Placement::replicate());
  REQUIRE(parse_placement("Partial(avg)") == Placement::partial(ReduceOp::Avg));
  REQUIRE(placements_str(Placements{Placement::shard(1), Placement::replicate()}) ==
          "(Shard(dim=1), Replicate())");
  REQUIRE_THROWS_AS(parse_placement("Shard(x)"), Error);
  REQUIRE(chunk_range(8, 3, 2).size == 2);
  REQUIRE(chunk_range(20, 8, 7).size == 0);
}

TEST_CASE("SequenceParallel norms: Partial gradients reduced in the optimizer phase",
          "[style][optimizer]") {
  TraceOptions o;
  o.cfg.model = "transformer";
  o.cfg.plan = "sp";
  o.cfg.world_size = 2;
  const Trace t = trace_run(o).at(0);
  int optimizer_all_reduce = 0, other_optimizer = 0;
  std::string reason;
  for (const Record& r : t.records) {
    if (r.phase != Phase::Optimizer || r.kind != EventKind::Collective) continue;
    if (r.collective.op == Collective::AllReduce) {
      ++optimizer_all_reduce;
      reason = t.str(r.reason);
      REQUIRE(placements_str(t.placements(r.collective.before)) == "(Partial(sum),)");
      REQUIRE(placements_str(t.placements(r.collective.after)) == "(Replicate(),)");
    } else {
      ++other_optimizer;
    }
  }
  // 2 layers × (attention_norm, ffn_norm) × (weight, bias) + the final norm's 2.
  REQUIRE(optimizer_all_reduce == 10);
  REQUIRE(other_optimizer == 0);
  REQUIRE(contains(reason, "optimizer"));
}

TEST_CASE("verify passes on uneven shards, input gradients and a dp × tp mesh", "[verify]") {
  struct Case {
    const char* model;
    const char* plan;
    int world;
    std::vector<int> mesh;
    bool input_grad;
  };
  for (const Case& c : std::vector<Case>{{"toy", "sp", 3, {}, true},
                                         {"mlp", "tp", 4, {2, 2}, true},
                                         {"transformer", "sp", 3, {}, false},
                                         {"transformer", "tp", 4, {2, 2}, false}}) {
    ParallelConfig cfg;
    cfg.model = c.model;
    cfg.plan = c.plan;
    cfg.world_size = c.world;
    cfg.mesh = c.mesh;
    cfg.input_requires_grad = c.input_grad;
    const VerifyReport r = verify(cfg);
    INFO(c.model << " " << c.plan << " world " << c.world);
    for (const TensorCheck& t : r.checks) {
      INFO(t.name << " " << t.max_rel_err << " " << t.factor);
      REQUIRE(t.pass);
    }
    REQUIRE(r.pass());
  }
}

TEST_CASE("verify's default tolerance follows the dtype, and in f32 the world", "[verify]") {
  REQUIRE(default_tolerance(DType::F32, false) == 1e-5);
  REQUIRE(default_tolerance(DType::F64, false, 4096) == 1e-5);
  REQUIRE(default_tolerance(DType::BF16, false, 4096) == 5e-2);
  REQUIRE(default_tolerance(DType::F32, true, 4) == 1e-2);
  // A rank-ordered f32 sum of n partials: the bound passes 1e-5 at 84 ranks.
  REQUIRE(default_tolerance(DType::F32, false, 83) == 1e-5);
  REQUIRE(default_tolerance(DType::F32, false, 84) == 84 * 0x1p-23);
  REQUIRE(default_tolerance(DType::F32, false, 4096) == 4096 * 0x1p-23);
}

TEST_CASE("verify reports a wrong plan with the constant factor of its gradients", "[verify]") {
  // Declares the TP output (replicated) as sharded: the loss counts every copy once per rank,
  // so every parameter gradient comes out 1/world of the reference.
  const testing::TempFile plan(
      "verify_wrong_plan.json",
      R"j({"schema": "commtrace.plan", "version": "1.0", "model_output": "Shard(0)",
      "plan": {"in_proj": {"style": "ColwiseParallel"}, "out_proj": {"style": "RowwiseParallel"}}})j");
  const std::string& path = plan.path;
  ParallelConfig cfg;
  cfg.model = "toy";
  cfg.plan = path;
  cfg.world_size = 4;
  const VerifyReport r = verify(cfg);
  REQUIRE_FALSE(r.pass());
  bool saw_factor = false;
  for (const TensorCheck& t : r.checks) {
    if (t.name == "in_proj.weight.grad") {
      REQUIRE_FALSE(t.pass);
      REQUIRE(t.factor == "×1/4 (1/world size)");
      saw_factor = true;
    }
  }
  REQUIRE(saw_factor);
}
