// The DTensor path of the op layer's dispatcher (its DistHooks): an op's rule lists candidate
// strategies per mesh dim; they are expanded over the mesh (the Cartesian product, as DTensor's
// single-dim strategies are) and the one with the lowest redistribute cost wins (PyTorch's cost
// model; the first on ties). That choice, with the outputs' global and local shapes, is the
// op's sharding plan, cached per thread by everything it depends on (PyTorch caches its sharding
// propagation likewise). The inputs are redistributed (traced collectives, outside autograd), the
// op runs once on the local shards, and each output is wrapped with its placements. The op is
// recorded as a sharded op with global shapes before its collectives, keyed by its plan: every
// event it records is a function of the plan, so a repeated iteration matches them by the key.
#include <limits>
#include <vector>

#include "parallel/comm/mesh.h"
#include "parallel/dtensor/dtensor.h"
#include "parallel/dtensor/key_cache.h"
#include "parallel/tensor/op.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {

using PlacementRow = std::array<Placement, kMaxMeshDims>;

// The chosen strategy: per input its target placements, per output its placements (the first
// mesh.ndim() entries of each row).
struct Choice {
  Choice() {}  // NOLINT: rows are written before they are read; unions skip their construction
  union {
    PlacementRow inputs[kMaxRuleInputs];
  };
  union {
    PlacementRow outputs[kMaxOpOutputs];
  };
};

Choice choose(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a,
              const DeviceMesh& mesh) {
  const int ndim = mesh.ndim();
  const auto nd = std::size_t(ndim);
  std::array<Strategies, kMaxMeshDims> per_dim;
  std::array<Placement, kMaxRuleInputs> current;
  for (int d = 0; d < ndim; ++d) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      current[i] =
          is_dtensor(in[i]) ? dist_of(in[i]).placements[std::size_t(d)] : Placement::replicate();
    }
    const RuleArgs r{in, std::span<const Placement>(current.data(), in.size()), mesh.size(d), a};
    Strategies& s = per_dim[std::size_t(d)];
    if (op.rule) {
      op.rule(r, s);
    } else {
      s.add();  // every input and output Replicate
    }
    COMMTRACE_CHECK(s.size() > 0, ErrorCode::Internal, "{}: sharding rule gave no strategy",
                    op.name);
  }
  // The cheapest combination over the mesh, the first on ties.
  std::array<int, kMaxMeshDims> pick{}, best{};
  double best_cost = std::numeric_limits<double>::infinity();
  bool found = false;
  PlacementRow target;
  for (;;) {
    double cost = 0;
    for (std::size_t i = 0; i < in.size() && cost < best_cost; ++i) {
      if (!is_dtensor(in[i])) continue;
      for (std::size_t d = 0; d < nd; ++d) target[d] = per_dim[d][pick[d]].inputs[i];
      cost += redistribute_cost(in[i].shape(), in[i].dtype(), mesh, dist_of(in[i]).placements,
                                {target.data(), nd});
    }
    if (cost < best_cost) {
      best_cost = cost;
      best = pick;
      found = true;
    }
    int d = ndim - 1;
    while (d >= 0 && ++pick[std::size_t(d)] == per_dim[std::size_t(d)].size()) {
      pick[std::size_t(d--)] = 0;
    }
    if (d < 0) break;
  }
  COMMTRACE_CHECK(found, ErrorCode::Unsupported, "{}: no sharding strategy fits these inputs",
                  op.name);
  Choice c;
  for (std::size_t d = 0; d < nd; ++d) {
    const DimStrategy& s = per_dim[d][best[d]];
    for (std::size_t i = 0; i < in.size(); ++i) c.inputs[i][d] = s.inputs[i];
    for (std::size_t o = 0; o < std::size_t(op.n_outputs); ++o) c.outputs[o][d] = s.outputs[o];
  }
  return c;
}

// The outputs' global and local specs and the chosen strategy for one key (plan_key).
struct ShardingPlan {
  std::array<OutSpec, kMaxOpOutputs> global, local;
  Choice choice;
};

// What a sharding plan is a function of (OpDef::shapes and rule read nothing else), as words:
// the mesh, the op, the attrs i, shape and transposed, and per input its definedness, dtype,
// shape, and for a DTensor its local shape and placements.
void plan_key(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a, const DeviceMesh& mesh,
              std::vector<std::int64_t>& w) {
  w.clear();
  w.push_back(std::int64_t(reinterpret_cast<std::uintptr_t>(&op)));
  w.push_back(std::int64_t(mesh.uid()));
  w.insert(w.end(), std::begin(a.i), std::end(a.i));
  w.push_back(std::int64_t(a.transposed));
  w.push_back(a.shape ? std::int64_t(a.shape->size()) : -1);
  if (a.shape) w.insert(w.end(), a.shape->begin(), a.shape->end());
  for (const Tensor& t : in) append_layout(t, w);
}

