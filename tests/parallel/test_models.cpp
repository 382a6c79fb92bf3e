// The model zoo: PyTorch FQNs and parameters, tied weights, training that learns, meta runs
// that allocate no tensor data, and the step benchmark that times them untraced and traced.
#include <string>
#include <vector>

#include "parallel/nn/models.h"
#include "parallel/nn/optim.h"
#include "parallel/run/bench.h"
#include "parallel/run/runner.h"
#include "parallel/run/train.h"
#include "parallel/tensor/ops.h"
#include "tests/catch_compat.h"

using namespace commtrace;

namespace {
std::vector<std::string> param_names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

std::vector<double> losses(const std::string& model, int steps, Device device = Device::CPU) {
  TrainOptions o;
  o.model = model;
  o.steps = steps;
  o.module.device = device;
  std::vector<double> out;
  train(o, [&](const StepResult& r) {
    if (device == Device::CPU) out.push_back(r.loss.item());
  });
  return out;
}
}  // namespace

TEST_CASE("MLPModule has PyTorch's FQNs and parameters", "[models]") {
  auto m = find_model("mlp").build(0, {});
  REQUIRE(m->fqn() == "MLPModule");
  std::vector<std::string> fqns;
  for (auto& [name, mod] : m->named_modules()) fqns.push_back(mod->fqn());
  REQUIRE(fqns == std::vector<std::string>{"MLPModule", "MLPModule.net1", "MLPModule.relu",
                                           "MLPModule.net2"});
  REQUIRE(param_names(*m) ==
          std::vector<std::string>{"net1.weight", "net1.bias", "net2.weight", "net2.bias"});
  REQUIRE(m->find("net1")->param("weight").shape() == Shape{16, 10});
  REQUIRE(m->find("nope") == nullptr);
  REQUIRE_THROWS_AS(m->find("net1")->param("nope"), Error);
}

TEST_CASE("Transformer matches DESIGN §4 and ties the output to the token embedding", "[models]") {
  auto m = find_model("transformer").build(0, {});
  auto& t = static_cast<Transformer&>(*m);
  REQUIRE(t.output->param("weight").impl() == t.tok_embeddings->param("weight").impl());
  const auto names = param_names(*m);
  REQUIRE(names.front() == "tok_embeddings.weight");
  REQUIRE(std::find(names.begin(), names.end(), "output.weight") == names.end());
  REQUIRE(std::find(names.begin(), names.end(), "layers.1.attention.wq.weight") != names.end());
  REQUIRE(m->find("layers.0.feed_forward.w1")->fqn() == "Transformer.layers.0.feed_forward.w1");
  std::int64_t count = 0;
  for (const Tensor& p : m->parameters()) count += p.numel();
  REQUIRE(count == 6848);

  const Batch b = find_model("transformer").batch(0, {}, 1);
  REQUIRE(b.input.shape() == Shape{8, 8});
  REQUIRE((*m)(b.input).shape() == Shape{8, 8, 8});
  REQUIRE_THROWS_AS((*m)(Tensor::zeros({8, 8})), Error);  // floats are not tokens
}

TEST_CASE("the same seed builds the same model and batch", "[models]") {
  const ModelEntry& e = find_model("toy");
  auto a = e.build(7, {}), b = e.build(7, {}), c = e.build(8, {});
  REQUIRE(a->parameters()[0].to_vector() == b->parameters()[0].to_vector());
  REQUIRE(a->parameters()[0].to_vector() != c->parameters()[0].to_vector());
  REQUIRE(e.batch(7, {}, 1).input.to_vector() == e.batch(7, {}, 1).input.to_vector());
  REQUIRE_THROWS_AS(find_model("resnet"), Error);
}

TEST_CASE("training on a fixed batch halves the loss in 30 steps", "[models][train]") {
  for (const std::string model : {"toy", "mlp", "mlp-stacked", "transformer"}) {
    const auto l = losses(model, 30);
    INFO(model << ": first " << l.front() << ", last " << l.back());
    REQUIRE(l.size() == 30);
    REQUIRE(l.back() < 0.5 * l.front());
  }
}

