#include "parallel/placement.h"

#include <algorithm>
#include <cctype>

namespace commtrace {

bool Placement::operator==(const Placement& o) const {
  if (kind != o.kind) return false;
  if (kind == Kind::Shard) return dim == o.dim;
  if (kind == Kind::Partial) return op == o.op;
  return true;
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard:
      return fmt::format("Shard(dim={})", dim);
    case Kind::Replicate:
      return "Replicate()";
    case Kind::Partial:
      return fmt::format("Partial({})", reduce_op_name(op));
  }
  return "?";
}

std::string placements_str(const Placements& p) {
  std::vector<std::string> parts;
  for (const Placement& x : p) parts.push_back(x.str());
  if (parts.size() == 1) return "(" + parts[0] + ",)";
  return fmt::format("({})", fmt::join(parts, ", "));
}

Placement parse_placement(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  }
  const auto open = s.find('(');
  const std::string head = s.substr(0, open);
  std::string arg;
  if (open != std::string::npos) {
    COMMTRACE_CHECK(s.back() == ')', ErrorCode::InvalidArgument, "placement '{}': missing ')'",
                    text);
    arg = s.substr(open + 1, s.size() - open - 2);
  }
  if (head == "R" || head == "Replicate") {
    COMMTRACE_CHECK(arg.empty(), ErrorCode::InvalidArgument,
                    "placement '{}': Replicate takes no argument", text);
    return Placement::replicate();
  }
  if (head == "S" || head == "Shard") {
    if (arg.rfind("dim=", 0) == 0) arg = arg.substr(4);
    try {
      std::size_t used = 0;
      const int d = std::stoi(arg, &used);
      if (used == arg.size()) return Placement::shard(d);
    } catch (const std::exception&) {
    }
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("placement '{}': Shard needs an integer dim, e.g. Shard(0)", text));
  }
  if (head == "P" || head == "Partial") {
    if (arg.rfind("reduce_op=", 0) == 0) arg = arg.substr(10);
    arg.erase(std::remove(arg.begin(), arg.end(), '\''), arg.end());
    if (arg.empty() || arg == "sum") return Placement::partial(ReduceOp::Sum);
    if (arg == "avg") return Placement::partial(ReduceOp::Avg);
    if (arg == "max") return Placement::partial(ReduceOp::Max);
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("placement '{}': Partial takes sum, avg or max", text));
  }
  throw Error(
      ErrorCode::InvalidArgument,
      fmt::format("unknown placement '{}' (expected Shard(d), Replicate() or Partial(op))", text));
}

Placements normalize_placements(Placements p, int rank, const char* what) {
  for (Placement& x : p) {
    if (!x.is_shard()) continue;
    COMMTRACE_CHECK(x.dim >= -rank && x.dim < rank, ErrorCode::InvalidArgument,
                    "{}: Shard(dim={}) is out of range for a {}-d tensor", what, x.dim, rank);
    if (x.dim < 0) x.dim += rank;
  }
  return p;
}

std::int64_t chunk_capacity(std::int64_t n, int w) { return (n + w - 1) / w; }

ChunkRange chunk_range(std::int64_t n, int w, int i) {
  const std::int64_t cap = chunk_capacity(n, w);
  const std::int64_t begin = std::min(n, cap * i);
  return {begin, std::min(n, begin + cap) - begin};
}

}  // namespace commtrace
