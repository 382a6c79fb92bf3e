// The parallel styles (ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput
// and PrepareModuleOutput) and parallelize_module, as PyTorch's tensor parallel API applies them.
#include "parallel/plans/style.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "parallel/nn/models.h"
#include "parallel/tensor/ops.h"

namespace commtrace {

namespace {

// Parameters already distributed by the running parallelize_module (tied weights).
struct Distributed {
  Placements placements;
  Tensor dtensor;
  std::string owner;
};
thread_local std::map<const TensorImpl*, Distributed>* g_distributed = nullptr;

// Swaps the module's parameter `name` for a leaf DTensor with `placements`, reusing the
// DTensor of a tied parameter distributed the same way.
void distribute_param(Module& m, const std::string& name,
                      const std::shared_ptr<const DeviceMesh>& mesh, Placements placements) {
  const Tensor p = m.param(name);
  if (is_dtensor(p)) {
    COMMTRACE_CHECK(dist_of(p).placements == normalize_placements(placements, p.dim(), "param"),
                    ErrorCode::InvalidArgument,
                    "{}.{} is already distributed as {}; a second style asks for {}", m.fqn(), name,
                    placements_str(dist_of(p).placements), placements_str(placements));
    return;
  }
  if (g_distributed) {
    if (auto it = g_distributed->find(p.impl()); it != g_distributed->end()) {
      COMMTRACE_CHECK(it->second.placements == normalize_placements(placements, p.dim(), "param"),
                      ErrorCode::InvalidArgument,
                      "{}.{} is tied to {} which is distributed as {}, not {}", m.fqn(), name,
                      it->second.owner, placements_str(it->second.placements),
                      placements_str(placements));
      m.set_param(name, it->second.dtensor);
      return;
    }
  }
  Tensor d = distribute_tensor(p, mesh, placements);  // keeps requires_grad (frozen: off)
  if (g_distributed) {
    (*g_distributed)[p.impl()] = {dist_of(d).placements, d, m.fqn() + "." + name};
  }
  m.set_param(name, d);
}

void distribute_all(Module& m, const std::shared_ptr<const DeviceMesh>& mesh,
                    const Placements& placements) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m.local_parameters()) names.push_back(name);
  for (const auto& name : names) distribute_param(m, name, mesh, placements);
}

bool is_linear(const Module& m) { return dynamic_cast<const Linear*>(&m) != nullptr; }
bool is_embedding(const Module& m) { return dynamic_cast<const Embedding*>(&m) != nullptr; }

// p with a negative shard dim counted from the end of a rank-`rank` tensor. InvalidArgument
// naming the module, style and layout (`who`) when the dim does not fit the tensor.
Placement normalized(Placement p, int rank, const Reason& who) {
  if (!p.is_shard()) return p;
  const int d = p.dim < 0 ? p.dim + rank : p.dim;
  COMMTRACE_CHECK(d >= 0 && d < rank, ErrorCode::InvalidArgument,
                  "{}: {} is out of range for a {}-d tensor", who.str(), p.str(), rank);
  p.dim = d;
  return p;
}

// The reasons a style's collectives carry, built once when the style is applied.
struct StyleReasons {
  StyleReasons(const std::string& who, const std::string& style)
      : input_grad(
            fmt::format("{} input grad (from_local backward, {} input_layouts)", who, style)),
        input(fmt::format("{} input ({} input_layouts)", who, style)),
        output(fmt::format("{} output ({} output_layouts)", who, style)) {}
  Reason input_grad, input, output;
};

// Input conversion shared by the styles: a plain tensor becomes from_local(layout), then the
// DTensor is redistributed to `desired` when the layouts differ (PyTorch compares the declared
// layouts, not the tensor's).
Tensor prepare_input(const Tensor& x, const std::shared_ptr<const DeviceMesh>& mesh,
                     Placement layout, Placement desired, const StyleReasons& why) {
  Tensor d = x;
  if (!is_dtensor(d)) {
    d = from_local(x, mesh, {normalized(layout, x.dim(), why.input)}, std::nullopt, why.input_grad);
  }
  const Placement want = normalized(desired, d.dim(), why.input);
  if (!(normalized(layout, d.dim(), why.input) == want)) {
    d = redistribute(d, {want}, why.input);
  }
  return d;
}

