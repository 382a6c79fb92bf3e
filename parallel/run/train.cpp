#include "parallel/run/train.h"

#include <memory>

#include "kernels/backend.h"
#include "parallel/nn/optim.h"

namespace commtrace {

void train(const TrainOptions& opts, const std::function<void(const StepResult&)>& on_step) {
  COMMTRACE_CHECK(opts.steps >= 0, ErrorCode::InvalidArgument, "train: steps = {} (must be >= 0)",
                  opts.steps);
  COMMTRACE_CHECK(opts.module.device != Device::CUDA || has_kernels(Device::CUDA),
                  ErrorCode::Unsupported, "train: device cuda: {}",
                  kernels_unavailable_reason(Device::CUDA));
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
  for (int s = 1; s <= opts.steps; ++s) {
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

}  // namespace commtrace
