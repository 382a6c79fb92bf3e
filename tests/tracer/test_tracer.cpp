// The tracer core on its own: the module tree, phases, scopes and activation.
#include "tests/catch_compat.h"
#include "tracer/tracer.h"

using namespace commtrace;

namespace {
OpRecord op(const char* name) {
  OpRecord r;
  r.name = name;
  return r;
}
}  // namespace

TEST_CASE("module scopes build the FQN tree under Global", "[tracer]") {
  Tracer tr(3);
  {
    TracerActivation on(tr);
    ModuleScope root("M", "MLPModule");
    {
      ModuleScope a("M.net1", "Linear");
      Tracer::current()->record(op("addmm"));
    }
    {
      ModuleScope b("M.net2", "Linear");
      Tracer::current()->record(op("addmm"));
    }
    {
      ModuleScope a_again("M.net1", "Linear");  // reuse: the same node, not a new one
      Tracer::current()->record(op("mm"));
    }
  }
  const Trace& t = tr.trace();
  REQUIRE(t.rank == 3);
  REQUIRE(t.modules.size() == 4);
  REQUIRE(t.modules[0].fqn == "Global");
  REQUIRE(t.modules[1].fqn == "M");
  REQUIRE(t.modules[1].depth == 1);
  REQUIRE(t.modules[1].children == std::vector<int>{2, 3});
  REQUIRE(t.modules[2].type == "Linear");
  REQUIRE(t.records.size() == 3);
  REQUIRE(t.records[0].module == 2);
  REQUIRE(t.records[1].module == 3);
  REQUIRE(t.records[2].module == 2);
  REQUIRE(t.records[2].index == 2);
  REQUIRE(t.is_within(2, 1));
  REQUIRE(t.is_within(2, 0));
  REQUIRE_FALSE(t.is_within(2, 3));
  REQUIRE(t.find_module("M.net2") == 3);
  REQUIRE(t.find_module("M.nope") == -1);
}

TEST_CASE("phases and attribution scopes stamp records", "[tracer]") {
  Tracer tr;
  TracerActivation on(tr);
  int net = -1;
  {
    ModuleScope m("M", "T");
    net = m.module();
  }
  {
    PhaseScope p(Phase::Optimizer);
    tr.record(op("step"));
  }
  REQUIRE(tr.phase() == Phase::Forward);
  {
    AttributionScope a(&tr, net, Phase::Backward);
    tr.record(op("mm"));
  }
  {
    Tracer other;
    AttributionScope foreign(&other, net, Phase::Backward);  // another tracer's module: Global
    tr.record(op("add"));
  }
  const auto& r = tr.trace().records;
  REQUIRE(r[0].phase == Phase::Optimizer);
  REQUIRE(r[0].module == 0);
  REQUIRE(r[1].phase == Phase::Backward);
  REQUIRE(r[1].module == net);
  REQUIRE(r[2].module == 0);
  REQUIRE(tr.current_module() == 0);
}

TEST_CASE("activation nests and restores; no tracer means no recording", "[tracer]") {
  REQUIRE(Tracer::current() == nullptr);
  {
    ModuleScope idle("M", "T");  // harmless without a tracer
    REQUIRE(idle.module() == -1);
  }
  Tracer a, b;
  {
    TracerActivation on_a(a);
    {
      TracerActivation on_b(b);
      REQUIRE(Tracer::current() == &b);
    }
    REQUIRE(Tracer::current() == &a);
  }
  REQUIRE(Tracer::current() == nullptr);
}

TEST_CASE("take() moves the trace out and resets", "[tracer]") {
  Tracer tr(1);
  TracerActivation on(tr);
  {
    ModuleScope m("M", "T");
    tr.record(op("mm"));
  }
  Trace t = tr.take();
  REQUIRE(t.records.size() == 1);
  REQUIRE(t.rank == 1);
  REQUIRE(tr.trace().records.empty());
  REQUIRE(tr.trace().modules.size() == 1);
  REQUIRE(tr.trace().rank == 1);
}

TEST_CASE("serialized enum names round-trip", "[tracer]") {
  for (Phase p : {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Recompute}) {
    REQUIRE(parse_phase(phase_name(p)) == p);
  }
  for (EventKind k :
       {EventKind::Collective, EventKind::Gemm, EventKind::Compute, EventKind::Trivial}) {
    REQUIRE(parse_event_kind(event_kind_name(k)) == k);
  }
  for (ReduceOp r : {ReduceOp::None, ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    REQUIRE(parse_reduce_op(reduce_op_name(r)) == r);
  }
  REQUIRE_THROWS_AS(parse_phase("sideways"), Error);
}
