// The commtrace binary: CLI11 wiring, one function per subcommand. This is the only place that
// maps errors to exit codes: 0 success, 1 a failed check, 2 bad input or any other error.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <cstdio>

#include "parallel/models.h"
#include "parallel/runner.h"
#include "parallel/train.h"

namespace commtrace {
namespace {

int cmd_models() {
  fmt::print("{:<13} {:>8}  {:<18} {}\n", "model", "params", "input", "description");
  for (const ModelEntry& e : model_zoo()) {
    std::int64_t count = 0;
    for (const Tensor& p : e.build(0, ModuleOptions{DType::F32, Device::Meta})->parameters()) {
      count += p.numel();
    }
    fmt::print("{:<13} {:>8}  {:<18} {}\n", e.name, count, e.input, e.description);
  }
  return 0;
}

struct TrainArgs {
  TrainOptions opts;
  std::string device = "cpu";
  std::string dtype = "f32";
};

int cmd_train(TrainArgs& a) {
  a.opts.module.device = parse_device(a.device);
  a.opts.module.dtype = parse_dtype(a.dtype);
  const bool meta = a.opts.module.device == Device::Meta;
  fmt::print("train {} on {} ({}, {}, lr {}, seed {})\n", a.opts.model, a.device, a.dtype,
             a.opts.optimizer, a.opts.lr, a.opts.seed);
  train(a.opts, [&](const StepResult& r) {
    if (meta) {
      fmt::print("step {:>3}  output {}  loss {}  (meta: shapes only)\n", r.step,
                 describe(r.output), describe(r.loss));
    } else {
      fmt::print("step {:>3}  loss {:.6f}\n", r.step, r.loss.item());
    }
    std::fflush(stdout);
  });
  return 0;
}

struct VerifyArgs {
  ParallelConfig cfg;
  std::string mesh;
  std::string dtype = "f32";
  double tolerance = 1e-5;
};

int cmd_verify(VerifyArgs& a) {
  if (!a.mesh.empty()) a.cfg.mesh = parse_mesh_shape(a.mesh);
  a.cfg.module.dtype = parse_dtype(a.dtype);
  const std::vector<int> shape = mesh_shape(a.cfg);
  fmt::print(
      "verify {} plan {} on {} ranks (mesh {}, threads backend) against one device, seed "
      "{}{}\n",
      a.cfg.model, a.cfg.plan, a.cfg.world_size, fmt::join(shape, "x"), a.cfg.seed,
      a.cfg.input_requires_grad ? ", input requires grad" : "");
  const VerifyReport r = verify(a.cfg, a.tolerance);
  if (!r.note.empty()) fmt::print("note: {}\n", r.note);
  std::size_t width = 6;
  for (const TensorCheck& c : r.checks) width = std::max(width, c.name.size());
  fmt::print("  {:<{}}  {:>12}  {}\n", "tensor", width, "max rel err", "status");
  for (const TensorCheck& c : r.checks) {
    fmt::print("  {:<{}}  {:>12.3e}  {}{}\n", c.name, width, c.max_rel_err,
               c.pass ? "PASS" : "FAIL", c.factor.empty() ? "" : "  differs by " + c.factor);
  }
  const bool ok = r.pass();
  fmt::print("{}: {} tensors, tolerance {:.0e}\n", ok ? "PASS" : "FAIL", r.checks.size(),
             a.tolerance);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace commtrace

int main(int argc, char** argv) {
  using namespace commtrace;
  CLI::App app{
      "commtrace: a communication-trace debugger for tensor- and sequence-parallel models"};
  app.set_version_flag("--version", std::string("commtrace ") + COMMTRACE_VERSION);
  app.require_subcommand(1);

  auto* models = app.add_subcommand("models", "List the model zoo: parameters and inputs");

  TrainArgs train_args;
  auto* train_cmd =
      app.add_subcommand("train", "Train a zoo model on one device, printing the loss");
  train_cmd->add_option("--model", train_args.opts.model, "Model name (see `commtrace models`)")
      ->capture_default_str();
  train_cmd->add_option("--steps", train_args.opts.steps, "Training steps")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--lr", train_args.opts.lr, "Learning rate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train_cmd->add_option("--optimizer", train_args.opts.optimizer, "adamw or sgd")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  train_cmd->add_option("--device", train_args.device, "cpu or meta (shapes only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "meta"}));
  train_cmd->add_option("--dtype", train_args.dtype, "f32 or f64")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f64"}));
  train_cmd->add_option("--seed", train_args.opts.seed, "Seed of weights and batch")
      ->capture_default_str();

  VerifyArgs verify_args;
  auto* verify_cmd = app.add_subcommand(
      "verify", "Run a model in parallel (threads backend) and on one device; compare");
  verify_cmd->add_option("--model", verify_args.cfg.model, "Model name")->capture_default_str();
  verify_cmd->add_option("--plan", verify_args.cfg.plan, "Built-in plan (tp, sp) or plan JSON")
      ->capture_default_str();
  verify_cmd->add_option("--world-size", verify_args.cfg.world_size, "Ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  verify_cmd->add_option("--mesh", verify_args.mesh, "Mesh shape: N or DPxTP (e.g. 2x2)");
  verify_cmd->add_flag("--input-requires-grad", verify_args.cfg.input_requires_grad,
                       "Make the model input require grad (and compare its gradient)");
  verify_cmd->add_option("--seed", verify_args.cfg.seed, "Seed of weights and batch")
      ->capture_default_str();
  verify_cmd->add_option("--dtype", verify_args.dtype, "f32 or f64")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f64"}));
  verify_cmd->add_option("--tolerance", verify_args.tolerance, "Max relative error")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*models) return cmd_models();
    if (*train_cmd) return cmd_train(train_args);
    if (*verify_cmd) return cmd_verify(verify_args);
  } catch (const Error& e) {
    fmt::print(stderr, "commtrace: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "commtrace: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
