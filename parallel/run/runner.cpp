#include "parallel/run/runner.h"
#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_set>

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

std::int64_t global_rows_scale(const Plan& plan, int dp, int tp) {
  if (plan.context_parallel) return dp;  // the sequence is sharded, not the rows
  COMMTRACE_CHECK(plan.model_input.is_replicate() || plan.model_input.is_shard(0),
                  ErrorCode::InvalidArgument,
                  "plan '{}': model_input must be Replicate() or Shard(0), got {}", plan.name,
                  plan.model_input.str());
  return std::int64_t(dp) * (plan.model_input.is_shard(0) ? tp : 1);
}

}  // namespace

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

namespace {

// Caps of DDP's buckets in bytes: {the first bucket's, the others'} (bucket_cap_mb; PyTorch's
// default is 1 MiB for the first bucket, 25 MiB after it).
std::pair<std::int64_t, std::int64_t> bucket_caps(double mb) {
  if (mb == 0) return {std::int64_t(1) << 20, std::int64_t(25) << 20};
  const auto bytes = std::max<std::int64_t>(1, std::int64_t(mb * 1024 * 1024));
  return {bytes, bytes};
}

// PyTorch's compute_bucket_assignment_by_size over tensors in gradient-ready order: one open
// bucket per dtype, closed once it holds at least its cap (the first cap for a dtype's first
// bucket), in the order they close, then the open ones.
std::vector<std::vector<const TensorImpl*>> assign_buckets(
    const std::vector<const TensorImpl*>& order, std::pair<std::int64_t, std::int64_t> caps) {
  struct Open {
    DType dtype;
    std::vector<const TensorImpl*> items;
    std::int64_t bytes = 0;
    bool first = true;
  };
  std::vector<Open> open;
  std::vector<std::vector<const TensorImpl*>> out;
  for (const TensorImpl* p : order) {
    const Tensor g(p->grad);
    const DType dt = g.dtype();
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) { return o.dtype == dt; });
    if (it == open.end()) it = open.insert(open.end(), Open{dt, {}, 0, true});
    it->items.push_back(p);
    it->bytes += (is_dtensor(g) ? dist_of(g).local : g).numel() * std::int64_t(dtype_size(dt));
    if (it->bytes >= (it->first ? caps.first : caps.second)) {
      out.push_back(std::move(it->items));
      it->items.clear();
      it->bytes = 0;
      it->first = false;
    }
  }
  for (Open& o : open) {
    if (!o.items.empty()) out.push_back(std::move(o.items));
  }
  return out;
}

// All-reduces the local gradients of `params` over `comm` as one flat buffer and hands each
// parameter its slice back; a DTensor gradient's Partial placements become Replicate when
// `resolve_partial` (the reduction is theirs). `reason` is formatted only when traced.
template <class Reason>
void all_reduce_flat(RankState& s, const std::vector<Tensor>& params, Communicator& comm,
                     ReduceOp op, bool resolve_partial, Reason&& reason) {
  std::vector<Tensor> flat_parts;
  std::int64_t bytes = 0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    const Tensor local = is_dtensor(g) ? dist_of(g).local : g;
    flat_parts.push_back(view(local, {-1}));
    bytes += local.numel() * std::int64_t(dtype_size(local.dtype()));
  }
  Tensor flat = flat_parts.size() == 1 ? clone(flat_parts[0]) : cat(flat_parts, 0);
  {
    const std::string why = Tracer::current() ? reason(bytes) : std::string();
    const CollectiveScope scope(
        CollectiveContext{why, {}, {}, &s.mesh->info(), s.mesh->uid(), flat.shape()});
    comm.all_reduce(flat, op);
  }
  std::int64_t offset = 0;
  for (Tensor p : params) {
    const Tensor g = p.grad();
    const Tensor local = is_dtensor(g) ? dist_of(g).local : g;
    const Tensor part = view(narrow(flat, 0, offset, local.numel()), local.shape());
    offset += local.numel();
    if (!is_dtensor(g)) {
      p.set_grad(part);
      continue;
    }
    const DistSpec& d = dist_of(g);
    Placements placements = d.placements;
    for (Placement& pl : placements) {
      if (resolve_partial && pl.is_partial()) pl = Placement::replicate();
    }
    p.set_grad(wrap_dtensor(part, d.mesh, placements, g.shape()));
  }
}

