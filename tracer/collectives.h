// The per-collective table (nccl-tests' descriptor rows): one row per collective holds its
// canonical name, PyTorch's CommDebugMode key and aliases, how its buffers relate (the argument
// checks), which buffer its byte count comes from and its bus-bandwidth factor. Communicators,
// backends, the tracer and the reports all read this table; nothing else knows these facts.
#pragma once

#include <cstdint>
#include <string_view>

namespace commtrace {

// Serialized by name; the values are stable.
enum class Collective : std::uint8_t {
  AllReduce = 0,
  AllGather = 1,
  ReduceScatter = 2,
  AllToAll = 3,
  Broadcast = 4,
  Send = 5,
  Recv = 6,
  Barrier = 7,
};
inline constexpr int kCollectiveCount = 8;

// How a call's buffers relate; n is the group size, chunks split dim 0.
enum class BufferRule : std::uint8_t {
  InPlace,   // one buffer t of any shape (all_reduce, broadcast)
  Gather,    // out = n × in along dim 0 (all_gather)
  Scatter,   // in = n × out along dim 0 (reduce_scatter)
  Exchange,  // out has in's shape, dim 0 divisible by n (all_to_all)
  Send,      // one input buffer, a peer
  Recv,      // one output buffer, a peer
  None,      // no buffer (barrier)
};

// nccl-tests' S: the bytes of this buffer (the total buffer for all_gather and reduce_scatter).
enum class ByteSource : std::uint8_t { Input, Output, None };

struct CollectiveSpec {
  Collective op;
  const char* name;            // canonical: "all_reduce"
  const char* torch_name;      // CommDebugMode key: "c10d_functional.all_reduce"
  const char* const* aliases;  // other PyTorch keys (c10d and coalesced variants), null-ended
  BufferRule buffers;
  ByteSource bytes;
  bool reduces;  // takes a reduce op (sum, avg, max)
  bool rooted;   // takes a root group rank
  bool p2p;      // takes a peer group rank; sequence numbers count per peer and direction
  // busbw = algbw × factor(n): all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all
  // (n−1)/n; broadcast, send, recv 1; barrier 0.
  double (*busbw_factor)(int n);
};

const CollectiveSpec& collective_spec(Collective c);
// The row of a canonical name, a PyTorch key or an alias; null when none matches.
const CollectiveSpec* find_collective(std::string_view name);
// Throws InvalidArgument naming `name` when it is no collective.
Collective parse_collective(std::string_view name);
const char* collective_name(Collective c);  // canonical
// REQUIRES n >= 1 (else InvalidArgument).
double busbw_factor(Collective c, int n);

}  // namespace commtrace
