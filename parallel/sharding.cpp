#include "parallel/sharding.h"

#include <limits>

#include "tracer/tracer.h"

namespace commtrace {

namespace {

Placement dim_placement(const Tensor& t, int mesh_dim) {
  if (!is_dtensor(t)) return Placement::replicate();
  return dist_of(t).placements[std::size_t(mesh_dim)];
}

// Maps a shard of the broadcast result (rank `out_rank`) onto an input of `in_shape`; a
// broadcast dim (size 1 against a larger size) cannot hold a shard.
Placement map_to_input(const Placement& out, int out_rank, const Shape& out_shape,
                       const Shape& in_shape) {
  if (!out.is_shard()) return out;
  const int aligned = out.dim - (out_rank - int(in_shape.size()));
  if (aligned < 0) return Placement::replicate();
  if (in_shape[std::size_t(aligned)] != out_shape[std::size_t(out.dim)]) {
    return Placement::replicate();
  }
  return Placement::shard(aligned);
}

}  // namespace

RecordedArgs::RecordedArgs(const std::vector<Tensor>& inputs,
                           const detail::Transposed& transposed) {
  views_.reserve(inputs.size());
  std::size_t k = 0;
  bool first = true;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (first) first_dtype_ = t.dtype();
    first = false;
    const bool trans = !transposed.empty() && transposed[k++] && t.dim() >= 2;
    const DistSpec* d = is_dtensor(t) ? &dist_of(t) : nullptr;
    if (!trans) {
      views_.push_back(d ? ArgView{d->local.shape(), t.shape(), d->placements}
                         : ArgView{t.shape(), {}, {}});
      continue;
    }
    auto swap_last = [](Shape s) {
      std::swap(s[s.size() - 2], s[s.size() - 1]);
      return s;
    };
    Swapped& sw = swapped_.emplace_back();
    sw.shape = swap_last(d ? d->local.shape() : t.shape());
    sw.global = swap_last(t.shape());
    if (d) {
      const int last = t.dim() - 1;
      sw.placements = d->placements;
      for (Placement& p : sw.placements) {
        if (p.is_shard() && p.dim >= last - 1) p.dim = p.dim == last ? last - 1 : last;
      }
    }
    views_.push_back(ArgView{sw.shape, sw.global, sw.placements});
  }
}

ArgView result_view(const Tensor& local, const Shape& global, const Placements& placements) {
  return ArgView{local.shape(), global, placements};
}

Tensor wrap_like(const Tensor& aux_local, const Tensor& like, const Shape& global,
                 Placements placements) {
  if (!is_dtensor(like)) return aux_local;
  return wrap_dtensor(aux_local, dist_of(like).mesh, std::move(placements), global);
}

ShardingRule replicate_rule() {
  return {
      [](const std::vector<Tensor>& in, const std::vector<Placement>&, const DeviceMesh&, int) {
        return std::vector<DimStrategy>{
            {std::vector<Placement>(in.size(), Placement::replicate()), Placement::replicate()}};
      },
      nullptr};
}

ShardingRule pointwise_rule(bool linear) {
  return {
      [linear](const std::vector<Tensor>& in, const std::vector<Placement>& cur, const DeviceMesh&,
               int) {
        Shape common;
        int follow = -1, follow_shards = -1, follow_rank = -1;
        for (std::size_t i = 0; i < in.size(); ++i) {
          if (!in[i].defined()) continue;
          const Shape& s = in[i].shape();
          if (s.size() > common.size()) common.insert(common.begin(), s.size() - common.size(), 1);
          for (std::size_t k = 0; k < s.size(); ++k) {
            auto& c = common[common.size() - s.size() + k];
            if (c == 1) c = s[k];
          }
          if (!is_dtensor(in[i])) continue;
          const int shards = cur[i].is_shard() ? 1 : 0;
          if (shards > follow_shards || (shards == follow_shards && in[i].dim() > follow_rank)) {
            follow = int(i);
            follow_shards = shards;
            follow_rank = in[i].dim();
          }
        }
        const int rank = int(common.size());
        Placement out = cur[std::size_t(follow)];
        if (out.is_shard()) out = Placement::shard(out.dim + rank - follow_rank);
        if (out.is_partial() && !linear) out = Placement::replicate();
        DimStrategy s{{}, out};
        for (const Tensor& t : in) {
          s.inputs.push_back(t.defined() ? map_to_input(out, rank, common, t.shape())
                                         : Placement::replicate());
        }
        return std::vector<DimStrategy>{s};
      },
      nullptr};
}

