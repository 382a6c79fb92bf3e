#include "parallel/run/bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "kernels/backend.h"
#include "parallel/comm/launch.h"
#include "parallel/nn/optim.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}
double seconds_since(Clock::time_point t0) { return seconds(t0, Clock::now()); }

// The seconds of CPU this thread has used: its waits (for other ranks) excluded.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// The q-quantile of v (linear between neighbours); 0 when empty.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double at = q * double(v.size() - 1);
  const auto lo = std::size_t(at);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - double(lo));
}

double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

}  // namespace

double StepBenchResult::ns_per_event(double ratio, double untraced_s) const {
  return events_per_step ? (ratio - 1) * untraced_s * 1e9 / double(events_per_step) : 0.0;
}

StepBenchResult bench_step(const StepBenchOptions& o) {
  const ParallelConfig& cfg = o.cfg;
  mesh_shape(cfg);
  COMMTRACE_CHECK(o.steps >= 1 && o.rounds >= 1, ErrorCode::InvalidArgument,
                  "bench: steps {} and rounds {} must be >= 1", o.steps, o.rounds);
  check_device(cfg);
  config_plan(cfg);  // fail early, before any thread

  StepBenchResult result;
  // Rank 0's pairs: (traced, untraced) wall and CPU seconds, by kind; and each round's sums.
  struct Pair {
    double traced, untraced, traced_cpu, untraced_cpu;
  };
  std::array<std::vector<Pair>, 3> pairs;  // first, timed, untimed
  std::vector<double> round_ratios;
  std::mutex mu;
  LaunchOptions lo;
  lo.backend = cfg.backend;
  lo.timeout_s = cfg.timeout_s;
  if (cfg.backend == "fake") lo.ranks = {0};  // ranks never wait for each other: run one
  const int running = cfg.backend == "fake" ? 1 : cfg.world_size;
  check_host_memory(cfg, running);
  result.traced_ranks = o.trace_all_ranks ? running : 1;
  launch(
      cfg.world_size,
      [&](RankContext& ctx) {
        RankState s = setup_rank(ctx, cfg);
        AdamW opt(optimizer_parameters(s), 1e-3);
        const bool traces = o.trace_all_ranks || ctx.rank() == 0;
        train_step(s, opt);  // warm-up: first-step state, allocations, sharding plans
        auto timed_step = [&](Tracer* tr) {
          std::optional<TracerActivation> on;
          if (tr) on.emplace(*tr);
          const Clock::time_point t0 = Clock::now();
          const double cpu0 = thread_cpu_s();
          train_step(s, opt);
          const double cpu = thread_cpu_s() - cpu0;
          const double wall = seconds_since(t0);
          if (tr) tr->next_iteration();
          return std::pair<double, double>{wall, cpu};
        };
        for (int round = 0; round < o.rounds; ++round) {
          Tracer tr(ctx.rank(), o.timing);
          Tracer* traced = traces ? &tr : nullptr;
          std::vector<std::pair<int, Pair>> mine;  // kind, pair
          double sum_traced = 0, sum_untraced = 0;
          for (int i = 0; i < o.steps; ++i) {
            const int kind = i == 0 ? 0 : tr.timing() ? 1 : 2;
            std::pair<double, double> t, u;
            if (round % 2 == 0) {
              t = timed_step(traced);
              u = timed_step(nullptr);
            } else {
              u = timed_step(nullptr);
              t = timed_step(traced);
            }
            mine.push_back({kind, Pair{t.first, u.first, t.second, u.second}});
            sum_traced += t.first;
            sum_untraced += u.first;
          }
          if (ctx.rank() != 0) continue;
          const Trace trace = tr.take();
          std::lock_guard<std::mutex> lock(mu);
          for (const auto& [kind, p] : mine) pairs[std::size_t(kind)].push_back(p);
          round_ratios.push_back(StepBenchResult::ratio_of(sum_traced, sum_untraced));
          if (!traces) continue;
          result.recorded_events = trace.event_count();
          result.events_per_step = trace.event_count() / std::uint64_t(o.steps);
          result.stored_records = trace.records.size();
          const std::size_t bytes = trace.records.size() * sizeof(Record) +
                                    trace.args.size() * sizeof(TensorArg) + trace.pools.bytes();
          result.record_bytes = trace.records.empty() ? 0 : bytes / trace.records.size();
        }
      },
      lo);
  std::vector<double> traced, untraced, traced_cpu, untraced_cpu;
  StepBenchResult::Kind* kinds[] = {&result.first, &result.timed, &result.untimed};
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    std::vector<double> t, u, ratios;
    for (const Pair& p : pairs[k]) {
      t.push_back(p.traced);
      u.push_back(p.untraced);
      ratios.push_back(StepBenchResult::ratio_of(p.traced, p.untraced));
      traced_cpu.push_back(p.traced_cpu);
      untraced_cpu.push_back(p.untraced_cpu);
    }
    kinds[k]->steps = pairs[k].size();
    kinds[k]->traced_s = median(t);
    kinds[k]->untraced_s = median(u);
    kinds[k]->ratio = median(ratios);
    traced.insert(traced.end(), t.begin(), t.end());
    untraced.insert(untraced.end(), u.begin(), u.end());
  }
  result.traced_s = median(traced);
  result.untraced_s = median(untraced);
  result.traced_cpu_s = median(traced_cpu);
  result.untraced_cpu_s = median(untraced_cpu);
  result.ratio = median(round_ratios);
  result.ratio_q1 = quantile(round_ratios, 0.25);
  result.ratio_q3 = quantile(round_ratios, 0.75);
  return result;
}

