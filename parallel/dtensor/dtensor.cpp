#include "parallel/dtensor/dtensor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "parallel/dtensor/key_cache.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

namespace commtrace {

Placements normalize_placements(Placements p, int rank, const char* what) {
  for (Placement& x : p) {
    if (!x.is_shard()) continue;
    COMMTRACE_CHECK(x.dim >= -rank && x.dim < rank, ErrorCode::InvalidArgument,
                    "{}: Shard(dim={}) is out of range for a {}-d tensor", what, x.dim, rank);
    if (x.dim < 0) x.dim += rank;
  }
  return p;
}

namespace {
std::int64_t placement_word(const Placement& p) {
  return std::int64_t(p.kind) | std::int64_t(p.op) << 8 | std::int64_t(p.dim) << 16;
}

// A tensor's first layout word: its dtype, whether it is a DTensor, and its rank.
std::int64_t layout_word(const TensorImpl& i) {
  return std::int64_t(i.dtype) | (i.dist ? 0x100 : 0) | std::int64_t(i.shape.size()) << 16;
}
}  // namespace

// Its events are a function of redistribute_local's arguments, the mesh standing for its
// communicators, and the reason's parts (interned or static, so equal parts mean an equal text).
// Written in place (it runs for every redistribution a tracer sees outside a keyed op); the local
// tensor is plain, so its layout is append_layout's words for a plain tensor.
std::uint64_t redistribute_key(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                               std::span<const Placement> src, std::span<const Placement> dst,
                               const Reason& reason) {
  static thread_local KeyedCache<char> cache;
  static thread_local std::vector<std::int64_t> key;
  const TensorImpl& l = *local.impl();
  const Shape& shape = l.shape;
  key.resize(8 + shape.size() + global.size() + src.size() + dst.size());
  std::int64_t* w = key.data();
  *w++ = std::int64_t(mesh.uid());
  *w++ = layout_word(l);
  w = std::copy(shape.begin(), shape.end(), w);
  *w++ = std::int64_t(global.size());
  w = std::copy(global.begin(), global.end(), w);
  for (const Placement& p : src) *w++ = placement_word(p);
  for (const Placement& p : dst) *w++ = placement_word(p);
  *w++ = std::int64_t(reinterpret_cast<std::uintptr_t>(reason.prefix));
  *w++ = std::int64_t(reinterpret_cast<std::uintptr_t>(reason.text.data()));
  *w++ = std::int64_t(reinterpret_cast<std::uintptr_t>(reason.op));
  *w++ = std::int64_t(reason.text.size());
  *w++ = reason.index;
  // Every word is written: a word left from an earlier key would make equal arguments miss.
  COMMTRACE_CHECK(w == key.data() + key.size(), ErrorCode::Internal,
                  "redistribute: {} key words written for {}", w - key.data(), key.size());
  KeyedCache<char>::Entry scratch{};
  return cache.get(key, scratch, [](char&) {}).id;
}

void append_layout(const Tensor& t, std::vector<std::int64_t>& key) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  const TensorImpl& i = *t.impl();
  key.push_back(layout_word(i));
  key.insert(key.end(), i.shape.begin(), i.shape.end());
  if (!i.dist) return;
  const Shape& local = i.dist->local.shape();
  key.insert(key.end(), local.begin(), local.end());
  for (const Placement& p : i.dist->placements) key.push_back(placement_word(p));
}

bool is_dtensor(const Tensor& t) { return t.defined() && t.impl()->dist != nullptr; }

const DistSpec& dist_of(const Tensor& t) {
  COMMTRACE_CHECK(is_dtensor(t), ErrorCode::InvalidArgument, "expected a DTensor, got {}",
                  describe(t));
  return *t.impl()->dist;
}

