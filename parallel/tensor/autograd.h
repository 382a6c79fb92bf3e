// Reverse-mode autograd: graph nodes, the grad-mode switch and the engine. A node remembers the
// module and tracer that were current when its forward op ran, so its backward ops are filed
// under that module (DESIGN §1, deterministic attribution).
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "parallel/tensor/tensor.h"

namespace commtrace {

class Tracer;

// Where an input's gradient goes: the node that produced it, or the leaf that accumulates it.
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<TensorImpl> leaf;
  bool active() const { return node || leaf; }
};

// Maps the gradient of the node's output to one gradient per input (undefined = none).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out)>;

// Runs once, before the first of the nodes that share it runs backward (activation
// checkpointing: the recomputation of a region's forward, parallel/nn/nn.h).
struct BackwardPreHook {
  std::function<void()> fn;
  bool done = false;
};

struct Node {
  const char* name = "";  // "AddmmBackward" (a static string)
  std::vector<Edge> next;
  BackwardFn backward;
  std::uint64_t seq = 0;  // creation order; the engine runs newer nodes first
  const Tracer* tracer = nullptr;
  int module = -1;
  std::shared_ptr<BackwardPreHook> pre_hook;  // null: none
};

// While in scope, every node attached on this thread gets `hook` (scopes nest: the innermost).
class BackwardPreHookScope {
 public:
  explicit BackwardPreHookScope(std::shared_ptr<BackwardPreHook> hook);
  ~BackwardPreHookScope();
  BackwardPreHookScope(const BackwardPreHookScope&) = delete;
  BackwardPreHookScope& operator=(const BackwardPreHookScope&) = delete;

 private:
  std::shared_ptr<BackwardPreHook> previous_;
};

bool grad_enabled();

// Disables graph building for the scope (thread-local), as torch.no_grad().
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and some input requires grad.
bool needs_grad(std::span<const Tensor> inputs);

// Makes `out` the result of a differentiable op on `inputs`. REQUIRES: needs_grad(inputs).
void attach_node(Tensor& out, const char* name, std::span<const Tensor> inputs, BackwardFn fn);

// attach_node when needs_grad(inputs); otherwise nothing (fn is never wrapped in a
// BackwardFn, which would allocate).
template <class F>
void attach_grad(Tensor& out, const char* name, std::span<const Tensor> inputs, F&& fn) {
  if (needs_grad(inputs)) attach_node(out, name, inputs, BackwardFn(std::forward<F>(fn)));
}
template <class F>
void attach_grad(Tensor& out, const char* name, std::initializer_list<Tensor> inputs, F&& fn) {
  attach_grad(out, name, std::span<const Tensor>(inputs.begin(), inputs.size()),
              std::forward<F>(fn));
}

// While in scope, appends to `out` (on this thread) every leaf whose gradient becomes final in a
// backward pass, in that order: the last edge into it has run (a leaf used twice, such as a tied
// weight, is final after its second use). DDP's gradient-ready order, which it buckets by.
class GradReadyRecorder {
 public:
  explicit GradReadyRecorder(std::vector<const TensorImpl*>& out);
  ~GradReadyRecorder();
  GradReadyRecorder(const GradReadyRecorder&) = delete;
  GradReadyRecorder& operator=(const GradReadyRecorder&) = delete;

 private:
  std::vector<const TensorImpl*>* previous_;
};

// The engine behind Tensor::backward. REQUIRES: root requires grad; grad is undefined only for
// a one-element root (then it is 1). Leaf gradients accumulate across calls.
void run_backward(const Tensor& root, const Tensor& grad);

}  // namespace commtrace