Tensor prepare_output(const Tensor& y, Placement layout, bool use_local, const StyleReasons& why) {
  Tensor d = y;
  const Placement want = normalized(layout, d.dim(), why.output);
  if (!(dist_of(d).placements == Placements{want})) d = redistribute(d, {want}, why.output);
  return use_local ? to_local(d) : d;
}

std::string args_str(const std::vector<std::pair<std::string, std::string>>& args) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : args) parts.push_back(k + "=" + v);
  return fmt::format("{}", fmt::join(parts, ", "));
}

void check_mesh(const std::shared_ptr<const DeviceMesh>& mesh, const char* style) {
  COMMTRACE_CHECK(mesh && mesh->ndim() == 1, ErrorCode::InvalidArgument,
                  "{}: styles apply on a 1-D mesh (take the 'tp' dim of a 2-D mesh)", style);
}

}  // namespace

// ---------------------------------------------------------------- styles

std::string ColwiseParallel::str() const {
  std::vector<std::pair<std::string, std::string>> a;
  if (!input_layout.is_replicate()) a.emplace_back("input_layouts", input_layout.str());
  if (!(output_layout == Placement::shard(-1)))
    a.emplace_back("output_layouts", output_layout.str());
  if (!use_local_output) a.emplace_back("use_local_output", "False");
  return "ColwiseParallel(" + args_str(a) + ")";
}

namespace {

// Fewer heads than ranks (grouped-query attention's kv projections): the parameters stay
// Replicate, and each call derives a weight of one head per rank, rank r holding head
// r / (ranks / heads): every head repeated ranks / heads times (expand, local) and sharded on
// dim 0 (a local chunk). Backward gathers the per-rank weight gradients over the mesh and sums
// each head's copies, so the parameters' gradients come out Replicate.
void duplicate_heads(Linear& lin, const std::shared_ptr<const DeviceMesh>& mesh) {
  distribute_all(lin, mesh, {Placement::replicate()});
  const std::int64_t heads = lin.heads, copies = mesh->size(0) / heads;
  const Reason why(fmt::format("{} weight: {} heads duplicated onto {} ranks (ColwiseParallel)",
                               lin.fqn(), heads, mesh->size(0)));
  auto dup = [heads, copies, why, fqn = lin.fqn()](const Tensor& t) {
    if (!t.defined()) return t;
    Shape grouped = t.shape(), repeated;
    COMMTRACE_CHECK(grouped[0] % heads == 0, ErrorCode::ShapeMismatch,
                    "{}: {} output features are not {} whole heads", fqn, grouped[0], heads);
    grouped[0] /= heads;
    grouped.insert(grouped.begin(), {heads, 1});
    repeated = grouped;
    repeated[1] = copies;
    Shape flat = t.shape();
    flat[0] *= copies;
    return redistribute(view(expand(view(t, grouped), repeated), flat), {Placement::shard(0)}, why);
  };
  lin.derive = [dup](const Tensor& w, const Tensor& b) { return std::pair{dup(w), dup(b)}; };
}

}  // namespace

