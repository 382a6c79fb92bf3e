// verify (runner.h): one training step's output and gradients on the parallel ranks, gathered,
// against the same step of the unsharded model on one device.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "parallel/comm/launch.h"
#include "parallel/run/runner.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/memory.h"
#include "parallel/tensor/ops.h"

namespace commtrace {

bool VerifyReport::pass() const {
  for (const TensorCheck& c : checks) {
    if (!c.pass) return false;
  }
  return !checks.empty();
}

namespace {

using Values = std::map<std::string, std::vector<double>>;

// Describes a constant factor between a and b when a ≈ r·b.
std::string factor_of(const std::vector<double>& a, const std::vector<double>& b, int world,
                      const MeshDims& dims, double tol) {
  double ab = 0, bb = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    bb += b[i] * b[i];
    scale = std::max(scale, std::abs(b[i]));
  }
  if (bb == 0 || scale == 0) return "";
  const double r = ab / bb;
  double resid = 0;
  for (std::size_t i = 0; i < a.size(); ++i) resid = std::max(resid, std::abs(a[i] - r * b[i]));
  if (resid / scale > 100 * tol || std::abs(r - 1) < 1e-6) return "";
  std::vector<std::pair<double, std::string>> named{
      {double(world), fmt::format("{} (world size)", world)},
      {1.0 / world, fmt::format("1/{} (1/world size)", world)}};
  for (const auto& [n, name] : {std::pair{dims.cp, "cp"}, {dims.tp, "tp"}, {dims.dp, "dp"}}) {
    if (n == 1) continue;
    named.emplace_back(double(n), fmt::format("{} ({} size)", n, name));
    named.emplace_back(1.0 / n, fmt::format("1/{} (1/{} size)", n, name));
  }
  named.emplace_back(0.0, "0 (no gradient reached it)");
  for (const auto& [v, text] : named) {
    if (std::abs(r - v) <= 1e-3 * std::max(1.0, std::abs(v))) return "×" + text;
  }
  return fmt::format("×{:.6g}", r);
}

// The unsharded model's step on one device: its output, and its gradients after backward.
struct Reference {
  std::shared_ptr<Module> model;
  Batch batch;
  Tensor out;
  bool input_grad = false;
};

Reference reference_step(const ParallelConfig& cfg, const Plan& plan, int dp, int tp) {
  const ModelEntry& entry = resolve_model(cfg.model);
  Reference r;
  r.model = entry.build(cfg.seed, cfg.module);
  r.batch = entry.batch(cfg.seed, cfg.module, global_rows_scale(plan, dp, tp));
  r.input_grad = cfg.input_requires_grad && is_floating(r.batch.input.dtype());
  if (r.input_grad) r.batch.input.set_requires_grad(true);
  r.out = (*r.model)(r.batch.input);
  // The reference is the loss over the whole batch on one device, except that DDP's average
  // over dp (PyTorch's, not a plan's choice) is taken as given: a "sum" loss is divided by dp
  // (a mean already is the mean of the replicas' means). A context-parallel reduction is what
  // verify checks: "avg" is exact for mean losses, "sum" for a sum.
  Tensor loss = entry.loss(r.out, r.batch);
  if (entry.loss_name == "sum" && dp > 1) loss = mul(loss, 1.0 / dp);
  loss.backward();
  return r;
}

// What verify compares, by name: the output, each trainable parameter's gradient, and the
// input's gradient when it has one. `value` reads one (to_vector, or a count on meta).
template <class T, class F>
std::map<std::string, T> compared(const Reference& r, F value) {
  std::map<std::string, T> v;
  v["output"] = value(r.out);
  for (const auto& [name, p] : r.model->named_parameters()) {
    if (!p.requires_grad()) continue;  // frozen
    v[name + ".grad"] = p.grad().defined() ? value(p.grad()) : value(zeros_like(p));
  }
  if (r.input_grad) v["input.grad"] = value(r.batch.input.grad());
  return v;
}

Values reference_run(const ParallelConfig& cfg, const Plan& plan, int dp, int tp) {
  return compared<std::vector<double>>(reference_step(cfg, plan, dp, tp),
                                       [](const Tensor& t) { return t.to_vector(); });
}

// On cpu, fails fast (check_host_room) when verify would not fit: on the reporting process the
// reference step's peak with its compared values in double, then the ranks' gradient steps
// beside the values of both runs. Measured shape-only (meta).
void check_verify_memory(const ParallelConfig& cfg, const Plan& plan, const MeshDims& dims,
                         int ranks_here, bool reports) {
  if (cfg.module.device != Device::CPU) return;
  std::uint64_t reference = 0, values = 0;
  if (reports) {
    ParallelConfig meta = cfg;
    meta.module.device = Device::Meta;
    reference = peak_bytes([&] {
      const Reference r = reference_step(meta, plan, dims.dp, dims.tp);
      for (const auto& [name, n] :
           compared<std::uint64_t>(r, [](const Tensor& t) { return std::uint64_t(t.numel()); })) {
        values += n * sizeof(double);
      }
    });
  }
  const std::uint64_t per_rank = rank_peak_bytes(cfg, false);
  const std::uint64_t ranks = per_rank * std::uint64_t(ranks_here) + 2 * values;
  check_host_room(
      std::max(reference + values, ranks),
      fmt::format("verify {} on cpu: {} per rank (rank 0's peak, measured "
                  "shape-only) for {} rank{} in this process, beside the "
                  "reference's {} and {} of compared values",
                  cfg.model, format_bytes(per_rank), ranks_here, ranks_here == 1 ? "" : "s",
                  format_bytes(reference), format_bytes(2 * values)));
}

}  // namespace

