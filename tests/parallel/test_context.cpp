// Sequence-parallel families on "cp" (parallel/plans/context.h): verify against one device for
// every exact variant, the published RSA scaling caught with its factor, the collectives per
// layer against the README's formulas, deliberate faults caught, and the errors.
#include <map>
#include <string>
#include <tuple>

#include "parallel/run/runner.h"
#include "report/consistency.h"
#include "report/tree.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;

namespace {

std::string sample_model(const char* name) {
  return std::string(COMMTRACE_SOURCE_DIR) + "/samples/models/" + name;
}

ParallelConfig cp_config(const std::string& model, int world) {
  ParallelConfig cfg;
  cfg.model = model;
  cfg.world_size = world;
  return cfg;
}

std::string rsa_plan(bool divide, const char* reduction, const char* params = "avg") {
  return fmt::format(
      R"J({{"schema": "commtrace.plan", "version": "1.2", "context_parallel": {{"family": "rsa",
          "divide_by_world_size": {}, "grad_reduction": "{}", "param_grad_reduction": "{}"}}}})J",
      divide ? "true" : "false", reduction, params);
}

// A plan file for the duration of a test.
struct PlanFile : testing::TempFile {
  PlanFile(const std::string& text, const std::string& name)
      : TempFile("test_context_" + name + ".json", text) {}
};

const TensorCheck& check_of(const VerifyReport& r, const std::string& name) {
  for (const TensorCheck& c : r.checks) {
    if (c.name == name) return c;
  }
  FAIL("no check named " << name);
  throw;
}

// (phase, op, module fqn) -> count and bytes over the cp group, repeats counted.
struct Tally {
  int count = 0;
  std::uint64_t bytes = 0;
};
using Counts = std::map<std::tuple<Phase, std::string, std::string>, Tally>;
Counts cp_collectives(const Trace& t) {
  Counts c;
  auto add = [&](const Record& r, std::uint64_t n) {
    if (r.kind != EventKind::Collective || t.str(r.collective.group) != "cp") return;
    Tally& e = c[{r.phase, std::string(t.str(r.name)), t.modules[r.module].fqn}];
    e.count += int(n);
    e.bytes += n * r.collective.bytes;
  };
  if (t.blocks.empty()) {
    for (const Record& r : t.records) add(r, 1);
  }
  for (const Block& b : t.blocks) {
    for (std::uint32_t i = b.first; i < b.first + b.count; ++i) add(t.records[i], b.repeat);
  }
  return c;
}

Tally at(const Counts& c, Phase ph, const std::string& op, const std::string& fqn) {
  auto it = c.find({ph, op, fqn});
  return it == c.end() ? Tally{} : it->second;
}

int total(const Counts& c, Phase ph, const std::string& op) {
  int n = 0;
  for (const auto& [k, v] : c) {
    if (std::get<0>(k) == ph && std::get<1>(k) == op) n += v.count;
  }
  return n;
}

}  // namespace

TEST_CASE("context parallel: ulysses, ring and the exact rsa variants pass verify",
          "[context][verify]") {
  const std::string six = sample_model("transformer_6h.json");    // 6 heads, 12 tokens
  const std::string eight = sample_model("transformer_4l.json");  // 8 heads, 16 tokens
  const PlanFile rsa_ar(rsa_plan(false, "all_reduce"), "rsa_ar");
  const PlanFile rsa_rs(rsa_plan(false, "reduce_scatter"), "rsa_rs");
  for (const std::string& plan :
       {std::string("ulysses"), std::string("ring"), rsa_ar.path, rsa_rs.path}) {
    for (const auto& [model, world] : std::vector<std::pair<std::string, int>>{
             {"transformer", 1}, {"transformer", 2}, {"transformer", 4}, {six, 3}, {eight, 8}}) {
      ParallelConfig cfg = cp_config(model, world);
      cfg.plan = plan;
      const VerifyReport r = verify(cfg);
      INFO(plan << " on " << model << " at world " << world);
      for (const TensorCheck& c : r.checks) {
        INFO(c.name << " " << c.max_rel_err << " " << c.factor);
        CHECK(c.pass);
      }
      REQUIRE(r.pass());
    }
  }
}

TEST_CASE("context parallel: ulysses, ring and rsa on dp x cp with DDP", "[context][verify]") {
  for (const char* plan : {"ulysses", "ring"}) {
    ParallelConfig cfg = cp_config("transformer", 4);
    cfg.plan = plan;
    cfg.mesh = {2, 2};
    REQUIRE(verify(cfg).pass());
  }
  const PlanFile rsa(rsa_plan(false, "reduce_scatter"), "rsa_2x2");
  ParallelConfig cfg = cp_config("transformer", 4);
  cfg.plan = rsa.path;
  cfg.mesh = {2, 2};
  REQUIRE(verify(cfg).pass());
}

