// nn: Module with named children and parameters and PyTorch-style FQNs (root = class name,
// children `parent.attr`), forward pre/post hooks (what parallel styles attach to), and the
// layers of the model zoo. Calling a module runs its hooks and forward inside its tracer scope.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor/random.h"
#include "parallel/tensor/tensor.h"

namespace commtrace {

// Where and how parameters are created.
struct ModuleOptions {
  DType dtype = DType::F32;
  Device device = Device::CPU;
};

class Module {
 public:
  using PreHook = std::function<Tensor(Module&, const Tensor& input)>;
  using PostHook = std::function<Tensor(Module&, const Tensor& input, const Tensor& output)>;

  explicit Module(std::string type) : type_(type), fqn_(std::move(type)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Runs pre-hooks, forward and post-hooks inside this module's tracer scope.
  Tensor operator()(const Tensor& input);
  virtual Tensor forward(const Tensor& input) = 0;

  const std::string& type() const { return type_; }
  const std::string& fqn() const { return fqn_; }

  // Parameters and children in registration order; names are relative to this module
  // ("net1.weight"). A tensor shared by two modules (tied weights) is listed once, first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // Every module below and including this one; this one is "".
  std::vector<std::pair<std::string, Module*>> named_modules();
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  const std::vector<std::pair<std::string, Tensor>>& local_parameters() const { return params_; }

  // REQUIRES: a parameter of that local name exists (else InvalidArgument naming both).
  Tensor param(const std::string& name) const;
  // Replaces a local parameter (a parallel style swapping in a DTensor).
  void set_param(const std::string& name, Tensor value);
  // Resolves "layers.0.attention" relative to this module; null when absent.
  Module* find(const std::string& path);

  // `prepend`: runs before the hooks added so far (FSDP's unshard precedes the plan's hooks).
  void add_pre_hook(PreHook h, bool prepend = false) {
    pre_hooks_.insert(prepend ? pre_hooks_.begin() : pre_hooks_.end(), std::move(h));
  }
  void add_post_hook(PostHook h) { post_hooks_.push_back(std::move(h)); }
  void clear_hooks();

  void train(bool on = true);
  bool training() const { return training_; }

  // Activation checkpointing (torch.utils.checkpoint, non-reentrant): the module's forward runs
  // as usual, and before the first of its backward steps it runs again, in the recompute phase
  // and under this module's scope, until the last op whose output backward keeps (PyTorch's
  // early stop: what follows it, a rowwise layer's closing all_reduce say, is not run again).
  // Gradients come from the first run's graph; the recomputed values are dropped. Regions do
  // not nest: a checkpointed module inside one runs plainly.
  void set_checkpoint(bool on) { checkpoint_ = on; }
  bool checkpoint() const { return checkpoint_; }

 protected:
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    m->set_fqn(fqn_ + "." + name);
    children_.emplace_back(name, m);
    return m;
  }
  Tensor register_parameter(const std::string& name, Tensor t);

 private:
  void set_fqn(const std::string& fqn);
  void collect_parameters(const std::string& prefix,
                          std::vector<std::pair<std::string, Tensor>>& out) const;

  Tensor call(const Tensor& input);               // scope, hooks and forward
  Tensor call_checkpointed(const Tensor& input);  // call() as a checkpoint region

  std::string type_;
  std::string fqn_;
  TraceSlot trace_slot_;  // its node in the tree of the tracer that last entered it
  bool training_ = true;
  bool checkpoint_ = false;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<PreHook> pre_hooks_;
  std::vector<PostHook> post_hooks_;
};

// ---- layers ----

// y = x Wᵀ + b; W (out, in) and b (out) ~ U(-1/sqrt(in), 1/sqrt(in)) as PyTorch.
class Linear : public Module {
 public:
  Linear(std::int64_t in, std::int64_t out, bool bias, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& x) override;
  std::int64_t in_features, out_features;
  // > 0: the output features are this many heads (set by attention modules), so column
  // sharding keeps heads whole, and duplicates them when there are fewer heads than ranks.
  std::int64_t heads = 0;
  // When set, forward multiplies by what it returns for (weight, bias) instead: a style that
  // derives the weight it uses each call (ColwiseParallel's duplicated heads). Differentiable.
  std::function<std::pair<Tensor, Tensor>(const Tensor& weight, const Tensor& bias)> derive;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

class GELU : public Module {
 public:
  GELU() : Module("GELU") {}
  Tensor forward(const Tensor& x) override;
};

// Seeded dropout: each call draws a new stream from (seed, call count). p = 0 is the identity.
class Dropout : public Module {
 public:
  explicit Dropout(double p, std::uint64_t seed = 0) : Module("Dropout"), p_(p), seed_(seed) {}
  Tensor forward(const Tensor& x) override;

 private:
  double p_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
};

// weight (num, dim) ~ N(0, 1) as PyTorch.
class Embedding : public Module {
 public:
  Embedding(std::int64_t num, std::int64_t dim, Generator& gen, const ModuleOptions& o);
  Tensor forward(const Tensor& idx) override;
  std::int64_t num_embeddings, embedding_dim;
};

class LayerNorm : public Module {
 public:
  LayerNorm(std::int64_t dim, const ModuleOptions& o, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;

 private:
  double eps_;
};

// weight (dim) = 1; x / sqrt(mean(x^2) + eps) * weight over the last dim (torch.nn.RMSNorm).
class RMSNorm : public Module {
 public:
  RMSNorm(std::int64_t dim, const ModuleOptions& o, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;

 private:
  double eps_;
};

}  // namespace commtrace