double default_tolerance(DType dt, bool tf32, int world_size) {
  if (dt == DType::BF16) return 5e-2;
  if (dt != DType::F32) return 1e-5;
  return std::max(tf32 ? 1e-2 : 1e-5, double(world_size) * 0x1p-23);
}

VerifyReport verify(const ParallelConfig& cfg, double tolerance) {
  COMMTRACE_CHECK(cfg.module.device != Device::Meta, ErrorCode::InvalidArgument,
                  "verify: compares values, so it runs on cpu or cuda (got meta)");
  check_device(cfg);
  const Plan plan = config_plan(cfg);
  const MeshDims dims = mesh_dims(cfg, plan);
  const int dp = dims.dp, tp = dims.tp;
  COMMTRACE_CHECK(cfg.backend == "threads" || cfg.backend == "mpi" || cfg.backend == "nccl",
                  ErrorCode::InvalidArgument,
                  "verify: runs on the threads, mpi or nccl backend (got {})", cfg.backend);
  LaunchOptions lo;
  lo.launcher = launcher_for(cfg.backend);
  lo.backend = cfg.backend;
  lo.timeout_s = cfg.timeout_s;
  // With one process per rank, process 0 (rank 0) holds the gathered tensors and compares.
  const bool reports = processes_of(lo.launcher).rank == 0;
  check_verify_memory(cfg, plan, dims, lo.launcher == "mpi" ? 1 : cfg.world_size, reports);
  const Values ref = reports ? reference_run(cfg, plan, dp, tp) : Values{};

  Values par;
  std::vector<std::string> warnings;  // rank 0's: every rank parallelizes alike
  std::mutex mu;
  launch(
      cfg.world_size,
      [&](RankContext& ctx) {
        RankState s = setup_rank(ctx, cfg);
        StepOut step = forward_loss(s);
        step.loss.backward();
        finish_backward(s);
        // Every rank takes part in the gathers; rank 0 alone keeps what it compares.
        Values mine;
        auto keep = [&](const std::string& name, const Tensor& t) {
          if (ctx.rank() == 0) mine[name] = t.to_vector();
        };
        Tensor output = step.output;
        if (s.cp) {  // this rank's sub-sequence of every row: joined along dim 1 first
          NoGradGuard no_grad;
          Shape global = output.shape();
          global[1] *= s.cp->size(0);
          output = full_tensor(from_local(output, s.cp, {Placement::shard(1)}, global));
        }
        keep("output", gather_full(s, output, true));
        for (const auto& [name, p] : s.model->named_parameters()) {
          if (!p.requires_grad()) continue;  // frozen
          const Tensor g = parameter_grad(s, name, p);
          if (g.defined()) {
            keep(name + ".grad", gather_full(s, g, false));
          } else if (ctx.rank() == 0) {
            mine[name + ".grad"] = std::vector<double>(std::size_t(p.numel()), 0.0);
          }
        }
        if (s.batch.input.requires_grad()) {
          Tensor g = s.batch.input.grad();
          if (s.plan.model_input.is_shard(0)) {
            Shape global = g.shape();
            global[0] *= s.tp->size(0);
            g = from_local(g, s.tp, {Placement::shard(0)}, global);
          }
          // DDP averages parameter gradients over "dp", not input gradients: the run's loss is the
          // mean of the replicas' losses, so its input gradient is the local one over dp.
          g = gather_full(s, g, true);
          keep("input.grad", s.dp ? mul(g, 1.0 / s.dp->size()) : g);
        }
        if (ctx.rank() == 0) {
          std::lock_guard<std::mutex> lock(mu);
          par = std::move(mine);
          warnings = s.warnings;
        }
      },
      lo);

  VerifyReport report;
  report.reported = reports;
  if (!reports) return report;
  if (cfg.input_requires_grad && !ref.count("input.grad")) {
    report.note = "the model's input is integer tokens: --input-requires-grad has no effect";
  }
  for (const std::string& w : warnings) {
    if (!report.note.empty()) report.note += "; ";
    report.note += w;
  }
  if (const auto& frozen = resolve_model(cfg.model).freeze; !frozen.empty()) {
    if (!report.note.empty()) report.note += "; ";
    report.note += fmt::format("parameters frozen by {} have no gradient and are not compared",
                               fmt::join(frozen, ", "));
  }
  // A tensor's scale is its largest entry, but at least 1e-3 of the largest gradient entry of the
  // reference run: a gradient that is exactly zero in exact arithmetic (the key projection's
  // bias, which softmax cancels) holds only rounding noise, relative to the gradients around it.
  double grad_scale = 0;
  for (const auto& [name, b] : ref) {
    if (name == "output") continue;
    for (double x : b) grad_scale = std::max(grad_scale, std::abs(x));
  }
  for (const auto& [name, b] : ref) {
    TensorCheck c;
    c.name = name;
    auto it = par.find(name);
    if (it == par.end() || it->second.size() != b.size()) {
      c.max_rel_err = std::numeric_limits<double>::infinity();
      c.factor = it == par.end() ? "missing in the parallel run" : "size differs";
      report.checks.push_back(c);
      continue;
    }
    const std::vector<double>& a = it->second;
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      diff = std::max(diff, std::abs(a[i] - b[i]));
      scale = std::max(scale, std::abs(b[i]));
    }
    if (name != "output") scale = std::max(scale, 1e-3 * grad_scale);
    c.max_rel_err = scale > 0 ? diff / scale : diff;
    c.pass = c.max_rel_err <= tolerance;
    if (!c.pass) {
      c.factor = factor_of(a, b, cfg.world_size, dims, tolerance);
    }
    report.checks.push_back(c);
  }
  return report;
}

}  // namespace commtrace
