// A model file's "loss" and "freeze" (parallel/nn/models.h): every loss verifies on every
// family, frozen parameters get no gradient and take their backward collectives with them (the
// counts PyTorch gives, tests/oracle/oracle_diff.sh), and the errors name the file's key.
#include <string>

#include "parallel/run/runner.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;

namespace {

// A model file for the duration of a test; resolve_model caches by path, so names are unique.
struct ModelFile : testing::TempFile {
  ModelFile(const std::string& name, const std::string& body)
      : TempFile("test_model_files_" + name + ".json", body) {}
};

std::string model_json(const std::string& base, const std::string& extra) {
  return fmt::format(
      R"J({{"schema": "commtrace.model", "version": "1.1", "name": "{}-x", "base": "{}"{}}})J",
      base, base, extra);
}

ParallelConfig config(const std::string& model, const std::string& plan, int world,
                      std::vector<int> mesh = {}) {
  ParallelConfig cfg;
  cfg.model = model;
  cfg.plan = plan;
  cfg.world_size = world;
  cfg.mesh = std::move(mesh);
  return cfg;
}

int backward_all_reduces(const Trace& t) {
  int n = 0;
  auto add = [&](const Record& r, std::uint64_t times) {
    if (r.kind == EventKind::Collective && r.phase == Phase::Backward &&
        t.name(r) == "all_reduce") {
      n += int(times);
    }
  };
  if (t.blocks.empty()) {
    for (const Record& r : t.records) add(r, 1);
  }
  for (const Block& b : t.blocks) {
    for (std::uint32_t i = b.first; i < b.first + b.count; ++i) add(t.records[i], b.repeat);
  }
  return n;
}

// A family's options with the parameter reduction that is exact for the loss: the gradient of
// a mean is the average of the sub-sequences' gradients, that of a sum their sum.
ContextParallel exact_cp(const char* family, const std::string& loss) {
  ContextParallel cp;
  cp.family = family;
  cp.divide_by_world_size = false;
  cp.param_grad_reduction = loss == "sum" ? "sum" : "avg";
  return cp;
}

}  // namespace

TEST_CASE("glob patterns: '*' spans dots, '?' one character", "[models][freeze]") {
  CHECK(glob_match("layers.0.*", "layers.0.attention.wq.weight"));
  CHECK(glob_match("*.bias", "layers.1.ffn_norm.bias"));
  CHECK(glob_match("layers.?.attention.w?.weight", "layers.3.attention.wk.weight"));
  CHECK(glob_match("net1.bias", "net1.bias"));
  CHECK(glob_match("*", "x"));
  CHECK_FALSE(glob_match("layers.0.*", "layers.10.attention.wq.weight"));
  CHECK_FALSE(glob_match("net1.bias", "net1.bias2"));
  CHECK_FALSE(glob_match("?", ""));
  CHECK_FALSE(glob_match("a*b", "acbd"));
}

TEST_CASE("every loss verifies on every family", "[models][loss]") {
  for (const char* loss : {"mse", "sum", "cross_entropy"}) {
    const ModelFile mlp(std::string("mlp_") + loss,
                        model_json("mlp", fmt::format(R"(, "loss": "{}")", loss)));
    const ModelFile tf(std::string("tf_") + loss,
                       model_json("transformer", fmt::format(R"(, "loss": "{}")", loss)));
    INFO("loss " << loss);
    CHECK(resolve_model(mlp.path).loss_name == loss);
    for (const char* plan : {"tp", "sp"}) {
      INFO(plan);
      ParallelConfig cfg = config(mlp.path, plan, 2);
      cfg.input_requires_grad = true;
      CHECK(verify(cfg).pass());
      CHECK(verify(config(tf.path, plan, 2)).pass());
    }
    // DDP averages the replicas' gradients: the reference divides a sum loss by dp.
    CHECK(verify(config(mlp.path, "tp", 4, {2, 2})).pass());
    CHECK(verify(config(tf.path, "tp", 4, {2, 2})).pass());
    for (const char* family : {"ulysses", "ring", "rsa"}) {
      INFO(family);
      ParallelConfig cfg = config(tf.path, family, 4, {2, 2});
      cfg.context_parallel = exact_cp(family, loss);
      CHECK(verify(cfg).pass());
    }
  }
}

