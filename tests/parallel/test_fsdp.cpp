// FSDP2-style sharding on dp (parallel/plans/fsdp.h): the collectives per unit and phase, what
// reshard_after_forward changes, training that follows DDP's, verify, and its errors.
#include <map>
#include <string>
#include <tuple>

#include "parallel/run/runner.h"
#include "tests/catch_compat.h"

using namespace commtrace;

namespace {

ParallelConfig llama_2x2() {
  ParallelConfig cfg;
  cfg.model = std::string(COMMTRACE_SOURCE_DIR) + "/samples/models/llama-tiny.json";
  cfg.plan = "torchtitan";
  cfg.world_size = 4;
  cfg.mesh = {2, 2};
  cfg.data_parallel = "fsdp";
  return cfg;
}

// (phase, op, group, module fqn) -> count, over the trace's records (repeats counted).
using Counts = std::map<std::tuple<Phase, std::string, std::string, std::string>, int>;
Counts dp_collectives(const Trace& t) {
  Counts c;
  auto add = [&](const Record& r, std::uint64_t n) {
    if (r.kind != EventKind::Collective || t.str(r.collective.group) != "dp") return;
    c[{r.phase, std::string(t.str(r.name)), "dp", t.modules[r.module].fqn}] += int(n);
  };
  if (t.blocks.empty()) {
    for (const Record& r : t.records) add(r, 1);
  }
  for (const Block& b : t.blocks) {
    for (std::uint32_t i = b.first; i < b.first + b.count; ++i) add(t.records[i], b.repeat);
  }
  return c;
}

int count(const Counts& c, Phase ph, const std::string& op, const std::string& fqn) {
  auto it = c.find({ph, op, "dp", fqn});
  return it == c.end() ? 0 : it->second;
}

int total(const Counts& c, Phase ph, const std::string& op) {
  int n = 0;
  for (const auto& [k, v] : c) {
    if (std::get<0>(k) == ph && std::get<1>(k) == op) n += v;
  }
  return n;
}

}  // namespace

TEST_CASE("fsdp: one all_gather per unit before forward and backward, one reduce_scatter after",
          "[fsdp]") {
  TraceOptions o;
  o.cfg = llama_2x2();  // 2 layers: units layers.0, layers.1 and the root
  o.iters = 2;
  const Counts c = dp_collectives(trace_run(o)[0]);
  const std::string root = "Transformer";
  // Per iteration: each unit gathered before its forward...
  for (const std::string& u : {root, root + ".layers.0", root + ".layers.1"}) {
    REQUIRE(count(c, Phase::Forward, "all_gather", u) == 2);
  }
  // ...and before its backward, by the unit before it in backward order (prefetch): the root
  // gathers itself and layers.1, layers.1 gathers layers.0.
  REQUIRE(count(c, Phase::Backward, "all_gather", root) == 4);
  REQUIRE(count(c, Phase::Backward, "all_gather", root + ".layers.1") == 2);
  REQUIRE(count(c, Phase::Backward, "all_gather", root + ".layers.0") == 0);
  for (const std::string& u : {root, root + ".layers.0", root + ".layers.1"}) {
    REQUIRE(count(c, Phase::Backward, "reduce_scatter", u) == 2);
  }
  REQUIRE(total(c, Phase::Backward, "all_reduce") == 0);  // no DDP
  REQUIRE(total(c, Phase::Optimizer, "all_gather") + total(c, Phase::Optimizer, "all_reduce") +
              total(c, Phase::Optimizer, "reduce_scatter") ==
          0);
}

TEST_CASE("fsdp: without reshard after forward, backward gathers nothing", "[fsdp]") {
  TraceOptions o;
  o.cfg = llama_2x2();
  o.cfg.reshard_after_forward = false;
  const Trace t = trace_run(o)[0];
  const Counts c = dp_collectives(t);
  REQUIRE(total(c, Phase::Forward, "all_gather") == 3);
  REQUIRE(total(c, Phase::Backward, "all_gather") == 0);
  REQUIRE(total(c, Phase::Backward, "reduce_scatter") == 3);
  REQUIRE(t.metadata.at("data_parallel") == "fsdp (no reshard after forward)");
}