namespace {

// The size of tensor dim `k` as mesh dim `mesh_dim` sees it: after the shards of the earlier
// mesh dims on the same tensor dim (nested torch.chunk splits).
std::int64_t dim_size_at(const Shape& global, std::span<const Placement> p, const DeviceMesh& mesh,
                         int k, int mesh_dim) {
  std::int64_t n = global[std::size_t(k)];
  for (int i = 0; i < mesh_dim; ++i) {
    if (p[std::size_t(i)].is_shard(k)) n = chunk_range(n, mesh.size(i), mesh.coordinate(i)).size;
  }
  return n;
}

void check_placements(std::span<const Placement> p, const DeviceMesh& mesh, int rank,
                      const char* what) {
  COMMTRACE_CHECK(int(p.size()) == mesh.ndim(), ErrorCode::InvalidArgument,
                  "{}: {} placements {} for a {}-d mesh", what, p.size(), placements_str(p),
                  mesh.ndim());
  for (const Placement& x : p) {
    COMMTRACE_CHECK(!x.is_shard() || (x.dim >= 0 && x.dim < rank), ErrorCode::InvalidArgument,
                    "{}: {} is out of range for a {}-d tensor", what, x.str(), rank);
  }
}

// Pads dim 0 of x with zero rows up to `rows`.
Tensor pad_rows(const Tensor& x, std::int64_t rows) {
  if (x.size(0) == rows) return x;
  Shape s = x.shape();
  s[0] = rows - x.size(0);
  return cat({x, Tensor::zeros(s, x.dtype(), x.device())}, 0);
}

Tensor to_front(const Tensor& x, int k) { return k == 0 ? x : transpose(x, 0, k); }

// The w chunks of dim 0 (n rows, torch.chunk split), each zero-padded to the chunk capacity
// and concatenated: the equal-block layout reduce_scatter and all_to_all exchange. torch.chunk
// starts chunk r at row r × capacity, so that layout is x followed by zero rows.
Tensor padded_chunks(const Tensor& x, std::int64_t n, int w) {
  return pad_rows(x, chunk_capacity(n, w) * w);
}

// S(k) → R on one mesh dim: pad to the chunk capacity, all_gather, trim the padding.
Tensor all_gather_dim(const Tensor& x, int k, std::int64_t n, Communicator& comm) {
  const int w = comm.size();
  const std::int64_t cap = chunk_capacity(n, w);
  Tensor xt = pad_rows(to_front(x, k), cap);
  Shape out_shape = xt.shape();
  out_shape[0] = cap * w;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  comm.all_gather(xt, out);
  // Block r holds chunk r, which starts at row r × capacity: the padding is all at the end.
  if (cap * w != n) out = narrow(out, 0, 0, n);
  return to_front(out, k);
}

// P → S(k) on one mesh dim: pad to w × capacity, reduce_scatter, trim this rank's chunk.
Tensor reduce_scatter_dim(const Tensor& x, int k, ReduceOp op, Communicator& comm) {
  const int w = comm.size();
  const std::int64_t n = x.size(k);
  const std::int64_t cap = chunk_capacity(n, w);
  Tensor xt = padded_chunks(to_front(x, k), n, w);
  Shape out_shape = xt.shape();
  out_shape[0] = cap;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  comm.reduce_scatter(xt, out, op);
  const ChunkRange mine = chunk_range(n, w, comm.rank());
  if (mine.size != cap) out = narrow(out, 0, 0, mine.size);
  return to_front(out, k);
}

// S(i) → S(j) on one mesh dim: every rank sends chunk r of dim j to rank r and assembles dim i
// from the pieces it receives. n_i, n_j are the dim sizes this mesh dim splits.
Tensor all_to_all_dim(const Tensor& x, int i, int j, std::int64_t n_i, std::int64_t n_j,
                      Communicator& comm) {
  const int w = comm.size();
  const std::int64_t cap_i = chunk_capacity(n_i, w), cap_j = chunk_capacity(n_j, w);
  // Send buffer: dim j in front, padded to w × cap_j rows; dim i padded to cap_i.
  Tensor xt = to_front(x, j);
  const int pos_i = i == 0 ? j : i;  // where dim i sits after swapping dims 0 and j
  {
    Tensor moved = to_front(xt, pos_i);
    xt = to_front(pad_rows(moved, cap_i), pos_i);
  }
  Tensor send = padded_chunks(xt, n_j, w);
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device());
  comm.all_to_all(send, recv);
  // Block r of recv: rank r's rows of dim i (padded to cap_i) for this rank's chunk of dim j.
  std::vector<Tensor> pieces;
  for (int r = 0; r < w; ++r) {
    const ChunkRange ci = chunk_range(n_i, w, r);
    if (ci.size == 0) continue;
    Tensor block = narrow(recv, 0, std::int64_t(r) * cap_j, cap_j);
    pieces.push_back(narrow(block, pos_i, 0, ci.size));
  }
  Tensor out = cat(pieces, pos_i);
  const ChunkRange mine = chunk_range(n_j, w, comm.rank());
  out = narrow(out, 0, 0, mine.size);
  return to_front(out, j);
}

