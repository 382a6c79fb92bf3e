// Runtime and tracer costs: one recorded event, one small op with and without an active tracer
// against the bare kernel, and a transformer training step traced vs untraced. Compare the
// figures of one run as ratios (e.g. OpTraced / OpUntraced).
#include <benchmark/benchmark.h>

#include <chrono>
#include <optional>

#include "kernels/backend.h"
#include "parallel/nn/models.h"
#include "parallel/nn/optim.h"
#include "parallel/run/runner.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

using namespace commtrace;

namespace {

// An addmm record with three inputs and one output, as the op layer makes it.
struct GemmEvent {
  GemmEvent() {
    e.kind = EventKind::Gemm;
    e.name = "addmm";
    e.inputs = ins;
    e.outputs = {&out, 1};
  }
  GemmEvent(const GemmEvent&) = delete;
  GemmEvent& operator=(const GemmEvent&) = delete;
  const Shape bias{16}, x{8, 10}, w{10, 16}, y{8, 16};
  const ArgView ins[3] = {{bias, {}, {}}, {x, {}, {}}, {w, {}, {}}};
  const ArgView out{y, {}, {}};
  EventView e;
};

// Every event stored as a new record (a first iteration).
void BM_RecordEvent(benchmark::State& state) {
  Tracer tr;
  const GemmEvent g;
  for (auto _ : state) {
    tr.record(g.e, tr.now());
    if (tr.record_count() >= 1 << 16) {
      state.PauseTiming();
      tr.take();
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_RecordEvent);

// The steady state of a traced training loop: iterations of 64 events, each iteration the same
// as the one before, so every event is matched against its stored record (nothing is stored).
void BM_RecordRepeatedEvent(benchmark::State& state) {
  Tracer tr;
  const GemmEvent g;
  int in_iteration = 0;
  for (auto _ : state) {
    tr.record(g.e, tr.now());
    if (++in_iteration == 64) {
      tr.next_iteration();
      in_iteration = 0;
    }
  }
  state.counters["stored"] = double(tr.record_count());
}
BENCHMARK(BM_RecordRepeatedEvent);

// The bare kernel with the same allocation an op makes: the floor for OpUntraced.
void BM_ReluKernel(benchmark::State& state) {
  const Tensor x = Tensor::full({state.range(0)}, 0.5);
  for (auto _ : state) {
    Tensor out = Tensor::empty(x.shape());
    kernels_for(Device::CPU).relu_forward(x.dtype(), x.data_ptr(), out.data_ptr(), x.numel());
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
    if (tr.record_count() >= 1 << 16) {
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

// One transformer training step (forward, loss, backward, AdamW) at world size range(1), TP
// plan, traced when range(0) == 1 (one tracer iteration per step, as `commtrace run --iters`
// does). range(2) == 0: threads backend, every rank runs and is traced; 1: fake backend, rank 0
// alone runs (its peers never wait). Each benchmark iteration is one launch running range(3)
// steps (100: the long run, where a tracer's first iteration weighs 1%); the time is rank 0's per
// step (set manually, setup excluded). `commtrace bench step` measures the same interleaved, with
// medians.
void BM_TransformerStepParallel(benchmark::State& state) {
  const int steps = int(state.range(3));
  const bool traced = state.range(0) == 1;
  ParallelConfig cfg;
  cfg.model = "transformer";
  cfg.plan = "tp";
  cfg.world_size = int(state.range(1));
  LaunchOptions lo;
  if (state.range(2) == 1) {
    cfg.backend = lo.backend = "fake";
    lo.ranks = {0};
  }
  for (auto _ : state) {
    double seconds = 0;
    launch(
        cfg.world_size,
        [&](RankContext& ctx) {
          RankState s = setup_rank(ctx, cfg);
          AdamW opt(optimizer_parameters(s), 1e-3);
          Tracer tr(ctx.rank());
          std::optional<TracerActivation> on;
          if (traced) on.emplace(tr);
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < steps; ++i) {
            train_step(s, opt);
            if (traced) tr.next_iteration();
          }
          if (ctx.rank() == 0) {
            seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          }
        },
        lo);
    state.SetIterationTime(seconds / steps);
  }
}
BENCHMARK(BM_TransformerStepParallel)
    ->ArgsProduct({{0, 1}, {2, 4}, {0, 1}, {20}})
    ->Args({0, 4, 1, 100})
    ->Args({1, 4, 1, 100})
    ->ArgNames({"traced", "world", "fake", "steps"})
    ->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