ShardingRule matmul_rule(int rank, bool trans_a, bool trans_b, bool has_bias) {
  return {
      [=](const std::vector<Tensor>& in, const std::vector<Placement>&, const DeviceMesh&, int) {
        // Logical (out, op(a), op(b)) candidates in PyTorch's einsum order: replicate,
        // batch, contracting, lhs free, rhs free.
        const int m = rank - 2, last = rank - 1;
        auto S = [](int d) { return Placement::shard(d); };
        const Placement R = Placement::replicate(), P = Placement::partial();
        std::vector<std::array<Placement, 3>> logical{{R, R, R}};
        if (rank == 3) logical.push_back({S(0), S(0), S(0)});
        logical.push_back({P, S(last), S(m)});
        logical.push_back({S(m), S(m), R});
        logical.push_back({S(last), R, S(last)});
        // A transposed operand stores its last two dims swapped.
        auto stored = [&](Placement p, bool trans) {
          if (trans && p.is_shard() && p.dim >= m) p.dim = p.dim == m ? last : m;
          return p;
        };
        std::vector<DimStrategy> out;
        for (const auto& [o, a, b] : logical) {
          DimStrategy s;
          s.output = o;
          if (has_bias) {
            // The bias broadcasts over the output: it holds a shard only on a real dim.
            const Tensor& bias = in[0];
            Placement bp = o;
            if (o.is_shard()) {
              const int aligned = o.dim - (rank - bias.dim());
              bp = aligned >= 0 && bias.shape()[std::size_t(aligned)] != 1
                       ? Placement::shard(aligned)
                       : R;
            }
            s.inputs.push_back(bp);
          }
          s.inputs.push_back(stored(a, trans_a));
          s.inputs.push_back(stored(b, trans_b));
          out.push_back(s);
        }
        return out;
      },
      nullptr};
}

ShardingRule follow_rule(std::vector<int> replicate_dims, bool linear, bool prefix) {
  return {[=](const std::vector<Tensor>& in, const std::vector<Placement>& cur, const DeviceMesh&,
              int) {
            const int rank0 = in[0].dim();
            Placement p = cur[0];
            for (int d : replicate_dims) {
              const int nd = d < 0 ? d + rank0 : d;
              if (p.is_shard(nd)) p = Placement::replicate();
            }
            if (p.is_partial() && !linear) p = Placement::replicate();
            DimStrategy s{{}, p};
            for (const Tensor& t : in) {
              Placement q = Placement::replicate();
              if (t.defined() && t.dim() == rank0) {
                q = p;
              } else if (t.defined() && prefix && t.dim() == rank0 - 1 && p.is_shard() &&
                         p.dim < t.dim()) {
                q = p;
              }
              s.inputs.push_back(q);
            }
            return std::vector<DimStrategy>{s};
          },
          nullptr};
}

ShardingRule transpose_rule(int d0, int d1) {
  return {
      [=](const std::vector<Tensor>&, const std::vector<Placement>& cur, const DeviceMesh&, int) {
        Placement out = cur[0];
        if (out.is_shard(d0)) {
          out.dim = d1;
        } else if (out.is_shard(d1)) {
          out.dim = d0;
        }
        return std::vector<DimStrategy>{{{cur[0]}, out}};
      },
      nullptr};
}

ShardingRule reduce_rule(std::vector<int> dims, bool keepdim) {
  return {
      [=](const std::vector<Tensor>&, const std::vector<Placement>& cur, const DeviceMesh&, int) {
        const Placement p = cur[0];
        Placement out = p;
        if (p.is_shard()) {
          int before = 0;
          bool reduced = false;
          for (int d : dims) {
            if (d == p.dim) reduced = true;
            if (d < p.dim) ++before;
          }
          out = reduced ? Placement::partial() : Placement::shard(keepdim ? p.dim : p.dim - before);
        } else if (p.is_partial() && p.op != ReduceOp::Sum) {
          return std::vector<DimStrategy>{{{Placement::replicate()}, Placement::replicate()}};
        }
        return std::vector<DimStrategy>{{{p}, out}};
      },
      nullptr};
}

ShardingRule expand_rule(int added_dims) {
  return {[=](const std::vector<Tensor>& in, const std::vector<Placement>& cur, const DeviceMesh&,
              int) {
            Placement p = cur[0];
            if (p.is_shard() && in[0].shape()[std::size_t(p.dim)] == 1) p = Placement::replicate();
            Placement out = p.is_shard() ? Placement::shard(p.dim + added_dims) : p;
            return std::vector<DimStrategy>{{{p}, out}};
          },
          nullptr};
}