void all_reduce_bucket(RankState& s, const std::vector<Tensor>& params, std::size_t index,
                       std::size_t count) {
  all_reduce_flat(s, params, *s.dp, ReduceOp::Avg, false, [&](std::int64_t bytes) {
    return fmt::format("DDP bucket {} of {}: {} gradients, {} bytes, over '{}'", index, count,
                       params.size(), bytes, s.mesh->dim_name(0));
  });
}

}  // namespace

void sync_data_parallel_grads(RankState& s) {
  if (!s.dp) return;
  PhaseScope phase(Phase::Backward);
  std::vector<std::pair<std::string, Tensor>> params;
  for (auto& [name, p] : s.model->named_parameters()) {
    if (p.grad().defined()) params.emplace_back(name, p);
  }
  if (s.ddp.cap_mb < 0) {  // one all_reduce per gradient, in parameter order
    for (const auto& [name, p] : params) {
      Tensor g = p.grad();
      Tensor local = is_dtensor(g) ? dist_of(g).local : g;
      const std::string reason =
          Tracer::current() ? fmt::format("DDP gradient of {} over '{}'", name, s.mesh->dim_name(0))
                            : std::string();
      const std::span<const Placement> pl = is_dtensor(g)
                                                ? std::span<const Placement>(dist_of(g).placements)
                                                : std::span<const Placement>();
      const CollectiveScope scope(
          CollectiveContext{reason, pl, pl, &s.mesh->info(), s.mesh->uid(), g.shape()});
      s.dp->all_reduce(local, ReduceOp::Avg);
    }
    return;
  }
  std::map<const TensorImpl*, Tensor> by_impl;
  for (const auto& [name, p] : params) by_impl.emplace(p.impl(), p);
  std::vector<std::vector<const TensorImpl*>> buckets;
  if (!s.ddp.rebuilt) {
    // The first iteration: one bucket per dtype holding every gradient (PyTorch's DDP before
    // its buckets are rebuilt); then the buckets of the later iterations, in ready order.
    std::vector<const TensorImpl*> all;
    for (const auto& [name, p] : params) all.push_back(p.impl());
    buckets = assign_buckets(
        all, {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max()});
    std::vector<const TensorImpl*> ready;  // one backward listed each leaf once
    for (const TensorImpl* p : s.ddp.ready) {
      if (by_impl.count(p)) ready.push_back(p);
    }
    s.ddp.buckets = assign_buckets(ready, bucket_caps(s.ddp.cap_mb));
    s.ddp.rebuilt = true;
  } else {
    buckets = s.ddp.buckets;
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::vector<Tensor> members;
    for (const TensorImpl* p : buckets[b]) {
      auto it = by_impl.find(p);
      COMMTRACE_CHECK(it != by_impl.end(), ErrorCode::InvalidArgument,
                      "DDP: a parameter of bucket {} has no gradient in this iteration (DDP "
                      "without find_unused_parameters needs every gradient)",
                      b);
      members.push_back(it->second);
    }
    all_reduce_bucket(s, members, b, buckets.size());
  }
}

void coalesce_partial_grads(RankState& s) {
  if (!s.plan.coalesce_partial_grads) return;
  PhaseScope phase(Phase::Backward);
  std::vector<Tensor> partial;
  for (const auto& [name, p] : s.model->named_parameters()) {
    const Tensor g = p.grad();
    if (!g.defined() || !is_dtensor(g)) continue;
    const Placements& pl = dist_of(g).placements;
    COMMTRACE_CHECK(pl.size() == 1 && dist_of(g).mesh == s.tp, ErrorCode::Internal,
                    "coalesced gradients: {} is not on the plan's 1-D mesh", name);
    if (!pl[0].is_partial()) continue;
    COMMTRACE_CHECK(pl[0].op == ReduceOp::Sum, ErrorCode::Unsupported,
                    "coalesced gradients: {} is {}; only Partial(sum) is coalesced", name,
                    pl[0].str());
    partial.push_back(p);
  }
  if (partial.empty()) return;
  all_reduce_flat(s, partial, s.tp->comm(0), ReduceOp::Sum, true, [&](std::int64_t bytes) {
    return fmt::format(
        "{} Partial gradients ({} bytes) over '{}' in one call (plan '{}': "
        "coalesce_partial_grads)",
        partial.size(), bytes, s.tp->dim_name(0), s.plan.name);
  });
}