TEST_CASE("fsdp: the all_gather holds every padded chunk of the unit", "[fsdp]") {
  // Pure FSDP (3 × 1) on llama-tiny: a chunk is ceil(rows / 3) rows of each parameter.
  TraceOptions o;
  o.cfg = llama_2x2();
  o.cfg.world_size = 3;
  o.cfg.mesh = {3, 1};
  o.cfg.plan = "tp";
  const Trace t = trace_run(o)[0];
  std::int64_t block = 0;  // layers.0: norms (dim), wq, wk, wv, wo, w1, w3, w2
  const std::int64_t dim = 64, kv = 32, hidden = 96;  // samples/models/llama-tiny.json
  auto chunk = [](std::int64_t rows) { return (rows + 2) / 3; };
  block += 2 * chunk(dim) + chunk(dim) * dim * 2 + 2 * chunk(kv) * dim;
  block += 2 * chunk(hidden) * dim + chunk(dim) * hidden;
  bool seen = false;
  for (const Record& r : t.records) {
    if (r.kind != EventKind::Collective || t.str(r.collective.group) != "dp") continue;
    if (t.modules[r.module].fqn != "Transformer.layers.0" || r.phase != Phase::Forward) continue;
    REQUIRE(t.str(r.name) == "all_gather");
    REQUIRE(r.collective.bytes == std::uint64_t(3 * block * 4));
    seen = true;
  }
  REQUIRE(seen);
}

TEST_CASE("fsdp: training follows DDP's losses", "[fsdp][verify]") {
  for (const char* plan : {"tp", "torchtitan"}) {
    INFO(plan);
    TraceOptions o;
    o.cfg = llama_2x2();
    o.cfg.plan = plan;
    o.iters = 3;
    std::vector<double> fsdp, ddp;
    trace_run(o, &fsdp);
    o.cfg.data_parallel = "ddp";
    trace_run(o, &ddp);
    REQUIRE(fsdp.size() == 3);
    for (std::size_t i = 0; i < fsdp.size(); ++i) {
      REQUIRE(std::abs(fsdp[i] - ddp[i]) <= 1e-5 * std::abs(ddp[i]));
    }
    REQUIRE(fsdp[2] < fsdp[0]);
  }
}

TEST_CASE("fsdp: verify passes, resharded or not", "[fsdp][verify]") {
  for (bool reshard : {true, false}) {
    for (const std::vector<int>& mesh : {std::vector<int>{2, 2}, std::vector<int>{4, 1}}) {
      ParallelConfig cfg = llama_2x2();
      cfg.reshard_after_forward = reshard;
      cfg.mesh = mesh;
      const VerifyReport r = verify(cfg);
      for (const TensorCheck& ch : r.checks) {
        INFO(ch.name << " " << ch.max_rel_err << " " << ch.factor);
        CHECK(ch.pass);
      }
      REQUIRE(r.pass());
    }
  }
}

TEST_CASE("fsdp: errors name the problem", "[fsdp]") {
  auto error_of = [](ParallelConfig cfg) {
    try {
      verify(cfg);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ParallelConfig one_d = llama_2x2();
  one_d.mesh = {};
  REQUIRE(error_of(one_d).find("fsdp shards over the dp dim of a 2-D mesh") != std::string::npos);
  ParallelConfig coalesced = llama_2x2();
  coalesced.model = std::string(COMMTRACE_SOURCE_DIR) + "/samples/models/llama-tiny-megatron.json";
  coalesced.plan = "megatron-sp";
  REQUIRE(error_of(coalesced).find("coalesce_partial_grads") != std::string::npos);
  ParallelConfig unknown = llama_2x2();
  unknown.data_parallel = "zero3";
  REQUIRE(error_of(unknown).find("data parallel 'zero3'") != std::string::npos);
}
