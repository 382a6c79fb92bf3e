#include "parallel/placement.h"

#include <algorithm>
#include <cctype>

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

std::int64_t chunk_capacity(std::int64_t n, int w) { return (n + w - 1) / w; }

ChunkRange chunk_range(std::int64_t n, int w, int i) {
  const std::int64_t cap = chunk_capacity(n, w);
  const std::int64_t begin = std::min(n, cap * i);
  return {begin, std::min(n, begin + cap) - begin};
}

}  // namespace commtrace