void sync_context_parallel_grads(RankState& s) {
  if (!s.cp || s.cp->size(0) == 1) return;
  PhaseScope phase(Phase::Backward);
  std::vector<Tensor> params;
  for (const auto& [name, p] : s.model->named_parameters()) {
    if (p.grad().defined()) params.push_back(p);
  }
  if (params.empty()) return;
  const bool avg = s.plan.context_parallel->param_grad_reduction == "avg";
  all_reduce_flat(s, params, s.cp->comm(0), avg ? ReduceOp::Avg : ReduceOp::Sum, false,
                  [&](std::int64_t bytes) {
                    return fmt::format(
                        "context parallel: {} parameter gradients ({} bytes) {} over '{}' in one "
                        "call",
                        params.size(), bytes, avg ? "averaged" : "summed", s.cp->dim_name(0));
                  });
}

void finish_backward(RankState& s) {
  coalesce_partial_grads(s);
  sync_context_parallel_grads(s);
  if (s.fsdp) {
    s.fsdp->finish_backward();
  } else {
    sync_data_parallel_grads(s);
  }
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

  // Slot i: the trace of traced[i], when this process ran that rank.
  std::vector<std::optional<Trace>> traces(traced.size());
  std::vector<double> rank0_losses;
  std::mutex mu;
  LaunchOptions lo;
  lo.launcher = launcher_for(cfg.backend);
  lo.backend = cfg.backend;
  lo.timeout_s = cfg.timeout_s;
  if (cfg.backend == "fake") lo.ranks = traced;
  launch(
      cfg.world_size,
      [&](RankContext& ctx) {
        RankState s = setup_rank(ctx, cfg);
        AdamW opt(optimizer_parameters(s), opts.lr);
        const auto slot = std::find(traced.begin(), traced.end(), ctx.rank());
        Tracer tr(ctx.rank());
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

Values reference_run(const ParallelConfig& cfg, const Plan& plan, int dp, int tp) {
  const ModelEntry& entry = resolve_model(cfg.model);
  auto model = entry.build(cfg.seed, cfg.module);
  Batch b = entry.batch(cfg.seed, cfg.module, global_rows_scale(plan, dp, tp));
  const bool input_grad = cfg.input_requires_grad && is_floating(b.input.dtype());
  if (input_grad) b.input.set_requires_grad(true);
  Tensor out = (*model)(b.input);
  // The reference is the loss over the whole batch on one device, except that DDP's average
  // over dp (PyTorch's, not a plan's choice) is taken as given: a "sum" loss is divided by dp
  // (a mean already is the mean of the replicas' means). A context-parallel reduction is what
  // verify checks: "avg" is exact for mean losses, "sum" for a sum.
  Tensor loss = entry.loss(out, b);
  if (entry.loss_name == "sum" && dp > 1) loss = mul(loss, 1.0 / dp);
  loss.backward();
  Values v;
  v["output"] = out.to_vector();
  for (const auto& [name, p] : model->named_parameters()) {
    if (!p.requires_grad()) continue;  // frozen
    v[name + ".grad"] = p.grad().defined() ? p.grad().to_vector()
                                           : std::vector<double>(std::size_t(p.numel()), 0.0);
  }
  if (input_grad) v["input.grad"] = b.input.grad().to_vector();
  return v;
}

}  // namespace

double default_tolerance(DType dt, bool tf32) {
  if (dt == DType::BF16) return 5e-2;
  return dt == DType::F32 && tf32 ? 1e-2 : 1e-5;
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
        Values mine;
        Tensor output = step.output;
        if (s.cp) {  // this rank's sub-sequence of every row: joined along dim 1 first
          NoGradGuard no_grad;
          Shape global = output.shape();
          global[1] *= s.cp->size(0);
          output = full_tensor(from_local(output, s.cp, {Placement::shard(1)}, global));
        }
        mine["output"] = gather_full(s, output, true).to_vector();
        for (const auto& [name, p] : s.model->named_parameters()) {
          if (!p.requires_grad()) continue;  // frozen
          const Tensor g = parameter_grad(s, name, p);
          mine[name + ".grad"] = g.defined() ? gather_full(s, g, false).to_vector()
                                             : std::vector<double>(std::size_t(p.numel()), 0.0);
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
          mine["input.grad"] = (s.dp ? mul(g, 1.0 / s.dp->size()) : g).to_vector();
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
