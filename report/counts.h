// Collective counts per module and phase, rolled up as CommDebugMode does (a module's counts
// include its descendants'; Global holds the total). The common ground of diff and check: it
// is built the same way from our traces and from PyTorch's dumps.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

struct OpStat {
  int count = 0;
  std::uint64_t bytes = 0;
};
using PhaseCounts = std::map<std::string, OpStat>;  // canonical collective name -> stat

struct ModuleCounts {
  std::string fqn;
  int depth = 0;
  std::array<PhaseCounts, 4> phases;  // indexed by Phase
};

struct CountTree {
  std::vector<ModuleCounts> modules;  // preorder, Global first
  bool has_bytes = true;              // false for PyTorch dumps (no bytes)
  const ModuleCounts* find(const std::string& fqn) const;
};

CountTree collective_counts(const Trace& t);

// The trace's metadata "iterations" (1 when absent). Throws InvalidArgument when it is not a
// positive integer.
int trace_iterations(const Trace& t);
// collective_counts divided by trace_iterations. Throws InvalidArgument naming the module,
// phase and collective when a count or byte total is not a multiple of the iterations.
CountTree collective_counts_per_iteration(const Trace& t);

}  // namespace commtrace
