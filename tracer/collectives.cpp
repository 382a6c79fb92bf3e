#include "tracer/collectives.h"

#include "kernels/base.h"

namespace commtrace {

const std::vector<CollectiveSpec>& collective_table() {
  static const std::vector<CollectiveSpec> table{
      {"all_reduce",
       "c10d_functional.all_reduce",
       {"c10d.allreduce_", "c10d_functional.all_reduce_coalesced", "c10d.allreduce_coalesced_"}},
      {"all_gather",
       "c10d_functional.all_gather_into_tensor",
       {"c10d._allgather_base_", "c10d.allgather_", "c10d.allgather_coalesced_",
        "c10d.allgather_into_tensor_coalesced_"}},
      {"reduce_scatter",
       "c10d_functional.reduce_scatter_tensor",
       {"c10d._reduce_scatter_base_", "c10d.reduce_scatter_",
        "c10d.reduce_scatter_tensor_coalesced_"}},
      {"all_to_all",
       "_dtensor.shard_dim_alltoall",
       {"c10d.alltoall_", "c10d.alltoall_base_", "c10d_functional.all_to_all_single"}},
      {"broadcast", "c10d_functional.broadcast", {"c10d.broadcast_"}},
      {"send", "c10d.send", {}},
      {"recv", "c10d.recv_", {}},
      {"barrier", "c10d.barrier", {}},
  };
  return table;
}

const CollectiveSpec* find_collective(const std::string& name) {
  for (const CollectiveSpec& c : collective_table()) {
    if (name == c.name || name == c.torch_name) return &c;
    for (const char* a : c.aliases) {
      if (name == a) return &c;
    }
  }
  return nullptr;
}

std::string canonical_collective(const std::string& name) {
  const CollectiveSpec* c = find_collective(name);
  COMMTRACE_CHECK(c != nullptr, ErrorCode::InvalidArgument, "unknown collective '{}'", name);
  return c->name;
}

double busbw_factor(const std::string& name, int n) {
  COMMTRACE_CHECK(n >= 1, ErrorCode::InvalidArgument, "busbw_factor: group size {} must be >= 1",
                  n);
  const std::string c = canonical_collective(name);
  const double nd = double(n);
  if (c == "all_reduce") return 2.0 * (nd - 1.0) / nd;
  if (c == "all_gather" || c == "reduce_scatter" || c == "all_to_all") return (nd - 1.0) / nd;
  if (c == "barrier") return 0.0;
  return 1.0;  // broadcast, send, recv
}

}  // namespace commtrace
