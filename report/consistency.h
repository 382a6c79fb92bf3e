// Cross-rank consistency: every rank of a run must issue the same collectives in the same
// order on each group (op, group, sequence number, dtype, global shape, reduce op); every send
// from one traced rank to another meets the receiver's recv of the same number, bytes and dtype
// (peers placed on the run's mesh, the trace metadata's "mesh").
#pragma once

#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

// Empty when consistent; otherwise one line per divergence naming both ranks and both calls.
std::vector<std::string> check_rank_consistency(const std::vector<Trace>& ranks);

}  // namespace commtrace
