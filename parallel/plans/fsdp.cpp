#include "parallel/plans/fsdp.h"

#include <cmath>
#include <limits>
#include <map>

#include "kernels/backend.h"
#include "parallel/dtensor/dtensor.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/ops.h"
#include "parallel/tensor/rules.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {

struct FsdpParam {
  std::string name;  // root-relative
  Tensor param;      // the registered parameter (a DTensor under TP)
  Tensor local;      // its local tensor: the storage the all_gather fills
  Tensor shard;      // this rank's padded chunk of `local` on dim 0: a leaf, the optimizer's
  std::int64_t rows = 0, chunk = 0, row_numel = 0;
  Reason grad_reason;  // the gradient's redistribution to the parameter's placements
};

struct Unit {
  std::string name;  // "layers.0"; "" for the root
  Module* module = nullptr;
  std::vector<FsdpParam> params;
  std::int64_t shard_numel = 0;  // this rank's all_gather input: every padded chunk
  DType dtype = DType::F32;
  Device device = Device::CPU;
  bool gathered = true;
  bool pending = false;  // a forward with grad ran; its gradients are not reduce-scattered yet
  Reason ag_forward, ag_backward, ag_prefetch, rs;
};

// Writes src's elements into dst's storage (same numel and dtype; nothing on meta).
void copy_into(const Tensor& dst, const Tensor& src) {
  if (dst.is_meta()) return;
  kernels_for(dst.device())
      .copy(dst.data_ptr(), src.data_ptr(), std::size_t(dst.numel()) * dtype_size(dst.dtype()));
}

bool is_block(const std::string& name) {
  constexpr std::string_view prefix = "layers.";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

}  // namespace

struct FullyShard::State {
  std::shared_ptr<const DeviceMesh> mesh;
  int dim = 0;
  FsdpOptions opts;
  std::vector<Unit> units;        // blocks in module order, the root last
  std::vector<int> post_forward;  // units in the order their forward ended, this iteration
  std::vector<Tensor> shards;     // every FsdpParam::shard, in root.named_parameters() order

  Communicator& comm() const { return mesh->comm(dim); }

  CollectiveContext context(const Reason& r, const Tensor& t) const {
    return CollectiveContext{r, {}, {}, &mesh->info(), mesh->uid(), t.shape()};
  }

  void unshard(Unit& u, const Reason& reason) {
    if (u.gathered) return;
    NoGradGuard no_grad;
    const int w = comm().size();
    std::vector<Tensor> parts;
    for (const FsdpParam& p : u.params) parts.push_back(view(p.shard.detach(), {-1}));
    const Tensor in = parts.size() == 1 ? parts[0] : cat(parts, 0);
    Tensor out = Tensor::empty({w * u.shard_numel}, u.dtype, u.device);
    {
      const CollectiveScope scope(context(reason, out));
      comm().all_gather(in, out);
    }
    std::int64_t offset = 0;  // of the parameter's chunk within one rank's block
    for (const FsdpParam& p : u.params) {
      std::vector<Tensor> rows;
      for (int j = 0; j < w; ++j) {
        const ChunkRange c = chunk_range(p.rows, w, j);
        if (c.size > 0)
          rows.push_back(narrow(out, 0, j * u.shard_numel + offset, c.size * p.row_numel));
      }
      copy_into(p.local, rows.size() == 1 ? rows[0] : cat(rows, 0));
      offset += p.chunk * p.row_numel;
    }
    u.gathered = true;
  }

  // Frees the unsharded parameters: their storage holds NaN until the next all_gather.
  void reshard(Unit& u) {
    u.gathered = false;
    if (u.device != Device::CPU) return;
    NoGradGuard no_grad;
    for (const FsdpParam& p : u.params) {
      copy_into(p.local, Tensor::full(p.local.shape(), std::numeric_limits<double>::quiet_NaN(),
                                      p.local.dtype(), p.local.device()));
    }
  }

