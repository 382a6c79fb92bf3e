// The runner: a config's mesh, plan and device checked; each rank's model, plan and batch set up;
// forward and loss, a training step, and trace_run. The gradient reductions are in grad_sync.cpp,
// verify in verify.cpp.
#include "parallel/run/runner.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "kernels/backend.h"

#include "parallel/dtensor/loss.h"
#include "parallel/nn/optim.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/memory.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

namespace commtrace {

std::vector<int> mesh_shape(const ParallelConfig& cfg) {
  COMMTRACE_CHECK(cfg.world_size >= 1, ErrorCode::InvalidArgument,
                  "world size {} must be at least 1", cfg.world_size);
  std::vector<int> shape = cfg.mesh.empty() ? std::vector<int>{cfg.world_size} : cfg.mesh;
  COMMTRACE_CHECK(shape.size() <= 3, ErrorCode::InvalidArgument,
                  "mesh {}: runs use 1 to 3 dims (dp x cp x tp at most); larger meshes are for "
                  "programs that build a DeviceMesh themselves",
                  fmt::join(shape, "x"));
  std::int64_t n = 1;
  for (int s : shape) n *= s;  // two ints: no overflow in 64 bits
  COMMTRACE_CHECK(n == cfg.world_size, ErrorCode::InvalidArgument,
                  "mesh {} has {} ranks but the world size is {}", fmt::join(shape, "x"), n,
                  cfg.world_size);
  COMMTRACE_CHECK(cfg.data_parallel == "ddp" || cfg.data_parallel == "fsdp",
                  ErrorCode::InvalidArgument, "data parallel '{}': ddp or fsdp", cfg.data_parallel);
  COMMTRACE_CHECK(cfg.data_parallel != "fsdp" || shape.size() == 2, ErrorCode::InvalidArgument,
                  "fsdp shards over the dp dim of a 2-D mesh: pass --mesh DPxTP (e.g. {}x1 for "
                  "FSDP alone)",
                  cfg.world_size);
  return shape;
}

MeshDims mesh_dims(const ParallelConfig& cfg, const Plan& plan) {
  const std::vector<int> shape = mesh_shape(cfg);
  const bool cp = plan.context_parallel.has_value(), styles = !plan.styles.empty();
  const std::string mesh = fmt::format("{}", fmt::join(shape, "x"));
  MeshDims d;
  if (cp && styles) {
    COMMTRACE_CHECK(shape.size() >= 2, ErrorCode::InvalidArgument,
                    "plan '{}' has a context-parallel family and styles: it runs on a CPxTP or "
                    "DPxCPxTP mesh (--mesh), not {}",
                    plan.name, mesh);
    d.names = shape.size() == 2 ? std::vector<std::string>{"cp", "tp"}
                                : std::vector<std::string>{"dp", "cp", "tp"};
  } else if (cp) {
    COMMTRACE_CHECK(shape.size() <= 2, ErrorCode::InvalidArgument,
                    "plan '{}' has a context-parallel family and no styles: it runs on a CP or "
                    "DPxCP mesh, not {} (--plan tp --context-parallel FAMILY adds TP on a third "
                    "dim)",
                    plan.name, mesh);
    d.names =
        shape.size() == 1 ? std::vector<std::string>{"cp"} : std::vector<std::string>{"dp", "cp"};
  } else {
    COMMTRACE_CHECK(shape.size() <= 2, ErrorCode::InvalidArgument,
                    "mesh {}: a 3-D mesh is dp x cp x tp and needs a context-parallel family "
                    "(--context-parallel FAMILY, or a plan file's \"context_parallel\")",
                    mesh);
    d.names =
        shape.size() == 1 ? std::vector<std::string>{"tp"} : std::vector<std::string>{"dp", "tp"};
  }
  for (std::size_t i = 0; i < shape.size(); ++i) {
    (d.names[i] == "dp" ? d.dp : d.names[i] == "cp" ? d.cp : d.tp) = shape[i];
  }
  return d;
}

namespace {

int dp_size(const RankState& s) { return s.dp ? s.dp->size() : 1; }

// Chunk i of w of `dim` (rows: 0; a sequence: 1).
Tensor slice_chunk(const Tensor& t, int dim, int w, int i) {
  const ChunkRange c = chunk_range(t.size(dim), w, i);
  NoGradGuard no_grad;
  return clone(narrow(t, dim, c.begin, c.size));
}

}  // namespace

std::int64_t global_rows_scale(const Plan& plan, int dp, int tp) {
  if (plan.context_parallel) return dp;  // the sequence is sharded, not the rows
  COMMTRACE_CHECK(plan.model_input.is_replicate() || plan.model_input.is_shard(0),
                  ErrorCode::InvalidArgument,
                  "plan '{}': model_input must be Replicate() or Shard(0), got {}", plan.name,
                  plan.model_input.str());
  return std::int64_t(dp) * (plan.model_input.is_shard(0) ? tp : 1);
}

void check_device(const ParallelConfig& cfg) {
  const Device d = cfg.module.device;
  COMMTRACE_CHECK(cfg.backend == "fake" || d != Device::Meta, ErrorCode::InvalidArgument,
                  "device meta needs the fake backend (the {} backend moves real data)",
                  cfg.backend);
  COMMTRACE_CHECK(cfg.backend != "nccl" || d == Device::CUDA, ErrorCode::InvalidArgument,
                  "the nccl backend moves cuda tensors: pass --device cuda (got {})",
                  device_name(d));
  if (d != Device::CUDA) return;
  COMMTRACE_CHECK(has_kernels(Device::CUDA), ErrorCode::Unsupported, "device cuda: {}",
                  kernels_unavailable_reason(Device::CUDA));
  COMMTRACE_CHECK(cfg.backend != "mpi", ErrorCode::Unsupported,
                  "device cuda runs on the threads, nccl or fake backend, not mpi (its "
                  "collectives move host buffers; under mpirun use --backend nccl)");
}

std::uint64_t rank_peak_bytes(const ParallelConfig& cfg, bool with_optimizer) {
  ParallelConfig meta = cfg;
  meta.module.device = Device::Meta;
  meta.backend = "fake";
  LaunchOptions lo;
  lo.backend = "fake";
  lo.ranks = {0};
  std::uint64_t peak = 0;
  launch(
      cfg.world_size,
      [&](RankContext& ctx) {
        peak = peak_bytes([&] {
          RankState s = setup_rank(ctx, meta);
          if (with_optimizer) {
            AdamW opt(optimizer_parameters(s), 1e-3);
            train_step(s, opt);
          } else {
            forward_loss(s).loss.backward();
            finish_backward(s);
          }
        });
      },
      lo);
  return peak;
}

void check_host_memory(const ParallelConfig& cfg, int ranks_here) {
  if (cfg.module.device != Device::CPU) return;
  const std::uint64_t per_rank = rank_peak_bytes(cfg);
  check_host_room(
      per_rank * std::uint64_t(ranks_here),
      fmt::format("{} on cpu: {} per rank (rank 0's peak, measured shape-only) for {} "
                  "rank{} in this process",
                  cfg.model, format_bytes(per_rank), ranks_here, ranks_here == 1 ? "" : "s"));
}

Plan config_plan(const ParallelConfig& cfg) {
  Plan plan = resolve_plan(resolve_model(cfg.model).family, cfg.plan);
  if (cfg.context_parallel) {
    cfg.context_parallel->check();
    plan.context_parallel = cfg.context_parallel;
    plan.model_input = Placement::shard(1);
  }
  return plan;
}

RankState setup_rank(RankContext& ctx, const ParallelConfig& cfg) {
  RankState s;
  const std::vector<int> shape = mesh_shape(cfg);
  s.entry = &resolve_model(cfg.model);
  s.plan = config_plan(cfg);
  const bool cp = s.plan.context_parallel.has_value();
  const MeshDims dims = mesh_dims(cfg, s.plan);
  // Without cp the names are DeviceMesh's defaults, unnamed as in PyTorch ("tp"; "dp", "tp").
  // The mesh names its device as PyTorch's would: cuda for a cuda run; cpu for cpu and for meta
  // (PyTorch's shape-only runs use a cpu mesh over a fake process group).
  s.mesh =
      std::make_shared<DeviceMesh>(ctx, shape, cp ? dims.names : std::vector<std::string>{},
                                   cfg.module.device == Device::CUDA ? Device::CUDA : Device::CPU);
  const int nd = s.mesh->ndim();
  s.tp = nd == 1 ? s.mesh : s.mesh->sub(nd - 1);  // a family alone: its cp dim (no styles)
  if (cp) s.cp = s.plan.styles.empty() ? s.tp : s.mesh->sub(nd - 2);
  if (dims.names[0] == "dp") s.dp = &s.mesh->comm(0);
  COMMTRACE_CHECK(!cp || cfg.data_parallel == "ddp", ErrorCode::Unsupported,
                  "plan '{}': a context-parallel plan runs with ddp on dp, not {}", s.plan.name,
                  cfg.data_parallel);
  s.model = s.entry->build(cfg.seed, cfg.module);
  s.ddp.cap_mb = cfg.ddp_bucket_mb;
  s.warnings = parallelize_module(*s.model, s.tp, s.plan);
  if (s.dp && cfg.data_parallel == "fsdp") {
    COMMTRACE_CHECK(!s.plan.coalesce_partial_grads, ErrorCode::Unsupported,
                    "plan '{}': coalesce_partial_grads all-reduces whole gradients after "
                    "backward, and FSDP has reduce-scattered them by then; use ddp on dp",
                    s.plan.name);
    COMMTRACE_CHECK(s.entry->freeze.empty(), ErrorCode::Unsupported,
                    "{}: frozen parameters (\"freeze\") run with ddp on dp, not fsdp",
                    s.entry->name);
    s.fsdp =
        std::make_shared<FullyShard>(*s.model, s.mesh, 0, FsdpOptions{cfg.reshard_after_forward});
  }

  const int dp = dp_size(s), tp = s.tp->size(0);
  Batch full = s.entry->batch(cfg.seed, cfg.module, global_rows_scale(s.plan, dp, tp));
  s.batch = full;
  // The input and the target (none for a "sum" loss) split alike.
  auto split = [&](int dim, int parts, int index) {
    s.batch.input = slice_chunk(s.batch.input, dim, parts, index);
    if (s.batch.target.defined()) s.batch.target = slice_chunk(s.batch.target, dim, parts, index);
  };
  if (dp > 1) split(0, dp, s.mesh->coordinate(0));
  if (cp) {
    apply_context_parallel(*s.model, s.cp, *s.plan.context_parallel, s.batch.input.size(1),
                           s.plan.styles.empty() ? 1 : tp);
    split(1, s.cp->size(0), s.cp->coordinate(0));
  } else if (s.plan.model_input.is_shard(0)) {
    split(0, tp, s.tp->coordinate(0));
  }
  if (cfg.input_requires_grad && is_floating(s.batch.input.dtype())) {
    s.batch.input = s.batch.input.detach();
    s.batch.input.set_requires_grad(true);
  }
  return s;
}

StepOut forward_loss(RankState& s) {
  StepOut out;
  out.output = (*s.model)(s.batch.input);
  const Placement layout = s.plan.model_output;
  if (s.plan.loss_parallel) {
    COMMTRACE_CHECK(s.entry->cross_entropy_loss, ErrorCode::InvalidArgument,
                    "plan '{}': loss parallel needs a cross-entropy model, and {} is not one",
                    s.plan.name, s.entry->name);
    if (!is_dtensor(out.output)) {  // a local shard (use_local_output): its origin's shape
      out.output = from_local(out.output, s.tp, {Placement::shard(-1)});
    }
    out.loss = loss_parallel_cross_entropy(out.output, s.batch.target);
    return out;
  }
  if (layout.is_replicate() || is_dtensor(out.output)) {
    out.loss = s.entry->loss(out.output, s.batch);
    return out;
  }
  // A sharded output: the loss is computed on DTensors, so its reductions stay global.
  const Placements pl{normalize_placements({layout}, out.output.dim(), "model_output")[0]};
  // The target shares the output's leading dims (the transformer's class dim is the output's
  // last): it is sharded like the output on a shared dim, replicated otherwise (vocab-sharded
  // logits against the full target).
  auto placed = [&](const Tensor& t) {
    return pl[0].is_shard() && pl[0].dim >= t.dim() ? Placements{Placement::replicate()} : pl;
  };
  auto global_of = [&](const Tensor& t, const Placements& p) {
    Shape g = t.shape();
    if (p[0].is_shard()) g[std::size_t(p[0].dim)] *= s.tp->size(0);
    return g;
  };
  const Shape local_out = out.output.shape();
  out.output = from_local(out.output, s.tp, pl, global_of(out.output, pl),
                          "model output grad (from_local backward)");
  Batch b = s.batch;
  if (b.target.defined()) {
    const Placements target_pl = placed(b.target);
    // A target shaped like the output but whole where the output is this rank's shard (an mse
    // target against vocab-sharded logits): its matching chunk.
    const Placement& tpl = target_pl[0];
    if (tpl.is_shard() && b.target.dim() == out.output.dim() &&
        b.target.size(tpl.dim) == local_out[std::size_t(tpl.dim)] * s.tp->size(0)) {
      b.target = slice_chunk(b.target, tpl.dim, s.tp->size(0), s.tp->coordinate(0));
    }
    b.target = from_local(b.target, s.tp, target_pl, global_of(b.target, target_pl));
  }
  out.loss = s.entry->loss(out.output, b);
  return out;
}

std::vector<Tensor> optimizer_parameters(const RankState& s) {
  return s.fsdp ? s.fsdp->sharded_parameters() : s.model->parameters();
}

Tensor parameter_grad(const RankState& s, const std::string& name, const Tensor& param) {
  return s.fsdp ? s.fsdp->unsharded_grad(name) : param.grad();
}

Tensor train_step(RankState& s, Optimizer& opt, MemoryLedger* mem) {
  opt.zero_grad();
  StepOut step = forward_loss(s);
  if (mem) mem->mark_forward_end();
  if (s.dp && !s.fsdp && s.ddp.cap_mb >= 0 && !s.ddp.rebuilt) {  // DDP learns the ready order
    const GradReadyRecorder ready(s.ddp.ready);
    step.loss.backward();
  } else {
    step.loss.backward();
  }
  finish_backward(s);
  opt.step();
  return step.loss;
}

Tensor gather_full(RankState& s, const Tensor& x, bool dp_sliced) {
  NoGradGuard no_grad;
  Tensor full = is_dtensor(x) ? to_local(redistribute(x, Placements(dist_of(x).placements.size(),
                                                                    Placement::replicate())))
                              : x;
  if (!dp_sliced || !s.dp) return full;
  const int dp = s.dp->size();
  // Every replica holds an equal slice (the runner builds dp × rows), so one all_gather joins them.
  Shape shape = full.shape();
  shape[0] *= dp;
  Tensor out = Tensor::empty(shape, full.dtype(), full.device());
  s.dp->all_gather(full, out);
  return out;
}

std::vector<ModuleMemory> module_memory(const RankState& s, const Trace& t,
                                        const MemoryLedger& mem) {
  std::vector<ModuleMemory> out(t.modules.size());
  const int dp = s.fsdp && s.dp ? s.dp->size() : 1;
  // Bytes a parameter holds between steps: its local tensor, or FSDP's padded dim-0 chunk of it.
  auto stored = [&](const Tensor& param) -> std::uint64_t {
    const Tensor p = is_dtensor(param) ? dist_of(param).local : param;  // this rank's shard
    const std::uint64_t size = dtype_size(p.dtype());
    if (dp == 1 || p.dim() == 0) return std::uint64_t(p.numel()) * size;
    const std::int64_t rows = p.size(0), per_row = rows > 0 ? p.numel() / rows : 0;
    return std::uint64_t((rows + dp - 1) / dp * per_row) * size;
  };
  std::unordered_set<const TensorImpl*> seen;  // a tied weight counts once, in its first module
  for (const auto& [path, m] : s.model->named_modules()) {
    const int idx = t.find_module(m->fqn());
    if (idx < 0) continue;
    ModuleMemory& mm = out[std::size_t(idx)];
    for (const auto& [name, p] : m->local_parameters()) {
      if (!p.defined() || !seen.insert(p.impl()).second) continue;
      const std::uint64_t bytes = stored(p);
      mm.params += bytes;
      if (p.requires_grad()) {
        mm.grads += dp > 1 || p.grad().defined() ? bytes : 0;
        // AdamW: exp_avg and exp_avg_sq, in the accumulation dtype (f32 for bf16 parameters).
        mm.optimizer += 2 * bytes / dtype_size(p.dtype()) * dtype_size(acc_dtype(p.dtype()));
      }
    }
  }
  const std::vector<std::uint64_t>& saved = mem.saved_by_module();
  for (std::size_t m = 0; m < saved.size() && m < out.size(); ++m) out[m].activations = saved[m];
  return out;
}

std::vector<Trace> trace_run(const TraceOptions& opts, std::vector<double>* losses) {
  const ParallelConfig& cfg = opts.cfg;
  const std::vector<int> shape = mesh_shape(cfg);
  COMMTRACE_CHECK(opts.iters >= 1, ErrorCode::InvalidArgument, "iterations {} must be >= 1",
                  opts.iters);
  std::vector<int> traced = opts.ranks.empty() ? std::vector<int>{0} : opts.ranks;
  for (int r : traced) {
    COMMTRACE_CHECK(r >= 0 && r < cfg.world_size, ErrorCode::InvalidArgument,
                    "rank {} out of range [0, {})", r, cfg.world_size);
  }
  check_device(cfg);
  config_plan(cfg);  // fail early, before any thread
  const std::string launcher = launcher_for(cfg.backend);
  check_host_memory(cfg, cfg.backend == "fake" ? int(traced.size())
                         : launcher == "mpi"   ? 1
                                               : cfg.world_size);

  // Slot i: the trace of traced[i], when this process ran that rank.
  std::vector<std::optional<Trace>> traces(traced.size());
  std::vector<double> rank0_losses;
  std::mutex mu;
  LaunchOptions lo;
  lo.launcher = launcher;
  lo.backend = cfg.backend;
  lo.timeout_s = cfg.timeout_s;
  if (cfg.backend == "fake") lo.ranks = traced;
  launch(
      cfg.world_size,
      [&](RankContext& ctx) {
        RankState s = setup_rank(ctx, cfg);
        AdamW opt(optimizer_parameters(s), opts.lr);
        const auto slot = std::find(traced.begin(), traced.end(), ctx.rank());
        Tracer tr(ctx.rank(), opts.timing);
        std::vector<double> mine;
        MemoryLedger mem;
        const bool traced_here = slot != traced.end();
        for (int it = 0; it < opts.iters; ++it) {
          Tensor loss;
          {
            std::optional<TracerActivation> on;
            std::optional<MemoryActivation> charged;
            if (traced_here) {
              on.emplace(tr);
              charged.emplace(mem);
              mem.begin_iteration();
            }
            loss = train_step(s, opt, traced_here ? &mem : nullptr);
          }
          tr.next_iteration();
          if (opts.on_iteration && ctx.rank() == traced.front())
            opts.on_iteration(it + 1, opts.iters);
          if (cfg.module.device != Device::Meta && cfg.backend != "fake") {
            NoGradGuard ng;  // the loss readout (an all_reduce when Partial) is not traced
            mine.push_back((is_dtensor(loss) ? full_tensor(loss) : loss).item());
          }
        }
        if (slot == traced.end()) return;
        Trace t = tr.take();
        t.memory = module_memory(s, t, mem);
        t.memory_peak = mem.iteration_peak();
        t.metadata = {{"model", cfg.model},
                      {"plan", cfg.plan},
                      {"world_size", std::to_string(cfg.world_size)},
                      {"mesh", s.mesh->str()},
                      {"device", device_name(cfg.module.device)},
                      {"dtype", dtype_name(cfg.module.dtype)},
                      {"backend", cfg.backend},
                      {"iterations", std::to_string(opts.iters)},
                      {"seed", std::to_string(cfg.seed)},
                      {"input_requires_grad", cfg.input_requires_grad ? "true" : "false"}};
        if (s.plan.context_parallel) {
          t.metadata["context_parallel"] = s.plan.context_parallel->str();
        }
        if (!s.warnings.empty())
          t.metadata["warning"] = fmt::format("{}", fmt::join(s.warnings, "; "));
        if (s.dp) {
          t.metadata["data_parallel"] =
              s.fsdp ? (cfg.reshard_after_forward ? "fsdp" : "fsdp (no reshard after forward)")
                     : "ddp";
        }
        std::lock_guard<std::mutex> lock(mu);
        traces[std::size_t(slot - traced.begin())] = std::move(t);
        if (ctx.rank() == 0) rank0_losses = mine;
      },
      lo);
  if (losses) *losses = rank0_losses;
  std::vector<Trace> out;
  for (std::optional<Trace>& t : traces) {
    if (t) out.push_back(std::move(*t));
  }
  return out;
}

}  // namespace commtrace
