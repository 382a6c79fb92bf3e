// The per-collective table (nccl-tests style): canonical names, PyTorch's CommDebugMode keys and
// the bus-bandwidth factor. One table serves the communicators that record and the reports that
// read (DESIGN §3).
#pragma once

#include <string>
#include <vector>

namespace commtrace {

struct CollectiveSpec {
  const char* name;        // canonical: "all_reduce"
  const char* torch_name;  // CommDebugMode key: "c10d_functional.all_reduce"
  // Extra keys PyTorch uses for the same collective (c10d and coalesced variants).
  std::vector<const char*> aliases;
};

const std::vector<CollectiveSpec>& collective_table();
// Null when `name` is neither a canonical name, a PyTorch key nor an alias.
const CollectiveSpec* find_collective(const std::string& name);
// The canonical name of a canonical or PyTorch name; throws InvalidArgument naming it otherwise.
std::string canonical_collective(const std::string& name);

// nccl-tests: algbw = S / t, busbw = algbw × factor; n is the collective's group size.
// all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all (n−1)/n; broadcast, send, recv 1;
// barrier 0. Throws on an unknown name or n < 1.
double busbw_factor(const std::string& name, int n);

}  // namespace commtrace