void ColwiseParallel::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "ColwiseParallel");
  COMMTRACE_CHECK(is_linear(m) || is_embedding(m), ErrorCode::InvalidArgument,
                  "ColwiseParallel on '{}' ({}): only Linear and Embedding are supported", m.fqn(),
                  m.type());
  auto* lin = dynamic_cast<Linear*>(&m);
  const int ranks = mesh->size(0);
  if (lin && lin->heads > 0 && lin->heads % ranks != 0) {
    COMMTRACE_CHECK(ranks % lin->heads == 0, ErrorCode::InvalidArgument,
                    "ColwiseParallel on '{}': its {} heads can be neither split over nor "
                    "duplicated onto {} ranks (one count must divide the other)",
                    m.fqn(), lin->heads, ranks);
    duplicate_heads(*lin, mesh);
  } else if (is_linear(m)) {
    distribute_all(m, mesh, {Placement::shard(0)});
  } else {
    distribute_param(m, "weight", mesh, {Placement::shard(1)});
  }
  const StyleReasons why(m.fqn(), "ColwiseParallel");
  m.add_pre_hook([=, in = input_layout](Module&, const Tensor& x) {
    return prepare_input(x, mesh, in, Placement::replicate(), why);
  });
  m.add_post_hook(
      [=, out = output_layout, local = use_local_output](Module&, const Tensor&, const Tensor& y) {
        return prepare_output(y, out, local, why);
      });
}

std::string RowwiseParallel::str() const {
  std::vector<std::pair<std::string, std::string>> a;
  if (!(input_layout == Placement::shard(-1))) a.emplace_back("input_layouts", input_layout.str());
  if (!output_layout.is_replicate()) a.emplace_back("output_layouts", output_layout.str());
  if (!use_local_output) a.emplace_back("use_local_output", "False");
  return "RowwiseParallel(" + args_str(a) + ")";
}

void RowwiseParallel::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "RowwiseParallel");
  COMMTRACE_CHECK(is_linear(m) || is_embedding(m), ErrorCode::InvalidArgument,
                  "RowwiseParallel on '{}' ({}): only Linear and Embedding are supported", m.fqn(),
                  m.type());
  const bool linear = is_linear(m);
  if (linear) {
    distribute_param(m, "weight", mesh, {Placement::shard(1)});
    for (const auto& [name, p] : m.local_parameters()) {
      if (name == "bias") distribute_param(m, "bias", mesh, {Placement::replicate()});
    }
  } else {
    distribute_param(m, "weight", mesh, {Placement::shard(0)});
  }
  const StyleReasons why(m.fqn(), "RowwiseParallel");
  const Placement desired = linear ? Placement::shard(-1) : Placement::replicate();
  m.add_pre_hook([=, in = input_layout](Module&, const Tensor& x) {
    return prepare_input(x, mesh, in, desired, why);
  });
  m.add_post_hook(
      [=, out = output_layout, local = use_local_output](Module&, const Tensor&, const Tensor& y) {
        return prepare_output(y, out, local, why);
      });
}

std::string SequenceParallel::str() const {
  std::vector<std::pair<std::string, std::string>> a;
  if (sequence_dim != 1) a.emplace_back("sequence_dim", std::to_string(sequence_dim));
  if (use_local_output) a.emplace_back("use_local_output", "True");
  return "SequenceParallel(" + args_str(a) + ")";
}

void SequenceParallel::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "SequenceParallel");
  distribute_all(m, mesh, {Placement::replicate()});
  const Reason input_grad(
      fmt::format("{} input grad (from_local backward, SequenceParallel)", m.fqn()));
  const Reason input(fmt::format("{} input (SequenceParallel sequence_dim)", m.fqn()));
  m.add_pre_hook([=, dim = sequence_dim](Module&, const Tensor& x) {
    if (is_dtensor(x)) return x;
    return from_local(x, mesh, {normalized(Placement::shard(dim), x.dim(), input)}, std::nullopt,
                      input_grad);
  });
  if (use_local_output) {
    m.add_post_hook(
        [](Module&, const Tensor&, const Tensor& y) { return is_dtensor(y) ? to_local(y) : y; });
  }
}

std::string PrepareModuleInput::str() const {
  return fmt::format("PrepareModuleInput(input_layouts={}, desired_input_layouts={}{})",
                     input_layout.str(), desired_input_layout.str(),
                     use_local_output ? ", use_local_output=True" : "");
}

void PrepareModuleInput::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "PrepareModuleInput");
  const StyleReasons why(m.fqn(), "PrepareModuleInput");
  m.add_pre_hook([=, in = input_layout, want = desired_input_layout, local = use_local_output](
                     Module&, const Tensor& x) {
    Tensor d = prepare_input(x, mesh, in, want, why);
    return local ? to_local(d) : d;
  });
}