AllReduceBenchResult bench_all_reduce(int world_size, std::uint64_t bytes, int rounds,
                                      const std::string& backend, Device device) {
  const int min_world = backend == "nccl" ? 1 : 2;
  COMMTRACE_CHECK(world_size >= min_world && rounds >= 1 && bytes >= 4 * std::uint64_t(world_size),
                  ErrorCode::InvalidArgument,
                  "bench all_reduce: world size {} must be >= {}, rounds {} >= 1, bytes {} >= 4 "
                  "per rank",
                  world_size, min_world, rounds, bytes);
  COMMTRACE_CHECK(device != Device::Meta, ErrorCode::InvalidArgument,
                  "bench all_reduce: moves real bytes, so it runs on cpu or cuda (got meta)");
  AllReduceBenchResult r;
  r.world_size = world_size;
  r.device = device;
  r.bytes = bytes / 4 * 4;
  r.cores = std::thread::hardware_concurrency();
  const std::int64_t n = std::int64_t(r.bytes / 4);
  std::vector<double> ar, mc;
  std::vector<int> ranks(static_cast<std::size_t>(world_size));
  for (int i = 0; i < world_size; ++i) ranks[std::size_t(i)] = i;
  LaunchOptions lo;
  lo.launcher = launcher_for(backend);
  lo.backend = backend;
  r.reported = processes_of(lo.launcher).rank == 0;
  launch(
      world_size,
      [&](RankContext& ctx) {
        auto comm = ctx.new_group("bench", ranks);
        // zeros stay zeros: no overflow, no denormals; src and dst touched: no page faults timed.
        Tensor t = Tensor::zeros({n}, DType::F32, device);
        const Tensor src = Tensor::zeros({n}, DType::F32, device);
        const Tensor dst = Tensor::zeros({n}, DType::F32, device);
        const Kernels& k = kernels_for(device);
        comm->all_reduce(t, ReduceOp::Sum);  // warm-up
        for (int i = 0; i < rounds; ++i) {
          comm->barrier();
          const Clock::time_point t0 = Clock::now();
          comm->all_reduce(t, ReduceOp::Sum);
          k.synchronize();
          const double took = seconds_since(t0);
          comm->barrier();
          if (ctx.rank() != 0) continue;
          ar.push_back(took);
          // The reference: one rank copying the same bytes while the others wait.
          const Clock::time_point c0 = Clock::now();
          k.copy(dst.data_ptr(), src.data_ptr(), r.bytes);
          k.synchronize();
          mc.push_back(seconds_since(c0));
        }
      },
      lo);
  if (!r.reported) return r;
  r.all_reduce_s = median(ar);
  r.memcpy_s = median(mc);
  r.algbw_gbs = double(r.bytes) / r.all_reduce_s / 1e9;
  r.busbw_gbs = r.algbw_gbs * busbw_factor(Collective::AllReduce, world_size);
  r.memcpy_gbs = double(r.bytes) / r.memcpy_s / 1e9;
  return r;
}

}  // namespace commtrace
