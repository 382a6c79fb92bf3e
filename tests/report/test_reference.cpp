// Our counts against PyTorch's: per module and phase for toy and mlp, tp and sp, with and
// without an input that requires grad (shared/reference/torch, copied to data/torch), and per
// phase for the transformer's tp and sp plans (and per module for tp) at world 2 and 4, as the
// oracle measured them (tests/oracle/measured). PyTorch files optimizer collectives under a
// module's forward; commtrace has an optimizer phase, so those are compared apart.
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/run/runner.h"
#include "report/counts.h"
#include "tests/catch_compat.h"
#include "tracer/collectives.h"

using namespace commtrace;
using json = nlohmann::json;

namespace {

using Counts = std::map<std::string, int>;  // canonical collective -> count

json load(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

Counts canonical(const json& torch_counts) {
  Counts c;
  for (const auto& [key, n] : torch_counts.items()) {
    if (n.get<int>() != 0) c[collective_name(parse_collective(key))] += n.get<int>();
  }
  return c;
}

Counts ours(const CountTree& tree, const std::string& fqn, Phase phase) {
  Counts c;
  const ModuleCounts* m = tree.find(fqn);
  if (!m) return c;
  for (const GroupStat& g : m->phases[std::size_t(phase)]) {
    if (g.stat.count) c[collective_name(g.op)] += int(g.stat.count);
  }
  return c;
}

Trace traced(const std::string& model, const std::string& plan, int world, bool input_grad) {
  TraceOptions o;
  o.cfg.model = model;
  o.cfg.plan = plan;
  o.cfg.world_size = world;
  o.cfg.input_requires_grad = input_grad;
  return trace_run(o).at(0);
}

}  // namespace

TEST_CASE("toy and mlp: counts per module and phase equal PyTorch's", "[report][reference]") {
  struct Case {
    const char* file;
    const char* model;
    const char* plan;
    bool input_grad;
  };
  for (const Case& c :
       {Case{"toy_tp_example.json", "toy", "tp", false},
        Case{"toy_sp_example.json", "toy", "sp", false},
        Case{"toy_tp_input_requires_grad.json", "toy", "tp", true},
        Case{"toy_sp_input_requires_grad.json", "toy", "sp", true},
        Case{"mlp_tp.json", "mlp", "tp", false}, Case{"mlp_sp.json", "mlp", "sp", false}}) {
    INFO(c.file);
    const json ref = load(std::string(COMMTRACE_TEST_DATA_DIR) + "/torch/" + c.file);
    const CountTree tree = collective_counts(traced(c.model, c.plan, 4, c.input_grad));
    const json& modules = ref["measured"]["comm_module_counts"];
    // Every module PyTorch counted, and every module of ours, agree phase by phase.
    for (const auto& [fqn, phases] : modules.items()) {
      INFO(fqn);
      REQUIRE(ours(tree, fqn, Phase::Forward) == canonical(phases["forward"]));
      REQUIRE(ours(tree, fqn, Phase::Backward) == canonical(phases["backward"]));
    }
    for (const ModuleCounts& m : tree.modules) {
      if (modules.contains(m.fqn)) continue;
      INFO(m.fqn << " has collectives PyTorch does not report");
      REQUIRE(ours(tree, m.fqn, Phase::Forward).empty());
      REQUIRE(ours(tree, m.fqn, Phase::Backward).empty());
    }
    REQUIRE(ours(tree, "Global", Phase::Optimizer).empty());  // PyTorch: optimizer_step {}
  }
}

TEST_CASE("transformer: per-phase counts equal PyTorch's, tp and sp, world 2 and 4",
          "[report][reference]") {
  for (const char* plan : {"tp", "sp"}) {
    for (int world : {2, 4}) {
      INFO(plan << " world " << world);
      const json ref =
          load(fmt::format("{}/transformer_{}_w{}.counts.json", COMMTRACE_ORACLE_DIR, plan, world));
      const CountTree tree = collective_counts(traced("transformer", plan, world, false));
      REQUIRE(ours(tree, "Global", Phase::Forward) == canonical(ref["phase_totals"]["forward"]));
      REQUIRE(ours(tree, "Global", Phase::Backward) == canonical(ref["phase_totals"]["backward"]));
      if (std::string(plan) == "tp") {
        // TP attributes every collective as PyTorch does, module by module.
        for (const auto& [fqn, phases] : ref["per_module"].items()) {
          INFO(fqn);
          REQUIRE(ours(tree, fqn, Phase::Forward) == canonical(phases["forward"]));
          REQUIRE(ours(tree, fqn, Phase::Backward) == canonical(phases["backward"]));
        }
      } else {
        // SP's Partial norm gradients: PyTorch all-reduces each on every read inside foreach
        // AdamW (30); commtrace reduces each of the 10 once, in its optimizer phase.
        REQUIRE(ours(tree, "Global", Phase::Optimizer) == Counts{{"all_reduce", 10}});
        REQUIRE(canonical(ref["phase_totals"]["optimizer"]) == Counts{{"all_reduce", 30}});
      }
    }
  }
}