std::string PrepareModuleOutput::str() const {
  return fmt::format("PrepareModuleOutput(output_layouts={}, desired_output_layouts={}{})",
                     output_layout.str(), desired_output_layout.str(),
                     use_local_output ? "" : ", use_local_output=False");
}

void PrepareModuleOutput::apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const {
  check_mesh(mesh, "PrepareModuleOutput");
  const StyleReasons why(m.fqn(), "PrepareModuleOutput");
  m.add_post_hook([=, out = output_layout, want = desired_output_layout, local = use_local_output](
                      Module&, const Tensor&, const Tensor& y) {
    Tensor d = y;
    if (!is_dtensor(d)) d = from_local(y, mesh, {normalized(out, y.dim(), why.output)});
    return prepare_output(d, want, local, why);
  });
}

// ---------------------------------------------------------------- parallelize_module

std::vector<std::string> match_modules(Module& root, const std::string& pattern) {
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    std::stringstream ss(s);
    std::string part;
    while (std::getline(ss, part, '.')) parts.push_back(part);
    return parts;
  };
  const auto want = split(pattern);
  std::vector<std::string> out;
  for (const auto& [name, m] : root.named_modules()) {
    const auto have = split(name);
    if (have.size() != want.size() || name.empty()) continue;
    bool ok = true;
    for (std::size_t i = 0; ok && i < want.size(); ++i) ok = want[i] == "*" || want[i] == have[i];
    if (ok) out.push_back(name);
  }
  return out;
}

std::vector<std::string> parallelize_module(Module& model,
                                            const std::shared_ptr<const DeviceMesh>& mesh,
                                            const Plan& plan) {
  std::map<const TensorImpl*, Distributed> distributed;
  struct Scope {
    explicit Scope(std::map<const TensorImpl*, Distributed>* m) { g_distributed = m; }
    ~Scope() { g_distributed = nullptr; }
  } scope(&distributed);
  for (const auto& [pattern, style] : plan.styles) {
    const auto names = match_modules(model, pattern);
    const bool optional =
        std::find(plan.optional.begin(), plan.optional.end(), pattern) != plan.optional.end();
    COMMTRACE_CHECK(!names.empty() || optional, ErrorCode::InvalidArgument,
                    "plan '{}': pattern '{}' matches no module of {}{}", plan.name, pattern,
                    model.fqn(), plan.requires_model.empty() ? "" : "; " + plan.requires_model);
    for (const auto& name : names) {
      try {
        style->apply(*model.find(name), mesh);
      } catch (const Error& e) {
        throw Error(e.code(),
                    fmt::format("plan '{}', pattern '{}': {}", plan.name, pattern, e.what()));
      }
    }
  }
  for (const std::string& pattern : plan.checkpoint) {
    const auto names = match_modules(model, pattern);
    COMMTRACE_CHECK(!names.empty(), ErrorCode::InvalidArgument,
                    "plan '{}': checkpoint pattern '{}' matches no module of {}", plan.name,
                    pattern, model.fqn());
    for (const auto& name : names) model.find(name)->set_checkpoint(true);
  }
  // A tied weight that a style distributed while another module still holds it plain.
  std::vector<std::string> untied;
  for (const auto& [path, m] : model.named_modules()) {
    for (const auto& [name, p] : m->local_parameters()) {
      const auto it = distributed.find(p.impl());
      if (it == distributed.end() || is_dtensor(p)) continue;
      untied.push_back(fmt::format(
          "the plan unties {}.{} from {}: {} is distributed as {}, {}.{} stays a plain tensor, "
          "so the parallel model trains two weights where the model has one (PyTorch's "
          "parallelize_module unties them alike); give both modules styles that distribute the "
          "weight the same way to keep it tied",
          m->fqn(), name, it->second.owner, it->second.owner, placements_str(it->second.placements),
          m->fqn(), name));
    }
  }
  return untied;
}

}  // namespace commtrace
