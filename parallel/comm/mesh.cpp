#include "parallel/comm/mesh.h"

#include <atomic>
#include <charconv>
#include <limits>
#include <set>

#include "parallel/comm/launch.h"

namespace commtrace {

DeviceMesh::DeviceMesh(RankContext& ctx, std::vector<int> shape, std::vector<std::string> names,
                       Device device_type)
    : shape_(std::move(shape)), names_(std::move(names)), device_(device_type), rank_(ctx.rank()) {
  COMMTRACE_CHECK(!shape_.empty(), ErrorCode::InvalidArgument, "DeviceMesh: no dims given");
  COMMTRACE_CHECK(shape_.size() <= std::size_t(kMaxMeshDims), ErrorCode::InvalidArgument,
                  "DeviceMesh: {} dims; at most {}", shape_.size(), kMaxMeshDims);
  std::int64_t total = 1;
  for (int s : shape_) {
    COMMTRACE_CHECK(s >= 1, ErrorCode::InvalidArgument, "DeviceMesh: dim size {} < 1", s);
    total *= s;
    COMMTRACE_CHECK(total <= ctx.world_size(), ErrorCode::InvalidArgument,
                    "DeviceMesh: mesh {} has more ranks than the world of {}",
                    fmt::join(shape_, "x"), ctx.world_size());
  }
  COMMTRACE_CHECK(total == ctx.world_size(), ErrorCode::InvalidArgument,
                  "DeviceMesh: mesh of {} ranks on a world of {}", total, ctx.world_size());
  named_ = !names_.empty();
  if (!named_) names_ = default_mesh_dim_names(shape_.size());
  COMMTRACE_CHECK(names_.size() == shape_.size(), ErrorCode::InvalidArgument,
                  "DeviceMesh: {} names for {} dims", names_.size(), shape_.size());
  const std::set<std::string> distinct(names_.begin(), names_.end());
  COMMTRACE_CHECK(distinct.size() == names_.size(), ErrorCode::InvalidArgument,
                  "DeviceMesh: dim names must differ ({})", fmt::join(names_, ", "));

  // Row-major coordinates; the group of dim d varies coordinate d and fixes the others.
  const int n = ndim();
  std::vector<int> stride(std::size_t(n), 1);
  for (int d = n - 2; d >= 0; --d) {
    stride[std::size_t(d)] = stride[std::size_t(d + 1)] * shape_[std::size_t(d + 1)];
  }
  coord_.resize(std::size_t(n));
  for (int d = 0; d < n; ++d) {
    coord_[std::size_t(d)] = rank_ / stride[std::size_t(d)] % shape_[std::size_t(d)];
  }
  for (int d = 0; d < n; ++d) {
    const int base = rank_ - coord_[std::size_t(d)] * stride[std::size_t(d)];
    std::vector<int> ranks;
    for (int i = 0; i < shape_[std::size_t(d)]; ++i) {
      ranks.push_back(base + i * stride[std::size_t(d)]);
    }
    comms_.push_back(ctx.new_group(names_[std::size_t(d)], ranks));
  }
  set_info();
}

std::shared_ptr<DeviceMesh> DeviceMesh::sub(int dim) const {
  std::shared_ptr<DeviceMesh> m(new DeviceMesh());
  m->shape_ = {size(dim)};
  m->names_ = {dim_name(dim)};
  m->named_ = named_ || ndim() > 1;
  m->device_ = device_;
  m->rank_ = rank_;
  m->coord_ = {coordinate(dim)};
  m->comms_ = {comms_.at(std::size_t(dim))};
  m->set_info();
  return m;
}

int DeviceMesh::size() const {
  int n = 1;
  for (int s : shape_) n *= s;
  return n;
}

int DeviceMesh::find_dim(const std::string& name) const {
  for (int d = 0; d < ndim(); ++d) {
    if (names_[std::size_t(d)] == name) return d;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("mesh has no dim '{}' (dims: {})", name, fmt::join(names_, ", ")));
}

void DeviceMesh::set_info() {
  static std::atomic<std::uint64_t> next_uid{1};
  info_ = MeshInfo{shape_, names_, named_, device_};
  repr_ = mesh_str(info_);
  uid_ = next_uid.fetch_add(1, std::memory_order_relaxed);
}

std::vector<int> parse_mesh_shape(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const auto x = s.find('x', pos);
    const std::string part = s.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    int v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    COMMTRACE_CHECK(
        !part.empty() && ec == std::errc() && end == part.data() + part.size() && v >= 1,
        ErrorCode::InvalidArgument, "mesh '{}': expected N, AxB or AxBxC... with positive integers",
        s);
    out.push_back(v);
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  return out;
}

}  // namespace commtrace
