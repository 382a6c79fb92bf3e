#include "parallel/run/train.h"

#include <algorithm>
#include <memory>

#include "kernels/backend.h"
#include "parallel/nn/optim.h"
#include "parallel/tensor/memory.h"

namespace commtrace {

namespace {

// Builds opts' model, batch and optimizer, then runs `steps` steps.
void run_steps(const TrainOptions& opts, int steps,
               const std::function<void(const StepResult&)>& on_step) {
  const ModelEntry& entry = resolve_model(opts.model);
  std::shared_ptr<Module> model = entry.build(opts.seed, opts.module);
  const Batch batch = entry.batch(opts.seed, opts.module, 1);

  std::unique_ptr<Optimizer> optim;
  if (opts.optimizer == "adamw") {
    optim = std::make_unique<AdamW>(model->parameters(), opts.lr);
  } else if (opts.optimizer == "sgd") {
    optim = std::make_unique<SGD>(model->parameters(), opts.lr);
  } else {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("train: unknown optimizer '{}' (adamw or sgd)", opts.optimizer));
  }
  for (int s = 1; s <= steps; ++s) {
    optim->zero_grad();
    StepResult r;
    r.step = s;
    r.output = (*model)(batch.input);
    r.loss = entry.loss(r.output, batch);
    r.loss.backward();
    optim->step();
    on_step(r);
  }
}

}  // namespace

void train(const TrainOptions& opts, const std::function<void(const StepResult&)>& on_step) {
  COMMTRACE_CHECK(opts.steps >= 0, ErrorCode::InvalidArgument, "train: steps = {} (must be >= 0)",
                  opts.steps);
  COMMTRACE_CHECK(opts.module.device != Device::CUDA || has_kernels(Device::CUDA),
                  ErrorCode::Unsupported, "train: device cuda: {}",
                  kernels_unavailable_reason(Device::CUDA));
  if (opts.module.device == Device::CPU) {  // fail fast when it cannot fit (see check_host_room)
    TrainOptions meta = opts;
    meta.module.device = Device::Meta;
    const std::uint64_t need =
        peak_bytes([&] { run_steps(meta, std::min(opts.steps, 1), [](const StepResult&) {}); });
    check_host_room(need, fmt::format("train {} on cpu: {} (its peak, measured shape-only)",
                                      opts.model, format_bytes(need)));
  }
  run_steps(opts, opts.steps, on_step);
}

}  // namespace commtrace