TEST_CASE("an mse target is cut like vocab-sharded logits", "[models][loss]") {
  const ModelFile mse("tf_mse_untied", model_json("transformer", R"(, "loss": "mse",
                                                   "args": {"weight_tying": false})"));
  const ModelFile plan("vocab_sharded_plan", R"J({"schema": "commtrace.plan", "version": "1.0",
      "model_output": "Shard(-1)",
      "plan": {"output": {"style": "ColwiseParallel", "use_local_output": true}}})J");
  for (int world : {2, 4}) {
    INFO("world " << world);
    CHECK(verify(config(mse.path, plan.path, world)).pass());
  }
}

TEST_CASE("a sum loss with averaged context-parallel gradients is caught with its factor",
          "[models][loss]") {
  const ModelFile tf("tf_sum_cp", model_json("transformer", R"(, "loss": "sum")"));
  ParallelConfig cfg = config(tf.path, "ulysses", 2);
  cfg.context_parallel = exact_cp("ulysses", "mean");  // averaged: half the sum's gradient
  const VerifyReport r = verify(cfg);
  REQUIRE_FALSE(r.pass());
  int halved = 0;
  for (const TensorCheck& c : r.checks) halved += c.factor.rfind("×1/2 (1/", 0) == 0;
  CHECK(halved > 10);
}

TEST_CASE("frozen parameters get no gradient and drop their backward collectives",
          "[models][freeze]") {
  const ModelFile frozen("tf_frozen", model_json("transformer", R"(, "loss": "sum", "freeze":
                                    ["tok_embeddings.*", "pos_embeddings.*", "layers.0.*"])"));
  const ModelEntry& e = resolve_model(frozen.path);
  int n_frozen = 0, n_trained = 0;
  for (const auto& [name, p] : e.build(0, {})->named_parameters()) {
    const bool expect_frozen =
        name.rfind("layers.0.", 0) == 0 || name.rfind("tok_", 0) == 0 || name.rfind("pos_", 0) == 0;
    INFO(name);
    CHECK(p.requires_grad() == !expect_frozen);
    (expect_frozen ? n_frozen : n_trained)++;
  }
  CHECK(n_frozen > 0);
  CHECK(n_trained > 0);

  for (const char* plan : {"tp", "sp"}) {
    INFO(plan);
    const VerifyReport r = verify(config(frozen.path, plan, 2));
    CHECK(r.pass());
    CHECK(r.checks.size() == std::size_t(n_trained) + 1);  // the output and the trained ones
    CHECK(r.note.find("not compared") != std::string::npos);
  }
  CHECK(verify(config(frozen.path, "tp", 4, {2, 2})).pass());

  // TP at world 4: 9 backward all_reduces, 4 of them layer 0's (PyTorch gives 5 frozen).
  TraceOptions o;
  o.cfg = config("transformer", "tp", 4);
  CHECK(backward_all_reduces(trace_run(o)[0]) == 9);
  o.cfg = config(frozen.path, "tp", 4);
  CHECK(backward_all_reduces(trace_run(o)[0]) == 5);
}

TEST_CASE("bad loss and freeze keys are errors naming them", "[models][loss][freeze]") {
  using testing::error_of;
  auto file_error = [&](const std::string& name, const std::string& extra) {
    const ModelFile f(name, model_json("mlp", extra));
    return error_of([&] { (void)resolve_model(f.path); });
  };
  using testing::contains;
  CHECK(contains(file_error("bad_loss", R"(, "loss": "l1")"),
                 "loss: unknown loss 'l1' (known: mse, sum, cross_entropy)"));
  CHECK(contains(file_error("bad_glob", R"(, "freeze": ["net1.*", "net3.*"])"),
                 "freeze[1]: 'net3.*' matches no parameter of mlp-x"));
  CHECK(contains(file_error("bad_freeze", R"(, "freeze": "net1.*")"), "freeze"));

  const ModelFile frozen("frozen_fsdp", model_json("transformer", R"(, "freeze": ["layers.0.*"])"));
  ParallelConfig cfg = config(frozen.path, "tp", 4, {2, 2});
  cfg.data_parallel = "fsdp";
  CHECK(contains(error_of([&] { (void)verify(cfg); }), "run with ddp on dp, not fsdp"));
  const ModelFile mse("tf_mse_lp", model_json("transformer", R"(, "loss": "mse")"));
  const std::string lp =
      std::string(COMMTRACE_SOURCE_DIR) + "/samples/plans/transformer_loss_parallel.json";
  CHECK(contains(error_of([&] { (void)verify(config(mse.path, lp, 2)); }),
                 "loss parallel needs a cross-entropy model"));
}
