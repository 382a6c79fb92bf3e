#include "parallel/comm/mesh.h"

#include "parallel/comm/launch.h"

namespace commtrace {

DeviceMesh::DeviceMesh(RankContext& ctx, std::vector<int> shape, std::vector<std::string> names)
    : shape_(std::move(shape)), names_(std::move(names)), rank_(ctx.rank()) {
  COMMTRACE_CHECK(shape_.size() == 1 || shape_.size() == 2, ErrorCode::InvalidArgument,
                  "DeviceMesh: {} dims given; 1-D and 2-D meshes are supported", shape_.size());
  int total = 1;
  for (int s : shape_) {
    COMMTRACE_CHECK(s >= 1, ErrorCode::InvalidArgument, "DeviceMesh: dim size {} < 1", s);
    total *= s;
  }
  COMMTRACE_CHECK(total == ctx.world_size(), ErrorCode::InvalidArgument,
                  "DeviceMesh: mesh of {} ranks on a world of {}", total, ctx.world_size());
  named_ = !names_.empty();
  if (!named_) {
    names_ =
        shape_.size() == 1 ? std::vector<std::string>{"tp"} : std::vector<std::string>{"dp", "tp"};
  }
  COMMTRACE_CHECK(names_.size() == shape_.size(), ErrorCode::InvalidArgument,
                  "DeviceMesh: {} names for {} dims", names_.size(), shape_.size());
  COMMTRACE_CHECK(names_.size() == 1 || names_[0] != names_[1], ErrorCode::InvalidArgument,
                  "DeviceMesh: dim names must differ ('{}')", names_[0]);

  // Row-major coordinates; the group of dim d varies coordinate d and fixes the others.
  const int cols = shape_.size() == 2 ? shape_[1] : 1;
  coord_ =
      shape_.size() == 2 ? std::vector<int>{rank_ / cols, rank_ % cols} : std::vector<int>{rank_};
  for (int d = 0; d < ndim(); ++d) {
    std::vector<int> ranks;
    for (int i = 0; i < shape_[std::size_t(d)]; ++i) {
      std::vector<int> c = coord_;
      c[std::size_t(d)] = i;
      ranks.push_back(shape_.size() == 2 ? c[0] * cols + c[1] : c[0]);
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
  info_ = MeshInfo{shape_, names_, named_, Device::CPU};
  repr_ = mesh_str(info_);
}

std::vector<int> parse_mesh_shape(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const auto x = s.find('x', pos);
    const std::string part = s.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    COMMTRACE_CHECK(!part.empty() && used == part.size() && v >= 1, ErrorCode::InvalidArgument,
                    "mesh '{}': expected N or AxB with positive integers", s);
    out.push_back(v);
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  COMMTRACE_CHECK(out.size() <= 2, ErrorCode::InvalidArgument,
                  "mesh '{}': at most 2 dims are supported", s);
  return out;
}

}  // namespace commtrace