// The family's options for a config (what --context-parallel sets), rsa in its exact variant.
ContextParallel family(const char* name, const char* reduction = "all_reduce") {
  ContextParallel cp;
  cp.family = name;
  cp.divide_by_world_size = false;
  cp.grad_reduction = reduction;
  return cp;
}

TEST_CASE("context parallel: 3-D meshes, a family on cp beside TP or SP on tp and DDP on dp",
          "[context][verify]") {
  for (const char* tp_plan : {"tp", "sp"}) {
    for (const ContextParallel& cp :
         {family("ulysses"), family("ring"), family("rsa"), family("rsa", "reduce_scatter")}) {
      for (const std::vector<int>& mesh : std::vector<std::vector<int>>{{2, 2, 2}, {2, 2}}) {
        ParallelConfig cfg = cp_config("transformer", mesh.size() == 3 ? 8 : 4);
        cfg.plan = tp_plan;
        cfg.mesh = mesh;
        cfg.context_parallel = cp;
        INFO(tp_plan << " + " << cp.str() << " on " << mesh.size() << "-D");
        const VerifyReport r = verify(cfg);
        for (const TensorCheck& c : r.checks) {
          INFO(c.name << " " << c.max_rel_err << " " << c.factor);
          CHECK(c.pass);
        }
        REQUIRE(r.pass());
      }
    }
  }
  // The published scaling fails there too, by the cp size on the attention path.
  ParallelConfig cfg = cp_config("transformer", 8);
  cfg.plan = "tp";
  cfg.mesh = {2, 2, 2};
  cfg.context_parallel = family("rsa");
  cfg.context_parallel->divide_by_world_size = true;
  const VerifyReport r = verify(cfg);
  REQUIRE_FALSE(r.pass());
  CHECK(check_of(r, "layers.1.attention.wq.weight.grad").factor == "×1/2 (1/cp size)");

  // Each collective is on its own dim: ring steps on cp, TP's on tp, DDP's on dp.
  TraceOptions o;
  o.cfg = cp_config("transformer", 8);
  o.cfg.plan = "tp";
  o.cfg.mesh = {2, 2, 2};
  o.cfg.context_parallel = family("ring");
  const Trace t = trace_run(o)[0];
  std::map<std::string, std::map<std::string, int>> by_group;
  for (const Record& rec : t.records) {
    if (rec.kind == EventKind::Collective)
      ++by_group[std::string(t.str(rec.collective.group))][std::string(t.name(rec))];
  }
  CHECK(by_group.size() == 3);
  CHECK(by_group["cp"]["send"] > 0);
  CHECK(by_group["cp"]["recv"] == by_group["cp"]["send"]);
  CHECK(by_group["cp"]["all_reduce"] == 1);  // the parameter gradients, over cp
  CHECK(by_group["tp"]["all_reduce"] > 0);
  CHECK(by_group["dp"]["all_reduce"] > 0);
  CHECK(by_group["tp"].count("send") == 0);
}

TEST_CASE("context parallel: the published RSA scaling makes the attention path 1/W too small",
          "[context][verify]") {
  for (int w : {2, 4}) {
    ParallelConfig cfg = cp_config("transformer", w);
    cfg.plan = "rsa";  // divide_by_world_size, all_reduce + slice: as published
    const VerifyReport r = verify(cfg);
    REQUIRE_FALSE(r.pass());
    const std::string factor = fmt::format("×1/{} (1/world size)", w);
    // The last layer's q, k, v projections and their norm only feed attention's q, k, v.
    for (const char* p : {"wq.weight", "wk.weight", "wv.weight"}) {
      const TensorCheck& c = check_of(r, fmt::format("layers.1.attention.{}.grad", p));
      CHECK_FALSE(c.pass);
      CHECK(c.factor == factor);
    }
    CHECK(check_of(r, "layers.1.attention_norm.weight.grad").factor == factor);
    // What comes after attention is untouched; the output is right.
    CHECK(check_of(r, "layers.1.attention.wo.weight.grad").pass);
    CHECK(check_of(r, "layers.1.feed_forward.w2.weight.grad").pass);
    CHECK(check_of(r, "output").pass);
    // Earlier layers mix both paths: off, by no constant factor.
    const TensorCheck& mixed = check_of(r, "layers.0.feed_forward.w1.weight.grad");
    CHECK_FALSE(mixed.pass);
    CHECK(mixed.factor.empty());
  }
  // Summing parameter gradients over cp instead of averaging them: everything ×W.
  const PlanFile sum(rsa_plan(false, "all_reduce", "sum"), "rsa_sum");
  ParallelConfig cfg = cp_config("transformer", 4);
  cfg.plan = sum.path;
  const VerifyReport r = verify(cfg);
  CHECK(check_of(r, "layers.0.feed_forward.w1.weight.grad").factor == "×4 (world size)");
  CHECK(check_of(r, "output").pass);
}

