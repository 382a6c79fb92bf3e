// The one roll-up of every report: collective counts and bytes per module and phase, a module's
// counts including its descendants' (CommDebugMode's convention; Global holds the total),
// repeated blocks counted with their repeats. Kept per (collective, group) in order of first
// occurrence, so each report can order and merge as it shows them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

struct OpStat {
  std::int64_t count = 0;
  std::uint64_t bytes = 0;
  double bus_bytes = 0;     // bytes × the busbw factor of the group size (0: size unknown)
  double seconds = 0;       // the records' durations summed (see has_times)
  double estimate_s = 0;    // the cost model's times summed (with a TraceCost)
  unsigned dtype_mask = 0;  // bit d set when a record of DType d is counted
};

// One collective on one group (the group's name and size; "" and 0 from PyTorch dumps). A send
// or recv is counted per direction: `from` → `to` in group ranks (a ring shows as its steps).
struct GroupStat {
  Collective op = Collective::AllReduce;
  std::string group;
  int group_size = 0;
  int from = -1, to = -1;
  OpStat stat;
  // "all_reduce", or "send 0→1" / "recv 3→0" for point-to-point.
  std::string name() const;
};

struct ModuleCounts {
  std::string fqn;
  int depth = 0;
  std::array<std::vector<GroupStat>, kPhaseCount> phases;  // first-occurrence order

  // Summed over groups; zero when absent.
  OpStat op(Phase p, Collective c) const;
  // The collectives of a phase in order of first occurrence.
  std::vector<Collective> ops(Phase p) const;
  bool empty() const;
};

struct CountTree {
  std::vector<ModuleCounts> modules;  // preorder from Global (children in call order)
  bool has_bytes = true;              // false for PyTorch dumps (no bytes)
  bool has_times = true;              // false when the durations measure nothing (has_times())
  bool has_estimates = false;         // counted with a TraceCost
  // Per-iteration counts of a trace whose iterations differ: the counts are those of the last
  // iterations, alike from this one on (0: every iteration is alike).
  int steady_from = 0;
  const ModuleCounts* find(const std::string& fqn) const;
};

class TraceCost;

// With `cost`, each collective's estimated time is summed too.
CountTree collective_counts(const Trace& t, const TraceCost* cost = nullptr);

// The trace's metadata "iterations" (1 when absent). Throws InvalidArgument when it is not a
// positive integer.
int trace_iterations(const Trace& t);
// One iteration's counts. When the trace's blocks are its iterations: their counts if all
// iterations are alike, else the last iterations' (steady_from says from which; DDP's first
// iteration uses one bucket, the later ones its rebuilt buckets). Otherwise (a trace without
// blocks) collective_counts divided by trace_iterations, throwing InvalidArgument naming the
// module, phase and collective when a count or byte total is not a multiple of the iterations.
CountTree collective_counts_per_iteration(const Trace& t, const TraceCost* cost = nullptr);

// Moves the recompute phase's counts into backward, as CommDebugMode counts an activation
// checkpoint's recomputed collectives (they run during backward): for comparisons with a
// PyTorch dump or a baseline made from one.
void fold_recompute_into_backward(CountTree& c);

// Modules in preorder from Global with their depth; unreachable modules (a malformed tree) last.
std::vector<std::pair<int, int>> module_preorder(const Trace& t);

bool is_torch_dump(const Trace& t);  // read from a PyTorch generate_json_dump file
// Whether the records' durations are measured transfer times: not for a PyTorch dump (none), the
// fake backend (moves no data) or the meta device (runs nothing).
bool has_times(const Trace& t);
std::string metadata_of(const Trace& t, const char* key);  // "" when absent

}  // namespace commtrace
