// Runtime and tracer costs: one recorded event, one small op with and without an active tracer
// against the bare kernel, and a transformer training step traced vs untraced. Compare the
// figures of one run as ratios (e.g. OpTraced / OpUntraced).
#include <benchmark/benchmark.h>

#include <optional>

#include "kernels/cpu.h"
#include "parallel/models.h"
#include "parallel/ops.h"
#include "parallel/optim.h"
#include "tracer/tracer.h"

using namespace commtrace;

namespace {

void BM_RecordEvent(benchmark::State& state) {
  Tracer tr;
  OpRecord r;
  r.kind = EventKind::Gemm;
  r.name = "addmm";
  r.inputs = {TensorMeta{{16}, {16}, {}}, TensorMeta{{8, 10}, {8, 10}, {}},
              TensorMeta{{10, 16}, {10, 16}, {}}};
  r.outputs = {TensorMeta{{8, 16}, {8, 16}, {}}};
  for (auto _ : state) {
    tr.record(r);
    if (tr.trace().records.size() >= 1 << 16) {
      state.PauseTiming();
      tr.take();
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_RecordEvent);

// The bare kernel with the same allocation an op makes: the floor for OpUntraced.
void BM_ReluKernel(benchmark::State& state) {
  const Tensor x = Tensor::full({state.range(0)}, 0.5);
  for (auto _ : state) {
    Tensor out = Tensor::empty(x.shape());
    cpu::relu_forward(x.data<float>(), out.data<float>(), x.numel());
    benchmark::DoNotOptimize(out.data<float>());
  }
}
BENCHMARK(BM_ReluKernel)->Arg(64)->Arg(4096);

void BM_OpUntraced(benchmark::State& state) {
  const Tensor x = Tensor::full({state.range(0)}, 0.5);
  for (auto _ : state) benchmark::DoNotOptimize(relu(x).impl());
}
BENCHMARK(BM_OpUntraced)->Arg(64)->Arg(4096);

void BM_OpTraced(benchmark::State& state) {
  const Tensor x = Tensor::full({state.range(0)}, 0.5);
  Tracer tr;
  TracerActivation on(tr);
  for (auto _ : state) {
    benchmark::DoNotOptimize(relu(x).impl());
    if (tr.trace().records.size() >= 1 << 16) {
      state.PauseTiming();
      tr.take();
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_OpTraced)->Arg(64)->Arg(4096);

// One transformer training step (forward, loss, backward, AdamW), traced when range(0) == 1.
void BM_TransformerStep(benchmark::State& state) {
  const ModelEntry& e = find_model("transformer");
  auto model = e.build(0, {});
  const Batch b = e.batch(0, {}, 1);
  AdamW opt(model->parameters(), 1e-3);
  for (auto _ : state) {
    Tracer tr;
    std::optional<TracerActivation> on;
    if (state.range(0) == 1) on.emplace(tr);
    opt.zero_grad();
    e.loss((*model)(b.input), b).backward();
    opt.step();
  }
}
BENCHMARK(BM_TransformerStep)->Arg(0)->Arg(1)->ArgName("traced");

}  // namespace

BENCHMARK_MAIN();
