// A plain single-device training loop over a zoo model: the same fixed batch every step
// (forward, loss, backward, optimizer step). Shared by `commtrace train` and the tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "parallel/nn/models.h"

namespace commtrace {

struct TrainOptions {
  std::string model = "transformer";
  int steps = 10;
  double lr = 0.03;
  std::string optimizer = "adamw";  // "adamw" or "sgd"
  ModuleOptions module;             // dtype and device (cpu or meta)
  std::uint64_t seed = 0;
};

struct StepResult {
  int step = 0;   // from 1
  Tensor output;  // the model's output (meta on meta)
  Tensor loss;    // one element; meta on meta
};

// Runs opts.steps steps and calls on_step after each. Throws Error on bad options.
void train(const TrainOptions& opts, const std::function<void(const StepResult&)>& on_step);

}  // namespace commtrace
