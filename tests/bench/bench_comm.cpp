// Threads-backend all_reduce bandwidth: 64 MiB of f32 at world sizes 2 and 4, reported as bus
// bandwidth (bytes × 2(n-1)/n / time, nccl-tests), next to a plain single-thread memcpy of 64 MiB
// as the machine's reference. Compare the counters of one run as ratios (busbw / memcpy bytes/s).
// Run: build/tests/bench/bench_comm
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <vector>

#include "parallel/comm/comm.h"
#include "parallel/comm/launch.h"

using namespace commtrace;

namespace {

constexpr std::int64_t kBytes = std::int64_t(64) << 20;

void BM_Memcpy(benchmark::State& state) {
  std::vector<char> src(std::size_t(kBytes), 1);
  std::vector<char> dst(std::size_t(kBytes), 0);  // both touched: no page faults when timed
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), std::size_t(kBytes));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_s"] =
      benchmark::Counter(double(kBytes) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);

// One launch per run; rank 0 drives the benchmark loop and times each all_reduce (the wait for
// the other ranks included, as nccl-tests does). Before each iteration rank 0 broadcasts whether
// another one follows, so every rank issues the same sequence of collectives.
void BM_AllReduceThreads(benchmark::State& state) {
  const int world = int(state.range(0));
  const std::int64_t n = kBytes / std::int64_t(sizeof(float));
  std::vector<int> ranks(std::size_t(world), 0);
  std::iota(ranks.begin(), ranks.end(), 0);
  try {
    launch(world, [&](RankContext& ctx) {
      auto comm = ctx.new_group("bench", ranks);
      Tensor t = Tensor::zeros({n});  // zeros stay zeros: no overflow, no denormals
      Tensor more = Tensor::zeros({1});
      if (ctx.rank() == 0) {
        for (auto _ : state) {
          more.data<float>()[0] = 1.0f;
          comm->broadcast(more, 0);
          const auto start = std::chrono::steady_clock::now();
          comm->all_reduce(t, ReduceOp::Sum);
          const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
          state.SetIterationTime(took.count());
        }
        more.data<float>()[0] = 0.0f;
        comm->broadcast(more, 0);
      } else {
        for (;;) {
          comm->broadcast(more, 0);
          if (more.data<float>()[0] == 0.0f) break;
          comm->all_reduce(t, ReduceOp::Sum);
        }
      }
    });
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  state.counters["busbw"] = benchmark::Counter(
      double(kBytes) * busbw_factor(Collective::AllReduce, world) * double(state.iterations()),
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AllReduceThreads)->Arg(2)->Arg(4)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