  void reduce_scatter(Unit& u) {
    NoGradGuard no_grad;
    const int w = comm().size();
    std::vector<Tensor> grads;  // the local gradients, laid out like the local parameters
    bool any = false;
    for (const FsdpParam& p : u.params) {
      Tensor g = p.param.grad();
      if (g.defined() && is_dtensor(g)) {
        const DistSpec& gs = dist_of(g);
        const DistSpec& ps = dist_of(p.param);
        g = gs.placements == ps.placements
                ? gs.local
                : redistribute_local(gs.local, g.shape(), *ps.mesh, gs.placements, ps.placements,
                                     p.grad_reason);
      }
      any = any || g.defined();
      grads.push_back(g);
    }
    if (!any) {  // no gradient reached the unit: nothing to reduce
      u.pending = false;
      reshard(u);
      return;
    }
    // Rank j's block: every parameter's chunk j, padded; a missing gradient counts as zeros.
    std::vector<Tensor> parts;
    for (int j = 0; j < w; ++j) {
      for (std::size_t i = 0; i < u.params.size(); ++i) {
        const FsdpParam& p = u.params[i];
        const ChunkRange c = chunk_range(p.rows, w, j);
        const std::int64_t valid = grads[i].defined() ? c.size * p.row_numel : 0;
        if (valid > 0) {
          parts.push_back(narrow(view(grads[i], {-1}), 0, c.begin * p.row_numel, valid));
        }
        if (p.chunk * p.row_numel > valid) {
          parts.push_back(Tensor::zeros({p.chunk * p.row_numel - valid}, u.dtype, u.device));
        }
      }
    }
    const Tensor in = cat(parts, 0);
    Tensor out = Tensor::empty({u.shard_numel}, u.dtype, u.device);
    {
      const CollectiveScope scope(context(u.rs, in));
      comm().reduce_scatter(in, out, ReduceOp::Avg);
    }
    std::int64_t offset = 0;
    for (FsdpParam& p : u.params) {
      const Tensor g = view(narrow(out, 0, offset, p.chunk * p.row_numel), p.shard.shape());
      offset += p.chunk * p.row_numel;
      const Tensor prev = p.shard.grad();
      p.shard.set_grad(prev.defined() ? add(prev, g) : clone(g));
      p.param.set_grad(Tensor());  // the unsharded gradient is freed
    }
    u.pending = false;
    reshard(u);
  }

  void pre_backward(int i) {
    unshard(units[std::size_t(i)], units[std::size_t(i)].ag_backward);
    // Prefetch: the unit whose forward ended before this one's runs its backward next.
    for (std::size_t k = 1; k < post_forward.size(); ++k) {
      if (post_forward[k] == i) {
        Unit& next = units[std::size_t(post_forward[k - 1])];
        unshard(next, next.ag_prefetch);
        break;
      }
    }
  }

  void post_backward(int i) {
    Unit& u = units[std::size_t(i)];
    if (u.pending) reduce_scatter(u);
  }

  // An identity on x whose backward runs `fn` before handing the gradient on.
  template <class F>
  static Tensor on_backward(const Tensor& x, const char* name, F fn) {
    Tensor out = x.detach();
    out.impl()->origin = x.impl()->origin;
    attach_grad(out, name, {x}, [fn](const Tensor& g) {
      fn();
      return std::vector<Tensor>{g};
    });
    return out;
  }
};

