// DeviceMesh: this rank's view of an N-D grid of ranks (row-major), with a name and a
// communicator per dim. On a 2×4 mesh named ("dp", "tp"), rank 6 sits at (1, 2); its "tp" group
// is ranks {4, 5, 6, 7} and its "dp" group {2, 6}. Sub-meshes of one dim share its communicator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/comm.h"

namespace commtrace {

class RankContext;

// The most dims a mesh may have (placement lists live in fixed arrays on the hot paths).
inline constexpr int kMaxMeshDims = 8;

class DeviceMesh {
 public:
  // names: one per dim, distinct; empty gives commtrace's defaults ("tp"; "dp", "tp"; "dim0",
  // ...), which PyTorch's repr does not show. device_type: what the mesh's repr and the trace
  // name (PyTorch's DeviceMesh("cuda", ...)). REQUIRES: the product of shape equals
  // ctx.world_size(); every dim size >= 1.
  DeviceMesh(RankContext& ctx, std::vector<int> shape, std::vector<std::string> names = {},
             Device device_type = Device::CPU);

  // The 1-D mesh of one dim (e.g. "tp" of a dp × tp mesh), sharing its communicator.
  std::shared_ptr<DeviceMesh> sub(int dim) const;

  int ndim() const { return int(shape_.size()); }
  int size(int dim) const { return shape_.at(std::size_t(dim)); }
  int size() const;  // all ranks
  const std::vector<int>& shape() const { return shape_; }
  const std::string& dim_name(int dim) const { return names_.at(std::size_t(dim)); }
  int find_dim(const std::string& name) const;  // throws naming the known dims
  int rank() const { return rank_; }            // global rank
  int coordinate(int dim) const { return coord_.at(std::size_t(dim)); }
  Communicator& comm(int dim) const { return *comms_.at(std::size_t(dim)); }
  // The mesh as trace data, and PyTorch's repr of it: "DeviceMesh((4,), 'cpu', stride=(1,))".
  const MeshInfo& info() const { return info_; }
  const std::string& str() const { return repr_; }
  // Unique to this object in the process (never reused): how the tracer recognizes it.
  std::uint64_t uid() const { return uid_; }

 private:
  DeviceMesh() = default;
  void set_info();

  std::vector<int> shape_;
  std::vector<std::string> names_;
  bool named_ = false;
  Device device_ = Device::CPU;
  int rank_ = 0;
  std::vector<int> coord_;
  std::vector<std::shared_ptr<Communicator>> comms_;
  MeshInfo info_;
  std::string repr_;
  std::uint64_t uid_ = 0;
};

// Parses "4", "2x4" or "2x2x2" into a mesh shape; throws on anything else.
std::vector<int> parse_mesh_shape(const std::string& s);

}  // namespace commtrace