TEST_CASE("context parallel: collectives per layer follow the README's formulas", "[context]") {
  struct Case {
    std::string model;
    std::uint64_t b, t, h, d;  // rows, tokens, heads, head dim (f32)
    int w;
  };
  const std::string four_layers = sample_model("transformer_4l.json");
  const std::uint64_t f32 = 4;
  const std::string attn = "Transformer.layers.0.attention";
  for (const Case& k : {Case{"transformer", 8, 8, 4, 4, 2}, Case{"transformer", 8, 8, 4, 4, 4},
                        Case{four_layers, 8, 16, 8, 8, 8}}) {
    const std::uint64_t b = k.b, t = k.t, h = k.h, d = k.d;
    const int w = k.w;
    INFO(k.model << " at world " << w);
    const std::uint64_t tl = t / std::uint64_t(w);
    TraceOptions o;
    o.cfg = cp_config(k.model, w);
    o.cfg.plan = "ulysses";
    Counts c = cp_collectives(trace_run(o)[0]);
    // Ulysses: q, k, v and the output, one all_to_all each way, B·H·(T/W)·D elements each.
    CHECK(at(c, Phase::Forward, "all_to_all", attn).count == 4);
    CHECK(at(c, Phase::Backward, "all_to_all", attn).count == 4);
    CHECK(at(c, Phase::Forward, "all_to_all", attn).bytes == 4 * b * h * tl * d * f32);
    CHECK(total(c, Phase::Backward, "all_reduce") == 1);  // parameter gradients, one flat call

    // Ring: W-1 forward steps moving k and v; backward W-1 steps moving k, v, dk, dv and one
    // taking dk, dv home. Every message is one block, B·H·(T/W)·D elements.
    o.cfg.plan = "ring";
    c = cp_collectives(trace_run(o)[0]);
    {
      const std::uint64_t steps = std::uint64_t(w) - 1, chunk = b * h * tl * d * f32;
      CHECK(at(c, Phase::Forward, "send", attn).count == int(2 * steps));
      CHECK(at(c, Phase::Forward, "recv", attn).count == int(2 * steps));
      CHECK(at(c, Phase::Forward, "send", attn).bytes == 2 * steps * chunk);
      CHECK(at(c, Phase::Backward, "send", attn).count == int(4 * steps + 2));
      CHECK(at(c, Phase::Backward, "recv", attn).count == int(4 * steps + 2));
      CHECK(at(c, Phase::Backward, "recv", attn).bytes == (4 * steps + 2) * chunk);
      CHECK(total(c, Phase::Backward, "all_reduce") == 1);
    }

    for (const char* reduction : {"all_reduce", "reduce_scatter"}) {
      const PlanFile plan(rsa_plan(false, reduction), reduction);
      o.cfg.plan = plan.path;
      c = cp_collectives(trace_run(o)[0]);
      const std::uint64_t steps = std::uint64_t(w) - 1, chunk = b * h * tl * d * f32;
      INFO(reduction << " at world " << w);
      // RSA forward: W-1 ring steps for sub-k and W-1 for sub-v, one send and one recv each.
      CHECK(at(c, Phase::Forward, "send", attn).count == int(2 * steps));
      CHECK(at(c, Phase::Forward, "recv", attn).count == int(2 * steps));
      CHECK(at(c, Phase::Forward, "send", attn).bytes == 2 * steps * chunk);
      // Backward: the rings again, and one reduction of the full k's and v's gradients.
      CHECK(at(c, Phase::Backward, "send", attn).count == int(2 * steps));
      CHECK(at(c, Phase::Backward, reduction, attn).count == 2);
      const std::uint64_t full = b * h * t * d * f32;
      // nccl-tests bytes: an all_reduce counts its buffer, a reduce_scatter its input.
      CHECK(at(c, Phase::Backward, reduction, attn).bytes == 2 * full);
      // and the parameter gradients: one flat all_reduce, besides the two of each layer's RSA.
      const int layers = k.model == "transformer" ? 2 : 4;
      CHECK(total(c, Phase::Backward, "all_reduce") ==
            1 + (std::string(reduction) == "all_reduce" ? 2 * layers : 0));
    }
  }
}