namespace detail {

Tensor dispatch_dtensor(const OpDef& op, const std::vector<Tensor>& inputs, const Compute& compute,
                        const Transposed& transposed, const ShardingRule* rule) {
  std::shared_ptr<const DeviceMesh> mesh;
  for (const Tensor& t : inputs) {
    if (!is_dtensor(t)) continue;
    const auto& m = dist_of(t).mesh;
    if (!mesh) mesh = m;
    COMMTRACE_CHECK(m == mesh, ErrorCode::InvalidArgument,
                    "{}: DTensor inputs on different meshes: {} and {}", op.name, mesh->str(),
                    m->str());
  }
  for (const Tensor& t : inputs) {
    COMMTRACE_CHECK(!t.defined() || is_dtensor(t) || t.dim() == 0 || t.dtype() == DType::I64,
                    ErrorCode::InvalidArgument,
                    "{}: mixes DTensor and plain tensor {} (wrap it with from_local)", op.name,
                    describe(t));
  }
  static const ShardingRule kReplicate = replicate_rule();
  const ShardingRule& r = rule ? *rule : kReplicate;

  // Candidates per mesh dim, expanded over the mesh; the cheapest wins, the first on ties.
  const int ndim = mesh->ndim();
  std::vector<std::vector<DimStrategy>> per_dim(static_cast<std::size_t>(ndim));
  for (int d = 0; d < ndim; ++d) {
    std::vector<Placement> cur;
    for (const Tensor& t : inputs) cur.push_back(dim_placement(t, d));
    per_dim[std::size_t(d)] = r.rule(inputs, cur, *mesh, d);
    COMMTRACE_CHECK(!per_dim[std::size_t(d)].empty(), ErrorCode::Internal,
                    "{}: sharding rule gave no strategy", op.name);
  }
  std::vector<std::size_t> pick(std::size_t(ndim), 0), best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (;;) {
    double cost = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (!is_dtensor(inputs[i])) continue;
      Placements target;
      for (int d = 0; d < ndim; ++d)
        target.push_back(per_dim[std::size_t(d)][pick[std::size_t(d)]].inputs[i]);
      cost += redistribute_cost(inputs[i].shape(), inputs[i].dtype(), *mesh,
                                dist_of(inputs[i]).placements, target);
    }
    if (cost < best_cost) {
      best_cost = cost;
      best = pick;
    }
    int d = ndim - 1;
    while (d >= 0 && ++pick[std::size_t(d)] == per_dim[std::size_t(d)].size())
      pick[std::size_t(d--)] = 0;
    if (d < 0) break;
  }
  COMMTRACE_CHECK(!best.empty(), ErrorCode::Unsupported,
                  "{}: no sharding strategy fits these inputs", op.name);
  std::vector<Placements> targets(inputs.size());
  Placements out_pl;
  for (int d = 0; d < ndim; ++d) {
    const DimStrategy& s = per_dim[std::size_t(d)][best[std::size_t(d)]];
    out_pl.push_back(s.output);
    for (std::size_t i = 0; i < inputs.size(); ++i) targets[i].push_back(s.inputs[i]);
  }

  Tracer* tracer = Tracer::current();
  std::uint32_t record_at = 0;
  if (tracer) {
    const RecordedArgs args(inputs, transposed);
    EventView e;
    e.kind = op.kind;
    e.name = op.name;
    e.overload = op.overload;
    e.dtype = args.first_dtype();
    e.sharded = true;
    e.mesh = &mesh->info();
    e.inputs = args.views();
    record_at = tracer->begin(e);
  }

  std::vector<Tensor> locals, metas;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!is_dtensor(t)) {
      locals.push_back(t);
      metas.push_back(t.defined() ? Tensor::empty(t.shape(), t.dtype(), Device::Meta) : t);
      continue;
    }
    const DistSpec& spec = dist_of(t);
    locals.push_back(redistribute_local(spec.local, t.shape(), *mesh, spec.placements, targets[i],
                                        tracer ? fmt::format("{} input {}", op.name, i) : ""));
    metas.push_back(Tensor::empty(t.shape(), t.dtype(), Device::Meta));
  }
  const Shape global = compute(metas).shape();
  Tensor local;
  if (r.local_compute) {
    local = dispatch(
        op, locals,
        [&](const std::vector<Tensor>& in) { return r.local_compute(in, out_pl, *mesh); },
        transposed);
  } else {
    local = dispatch(op, locals, compute, transposed);
  }
  Tensor out = wrap_dtensor(local, mesh, out_pl, global);
  if (tracer) {
    const ArgView result = result_view(local, global, out_pl);
    tracer->add_outputs(record_at, {&result, 1});
  }
  return out;
}

}  // namespace detail
}  // namespace commtrace
