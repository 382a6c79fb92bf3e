#include "parallel/nn/nn.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "parallel/dtensor/dtensor.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/op.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {

thread_local bool g_in_region = false;  // inside a checkpoint region's run or its recompute

// Where a region's liveness is judged: a tensor's bytes (a DTensor's local shard), or the tensor
// itself on meta, where nothing has bytes.
std::weak_ptr<const void> liveness_key(const Tensor& t) {
  const TensorImpl* impl = t.impl();
  if (impl->dist) impl = dist_of(t).local.impl();
  if (impl->storage) return impl->storage;
  return std::static_pointer_cast<const void>(t.impl_ptr());
}

// A region's first run: per dispatched op, its outputs' keys.
class RegionRecorder : public DispatchObserver {
 public:
  void before(const OpDef&) override { ++ops_; }
  void after(const OpOutputs& out) override {
    for (const Tensor& t : out) {
      if (t.defined()) outputs_.emplace_back(ops_, liveness_key(t));
    }
  }
  // The last op (1-based) whose output is still held once the region returned `result`,
  // other than the region's result itself or bytes it was given (`given`): what backward keeps.
  // 0 when it keeps none (then nothing is recomputed, as in PyTorch).
  int last_kept(const Tensor& result, const std::vector<Tensor>& given) const {
    std::vector<const void*> skip{liveness_key(result).lock().get()};
    for (const Tensor& g : given) {
      if (g.defined()) skip.push_back(liveness_key(g).lock().get());
    }
    int last = 0;
    for (const auto& [op, key] : outputs_) {
      const std::shared_ptr<const void> alive = key.lock();
      if (alive && std::find(skip.begin(), skip.end(), alive.get()) == skip.end()) last = op;
    }
    return last;
  }

 private:
  int ops_ = 0;
  std::vector<std::pair<int, std::weak_ptr<const void>>> outputs_;
};

// The recompute's early stop: thrown before op `stop_after` + 1 starts, caught by the region.
struct StopRecompute {};
class RecomputeLimit : public DispatchObserver {
 public:
  explicit RecomputeLimit(int stop_after) : left_(stop_after) {}
  void before(const OpDef&) override {
    if (left_-- == 0) throw StopRecompute{};
  }
  void after(const OpOutputs&) override {}

 private:
  int left_;
};

struct RegionFlag {
  RegionFlag() { g_in_region = true; }
  ~RegionFlag() { g_in_region = false; }
};

}  // namespace

Tensor Module::operator()(const Tensor& input) {
  if (checkpoint_ && !g_in_region && grad_enabled()) return call_checkpointed(input);
  return call(input);
}

Tensor Module::call_checkpointed(const Tensor& input) {
  auto hook = std::make_shared<BackwardPreHook>();
  Tracer* tracer = Tracer::current();
  const int parent = tracer ? tracer->current_module() : -1;
  RegionRecorder recorder;
  Tensor out;
  {
    const RegionFlag flag;
    const DispatchObserverScope observe(recorder);
    const BackwardPreHookScope tag(hook);
    out = call(input);
  }
  std::vector<Tensor> given{input};
  for (const auto& [name, p] : named_parameters()) given.push_back(p);
  const int stop_after = recorder.last_kept(out, given);
  if (stop_after == 0) return out;
  // The input as it came (a detached handle, so the recompute's graph stays its own).
  Tensor x = input.detach();
  if (input.requires_grad()) x.set_requires_grad(true);
  hook->fn = [this, tracer, parent, stop_after, x] {
    const AttributionScope scope(tracer, parent, Phase::Recompute);
    const RegionFlag flag;
    RecomputeLimit limit(stop_after);
    const DispatchObserverScope observe(limit);
    try {
      (void)call(x);
    } catch (const StopRecompute&) {
    }
  };
  return out;
}

Tensor Module::call(const Tensor& input) {
  ModuleScope scope(fqn_, type_, &trace_slot_);
  // Parameter placements are recorded on the module's first call under this tracer.
  if (scope.module() >= 0 && !params_.empty() && !Tracer::current()->has_params(scope.module())) {
    std::vector<std::pair<std::string, std::vector<Placement>>> infos;
    for (const auto& [name, p] : params_) {
      infos.emplace_back(name, is_dtensor(p) ? dist_of(p).placements : std::vector<Placement>());
    }
    Tracer::current()->set_params(scope.module(), infos);
  }
  Tensor x = input;
  for (const PreHook& h : pre_hooks_) x = h(*this, x);
  Tensor out = forward(x);
  for (const PostHook& h : post_hooks_) out = h(*this, x, out);
  return out;
}

