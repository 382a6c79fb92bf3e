// commtrace's own text report: the module tree with, per phase, the collectives (count, bytes,
// group) and at higher noise the ops with shapes, shardings and mesh; the reasons with
// `explain`; and the per-iteration summary (op, count, bytes, bus bytes, time, bandwidth, and
// with a topology the cost model's estimate).
#pragma once

#include <string>

#include "tracer/trace.h"

namespace commtrace {

class TraceCost;

struct TreeOptions {
  int noise = 0;
  bool explain = false;  // the reason of every collective (also shown at noise >= 1)
  bool color = false;
  const TraceCost* cost = nullptr;  // estimated times per module and phase (--topology)
};

std::string render_tree(const Trace& t, const TreeOptions& options);
// Per iteration (counts and bytes divided by metadata "iterations"); with `cost`, an estimated
// time per row, per phase and for the iteration.
std::string render_summary(const Trace& t, const TraceCost* cost = nullptr);
// The rank's memory per module, rolled up (a module includes its descendants): parameters,
// gradients, optimizer state, activations saved for backward; "" when the trace has none.
std::string render_memory(const Trace& t);
// Global's memory rolled up (the rank's totals); zeros when the trace has none.
ModuleMemory memory_total(const Trace& t);
// The rank's peak: parameters and optimizer state, and the iteration's own allocations at their
// most (activations, temporaries, gradients).
std::uint64_t memory_peak(const Trace& t);

}  // namespace commtrace
