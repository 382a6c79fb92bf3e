#include "parallel/nn/nn.h"

#include <cmath>
#include <unordered_set>

#include "parallel/dtensor/dtensor.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

namespace commtrace {

Tensor Module::operator()(const Tensor& input) {
  ModuleScope scope(fqn_, type_);
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
