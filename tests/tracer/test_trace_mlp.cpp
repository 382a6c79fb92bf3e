// One traced single-device forward+backward(+step) of the zoo models: every GEMM lands under
// the right module and phase, with PyTorch's shapes (compare the noise-1 table in
// shared/reference/torch/golden_mlp_tp_tables.txt, whose global shapes equal these).
#include <map>
#include <string>

#include "parallel/nn/models.h"
#include "parallel/nn/optim.h"
#include "parallel/tensor/ops.h"
#include "report/summary.h"
#include "tests/catch_compat.h"
#include "tracer/tracer.h"

using namespace commtrace;

namespace {
using Counts = std::map<std::string, std::int64_t>;

Counts gemms(const Trace& t, const std::string& module, Phase phase, bool rollup = false) {
  return op_counts(t, CountQuery{module, phase, EventKind::Gemm, rollup});
}

std::vector<Shape> input_shapes(const Trace& t, const std::string& module, Phase phase,
                                const std::string& name) {
  std::vector<Shape> out;
  const int m = t.find_module(module);
  for (const Record& r : t.records) {
    if (int(r.module) != m || r.phase != phase || t.name(r) != name) continue;
    for (const TensorArg& in : t.inputs(r)) {
      out.emplace_back(t.shape(in.shape).begin(), t.shape(in.shape).end());
    }
  }
  return out;
}

// Traces out = model(x); loss = out.sum(); loss.backward(), as CommDebugMode's MLP test does.
Trace trace_mlp(bool with_step) {
  auto model = find_model("mlp").build(5, {});
  const Tensor x = find_model("mlp").batch(5, {}, 1).input;  // (8, 10)
  AdamW opt(model->parameters(), 0.01);
  Tracer tr;
  {
    TracerActivation on(tr);
    sum((*model)(x)).backward();
    if (with_step) opt.step();
  }
  return tr.take();
}
}  // namespace

TEST_CASE("MLPModule: GEMMs under the right module and phase", "[tracer][mlp]") {
  const Trace t = trace_mlp(false);
  REQUIRE(t.find_module("MLPModule.net1") > 0);

  REQUIRE(gemms(t, "MLPModule.net1", Phase::Forward) == Counts{{"addmm", 1}});
  REQUIRE(gemms(t, "MLPModule.net2", Phase::Forward) == Counts{{"addmm", 1}});
  // net1's input needs no gradient: one mm (weight); net2: two (input and weight).
  REQUIRE(gemms(t, "MLPModule.net1", Phase::Backward) == Counts{{"mm", 1}});
  REQUIRE(gemms(t, "MLPModule.net2", Phase::Backward) == Counts{{"mm", 2}});
  REQUIRE(gemms(t, "MLPModule.relu", Phase::Forward).empty());
  REQUIRE(gemms(t, "MLPModule", Phase::Forward).empty());  // none directly in the root
  REQUIRE(gemms(t, "Global", Phase::Backward, true) == Counts{{"mm", 3}});

  REQUIRE(input_shapes(t, "MLPModule.net1", Phase::Forward, "addmm") ==
          std::vector<Shape>{{16}, {8, 10}, {10, 16}});
  REQUIRE(input_shapes(t, "MLPModule.net1", Phase::Backward, "mm") ==
          std::vector<Shape>{{16, 8}, {8, 10}});
  REQUIRE(input_shapes(t, "MLPModule.net2", Phase::Forward, "addmm") ==
          std::vector<Shape>{{10}, {8, 16}, {16, 10}});
  REQUIRE(input_shapes(t, "MLPModule.net2", Phase::Backward, "mm") ==
          std::vector<Shape>{{8, 10}, {10, 16}, {10, 8}, {8, 16}});
  REQUIRE(input_shapes(t, "MLPModule.net2", Phase::Backward, "sum") == std::vector<Shape>{{8, 10}});

  // Other ops are recorded too: relu and its backward under relu; the loss's sum and the
  // implicit ones_like gradient under Global's forward, as PyTorch records them.
  REQUIRE(op_counts(t, {"MLPModule.relu", Phase::Forward, EventKind::Compute, false}) ==
          Counts{{"relu", 1}});
  REQUIRE(op_counts(t, {"MLPModule.relu", Phase::Backward, EventKind::Compute, false}) ==
          Counts{{"threshold_backward", 1}});
  REQUIRE(op_counts(t, {"Global", Phase::Forward, EventKind::Compute, false}) ==
          (Counts{{"sum", 1}, {"ones_like", 1}}));
}

