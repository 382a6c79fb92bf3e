#include "parallel/tensor/autograd.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "parallel/tensor/op.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {
thread_local bool g_grad_enabled = true;
thread_local std::uint64_t g_node_seq = 0;
thread_local std::shared_ptr<BackwardPreHook> g_pre_hook;

struct NewerFirst {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->seq < b->seq;
  }
};

// True when nothing but `g` holds g or its data (a DTensor's local shard: asked of its layer).
bool uniquely_owned(const Tensor& g) {
  if (g.impl_ptr().use_count() != 1) return false;
  if (g.impl()->dist) return dist_hooks().local_unique(g);
  return !g.impl()->storage || g.impl()->storage.use_count() == 1;
}

// Leaf gradients never alias anything (later in-place updates, e.g. DDP's all_reduce, must not
// reach another tensor): a gradient nothing else holds is taken as it is (PyTorch's
// AccumulateGrad steals it too), an aliased one is copied; later ones are added.
void accumulate_leaf(TensorImpl& leaf, Tensor g) {
  if (leaf.grad) {
    leaf.grad = add(Tensor(leaf.grad), g).impl_ptr();
  } else {
    leaf.grad = uniquely_owned(g) ? g.impl_ptr() : clone(g).impl_ptr();
  }
}
}  // namespace

bool grad_enabled() { return g_grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

bool needs_grad(std::span<const Tensor> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

BackwardPreHookScope::BackwardPreHookScope(std::shared_ptr<BackwardPreHook> hook)
    : previous_(std::exchange(g_pre_hook, std::move(hook))) {}
BackwardPreHookScope::~BackwardPreHookScope() { g_pre_hook = std::move(previous_); }

void attach_node(Tensor& out, const char* name, std::span<const Tensor> inputs, BackwardFn fn) {
  auto node = std::make_shared<Node>();
  node->name = name;
  node->backward = std::move(fn);
  node->seq = ++g_node_seq;
  node->pre_hook = g_pre_hook;
  if (Tracer* t = Tracer::current()) {
    node->tracer = t;
    node->module = t->current_module();
  }
  node->next.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    Edge e;
    if (in.defined() && in.requires_grad()) {
      if (in.impl()->grad_fn) {
        e.node = in.impl()->grad_fn;
      } else {
        e.leaf = in.impl_ptr();
      }
    }
    node->next.push_back(std::move(e));
  }
  out.impl()->grad_fn = std::move(node);
  out.impl()->requires_grad = true;
}

namespace {
thread_local std::vector<const TensorImpl*>* g_ready = nullptr;
}  // namespace

GradReadyRecorder::GradReadyRecorder(std::vector<const TensorImpl*>& out) : previous_(g_ready) {
  g_ready = &out;
}
GradReadyRecorder::~GradReadyRecorder() { g_ready = previous_; }

void run_backward(const Tensor& root, const Tensor& grad) {
  COMMTRACE_CHECK(root.requires_grad(), ErrorCode::InvalidArgument,
                  "backward: tensor {} does not require grad", describe(root));
  Tensor g = grad;
  if (!g.defined()) {
    COMMTRACE_CHECK(root.numel() == 1, ErrorCode::InvalidArgument,
                    "backward: implicit gradient needs a one-element output, got {}",
                    describe(root));
    g = ones_like(root);
  }
  COMMTRACE_CHECK(g.shape() == root.shape(), ErrorCode::ShapeMismatch,
                  "backward: gradient {} does not match output {}", describe(g), describe(root));
  PhaseScope phase(Phase::Backward);
  NoGradGuard no_grad;
  if (root.is_leaf()) {
    accumulate_leaf(*root.impl(), std::move(g));
    if (g_ready) g_ready->push_back(root.impl());
    return;
  }

  // Count, for every reachable node and leaf, the edges that lead into it.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<const TensorImpl*, int> leaf_deps;
  std::vector<Node*> stack{root.impl()->grad_fn.get()};
  std::unordered_set<Node*> seen{stack.back()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (e.leaf) ++leaf_deps[e.leaf.get()];
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }

  std::unordered_map<Node*, Tensor> buffers;
  buffers[root.impl()->grad_fn.get()] = g;
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, NewerFirst> ready;
  ready.push(root.impl()->grad_fn);
  while (!ready.empty()) {
    std::shared_ptr<Node> n = ready.top();
    ready.pop();
    Tensor grad_out;
    if (auto it = buffers.find(n.get()); it != buffers.end()) {
      grad_out = std::move(it->second);
      buffers.erase(it);
    }
    std::vector<Tensor> grads(n->next.size());
    if (n->pre_hook && !n->pre_hook->done) {
      n->pre_hook->done = true;
      n->pre_hook->fn();
    }
    {
      AttributionScope scope(n->tracer, n->module, Phase::Backward);
      if (grad_out.defined()) {
        COMMTRACE_CHECK(n->backward != nullptr, ErrorCode::InvalidArgument,
                        "backward: trying to backward through {} a second time (its saved "
                        "tensors were freed)",
                        n->name);
        grads = n->backward(grad_out);
        COMMTRACE_CHECK(grads.size() == n->next.size(), ErrorCode::Internal,
                        "backward: {} returned {} gradients for {} inputs", n->name, grads.size(),
                        n->next.size());
      }
      n->backward = nullptr;  // frees the saved tensors
      for (std::size_t i = 0; i < n->next.size(); ++i) {
        const Edge& e = n->next[i];
        if (e.leaf) {
          // The gradient's last use: moved, so that a unique one can be taken as it is.
          if (grads[i].defined()) accumulate_leaf(*e.leaf, std::move(grads[i]));
          if (--leaf_deps[e.leaf.get()] == 0 && g_ready && e.leaf->grad) {
            g_ready->push_back(e.leaf.get());
          }
          continue;
        }
        if (!e.node) continue;
        if (grads[i].defined()) {
          Tensor& buf = buffers[e.node.get()];
          buf = buf.defined() ? add(buf, grads[i]) : grads[i];
        }
        if (--deps[e.node.get()] == 0) ready.push(e.node);
      }
    }
  }
}

}  // namespace commtrace