FullyShard::FullyShard(Module& root, std::shared_ptr<const DeviceMesh> mesh, int dim,
                       FsdpOptions opts)
    : state_(std::make_shared<State>()) {
  COMMTRACE_CHECK(mesh && dim >= 0 && dim < mesh->ndim(), ErrorCode::InvalidArgument,
                  "fully_shard: mesh dim {} out of range", dim);
  State& st = *state_;
  st.mesh = std::move(mesh);
  st.dim = dim;
  st.opts = opts;
  auto add_unit = [&](const std::string& name, Module* m) {
    st.units.emplace_back();
    st.units.back().name = name;
    st.units.back().module = m;
  };
  for (auto& [name, m] : root.named_modules()) {
    if (is_block(name)) add_unit(name, m);
  }
  add_unit("", &root);

  const int w = st.comm().size();
  const std::string& dim_name = st.mesh->dim_name(dim);
  for (auto& [name, p] : root.named_parameters()) {
    Unit* owner = &st.units.back();
    for (Unit& u : st.units) {
      if (!u.name.empty() && name.compare(0, u.name.size() + 1, u.name + ".") == 0) owner = &u;
    }
    const Tensor local = is_dtensor(p) ? dist_of(p).local : p;
    COMMTRACE_CHECK(local.dim() >= 1, ErrorCode::Unsupported,
                    "fully_shard: parameter {} is a scalar; FSDP shards dim 0", name);
    if (owner->params.empty()) {
      owner->dtype = local.dtype();
      owner->device = local.device();
    }
    COMMTRACE_CHECK(local.dtype() == owner->dtype, ErrorCode::Unsupported,
                    "fully_shard: unit '{}' mixes dtypes ({} is {}, its first parameter {}); one "
                    "all_gather per unit needs one",
                    owner->name, name, dtype_name(local.dtype()), dtype_name(owner->dtype));
    FsdpParam fp;
    fp.name = name;
    fp.param = p;
    fp.local = local;
    fp.rows = local.size(0);
    fp.row_numel = fp.rows > 0 ? local.numel() / fp.rows : 0;
    fp.chunk = chunk_capacity(fp.rows, w);
    {
      NoGradGuard no_grad;
      const ChunkRange c = chunk_range(fp.rows, w, st.comm().rank());
      Shape pad = local.shape();
      pad[0] = fp.chunk - c.size;
      std::vector<Tensor> parts;
      if (c.size > 0) parts.push_back(narrow(local.detach(), 0, c.begin, c.size));
      if (pad[0] > 0) parts.push_back(Tensor::zeros(pad, local.dtype(), local.device()));
      fp.shard = parts.size() == 1 ? clone(parts[0]) : cat(parts, 0);
      fp.shard.set_requires_grad(true);
    }
    fp.grad_reason = fmt::format(
        "FSDP: gradient of {} to its parameter's placements before the reduce_scatter", name);
    st.shards.push_back(fp.shard);
    owner->shard_numel += fp.chunk * fp.row_numel;
    owner->params.push_back(std::move(fp));
  }

  for (std::size_t i = 0; i < st.units.size(); ++i) {
    Unit& u = st.units[i];
    if (u.params.empty()) continue;
    const std::string what =
        fmt::format("FSDP {} of {} ({} parameters, {} bytes per rank) over '{}'", "{}",
                    u.name.empty() ? root.type() : u.name, u.params.size(),
                    u.shard_numel * std::int64_t(dtype_size(u.dtype)), dim_name);
    auto text = [&](const char* op, const char* when) {
      return Reason(fmt::format(fmt::runtime(what), op) + when);
    };
    u.ag_forward = text("all_gather", " before forward");
    u.ag_backward = text("all_gather", " before backward");
    u.ag_prefetch = text("all_gather", " before backward (prefetched by the unit after it)");
    u.rs = text("reduce_scatter", " after backward (average)");
    st.reshard(u);

    const int index = int(i);
    std::shared_ptr<State> sp = state_;
    u.module->add_pre_hook(
        [sp, index](Module&, const Tensor& x) {
          Unit& unit = sp->units[std::size_t(index)];
          if (std::size_t(index) + 1 == sp->units.size()) sp->post_forward.clear();  // the root
          sp->unshard(unit, unit.ag_forward);
          if (!grad_enabled()) return x;
          unit.pending = true;
          return State::on_backward(x, "FSDPPostBackward",
                                    [sp, index] { sp->post_backward(index); });
        },
        /*prepend=*/true);
    u.module->add_post_hook([sp, index](Module&, const Tensor&, const Tensor& out) {
      sp->post_forward.push_back(index);
      if (sp->opts.reshard_after_forward) sp->reshard(sp->units[std::size_t(index)]);
      if (!grad_enabled()) return out;
      return State::on_backward(out, "FSDPPreBackward", [sp, index] { sp->pre_backward(index); });
    });
  }
}

std::vector<Tensor> FullyShard::sharded_parameters() const { return state_->shards; }

void FullyShard::finish_backward() {
  State& st = *state_;
  for (auto it = st.post_forward.rbegin(); it != st.post_forward.rend(); ++it) {
    Unit& u = st.units[std::size_t(*it)];
    if (!u.pending) continue;
    const PhaseScope phase(Phase::Backward);
    const ModuleScope scope(u.module->fqn(), u.module->type());
    st.reduce_scatter(u);
  }
  st.post_forward.clear();
}

Tensor FullyShard::unsharded_grad(const std::string& name) const {
  const State& st = *state_;
  for (const Unit& u : st.units) {
    for (const FsdpParam& p : u.params) {
      if (p.name != name) continue;
      const Tensor g = p.shard.grad();
      if (!g.defined()) return Tensor();
      NoGradGuard no_grad;
      const int w = st.comm().size();
      Shape shape = g.shape();
      shape[0] *= w;
      Tensor all = Tensor::empty(shape, g.dtype(), g.device());
      st.comm().all_gather(g, all);
      std::vector<Tensor> rows;
      for (int j = 0; j < w; ++j) {
        const ChunkRange c = chunk_range(p.rows, w, j);
        if (c.size > 0) rows.push_back(narrow(all, 0, j * p.chunk, c.size));
      }
      Tensor local = rows.size() == 1 ? clone(rows[0]) : cat(rows, 0);
      if (!is_dtensor(p.param)) return local;
      const DistSpec& d = dist_of(p.param);
      return wrap_dtensor(local, d.mesh, d.placements, p.param.shape());
    }
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("fully_shard: no parameter '{}'", name));
}

std::vector<std::string> FullyShard::units() const {
  std::vector<std::string> out;
  for (const Unit& u : state_->units) out.push_back(u.name);
  return out;
}

}  // namespace commtrace
