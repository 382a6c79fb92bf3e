// The gradient reductions after backward (runner.h): DDP's buckets over "dp", the plan's
// coalesced Partial gradients, the context-parallel reduction over "cp", and their order.
#include <algorithm>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "parallel/run/runner.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

namespace commtrace {

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

}  // namespace commtrace