TEST_CASE("SGD lowers the loss too", "[models][train]") {
  TrainOptions o;
  o.model = "mlp";
  o.steps = 20;
  o.optimizer = "sgd";
  o.lr = 0.1;
  std::vector<double> l;
  train(o, [&](const StepResult& r) { l.push_back(r.loss.item()); });
  REQUIRE(l.back() < l.front());
}

TEST_CASE("training on meta allocates no tensor data", "[models][meta]") {
  for (const std::string model : {"toy", "transformer"}) {
    const auto before = Storage::allocations();
    Shape out_shape;
    TrainOptions o;
    o.model = model;
    o.steps = 2;
    o.module.device = Device::Meta;
    train(o, [&](const StepResult& r) {
      out_shape = r.output.shape();
      REQUIRE(r.loss.is_meta());
      REQUIRE(r.loss.shape() == Shape{});
    });
    REQUIRE(Storage::allocations() == before);
    REQUIRE(out_shape == (model == "toy" ? Shape{20, 5} : Shape{8, 8, 8}));
  }
}

TEST_CASE("bad training options are errors", "[models][train]") {
  TrainOptions o;
  o.optimizer = "lamb";
  REQUIRE_THROWS_AS(train(o, [](const StepResult&) {}), Error);
  o = TrainOptions{};
  o.model = "nope";
  REQUIRE_THROWS_AS(train(o, [](const StepResult&) {}), Error);
}

TEST_CASE("bench step times steps traced and untraced in turn, by kind", "[models][bench]") {
  StepBenchOptions o;
  o.cfg.model = "transformer";
  o.cfg.plan = "tp";
  o.cfg.world_size = 2;
  o.cfg.backend = "fake";
  o.steps = 6;
  o.rounds = 2;
  o.timing = TimingPolicy{2, 3};  // repeats 1 and 3 timed; 2, 4 and 5 not
  const StepBenchResult r = bench_step(o);
  TraceOptions t;
  t.cfg = o.cfg;
  const Trace one = trace_run(t)[0];
  REQUIRE(one.event_count() > 0);
  REQUIRE(r.events_per_step == one.event_count());
  REQUIRE(r.recorded_events == 6 * one.event_count());
  REQUIRE(r.stored_records == one.records.size());  // the repeats folded into the first
  REQUIRE(r.traced_ranks == 1);
  REQUIRE(r.first.steps == 2);
  REQUIRE(r.timed.steps == 4);
  REQUIRE(r.untimed.steps == 6);
  for (const StepBenchResult::Kind* k : {&r.first, &r.timed, &r.untimed}) {
    REQUIRE(k->traced_s > 0);
    REQUIRE(k->untraced_s > 0);
    REQUIRE(k->ratio > 0);
  }
  REQUIRE(r.traced_s > 0);
  REQUIRE(r.ratio_q1 > 0);
  REQUIRE(r.ratio_q1 <= r.ratio);
  REQUIRE(r.ratio <= r.ratio_q3);
  // One rank on its thread: its CPU time lies within the wall time of the same steps.
  REQUIRE(r.untraced_cpu_s > 0);
  REQUIRE(r.traced_cpu_s > 0);
  REQUIRE(r.untraced_cpu_s <= r.untraced_s * 1.05);
  REQUIRE(r.traced_cpu_s <= r.traced_s * 1.05);
  REQUIRE(r.ns_per_event(r.untimed) ==
          Approx((r.untimed.ratio - 1) * r.untimed.untraced_s * 1e9 / double(r.events_per_step)));

  o.steps = 1;  // a first step only
  const StepBenchResult single = bench_step(o);
  REQUIRE(single.first.steps == 2);
  REQUIRE(single.timed.steps + single.untimed.steps == 0);
  o.rounds = 0;
  REQUIRE_THROWS_AS(bench_step(o), Error);
}
