#include "parallel/tensor/rules.h"

#include <algorithm>

namespace commtrace {

std::int64_t chunk_capacity(std::int64_t n, int w) { return (n + w - 1) / w; }

ChunkRange chunk_range(std::int64_t n, int w, int i) {
  const std::int64_t cap = chunk_capacity(n, w);
  const std::int64_t begin = std::min(n, cap * i);
  return {begin, std::min(n, begin + cap) - begin};
}

namespace rules {

namespace {

// Maps a shard of the broadcast result (rank `out_rank`, shape `out_shape`) onto an input of
// `in_shape`; a broadcast dim (size 1 against a larger size) cannot hold a shard.
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

void set_outputs(DimStrategy& d, const Placement& p) { d.outputs.fill(p); }

}  // namespace

void replicate(const RuleArgs&, Strategies& s) { s.add(); }

void linear_pointwise(const RuleArgs& r, Strategies& s) { pointwise(r, true, s); }
void nonlinear_pointwise(const RuleArgs& r, Strategies& s) { pointwise(r, false, s); }

void last_dim_whole(const RuleArgs& r, Strategies& s) {
  static constexpr int kLast[] = {-1};
  follow(r, kLast, false, false, s);
}

void pointwise(const RuleArgs& r, bool linear, Strategies& s) {
  Shape common;
  int follow = -1, follow_shards = -1, follow_rank = -1;
  for (std::size_t i = 0; i < r.inputs.size(); ++i) {
    const Tensor& t = r.inputs[i];
    if (!t.defined()) continue;
    const Shape& sh = t.shape();
    if (sh.size() > common.size()) common.insert(common.begin(), sh.size() - common.size(), 1);
    for (std::size_t k = 0; k < sh.size(); ++k) {
      auto& c = common[common.size() - sh.size() + k];
      if (c == 1) c = sh[k];
    }
    if (!t.impl()->dist) continue;
    const int shards = r.current[i].is_shard() ? 1 : 0;
    if (shards > follow_shards || (shards == follow_shards && t.dim() > follow_rank)) {
      follow = int(i);
      follow_shards = shards;
      follow_rank = t.dim();
    }
  }
  const int rank = int(common.size());
  Placement out = r.current[std::size_t(follow)];
  if (out.is_shard()) out = Placement::shard(out.dim + rank - follow_rank);
  if (out.is_partial() && !linear) out = Placement::replicate();
  DimStrategy& d = s.add();
  set_outputs(d, out);
  for (std::size_t i = 0; i < r.inputs.size(); ++i) {
    const Tensor& t = r.inputs[i];
    d.inputs[i] = t.defined() ? map_to_input(out, rank, common, t.shape()) : Placement::replicate();
  }
}

void follow(const RuleArgs& r, std::span<const int> whole, bool linear, bool prefix,
            Strategies& s) {
  const int rank0 = r.inputs[0].dim();
  Placement p = r.current[0];
  for (int d : whole) {
    const int nd = d < 0 ? d + rank0 : d;
    if (p.is_shard(nd)) p = Placement::replicate();
  }
  if (p.is_partial() && !linear) p = Placement::replicate();
  DimStrategy& d = s.add();
  set_outputs(d, p);
  for (std::size_t i = 0; i < r.inputs.size(); ++i) {
    const Tensor& t = r.inputs[i];
    Placement q = Placement::replicate();
    if (t.defined() && t.dim() == rank0) {
      q = p;
    } else if (t.defined() && prefix && t.dim() == rank0 - 1 && p.is_shard() && p.dim < t.dim()) {
      q = p;
    }
    d.inputs[i] = q;
  }
}

void reduce(const RuleArgs& r, std::span<const int> dims, bool keepdim, int shift, Strategies& s) {
  const Placement p = r.current[0];
  Placement out = p;
  if (p.is_shard()) {
    int before = 0;
    bool reduced = false;
    for (int d : dims) {
      if (d == p.dim) reduced = true;
      if (d < p.dim) ++before;
    }
    out = reduced ? Placement::partial()
                  : Placement::shard((keepdim ? p.dim : p.dim - before) - shift);
  } else if (p.is_partial() && p.op != ReduceOp::Sum) {
    s.add();  // max/avg partials do not commute with a sum: all Replicate
    return;
  }
  DimStrategy& d = s.add();
  d.inputs[0] = p;
  set_outputs(d, out);
}

}  // namespace rules
}  // namespace commtrace
