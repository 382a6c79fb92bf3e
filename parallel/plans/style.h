// Parallel styles and parallelize_module (DESIGN §2), plans from JSON and the built-in plans.
// A style distributes a module's parameters (distribute_tensor) and installs forward hooks
// that convert inputs and outputs (from_local / redistribute / to_local) inside the module's
// scope, so their collectives are filed under that module with a reason naming the style.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/dtensor/dtensor.h"
#include "parallel/nn/nn.h"
#include "parallel/plans/context.h"

namespace commtrace {

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // "ColwiseParallel(input_layouts=Shard(dim=0))": only the non-default arguments.
  virtual std::string str() const = 0;
  // REQUIRES: a supported module type, else InvalidArgument naming the module and its type.
  virtual void apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const = 0;
};

struct ColwiseParallel : ParallelStyle {
  Placement input_layout = Placement::replicate();
  Placement output_layout = Placement::shard(-1);
  bool use_local_output = true;
  std::string str() const override;
  void apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const override;
};

struct RowwiseParallel : ParallelStyle {
  Placement input_layout = Placement::shard(-1);
  Placement output_layout = Placement::replicate();
  bool use_local_output = true;
  std::string str() const override;
  void apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const override;
};

// Parameters Replicate (their gradients come out Partial); a plain input becomes
// from_local(Shard(sequence_dim)); a DTensor input passes as it is.
struct SequenceParallel : ParallelStyle {
  int sequence_dim = 1;
  bool use_local_output = false;
  std::string str() const override;
  void apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const override;
};

// The module's (single) input: from_local(input_layout), redistribute to desired.
struct PrepareModuleInput : ParallelStyle {
  Placement input_layout = Placement::replicate();
  Placement desired_input_layout = Placement::replicate();
  bool use_local_output = false;
  std::string str() const override;
  void apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const override;
};

struct PrepareModuleOutput : ParallelStyle {
  Placement output_layout = Placement::replicate();
  Placement desired_output_layout = Placement::replicate();
  bool use_local_output = true;
  std::string str() const override;
  void apply(Module& m, const std::shared_ptr<const DeviceMesh>& mesh) const override;
};

// A plan: FQN patterns relative to the model ('*' matches one path segment) mapped to styles,
// applied in order; plus how the model's own input and output are laid out over the mesh (the
// runner slices the input and wraps the output with them).
struct Plan {
  std::string name;
  std::vector<std::pair<std::string, std::shared_ptr<ParallelStyle>>> styles;
  Placement model_input = Placement::replicate();
  Placement model_output = Placement::replicate();
  // The cross-entropy loss runs on the class-sharded output without gathering it (PyTorch's
  // loss_parallel; dtensor/loss.h). REQUIRES: model_output Shard(-1), a cross-entropy model.
  bool loss_parallel = false;
  // After backward, every Partial gradient of a parameter is all-reduced over the plan's mesh in
  // one coalesced call (Megatron-LM's finalize_model_grads for sequence-parallel norms), instead
  // of one all_reduce per gradient in the optimizer step.
  bool coalesce_partial_grads = false;
  // Patterns that may match no module (a built-in plan's wq/wk/wv against a fused wqkv model);
  // any other pattern that matches nothing is an error.
  std::vector<std::string> optional;
  // What the plan asks of a model, added to the error for a required pattern that matches
  // nothing (a built-in plan's hint: "... needs fused QKV ..."); empty: none.
  std::string requires_model;
  // A sequence-parallel family over the run's "cp" mesh dim (context.h): the runner shards the
  // input's sequence (model_input Shard(1)) and reduces parameter gradients over cp.
  std::optional<ContextParallel> context_parallel;
  // Module patterns made checkpoint regions (Module::set_checkpoint); each must match.
  std::vector<std::string> checkpoint;
};

// Applies every style of the plan on a 1-D mesh. A pattern that matches no module is an error
// naming it. Tied parameters stay tied when both uses ask for the same placements; a tied
// parameter that only some of its modules distribute is untied, as PyTorch does, and the result
// says so (one sentence per module left holding the plain tensor; empty when nothing untied).
std::vector<std::string> parallelize_module(Module& model,
                                            const std::shared_ptr<const DeviceMesh>& mesh,
                                            const Plan& plan);

// Names of modules under `root` (relative FQNs) that match `pattern`.
std::vector<std::string> match_modules(Module& root, const std::string& pattern);

// ---- plan files and the built-in plans (plan.cpp)

// Plan JSON (schema in README): {"schema": "commtrace.plan", "version": "1.2", "model_input":
// "Shard(0)", "model_output": "Replicate()", "loss_parallel": false, "plan": {"in_proj":
// {"style": "ColwiseParallel", "input_layouts": "Shard(0)"}, ...}, "context_parallel":
// {"family": "rsa", "divide_by_world_size": false}}. 1.0 files (without loss_parallel) and 1.1
// (without context_parallel) still load. Errors name the key and the bad value.
Plan plan_from_json_text(const std::string& text, const std::string& source);
Plan load_plan_file(const std::string& path);
// Built-in plans: toy and mlp "tp", "sp"; mlp-stacked "tp"; transformer "tp", "sp"; decoder
// "tp", "sp", "torchtitan" (sp with the output left vocab-sharded and loss parallel), "megatron",
// "megatron-sp" (fused wqkv required); transformer also "ulysses", "ring" and "rsa" (ColossalAI's
// ring self-attention as published), sequence-parallel families with no styles.
Plan builtin_plan(const std::string& model, const std::string& plan);
// A built-in name of the model family, or a path to a JSON file.
Plan resolve_plan(const std::string& family, const std::string& plan_or_file);
std::vector<std::string> builtin_plan_names(const std::string& model);

}  // namespace commtrace
