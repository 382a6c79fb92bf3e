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

// Placement (a plain data type), placements_str and parse_placement live in tracer/trace.h:
// records hold placements.
using Placements = std::vector<Placement>;  // one per mesh dim
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
