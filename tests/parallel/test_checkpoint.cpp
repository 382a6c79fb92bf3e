// Activation checkpointing (Module::set_checkpoint): the recomputed forward's collectives in the
// recompute phase, under the modules that issue them, stopped where PyTorch stops (after the last
// op backward keeps); gradients unchanged; the plan's "checkpoint" patterns; the PyTorch dump
// counting them as backward, as CommDebugMode does.
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "parallel/run/runner.h"
#include "report/torch_compat.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;

namespace {

const std::string kCheckpointed =
    std::string(COMMTRACE_SOURCE_DIR) + "/samples/models/transformer_checkpointed.json";

ParallelConfig config(const std::string& model, const std::string& plan, int world) {
  ParallelConfig cfg;
  cfg.model = model;
  cfg.plan = plan;
  cfg.world_size = world;
  return cfg;
}

// (phase, collective, module fqn) -> count, repeats counted.
using Counts = std::map<std::tuple<Phase, std::string, std::string>, int>;
Counts counts_of(const Trace& t) {
  Counts c;
  t.for_each_event([&](const Record& r, std::uint64_t) {
    if (r.kind == EventKind::Collective)
      ++c[{r.phase, std::string(t.name(r)), t.modules[r.module].fqn}];
  });
  return c;
}
int total(const Counts& c, Phase p, const std::string& op) {
  int n = 0;
  for (const auto& [key, count] : c) {
    if (std::get<0>(key) == p && std::get<1>(key) == op) n += count;
  }
  return n;
}

Trace trace_of(const std::string& model, const std::string& plan, int world) {
  TraceOptions o;
  o.cfg = config(model, plan, world);
  return trace_run(o)[0];
}

using testing::TempFile;

}  // namespace

TEST_CASE("checkpointing: gradients are unchanged on every plan and family", "[checkpoint]") {
  const std::string rsa = std::string(COMMTRACE_SOURCE_DIR) + "/samples/plans/rsa_exact.json";
  for (const std::string plan : {"tp", "sp", "ulysses", "ring", rsa.c_str()}) {
    for (int world : {1, 2, 4}) {
      INFO(plan << " at world " << world);
      CHECK(verify(config(kCheckpointed, plan, world)).pass());
    }
  }
  // 8 heads and 16 tokens: every family at world 8; 6 heads and 12 tokens at world 3.
  const TempFile eight("test_checkpoint_8h.json", R"J({"schema": "commtrace.model",
      "version": "1.1", "name": "t8", "base": "transformer", "args": {"n_layers": 2,
      "vocab_size": 32, "max_seq_len": 32, "dim": 64, "n_heads": 8, "batch": 2, "seq_len": 16,
      "checkpoint_activations": true}})J");
  const TempFile six("test_checkpoint_6h.json", R"J({"schema": "commtrace.model",
      "version": "1.1", "name": "t6", "base": "transformer", "args": {"n_layers": 2,
      "vocab_size": 16, "max_seq_len": 12, "dim": 24, "n_heads": 6, "batch": 2, "seq_len": 12,
      "checkpoint_activations": true}})J");
  for (const std::string plan : {"ulysses", "ring", rsa.c_str()}) {
    INFO(plan);
    CHECK(verify(config(eight.path, plan, 8)).pass());
    CHECK(verify(config(six.path, plan, 3)).pass());
  }
  ParallelConfig cfg = config(kCheckpointed, "sp", 8);
  cfg.mesh = {2, 2, 2};
  ContextParallel ring;
  ring.family = "ring";
  cfg.context_parallel = ring;
  CHECK(verify(cfg).pass());
}