// Replicate → Partial(sum): every rank keeps x / w, so that the pending sum is x again. A division
// by a 0-d tensor, as DTensor does it (recorded as aten.div.Tensor).
Tensor split_sum(const Tensor& x, int w) {
  return div(x, Tensor::full({}, double(w), x.dtype(), x.device()));
}

// PyTorch's topology constants for one host (GB/s and microseconds).
constexpr double kBandwidthGBs = 87.7;
constexpr double kLatencyUs = 0.6;
constexpr double kBaseLatencyUs = 6.6;

double ring_cost(double bytes_gb, int n, int hops) {
  return kBaseLatencyUs + hops * kLatencyUs + (bytes_gb * hops / n) / kBandwidthGBs * 1e6;
}

}  // namespace

Shape local_shape_of(const Shape& global, std::span<const Placement> placements,
                     const DeviceMesh& mesh) {
  Shape s = global;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const Placement& p = placements[std::size_t(d)];
    if (p.is_shard()) {
      s[std::size_t(p.dim)] =
          chunk_range(s[std::size_t(p.dim)], mesh.size(d), mesh.coordinate(d)).size;
    }
  }
  return s;
}

Tensor wrap_dtensor(Tensor local, std::shared_ptr<const DeviceMesh> mesh, Placements placements,
                    const Shape& global) {
  COMMTRACE_CHECK(local.defined() && !is_dtensor(local), ErrorCode::Internal,
                  "wrap_dtensor: the local part must be a plain tensor");
  install_dtensor_hooks();
  check_placements(placements, *mesh, int(global.size()), "DTensor");
  bool fits = local.dim() == int(global.size());
  for (int k = 0; fits && k < local.dim(); ++k) {
    fits = local.size(k) == dim_size_at(global, placements, *mesh, k, mesh->ndim());
  }
  COMMTRACE_CHECK(fits, ErrorCode::ShapeMismatch,
                  "DTensor: rank {} holds local {} but global {} with {} needs {}", mesh->rank(),
                  describe(local), shape_str(global), placements_str(placements),
                  shape_str(local_shape_of(global, placements, *mesh)));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = global;
  impl->dtype = local.dtype();
  impl->device = local.device();
  auto spec = std::make_shared<DistSpec>();
  spec->mesh = std::move(mesh);
  spec->placements = std::move(placements);
  spec->local = std::move(local);
  impl->dist = std::move(spec);
  return Tensor(std::move(impl));
}

