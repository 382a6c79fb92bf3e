#include "tracer/collectives.h"

#include "kernels/base.h"

namespace commtrace {

namespace {

double factor_all_reduce(int n) { return 2.0 * (n - 1) / n; }
double factor_ring(int n) { return double(n - 1) / n; }
double factor_one(int) { return 1.0; }
double factor_zero(int) { return 0.0; }

constexpr const char* kAllReduceAliases[] = {
    "c10d.allreduce_", "c10d_functional.all_reduce_coalesced", "c10d.allreduce_coalesced_",
    "_c10d_functional.all_reduce", nullptr};
constexpr const char* kAllGatherAliases[] = {"c10d._allgather_base_",
                                             "c10d.allgather_",
                                             "c10d.allgather_coalesced_",
                                             "c10d.allgather_into_tensor_coalesced_",
                                             "_c10d_functional.all_gather_into_tensor",
                                             nullptr};
constexpr const char* kReduceScatterAliases[] = {
    "c10d._reduce_scatter_base_", "c10d.reduce_scatter_", "c10d.reduce_scatter_tensor_coalesced_",
    "_c10d_functional.reduce_scatter_tensor", nullptr};
constexpr const char* kAllToAllAliases[] = {"c10d.alltoall_", "c10d.alltoall_base_",
                                            "c10d_functional.all_to_all_single",
                                            "_c10d_functional.all_to_all_single", nullptr};
constexpr const char* kBroadcastAliases[] = {"c10d.broadcast_", "_c10d_functional.broadcast",
                                             nullptr};
constexpr const char* kNone[] = {nullptr};

using B = BufferRule;
using S = ByteSource;
constexpr CollectiveSpec kTable[kCollectiveCount] = {
    {Collective::AllReduce, "all_reduce", "c10d_functional.all_reduce", kAllReduceAliases,
     B::InPlace, S::Input, true, false, false, factor_all_reduce},
    {Collective::AllGather, "all_gather", "c10d_functional.all_gather_into_tensor",
     kAllGatherAliases, B::Gather, S::Output, false, false, false, factor_ring},
    {Collective::ReduceScatter, "reduce_scatter", "c10d_functional.reduce_scatter_tensor",
     kReduceScatterAliases, B::Scatter, S::Input, true, false, false, factor_ring},
    {Collective::AllToAll, "all_to_all", "_dtensor.shard_dim_alltoall", kAllToAllAliases,
     B::Exchange, S::Input, false, false, false, factor_ring},
    {Collective::Broadcast, "broadcast", "c10d_functional.broadcast", kBroadcastAliases, B::InPlace,
     S::Input, false, true, false, factor_one},
    {Collective::Send, "send", "c10d.send", kNone, B::Send, S::Input, false, false, true,
     factor_one},
    {Collective::Recv, "recv", "c10d.recv_", kNone, B::Recv, S::Output, false, false, true,
     factor_one},
    {Collective::Barrier, "barrier", "c10d.barrier", kNone, B::None, S::None, false, false, false,
     factor_zero},
};

}  // namespace

const CollectiveSpec& collective_spec(Collective c) {
  const auto i = std::size_t(c);
  COMMTRACE_CHECK(i < std::size_t(kCollectiveCount), ErrorCode::Internal, "unknown collective {}",
                  i);
  return kTable[i];
}

const CollectiveSpec* find_collective(std::string_view name) {
  for (const CollectiveSpec& c : kTable) {
    if (name == c.name || name == c.torch_name) return &c;
    for (const char* const* a = c.aliases; *a != nullptr; ++a) {
      if (name == *a) return &c;
    }
  }
  return nullptr;
}

Collective parse_collective(std::string_view name) {
  const CollectiveSpec* c = find_collective(name);
  COMMTRACE_CHECK(c != nullptr, ErrorCode::InvalidArgument, "unknown collective '{}'", name);
  return c->op;
}

const char* collective_name(Collective c) { return collective_spec(c).name; }

double busbw_factor(Collective c, int n) {
  COMMTRACE_CHECK(n >= 1, ErrorCode::InvalidArgument, "busbw_factor: group size {} must be >= 1",
                  n);
  return collective_spec(c).busbw_factor(n);
}

}  // namespace commtrace
