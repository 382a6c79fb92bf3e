// Placements of a DTensor on one mesh dim: Shard(d), Replicate(), Partial(sum|avg|max), and the
// torch.chunk arithmetic of uneven shards (the first ranks get ceil(n/W), trailing ranks may get
// fewer or none). Strings follow PyTorch's repr: "(Shard(dim=0), Replicate())".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base.h"
#include "tracer/trace.h"

namespace commtrace {

struct Placement {
  enum class Kind : int { Shard = 0, Replicate = 1, Partial = 2 };
  Kind kind = Kind::Replicate;
  int dim = 0;                  // Shard: the tensor dim (normalized, >= 0)
  ReduceOp op = ReduceOp::Sum;  // Partial: how pending values combine

  static Placement shard(int d) { return {Kind::Shard, d, ReduceOp::None}; }
  static Placement replicate() { return {Kind::Replicate, 0, ReduceOp::None}; }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return {Kind::Partial, 0, op}; }

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int d) const { return kind == Kind::Shard && dim == d; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool operator==(const Placement& o) const;
  std::string str() const;  // "Shard(dim=0)", "Replicate()", "Partial(sum)"
};

using Placements = std::vector<Placement>;  // one per mesh dim

std::string placements_str(const Placements& p);  // "(Shard(dim=0),)"
// Parses "S(0)", "Shard(0)", "Shard(dim=-1)", "R", "Replicate", "P", "Partial(sum)" ...
// A negative shard dim stays negative until normalize_placements.
Placement parse_placement(const std::string& s);
// Resolves negative shard dims against a tensor rank; throws naming the placement when invalid.
Placements normalize_placements(Placements p, int rank, const char* what);

// The torch.chunk split of n items over w parts: the [begin, begin + size) of part i.
struct ChunkRange {
  std::int64_t begin = 0;
  std::int64_t size = 0;
};
ChunkRange chunk_range(std::int64_t n, int w, int i);
std::int64_t chunk_capacity(std::int64_t n, int w);  // ceil(n / w): every padded chunk's size

}  // namespace commtrace
