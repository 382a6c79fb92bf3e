// Sharding rules shared by several ops, and the torch.chunk arithmetic they and the DTensor layer
// use. A rule lists, for one mesh dim, the placements every input must have and every output
// gets (DTensor's single-dim strategies); the DTensor layer expands them over the mesh and picks
// the cheapest. Each op's own rule (in its family file) calls these with its attributes.
#pragma once

#include <cstdint>
#include <span>

#include "parallel/tensor/op.h"

namespace commtrace {

// The torch.chunk split of n items over w parts: the [begin, begin + size) of part i (the first
// parts get ceil(n/w), trailing ones may get fewer or none).
struct ChunkRange {
  std::int64_t begin = 0;
  std::int64_t size = 0;
};
ChunkRange chunk_range(std::int64_t n, int w, int i);
std::int64_t chunk_capacity(std::int64_t n, int w);  // ceil(n / w): every padded chunk's size

namespace rules {

// Every input and output Replicate.
void replicate(const RuleArgs& r, Strategies& s);
// pointwise() for linear ops (add, sub, a scale: Partial stays Partial) and the others.
void linear_pointwise(const RuleArgs& r, Strategies& s);
void nonlinear_pointwise(const RuleArgs& r, Strategies& s);
// follow() keeping the last dim whole (row-wise ops over it: softmax, layer_norm).
void last_dim_whole(const RuleArgs& r, Strategies& s);
// Elementwise with broadcasting: follows the input with the most shards; a Partial input stays
// Partial only for linear ops (else becomes Replicate). Every output follows.
void pointwise(const RuleArgs& r, bool linear, Strategies& s);
// Keeps input 0's placement except on the (input 0) dims `whole` (made Replicate, Partial too
// unless linear); inputs of the same rank follow it, inputs of lower rank follow on their leading
// dims when `prefix` (layer_norm's statistics) and are Replicate otherwise (parameters). Every
// output follows.
void follow(const RuleArgs& r, std::span<const int> whole, bool linear, bool prefix, Strategies& s);
// Reduction of the sorted dims of input 0, with or without keepdim: a sharded reduced dim makes
// the output Partial(sum); other shards move to their output dim, shifted by `shift`.
void reduce(const RuleArgs& r, std::span<const int> dims, bool keepdim, int shift, Strategies& s);

}  // namespace rules
}  // namespace commtrace