TEST_CASE("checkpointing: the recompute stops after the last op backward keeps", "[checkpoint]") {
  for (int world : {2, 4}) {
    INFO("world " << world);
    const Counts plain = counts_of(trace_of("transformer", "tp", world));
    const Counts tp = counts_of(trace_of(kCheckpointed, "tp", world));
    CHECK(total(plain, Phase::Recompute, "all_reduce") == 0);
    // TP, per layer: attention.wo's all_reduce again (its sum feeds ffn_norm, whose input
    // backward keeps); not feed_forward.w2's (only the residual add reads it).
    for (const char* layer : {"0", "1"}) {
      const std::string wo = std::string("Transformer.layers.") + layer + ".attention.wo";
      const std::string w2 = std::string("Transformer.layers.") + layer + ".feed_forward.w2";
      CHECK(tp.count({Phase::Recompute, "all_reduce", wo}) == 1);
      CHECK(tp.at({Phase::Recompute, "all_reduce", wo}) == 1);
      CHECK(tp.count({Phase::Recompute, "all_reduce", w2}) == 0);
    }
    CHECK(total(tp, Phase::Recompute, "all_reduce") == 2);
    // Forward and backward as without checkpointing.
    for (const Phase p : {Phase::Forward, Phase::Backward}) {
      for (const char* op : {"all_reduce", "all_gather"}) {
        CHECK(total(tp, p, op) == total(plain, p, op));
      }
    }
    // SP, per layer: both input all_gathers and wo's reduce_scatter; not w2's.
    const Counts sp = counts_of(trace_of(kCheckpointed, "sp", world));
    CHECK(total(sp, Phase::Recompute, "all_gather") == 4);
    CHECK(total(sp, Phase::Recompute, "reduce_scatter") == 2);
  }
}

TEST_CASE("checkpointing: a plan's checkpoint patterns choose the regions", "[checkpoint]") {
  const TempFile plan("test_checkpoint_plan.json", R"J({"schema": "commtrace.plan",
      "version": "1.3", "checkpoint": ["layers.0"], "plan": {
        "layers.*.attention.wq": {"style": "ColwiseParallel", "use_local_output": false},
        "layers.*.attention.wk": {"style": "ColwiseParallel", "use_local_output": false},
        "layers.*.attention.wv": {"style": "ColwiseParallel", "use_local_output": false},
        "layers.*.attention.wo": {"style": "RowwiseParallel"}}})J");
  const Counts c = counts_of(trace_of("transformer", plan.path, 2));
  CHECK(c.count({Phase::Recompute, "all_reduce", "Transformer.layers.0.attention.wo"}) == 1);
  CHECK(c.count({Phase::Recompute, "all_reduce", "Transformer.layers.1.attention.wo"}) == 0);
  CHECK(verify(config("transformer", plan.path, 2)).pass());

  const TempFile bad("test_checkpoint_bad.json", R"J({"schema": "commtrace.plan",
      "version": "1.3", "checkpoint": ["layers.9"]})J");
  CHECK(testing::contains(testing::error_of([&] { (void)trace_of("transformer", bad.path, 2); }),
                          "checkpoint pattern 'layers.9' matches no module"));
}

TEST_CASE("checkpointing: the PyTorch dump counts the recompute as backward", "[checkpoint]") {
  const Trace t = trace_of(kCheckpointed, "tp", 2);
  const nlohmann::json d = nlohmann::json::parse(torch_json_dump(t, 1));
  // Global: 9 backward all_reduces and the 2 recomputed ones, as CommDebugMode counts them.
  CHECK(d["collectives_backward"] ==
        nlohmann::json::parse(R"([["c10d_functional.all_reduce", 11]])"));
  const nlohmann::json* wo = nullptr;
  std::function<void(const nlohmann::json&)> find = [&](const nlohmann::json& m) {
    if (m["fqn"] == "Transformer.layers.0.attention.wo") wo = &m;
    for (const auto& c : m["children"]) find(c);
  };
  find(d);
  REQUIRE(wo);
  CHECK((*wo)["collectives_backward"] ==
        nlohmann::json::parse(R"([["c10d_functional.all_reduce", 1]])"));
  REQUIRE(!(*wo)["operations_checkpointing"].empty());
  for (const auto& op : (*wo)["operations_checkpointing"]) {
    CHECK(op["is_bw"] == true);
    CHECK(op["is_activation_checkpointing"] == true);
  }
}