OpOutputs dispatch_dtensor(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a) {
  std::shared_ptr<const DeviceMesh> mesh;
  std::size_t dtensors = 0;
  for (const Tensor& t : in) {
    if (!is_dtensor(t)) continue;
    ++dtensors;
    const auto& m = dist_of(t).mesh;
    if (!mesh) mesh = m;
    COMMTRACE_CHECK(m == mesh, ErrorCode::InvalidArgument,
                    "{}: DTensor inputs on different meshes: {} and {}", op.name, mesh->str(),
                    m->str());
  }
  for (const Tensor& t : in) {
    COMMTRACE_CHECK(!t.defined() || is_dtensor(t) || t.dim() == 0 || t.dtype() == DType::I64,
                    ErrorCode::InvalidArgument,
                    "{}: mixes DTensor and plain tensor {} (wrap it with from_local)", op.name,
                    describe(t));
  }
  COMMTRACE_CHECK(in.size() <= std::size_t(kMaxRuleInputs), ErrorCode::Unsupported,
                  "{}: {} inputs with {} DTensors; sharded ops take at most {} inputs", op.name,
                  in.size(), dtensors, kMaxRuleInputs);

  const auto nd = std::size_t(mesh->ndim());
  // Sharding plans by key, per thread (a rank's mesh is its own).
  static thread_local KeyedCache<ShardingPlan> cache;
  static thread_local std::vector<std::int64_t> key;
  plan_key(op, in, a, *mesh, key);
  KeyedCache<ShardingPlan>::Entry scratch;
  const KeyedCache<ShardingPlan>::Entry& planned = cache.get(key, scratch, [&](ShardingPlan& p) {
    op.shapes(in, a, p.global.data());
    p.choice = choose(op, in, a, *mesh);
    p.local = p.global;
    for (std::size_t o = 0; o < std::size_t(op.n_outputs); ++o) {
      if (!p.global[o].present) continue;
      p.local[o].shape = local_shape_of(p.global[o].shape, {p.choice.outputs[o].data(), nd}, *mesh);
    }
  });
  const ShardingPlan& plan = planned.value;
  const Choice& c = plan.choice;

  Tracer* tracer = Tracer::current();
  std::uint32_t record = 0;
  // The plan's id keys the event: the head is built only when the key does not match.
  if (tracer && (record = tracer->begin_by_key(planned.id)) == Tracer::kNone) {
    EventHead h;
    h.kind = op.kind;
    h.name = op.name;
    h.overload = op.overload;
    for (const Tensor& t : in) {
      if (t.defined()) {
        h.dtype = t.impl()->dtype;  // defined: no check
        break;
      }
    }
    h.sharded = true;
    h.mesh = &mesh->info();
    h.mesh_key = mesh->uid();
    h.key = planned.id;
    record = tracer->begin(h, [&](auto& sink) {
      describe_inputs(sink, in, a.transposed, [](const Tensor& t) {
        const TensorImpl& i = *t.impl();
        if (!i.dist) return ArgView::plain(i.shape, &i.trace_slot);
        const TensorImpl& local = *i.dist->local.impl();
        return ArgView{local.shape, i.shape, i.dist->placements, &i.trace_slot, &local.trace_slot};
      });
    });
  }

  std::array<Tensor, kMaxRuleInputs> locals;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const Tensor& t = in[i];
    if (!is_dtensor(t)) {
      locals[i] = t;
      continue;
    }
    const DistSpec& spec = dist_of(t);
    locals[i] = redistribute_local(spec.local, t.shape(), *mesh, spec.placements,
                                   {c.inputs[i].data(), nd}, Reason::op_input(op.name, int(i)));
  }
  std::array<OutSpec, kMaxOpOutputs> local = plan.local;  // run_local takes their shapes
  std::array<int, kMaxMeshDims> sizes{}, coords{};
  for (int d = 0; d < mesh->ndim(); ++d) {
    sizes[std::size_t(d)] = mesh->size(d);
    coords[std::size_t(d)] = mesh->coordinate(d);
  }
  const ShardInfo info{std::span<const int>(sizes.data(), std::size_t(mesh->ndim())),
                       std::span<const int>(coords.data(), std::size_t(mesh->ndim())),
                       {c.outputs[0].data(), nd}};
  const OpOutputs shards =
      run_local(op, std::span<const Tensor>(locals.data(), in.size()), a, local.data(), &info);

  OpOutputs out;
  for (int o = 0; o < op.n_outputs; ++o) {
    const Tensor& shard = shards[std::size_t(o)];
    if (!shard.defined()) continue;
    const std::span<const Placement> placements(c.outputs[std::size_t(o)].data(), nd);
    out[std::size_t(o)] =
        wrap_dtensor(shard, mesh, Placements(placements.begin(), placements.end()),
                     plan.global[std::size_t(o)].shape);
  }
  if (tracer) {
    tracer->finish(record, [&](auto& sink) {
      for (std::size_t o = 0; o < std::size_t(op.n_outputs); ++o) {
        const Tensor& shard = shards[o];
        if (!shard.defined()) continue;
        sink.output(ArgView{shard.impl()->shape, plan.global[o].shape,
                            std::span<const Placement>(c.outputs[o].data(), nd),
                            &out[o].impl()->trace_slot, &shard.impl()->trace_slot});
      }
    });
  }
  return out;
}

// Nothing but this handle holds the DTensor's spec, its local tensor, or the local's data.
bool local_unique(const Tensor& t) {
  const auto& dist = t.impl()->dist;
  if (dist.use_count() != 1) return false;
  const Tensor& local = dist->local;
  return local.impl_ptr().use_count() == 1 &&
         (!local.impl()->storage || local.impl()->storage.use_count() == 1);
}

}  // namespace

void install_dtensor_hooks() {
  static const bool installed = [] {
    install_dist_hooks(DistHooks{dispatch_dtensor, local_unique});
    return true;
  }();
  (void)installed;
}

}  // namespace commtrace
