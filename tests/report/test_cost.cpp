// The cost model: α–β times against the formulas computed by hand, the algorithm chosen, groups
// that span nodes priced by the slower link, topology files, and the estimates in the reports.
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "parallel/run/runner.h"
#include "report/advise.h"
#include "report/cost.h"
#include "report/diff.h"
#include "report/tree.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using namespace commtrace::testing;

TEST_CASE("cost: α–β times by hand on the h100 preset", "[report][cost]") {
  const Topology h = load_topology("h100");
  REQUIRE(h.gpus_per_node == 8);
  const double us = 1e-6, nv = 450e9, ib = 50e9;
  // 400 B all_reduce on 4 ranks: latency-bound, the tree wins.
  //   ring: 6.6 + 2·3·0.6 µs + 2·3/4 · 400 B / 450 GB/s;  tree: 6.8 + 2·2·0.6 µs + 2 · 400 B / β
  CostEstimate e = estimate_collective(Collective::AllReduce, 400, 4, false, h);
  CHECK(std::string(e.algorithm) == "tree");
  CHECK(e.seconds == Approx(6.8 * us + 4 * 0.6 * us + 2 * 400 / nv).epsilon(1e-12));
  // 64 MiB on 8 ranks: bandwidth-bound, the ring wins: 6.6 + 14·0.6 µs + 1.75 · S / β.
  const double s = 64.0 * 1024 * 1024;
  e = estimate_collective(Collective::AllReduce, std::uint64_t(s), 8, false, h);
  CHECK(std::string(e.algorithm) == "ring");
  CHECK(e.seconds == Approx(6.6 * us + 14 * 0.6 * us + 1.75 * s / nv).epsilon(1e-12));
  // all_gather of S total on 8 ranks, spanning nodes: InfiniBand's α and β.
  e = estimate_collective(Collective::AllGather, std::uint64_t(s), 8, true, h);
  CHECK(e.spans_nodes);
  CHECK(e.seconds == Approx(6.6 * us + 7 * 2.7 * us + 7.0 / 8 * s / ib).epsilon(1e-12));
  e = estimate_collective(Collective::Send, 1000, 2, false, h);
  CHECK(e.seconds == Approx(6.6 * us + 0.6 * us + 1000 / nv).epsilon(1e-12));
  CHECK(estimate_collective(Collective::AllReduce, 1 << 20, 1, false, h).seconds == 0);
}

TEST_CASE("cost: which groups span nodes, from the run's mesh", "[report][cost]") {
  const Topology h = load_topology("h100");  // 8 GPUs per node
  Trace t;
  t.metadata["mesh"] = "DeviceMesh((2, 8), 'cpu', stride=(8, 1))";  // dp × tp, tp inner
  t.rank = 3;
  Record r;
  r.kind = EventKind::Collective;
  r.collective.op = Collective::AllReduce;
  r.collective.bytes = 1 << 20;
  r.collective.group = t.pools.intern("tp");
  r.collective.group_size = 8;
  CHECK_FALSE(TraceCost(t, h).of(r).spans_nodes);  // ranks 0..7: one node
  r.collective.group = t.pools.intern("dp");
  r.collective.group_size = 2;
  CHECK(TraceCost(t, h).of(r).spans_nodes);  // ranks 3 and 11
  t.metadata["mesh"] = "DeviceMesh((16,), 'cpu', stride=(1,))";
  r.collective.group = t.pools.intern("tp");
  r.collective.group_size = 16;
  CHECK(TraceCost(t, h).of(r).spans_nodes);
  t.metadata.erase("mesh");  // no mesh: n consecutive ranks
  r.collective.group_size = 4;
  CHECK_FALSE(TraceCost(t, h).of(r).spans_nodes);
  CHECK(TraceCost(t, load_topology("ib")).of(r).spans_nodes);
}

