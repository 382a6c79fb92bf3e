// Optimizers: SGD and AdamW over a model's parameters. step() runs in the optimizer phase with
// grad mode off; each parameter's update is one fused op through the dispatcher, so it is traced.
// Parameters without a gradient are skipped. f32 and f64 parameters only. DTensor parameters are
// updated shard by shard; a gradient placed differently from its parameter (the Partial gradient
// of a Replicate SequenceParallel norm) is redistributed first, so its all_reduce is recorded
// in the optimizer phase (PyTorch files it under the last module's forward).
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/tensor/tensor.h"

namespace commtrace {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient. Traced as a keyed region (Tracer::begin_region):
  // a step whose parameters and gradients are laid out as in the step before repeats its events.
  void step();
  void zero_grad();  // drops the gradients (set_to_none, PyTorch's default)
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  // Updates params_[i] (its local shard) in place from g, laid out like the parameter.
  // REQUIRES: the events it records are a function of the layouts of params_[i] and g (dtype,
  // shapes, placements, mesh), never of values or of the step (step()'s region key says so).
  virtual void update(std::size_t i, const Tensor& g) = 0;
  std::vector<Tensor> params_;
  std::int64_t steps_ = 0;

 private:
  // The key of this step's events: the last step's when every parameter and gradient is laid
  // out as then (append_layout and the mesh), else a new one.
  std::uint64_t events_key();
  std::vector<std::int64_t> layouts_, scratch_;
  std::uint64_t key_ = 0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr, double momentum = 0.0, double weight_decay = 0.0);

 private:
  void update(std::size_t i, const Tensor& g) override;
  double lr_, momentum_, weight_decay_;
  std::vector<Tensor> momentum_buf_;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, double lr, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 0.01);

 private:
  void update(std::size_t i, const Tensor& g) override;
  double lr_, beta1_, beta2_, eps_, weight_decay_;
  std::vector<Tensor> m_, v_;
};

}  // namespace commtrace