Tensor redistribute_local(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                          std::span<const Placement> src, std::span<const Placement> dst,
                          const Reason& reason) {
  COMMTRACE_CHECK(src.size() == std::size_t(mesh.ndim()) && dst.size() == src.size(),
                  ErrorCode::Internal, "redistribute: {} → {} on a {}-d mesh", placements_str(src),
                  placements_str(dst), mesh.ndim());
  COMMTRACE_CHECK(local.defined() && !local.impl()->dist, ErrorCode::Internal,
                  "redistribute: the local tensor is {}, not a plain tensor",
                  local.defined() ? describe(local) : "undefined");
  if (std::equal(src.begin(), src.end(), dst.begin())) return local;
  NoGradGuard no_grad;
  const Tracer* tracer = Tracer::current();
  KeyedRegion region(
      tracer && !tracer->implying() ? redistribute_key(local, global, mesh, src, dst, reason) : 0);
  Tensor cur = local;
  Placements pl(src.begin(), src.end());
  // Shards are undone innermost mesh dim first (a tensor dim sharded on dims 0 and 1 must be
  // gathered on 1 before 0); every other move then runs outermost first.
  std::vector<int> order;
  for (int d = mesh.ndim() - 1; d >= 0; --d) {
    if (src[std::size_t(d)].is_shard()) order.push_back(d);
  }
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (!src[std::size_t(d)].is_shard()) order.push_back(d);
  }
  for (int d : order) {
    const Placement s = pl[std::size_t(d)], t = dst[std::size_t(d)];
    if (s == t) continue;
    Placements next = pl;
    next[std::size_t(d)] = t;
    // One rank on this dim: every placement holds the whole tensor, and no collective runs
    // (PyTorch's redistribute takes the same shortcut).
    if (mesh.size(d) == 1) {
      pl = next;
      continue;
    }
    const CollectiveScope scope(
        CollectiveContext{reason, pl, next, &mesh.info(), mesh.uid(), global});
    Communicator& comm = mesh.comm(d);
    const int w = comm.size();
    if (s.is_shard() && t.is_replicate()) {
      cur = all_gather_dim(cur, s.dim, dim_size_at(global, pl, mesh, s.dim, d), comm);
    } else if (s.is_shard() && t.is_shard()) {
      cur = all_to_all_dim(cur, s.dim, t.dim, dim_size_at(global, pl, mesh, s.dim, d),
                           dim_size_at(global, pl, mesh, t.dim, d), comm);
    } else if (s.is_replicate() && t.is_shard()) {
      const ChunkRange c = chunk_range(cur.size(t.dim), w, comm.rank());
      cur = narrow(cur, t.dim, c.begin, c.size);
    } else if (s.is_partial() && t.is_replicate()) {
      cur = clone(cur);
      comm.all_reduce(cur, s.op);
    } else if (s.is_partial() && t.is_shard()) {
      cur = reduce_scatter_dim(cur, t.dim, s.op, comm);
    } else if (s.is_replicate() && t.is_partial()) {
      cur = t.op == ReduceOp::Sum ? split_sum(cur, w) : clone(cur);
    } else if (s.is_partial() && t.is_partial()) {
      cur = clone(cur);
      comm.all_reduce(cur, s.op);
      if (t.op == ReduceOp::Sum) cur = split_sum(cur, w);
    } else {
      throw Error(ErrorCode::Unsupported,
                  fmt::format("redistribute: {} → {} on mesh dim '{}' is not supported (a shard "
                              "cannot become Partial)",
                              s.str(), t.str(), mesh.dim_name(d)));
    }
    pl = next;
  }
  region.end();
  return cur;
}

double redistribute_cost(const Shape& global, DType dtype, const DeviceMesh& mesh,
                         std::span<const Placement> src, std::span<const Placement> dst) {
  double shards = 1;
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (src[std::size_t(d)].is_shard()) shards *= mesh.size(d);
  }
  double bytes_gb = double(numel(global)) * double(dtype_size(dtype)) / shards / 1e9;
  double cost = 0;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const Placement& s = src[std::size_t(d)];
    const Placement& t = dst[std::size_t(d)];
    if (s == t) continue;
    const int n = mesh.size(d);
    if (s.is_shard() && t.is_replicate()) {
      bytes_gb *= n;
      cost += ring_cost(bytes_gb, n, n - 1);
    } else if (s.is_shard() && t.is_shard()) {
      cost += ring_cost(bytes_gb, n, n - 1) + 1.0;  // PyTorch's all_to_all penalty
    } else if (s.is_partial() && t.is_replicate()) {
      cost += ring_cost(bytes_gb, n, 2 * (n - 1));
    } else if (s.is_partial() && t.is_shard()) {
      cost += ring_cost(bytes_gb, n, n - 1);
      bytes_gb /= n;
    } else if (s.is_partial() && t.is_partial()) {
      cost += ring_cost(bytes_gb, n, 2 * (n - 1));
    } else if (s.is_shard() && t.is_partial()) {
      return std::numeric_limits<double>::infinity();
    }
  }
  return cost;
}

// ---------------------------------------------------------------- differentiable API

