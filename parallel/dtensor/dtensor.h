// DTensor: a Tensor whose impl carries a DistSpec (mesh, placements, local shard). Its shape()
// is the GLOBAL shape; its data lives in the local tensor (a plain Tensor). Ops on DTensors go
// through the op layer's one dispatcher, which hands them to this layer's hook (dispatch.cpp:
// the op's sharding rule, the cheapest strategy, redistribution, the op on the local shards).
// The functions here are the differentiable entry points of DESIGN §2 (from_local, to_local,
// redistribute, ...) and the comm-level redistribution they and the hook share.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/mesh.h"
#include "parallel/tensor/rules.h"
#include "parallel/tensor/tensor.h"

namespace commtrace {

// One placement per mesh dim. Placement itself (plain data, its string form and parser) lives in
// tracer/trace.h: records hold placements.
using Placements = std::vector<Placement>;

// Resolves negative shard dims against a tensor rank; throws naming the placement when invalid.
Placements normalize_placements(Placements p, int rank, const char* what);

struct DistSpec {
  std::shared_ptr<const DeviceMesh> mesh;
  Placements placements;  // one per mesh dim, shard dims normalized
  Tensor local;           // plain tensor: this rank's shard (the full value when Replicate)
};

// Where a local tensor came from (see TensorImpl::origin).
struct ShardOrigin {
  std::shared_ptr<const DeviceMesh> mesh;
  Placements placements;
  Shape global;
};

bool is_dtensor(const Tensor& t);
const DistSpec& dist_of(const Tensor& t);  // REQUIRES: is_dtensor(t)

// Appends what a sharding decision reads of `t` to `key`, as words: its definedness, dtype and
// shape, and for a DTensor its local shape and placements (the mesh is the caller's to add).
void append_layout(const Tensor& t, std::vector<std::int64_t>& key);

// The local shape this rank holds for `global` under `placements` (torch.chunk shards).
Shape local_shape_of(const Shape& global, std::span<const Placement> placements,
                     const DeviceMesh& mesh);

// Installs this layer's hooks into the op layer (idempotent; every DTensor is made by
// wrap_dtensor, which calls it).
void install_dtensor_hooks();

// Wraps a local tensor as a DTensor with no autograd link (the dispatcher's building block).
Tensor wrap_dtensor(Tensor local, std::shared_ptr<const DeviceMesh> mesh, Placements placements,
                    const Shape& global);

// ---- differentiable API (DESIGN §2) ----

// No communication. global_shape defaults to the DTensor the local tensor came from (to_local,
// then same-shape ops) when mesh and placements match, else to the even-shard guess (local ×
// mesh size on each sharded dim). Backward: the gradient is redistributed to `placements` and
// handed back as a local tensor (a Partial gradient reaching a Replicate input is all-reduced).
// `reason` names the backward collectives ("from_local backward" when empty).
Tensor from_local(const Tensor& local, std::shared_ptr<const DeviceMesh> mesh,
                  Placements placements, std::optional<Shape> global_shape = std::nullopt,
                  const Reason& reason = {});
// The local shard, sharing storage. Backward wraps the gradient with the forward placements.
Tensor to_local(const Tensor& x);
// Backward: the gradient goes back to the source placements, a Partial source becoming
// Replicate. `reason` names the cause in every collective record.
Tensor redistribute(const Tensor& x, Placements dst, const Reason& reason = {});
// A leaf DTensor holding this rank's shards of a full tensor (Shard/Replicate only).
Tensor distribute_tensor(const Tensor& full, std::shared_ptr<const DeviceMesh> mesh,
                         Placements placements);
// Every shard gathered: redistribute to Replicate everywhere, then to_local (differentiable).
Tensor full_tensor(const Tensor& x);

// ---- comm level (no autograd) ----

// The local tensor after moving from src to dst placements, mesh dim by mesh dim: S→R
// all_gather, P→R all_reduce, P→S reduce_scatter, S(i)→S(j) all_to_all, R→S local chunk,
// R→P(sum) divide by the dim size. Uneven shards are padded for the collective and trimmed.
Tensor redistribute_local(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                          std::span<const Placement> src, std::span<const Placement> dst,
                          const Reason& reason);
// The key of that move's events (redistribute_local's region while a tracer is active): one id,
// never reused, per distinct set of arguments on this thread. REQUIRES: `local` is plain.
std::uint64_t redistribute_key(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                               std::span<const Placement> src, std::span<const Placement> dst,
                               const Reason& reason);
// PyTorch's cost model of that move (microseconds); infinity when not allowed (Shard → Partial).
double redistribute_cost(const Shape& global, DType dtype, const DeviceMesh& mesh,
                         std::span<const Placement> src, std::span<const Placement> dst);

}  // namespace commtrace
