// commtrace's own text report: the module tree with per-phase collectives (count, bytes,
// group), the reasons at noise >= 1 or with explain, the ops by noise level, and the
// per-iteration summary with nccl-tests' bus bytes, algbw and busbw.
#include <string>

#include "parallel/run/runner.h"
#include "report/trace_json.h"
#include "report/tree.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using namespace commtrace::testing;

namespace {
Trace toy(const char* plan, int iters = 1) {
  TraceOptions o;
  o.cfg.model = "toy";
  o.cfg.plan = plan;
  o.cfg.world_size = 4;
  o.iters = iters;
  return trace_run(o).at(0);
}
}  // namespace

TEST_CASE("tree: collectives per module and phase, rolled up", "[report][tree]") {
  const std::string t = render_tree(toy("sp"), TreeOptions{});
  REQUIRE(contains(t, "Global\n  forward\n    all_gather      ×1     3.12 KiB  tp(4)\n"));
  REQUIRE(contains(t, "    ToyModel.in_proj  (Linear)\n      forward\n        all_gather"));
  REQUIRE(contains(t, "      backward\n        all_gather      ×1     1.56 KiB  tp(4)"));
  REQUIRE_FALSE(contains(t, "why:"));        // reasons only with explain or noise >= 1
  REQUIRE_FALSE(contains(t, "aten.addmm"));  // ops only at noise >= 1
}

TEST_CASE("tree: explain says why each collective happened", "[report][tree]") {
  const std::string t = render_tree(toy("sp"), TreeOptions{0, true, false});
  REQUIRE(contains(t,
                   "why: ToyModel.in_proj input (ColwiseParallel input_layouts): "
                   "(Shard(dim=0),) → (Replicate(),)"));
  REQUIRE(contains(t,
                   "why: ToyModel.out_proj output (RowwiseParallel output_layouts): "
                   "(Partial(sum),) → (Shard(dim=0),)"));
  REQUIRE(contains(t,
                   "why: backward of ToyModel.out_proj output (RowwiseParallel "
                   "output_layouts): (Shard(dim=0),) → (Replicate(),)"));
}

TEST_CASE("tree: noise levels add sharded ops, local ops, trivial ops", "[report][tree]") {
  const Trace tr = toy("tp");
  const std::string n1 = render_tree(tr, TreeOptions{1, false, false});
  REQUIRE(contains(n1, "param weight: (Shard(dim=0),)"));
  REQUIRE(contains(n1,
                   "aten.addmm.default  [32] (Shard(dim=0),), [20, 10] (Replicate(),), "
                   "[10, 32] (Shard(dim=1),)  DeviceMesh((4,), 'cpu', stride=(1,))"));
  REQUIRE_FALSE(contains(n1, "aten.relu.default"));
  const std::string n2 = render_tree(tr, TreeOptions{2, false, false});
  REQUIRE(contains(n2, "aten.relu.default"));
  REQUIRE_FALSE(contains(n2, "aten.view.default"));
  TraceOptions o;  // the transformer's attention views its projections into heads
  o.cfg.model = "transformer";
  o.cfg.world_size = 2;
  const Trace tt = trace_run(o).at(0);
  REQUIRE_FALSE(contains(render_tree(tt, TreeOptions{2, false, false}), "aten.view.default"));
  REQUIRE(contains(render_tree(tt, TreeOptions{3, false, false}), "aten.view.default"));
}

TEST_CASE("summary: per iteration, bus bytes, time and bandwidth", "[report][tree]") {
  const std::string s = render_summary(toy("tp", 3));
  REQUIRE(contains(s, "per iteration (3 iterations traced, rank 0)"));
  // all_reduce's bus bytes: 400 B × 2(n-1)/n = 600 B at n = 4.
  REQUIRE(contains(s, "forward    all_reduce      tp        4       1        400 B        600 B"));
  REQUIRE(contains(s, "(us)   (GB/s)   (GB/s)"));
  const std::string sp = render_summary(toy("sp"));
  REQUIRE(contains(sp, "forward    all_gather      tp        4       1     3.12 KiB     2.34 KiB"));
  REQUIRE(contains(sp, "total                                        3     6.25 KiB     4.69 KiB"));

  // nccl-tests' arithmetic on known durations: 1 MB in 1 ms is 1 GB/s, busbw 1.5 at n = 4.
  Trace t;
  t.metadata = {{"backend", "threads"}, {"device", "cpu"}};
  Record r;
  r.kind = EventKind::Collective;
  r.name = t.pools.intern("all_reduce");
  r.collective.op = Collective::AllReduce;
  r.collective.group = t.pools.intern("tp");
  r.collective.group_size = 4;
  r.collective.bytes = 1000000;
  r.duration_s = 1e-3;
  t.records.push_back(r);
  const std::string m = render_summary(t);
  INFO(m);
  REQUIRE(contains(m,
                   "forward    all_reduce      tp        4       1      977 KiB     1.43 MiB"
                   "     1000.0     1.00     1.50"));
  // The fake backend moves no data: no times.
  t.metadata["backend"] = "fake";
  const std::string f = render_summary(t);
  REQUIRE(contains(f, "1.43 MiB          -        -        -"));
  REQUIRE(contains(f, "(no times: the fake backend moves no data)"));
}

TEST_CASE("tree and summary of a PyTorch dump: counts, and what the dump lacks", "[report]") {
  const Trace d = load_traces(std::string(COMMTRACE_TEST_DATA_DIR) +
                              "/torch/golden_mlp_tp_comm_mode_log_noise3.json")
                      .at(0);
  const std::string t = render_tree(d, TreeOptions{});
  REQUIRE(contains(t, "Global\n  forward\n    all_reduce      ×1            -\n"));
  const std::string s = render_summary(d);
  REQUIRE(contains(s, "forward    all_reduce      -         ?       1            -            -"));
  REQUIRE(
      contains(s, "(a PyTorch CommDebugMode dump holds counts only: no bytes, groups or times)"));
}