Tensor from_local(const Tensor& local, std::shared_ptr<const DeviceMesh> mesh,
                  Placements placements, std::optional<Shape> global_shape, const Reason& reason) {
  COMMTRACE_CHECK(!is_dtensor(local), ErrorCode::InvalidArgument,
                  "from_local: the input is already a DTensor");
  placements = normalize_placements(std::move(placements), local.dim(), "from_local");
  Shape global = local.shape();
  const ShardOrigin* origin = local.impl()->origin.get();
  if (global_shape) {
    global = *global_shape;
  } else if (origin && origin->mesh == mesh && origin->placements == placements &&
             local_shape_of(origin->global, placements, *mesh) == local.shape()) {
    global = origin->global;
  } else {
    for (int d = 0; d < mesh->ndim(); ++d) {
      const Placement& p = placements[std::size_t(d)];
      if (p.is_shard()) global[std::size_t(p.dim)] *= mesh->size(d);
    }
  }
  Tensor out = wrap_dtensor(local.detach(), mesh, placements, global);
  static const Reason fallback("from_local backward");
  attach_grad(out, "FromLocalBackward", {local},
              [mesh, placements, global, reason](const Tensor& g) {
                const DistSpec& gs = dist_of(g);
                return std::vector<Tensor>{redistribute_local(gs.local, global, *mesh,
                                                              gs.placements, placements,
                                                              reason.empty() ? fallback : reason)};
              });
  return out;
}

Tensor to_local(const Tensor& x) {
  const DistSpec& spec = dist_of(x);
  Tensor out = spec.local.detach();
  out.impl()->origin =
      std::make_shared<ShardOrigin>(ShardOrigin{spec.mesh, spec.placements, x.shape()});
  attach_grad(
      out, "ToLocalBackward", {x},
      [mesh = spec.mesh, placements = spec.placements, global = x.shape()](const Tensor& g) {
        return std::vector<Tensor>{wrap_dtensor(g, mesh, placements, global)};
      });
  return out;
}

Tensor redistribute(const Tensor& x, Placements dst, const Reason& reason) {
  const DistSpec& spec = dist_of(x);
  dst = normalize_placements(std::move(dst), x.dim(), "redistribute");
  check_placements(dst, *spec.mesh, x.dim(), "redistribute");
  if (dst == spec.placements) return x;
  Tensor local =
      redistribute_local(spec.local, x.shape(), *spec.mesh, spec.placements, dst, reason);
  Tensor out = wrap_dtensor(local, spec.mesh, dst, x.shape());
  Placements back = spec.placements;  // the gradient returns to the source; Partial → Replicate
  for (Placement& p : back) {
    if (p.is_partial()) p = Placement::replicate();
  }
  static const Reason fallback("redistribute backward");
  attach_grad(out, "RedistributeBackward", {x},
              [back, reason, global = x.shape()](const Tensor& g) {
                const DistSpec& gs = dist_of(g);
                Tensor l = redistribute_local(gs.local, global, *gs.mesh, gs.placements, back,
                                              Reason::backward_of(reason, fallback));
                return std::vector<Tensor>{wrap_dtensor(l, gs.mesh, back, global)};
              });
  return out;
}

Tensor distribute_tensor(const Tensor& full, std::shared_ptr<const DeviceMesh> mesh,
                         Placements placements) {
  COMMTRACE_CHECK(!is_dtensor(full), ErrorCode::InvalidArgument,
                  "distribute_tensor: the input is already a DTensor");
  placements = normalize_placements(std::move(placements), full.dim(), "distribute_tensor");
  check_placements(placements, *mesh, full.dim(), "distribute_tensor");
  Tensor local = full.detach();
  {
    NoGradGuard no_grad;
    for (int d = 0; d < mesh->ndim(); ++d) {
      const Placement& p = placements[std::size_t(d)];
      COMMTRACE_CHECK(!p.is_partial(), ErrorCode::InvalidArgument,
                      "distribute_tensor: {} is not a valid target (Shard or Replicate)", p.str());
      if (p.is_shard()) {
        const ChunkRange c = chunk_range(local.size(p.dim), mesh->size(d), mesh->coordinate(d));
        local = narrow(local, p.dim, c.begin, c.size);
      }
    }
    if (local.impl()->storage == full.impl()->storage) local = clone(local);  // own storage
  }
  Tensor out = wrap_dtensor(local, mesh, placements, full.shape());
  if (full.requires_grad()) out.set_requires_grad(true);
  return out;
}

Tensor full_tensor(const Tensor& x) {
  const DistSpec& spec = dist_of(x);
  return to_local(
      redistribute(x, Placements(spec.placements.size(), Placement::replicate()), "full_tensor"));
}

}  // namespace commtrace