void Module::set_fqn(const std::string& fqn) {
  fqn_ = fqn;
  trace_slot_.set(0, 0);  // the node it named has the old name
  for (auto& [name, child] : children_) child->set_fqn(fqn_ + "." + name);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  for (const auto& [n, p] : params_) {
    COMMTRACE_CHECK(n != name, ErrorCode::Internal, "{}: parameter '{}' registered twice", fqn_,
                    name);
  }
  if (t.is_leaf() && is_floating(t.dtype())) t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

void Module::collect_parameters(const std::string& prefix,
                                std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, p] : params_) out.emplace_back(prefix + name, p);
  for (const auto& [name, child] : children_) child->collect_parameters(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> all, unique;
  collect_parameters("", all);
  std::unordered_set<const TensorImpl*> seen;
  for (auto& entry : all) {
    if (seen.insert(entry.second.impl()).second) unique.push_back(std::move(entry));
  }
  return unique;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [name, child] : children_) {
    for (auto& [sub, m] : child->named_modules()) {
      out.emplace_back(sub.empty() ? name : name + "." + sub, m);
    }
  }
  return out;
}

Tensor Module::param(const std::string& name) const {
  for (const auto& [n, p] : params_) {
    if (n == name) return p;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{} ({}) has no parameter '{}'", fqn_, type_, name));
}

void Module::set_param(const std::string& name, Tensor value) {
  for (auto& [n, p] : params_) {
    if (n == name) {
      p = std::move(value);
      return;
    }
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{} ({}) has no parameter '{}'", fqn_, type_, name));
}

Module* Module::find(const std::string& path) {
  if (path.empty()) return this;
  const auto dot = path.find('.');
  const std::string head = path.substr(0, dot);
  for (auto& [name, child] : children_) {
    if (name == head)
      return dot == std::string::npos ? child.get() : child->find(path.substr(dot + 1));
  }
  return nullptr;
}

void Module::clear_hooks() {
  pre_hooks_.clear();
  post_hooks_.clear();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

// ---------------------------------------------------------------- layers

Linear::Linear(std::int64_t in, std::int64_t out, bool bias, Generator& gen, const ModuleOptions& o)
    : Module("Linear"), in_features(in), out_features(out) {
  COMMTRACE_CHECK(in > 0 && out > 0, ErrorCode::InvalidArgument,
                  "Linear: features must be positive, got in={} out={}", in, out);
  const double bound = 1.0 / std::sqrt(double(in));
  register_parameter("weight", rand_uniform({out, in}, -bound, bound, gen, o.dtype, o.device));
  if (bias) register_parameter("bias", rand_uniform({out}, -bound, bound, gen, o.dtype, o.device));
}

Tensor Linear::forward(const Tensor& x) {
  Tensor b;
  for (const auto& [name, p] : local_parameters()) {
    if (name == "bias") b = p;
  }
  if (derive) {
    const auto [w, db] = derive(param("weight"), b);
    return linear(x, w, db);
  }
  return linear(x, param("weight"), b);
}

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

Tensor GELU::forward(const Tensor& x) { return gelu(x); }

Tensor Dropout::forward(const Tensor& x) {
  if (!training() || p_ == 0.0) return x;
  return dropout(x, p_, seed_ * 0x100000001b3ull + calls_++);
}

Embedding::Embedding(std::int64_t num, std::int64_t dim, Generator& gen, const ModuleOptions& o)
    : Module("Embedding"), num_embeddings(num), embedding_dim(dim) {
  COMMTRACE_CHECK(num > 0 && dim > 0, ErrorCode::InvalidArgument,
                  "Embedding: sizes must be positive, got {}x{}", num, dim);
  register_parameter("weight", randn({num, dim}, gen, o.dtype, o.device));
}

Tensor Embedding::forward(const Tensor& idx) { return embedding(idx, param("weight")); }

LayerNorm::LayerNorm(std::int64_t dim, const ModuleOptions& o, double eps)
    : Module("LayerNorm"), eps_(eps) {
  register_parameter("weight", Tensor::full({dim}, 1.0, o.dtype, o.device));
  register_parameter("bias", Tensor::zeros({dim}, o.dtype, o.device));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, param("weight"), param("bias"), eps_);
}

RMSNorm::RMSNorm(std::int64_t dim, const ModuleOptions& o, double eps)
    : Module("RMSNorm"), eps_(eps) {
  register_parameter("weight", Tensor::full({dim}, 1.0, o.dtype, o.device));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, param("weight"), eps_); }

}  // namespace commtrace