TEST_CASE("the optimizer step is its own phase", "[tracer][mlp]") {
  const Trace t = trace_mlp(true);
  REQUIRE(op_counts(t, {"Global", Phase::Optimizer, {}, true}) == Counts{{"_fused_adamw_", 4}});
  REQUIRE(op_counts(t, {"MLPModule", Phase::Optimizer, {}, true}).empty());
}

TEST_CASE("repeated optimizer steps fold, and a step with a gradient missing does not",
          "[tracer][mlp]") {
  auto model = find_model("mlp").build(5, {});
  const Tensor x = find_model("mlp").batch(5, {}, 1).input;
  std::vector<Tensor> params = model->parameters();
  AdamW opt(params, 0.01);
  Tracer tr;
  {
    TracerActivation on(tr);
    for (const bool drop : {false, false, true, false, false}) {
      opt.zero_grad();
      sum((*model)(x)).backward();
      if (drop) params[0].set_grad(Tensor());  // its update (one _fused_adamw_) is skipped
      opt.step();
      tr.next_iteration();
    }
  }
  const Trace t = tr.take();
  std::vector<int> per_step;  // _fused_adamw_ events of each step, in order
  Phase last = Phase::Forward;
  t.for_each_event([&](const Record& r, std::uint64_t) {
    if (r.phase == Phase::Optimizer && last != Phase::Optimizer) per_step.push_back(0);
    if (r.phase == Phase::Optimizer) ++per_step.back();
    last = r.phase;
  });
  REQUIRE(per_step == std::vector<int>{4, 4, 3, 4, 4});
  REQUIRE(t.blocks.size() == 3);
  REQUIRE(t.blocks[0].repeat == 2);
}

TEST_CASE("nothing is recorded without a tracer", "[tracer]") {
  auto model = find_model("mlp").build(5, {});
  Tracer tr;
  sum((*model)(find_model("mlp").batch(5, {}, 1).input)).backward();
  REQUIRE(tr.record_count() == 0);
  REQUIRE(tr.module_count() == 1);
}

TEST_CASE("Transformer: FQN tree in call order and attention GEMMs", "[tracer][transformer]") {
  const ModelEntry& e = find_model("transformer");
  auto model = e.build(0, {});
  const Batch b = e.batch(0, {}, 1);
  Tracer tr;
  {
    TracerActivation on(tr);
    e.loss((*model)(b.input), b).backward();
  }
  const Trace t = tr.take();
  const auto& top = t.modules[std::size_t(t.find_module("Transformer"))].children;
  std::vector<std::string> names;
  for (int c : top) names.push_back(t.modules[std::size_t(c)].fqn);
  REQUIRE(names == std::vector<std::string>{"Transformer.tok_embeddings",
                                            "Transformer.pos_embeddings", "Transformer.dropout",
                                            "Transformer.layers.0", "Transformer.layers.1",
                                            "Transformer.norm", "Transformer.output"});
  // wq (no bias) on a (8, 8, 16) input: one mm on the flattened (64, 16) rows.
  REQUIRE(gemms(t, "Transformer.layers.0.attention.wq", Phase::Forward) == Counts{{"mm", 1}});
  REQUIRE(input_shapes(t, "Transformer.layers.0.attention.wq", Phase::Forward, "mm") ==
          std::vector<Shape>{{64, 16}, {16, 16}});
  REQUIRE(gemms(t, "Transformer.layers.1.feed_forward.w1", Phase::Forward) == Counts{{"addmm", 1}});
  // Backward of every projection: grad input and grad weight.
  REQUIRE(gemms(t, "Transformer.layers.0.attention.wo", Phase::Backward) == Counts{{"mm", 2}});
  // The tied output weight gets its gradient from both uses: embedding backward and mm.
  REQUIRE(op_counts(t, {"Transformer.tok_embeddings", Phase::Backward, EventKind::Compute, false})
              .count("embedding_dense_backward") == 1);
}