TEST_CASE("context parallel: a broken collective is caught by verify", "[context][verify]") {
  // Faults live on ContextParallel, never in plan files: a program sets them on the config.
  for (const auto& [family, fault] : std::vector<std::pair<std::string, std::string>>{
           {"ulysses", "no_backward_all_to_all"}, {"rsa", "skip_ring_step"}}) {
    ContextParallel cp;
    cp.family = family;
    cp.divide_by_world_size = false;
    cp.fault = fault;
    ParallelConfig cfg = cp_config("transformer", 2);
    cfg.plan = family;
    cfg.context_parallel = cp;
    INFO(family << " with " << fault);
    REQUIRE_FALSE(verify(cfg).pass());
    cfg.context_parallel->fault.clear();  // the same run without the fault
    REQUIRE(verify(cfg).pass());
  }
}

TEST_CASE("context parallel: clear errors", "[context]") {
  using testing::contains;
  using testing::error_of;
  ParallelConfig cfg = cp_config("transformer", 8);  // 4 heads
  cfg.plan = "ulysses";
  CHECK(contains(error_of([&] { verify(cfg); }), "4 heads, not divisible by the cp size 8"));
  cfg.world_size = 3;  // 8 tokens
  cfg.plan = "rsa";
  CHECK(contains(error_of([&] { verify(cfg); }),
                 "the sequence length 8 is not divisible by the cp size 3"));
  cfg = cp_config("mlp", 2);
  const PlanFile plan(rsa_plan(false, "all_reduce"), "on_mlp");
  cfg.plan = plan.path;
  CHECK(contains(error_of([&] { verify(cfg); }), "runs on the transformer family"));
  const PlanFile bad(R"J({"schema": "commtrace.plan", "version": "1.2",
                         "context_parallel": {"family": "ulysess"}})J",
                     "bad_family");
  CHECK(contains(error_of([&] { load_plan_file(bad.path); }), "did you mean 'ulysses'"));
  const PlanFile bad_input(R"J({"schema": "commtrace.plan", "version": "1.2",
                               "model_input": "Shard(0)", "context_parallel": {"family": "rsa"}})J",
                           "bad_input");
  CHECK(contains(error_of([&] { load_plan_file(bad_input.path); }), "must be \"Shard(1)\""));
  const PlanFile fault(R"J({"schema": "commtrace.plan", "version": "1.2",
                           "context_parallel": {"family": "rsa", "fault": "skip_ring_step"}})J",
                       "fault_key");
  CHECK(contains(error_of([&] { load_plan_file(fault.path); }), "fault"));
  {  // 3-D meshes: the dims must fit the plan
    ParallelConfig c3 = cp_config("transformer", 8);
    c3.mesh = {2, 2, 2};
    c3.plan = "tp";
    CHECK(contains(error_of([&] { verify(c3); }), "a 3-D mesh is dp x cp x tp"));
    c3.plan = "ring";
    CHECK(contains(error_of([&] { verify(c3); }), "no styles: it runs on a CP or DPxCP mesh"));
    c3.plan = "tp";
    c3.mesh = {};
    c3.context_parallel = family("ring");
    CHECK(contains(error_of([&] { verify(c3); }), "runs on a CPxTP or DPxCPxTP mesh"));
    c3.model = sample_model("transformer_6h.json");
    c3.mesh = {2, 2, 2};
    c3.context_parallel = family("ulysses");
    CHECK(contains(error_of([&] { verify(c3); }),
                   "has 6 heads, 3 per tp rank, not divisible by the cp size 2"));
  }
}

TEST_CASE("context parallel: the report shows a ring as its steps, and every send meets its recv",
          "[context]") {
  TraceOptions o;
  o.cfg = cp_config("transformer", 4);
  o.cfg.plan = "ring";
  o.ranks = {0, 1, 2, 3};
  std::vector<Trace> traces = trace_run(o);
  REQUIRE(traces.size() == 4);
  // Rank 0 sends only to rank 1 and receives only from rank 3.
  const std::string tree = render_tree(traces[0], TreeOptions{});
  INFO(tree);
  CHECK(tree.find("send 0→1") != std::string::npos);
  CHECK(tree.find("recv 3→0") != std::string::npos);
  CHECK(tree.find("send 0→3") == std::string::npos);
  const std::string summary = render_summary(traces[2]);
  CHECK(summary.find("send 2→3") != std::string::npos);
  CHECK(summary.find("recv 1→2") != std::string::npos);
  CHECK(check_rank_consistency(traces).empty());

  // One send of rank 1 claims more bytes than rank 2 received: named with both ranks.
  for (Record& r : traces[1].records) {
    if (r.kind == EventKind::Collective && r.collective.op == Collective::Send) {
      r.collective.bytes += 4;
      break;
    }
  }
  const std::vector<std::string> found = check_rank_consistency(traces);
  REQUIRE(found.size() == 1);
  CHECK(found[0].find("group 'cp': rank 1's send seq 0 to rank 2") != std::string::npos);
}