TEST_CASE("cost: topology files and names", "[report][cost]") {
  const Topology t = topology_from_json(
      R"({"schema": "commtrace.topology", "version": "1.0", "name": "a100", "gpus_per_node": 8,
          "intra": {"name": "NVLink3", "latency_us": 0.7, "bandwidth_GBps": 300},
          "inter": {"latency_us": 3, "bandwidth_GBps": 25},
          "base_latency_us": {"ring": 6, "tree": 7}})",
      "a100.json");
  CHECK(t.name == "a100");
  CHECK(t.intra.bandwidth_Bps == 300e9);
  CHECK(t.base_tree_s == Approx(7e-6));
  auto error_of = [](const std::string& text) -> std::string {
    try {
      (void)topology_from_json(text, "t.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(error_of(R"({"schema": "commtrace.topology", "version": "1.0", "name": "x",
                     "gpus_per_node": 8, "intra": {"latency_us": 1, "bandwidth_GBps": 0},
                     "inter": {"latency_us": 1, "bandwidth_GBps": 1}})") ==
        "t.json: intra.bandwidth_GBps: the bandwidth must be positive");
  CHECK(contains(error_of(R"({"schema": "commtrace.topology", "version": "1.0", "name": "x"})"),
                 "missing key 'gpus_per_node'"));
  try {
    (void)load_topology("nvlnk");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "unknown topology 'nvlnk' (presets: h100, h200, pcie, ib; or a "
          "topology JSON file)");
  }
}

TEST_CASE("cost: estimates per collective, module, phase and iteration", "[report][cost]") {
  TraceOptions o;
  o.cfg.model = "toy";
  o.cfg.world_size = 4;
  const Trace t = trace_run(o).at(0);  // one 400 B all_reduce on 4 ranks, in ToyModel.out_proj
  const TraceCost cost(t, load_topology("h100"));
  const std::string s = render_summary(t, &cost);
  INFO(s);
  CHECK(contains(s, "est. time"));
  CHECK(contains(s,
                 "estimated on h100 (8 H100/H200 SXM GPUs per node on NVLink4 and NVSwitch; "
                 "NDR InfiniBand between nodes): forward 9.2 us; iteration 9.2 us"));
  const std::string tree = render_tree(t, TreeOptions{0, false, false, &cost});
  CHECK(contains(tree, "    ToyModel.out_proj  (Linear)\n      forward  (est. 9.2 us)"));
  o.cfg.plan = "sp";
  const Trace sp = trace_run(o).at(0);
  const Topology h = load_topology("h100");
  DiffOptions d;
  d.topology = &h;
  d.max_depth = 0;
  const std::string diff = render_diff(diff_traces(t, sp, d));
  INFO(diff);
  CHECK(contains(diff, "estimated time per iteration on h100: forward 9.2 → "));
}

TEST_CASE("advise: plans ranked by estimated time and by peak memory", "[report][cost]") {
  TraceOptions o;
  o.cfg.model = "transformer";
  o.cfg.world_size = 4;
  o.cfg.backend = "fake";
  o.cfg.module.device = Device::Meta;
  o.ranks = {0, 1, 2, 3};
  std::vector<PlanCandidate> c(3);
  c[0].plan = "sp";
  o.cfg.plan = "sp";
  c[0].traces = trace_run(o);
  c[1].plan = "tp";
  o.cfg.plan = "tp";
  c[1].traces = trace_run(o);
  c[2].plan = "broken.json";
  c[2].error = "pattern 'x' matches no module";
  const Topology h = load_topology("h100");
  const std::vector<PlanAdvice> a = rank_plans(c, h);
  REQUIRE(a.size() == 3);
  // The tiny transformer is latency-bound: TP's 16 calls beat SP's 33; SP saves memory.
  CHECK(a[0].plan == "tp");
  CHECK(a[0].time_rank == 1);
  CHECK(a[0].memory_rank == 2);
  CHECK(a[1].plan == "sp");
  CHECK(a[1].memory_rank == 1);
  CHECK(a[1].collectives == 33);
  CHECK(a[1].comm_s > a[0].comm_s);
  CHECK(a[1].peak_memory < a[0].peak_memory);
  CHECK_FALSE(a[2].applies);
  CHECK(a[2].time_rank == 0);
  const std::string text = render_advice(a, "title");
  CHECK(contains(text, "not applicable:\n  broken.json: pattern 'x' matches no module"));
}
