// The training loop shared by the two ToyModel samples (PyTorch's tensor_parallel_example.py and
// sequence_parallel_example.py): 4 ranks as threads, the same initial weights on every rank,
// 10 iterations of forward, sum().backward() and AdamW(lr 0.25); the last iteration is traced
// and printed as CommDebugMode's noise-1 table.
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "parallel/comm/launch.h"
#include "parallel/nn/models.h"
#include "parallel/nn/optim.h"
#include "parallel/plans/style.h"
#include "parallel/tensor/ops.h"
#include "report/torch_compat.h"
#include "tracer/tracer.h"

namespace commtrace::samples {

// sharded_input: each rank draws its own 20 input rows (a Shard(0) batch); otherwise every rank
// draws the same rows (a replicated batch, like torch.manual_seed(i) on every rank).
inline int run_toy_example(const char* title, const Plan& plan, bool sharded_input) {
  constexpr int kWorld = 4, kIters = 10;
  std::mutex mu;
  Trace last;
  try {
    launch(kWorld, [&](RankContext& ctx) {
      auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{kWorld});
      Generator init(0);
      auto model = std::make_shared<ToyModel>(init, ModuleOptions{});
      parallelize_module(*model, mesh, plan);
      AdamW optimizer(model->parameters(), 0.25);
      Tracer tracer(ctx.rank());
      for (int i = 0; i < kIters; ++i) {
        Generator data(std::uint64_t(sharded_input ? i * kWorld + ctx.rank() : i));
        const Tensor input = rand_uniform({20, 10}, 0.0, 1.0, data);
        std::optional<TracerActivation> on;
        if (i == kIters - 1) on.emplace(tracer);
        sum((*model)(input)).backward();
        optimizer.step();
        optimizer.zero_grad();
        if (ctx.rank() == 0) {
          std::lock_guard<std::mutex> lock(mu);
          fmt::print("{} iter {} completed\n", title, i);
        }
      }
      if (ctx.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        last = tracer.take();
      }
    });
  } catch (const Error& e) {
    fmt::print(stderr, "{}: {}\n", title, e.what());
    return 1;
  }
  fmt::print("\nCommDebugMode table of the last iteration (rank 0, noise 1):\n{}",
             torch_table(last, 1, false));
  return 0;
}

}  // namespace commtrace::samples
