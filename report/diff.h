// diff of two traces on their per-iteration collective counts (report/counts.h): per module and
// phase, every collective whose count (or bytes, when both sides have bytes) differs, and the
// totals that changed. The result is data; render_diff makes the aligned text tree. Not a
// record-by-record diff: shapes and reasons are out of scope (show both traces for those).
#pragma once

#include <string>
#include <vector>

#include "report/cost.h"
#include "report/counts.h"
#include "tracer/trace.h"

namespace commtrace {

struct DiffOptions {
  std::string label_a = "A";
  std::string label_b = "B";
  // Compare modules down to this depth only (0: Global's totals; 1: + the model; ...); -1: all.
  // Rolled-up counts make a shallow diff tolerant of attribution differences below it.
  int max_depth = -1;
  // With a topology, each side's estimated times (report/cost.h) are compared too.
  const Topology* topology = nullptr;
};

struct DiffRow {
  Phase phase = Phase::Forward;
  Collective op = Collective::AllReduce;
  OpStat a, b;
  bool bytes_differ = false;
};

struct DiffModule {
  std::string fqn;
  int only_in = 0;  // 0 both sides, 1 only in A, 2 only in B
  std::vector<DiffRow> rows;
};

// A change of Global's count (or, with equal counts, bytes) of one collective in one phase.
struct TotalChange {
  Phase phase = Phase::Forward;
  Collective op = Collective::AllReduce;
  std::int64_t count_delta = 0;
  std::int64_t bytes_delta = 0;
};

// One phase's estimated time on each side (with a topology).
struct PhaseTime {
  Phase phase = Phase::Forward;
  double a_s = 0, b_s = 0;
};

// One phase's bus bytes (nccl-tests: bytes × the busbw factor of the group size) on each side.
struct PhaseBus {
  Phase phase = Phase::Forward;
  double a = 0, b = 0;
};

struct DiffResult {
  bool equal = true;
  std::string topology;              // its name, when times were estimated
  std::vector<PhaseTime> est_times;  // per phase with collectives on either side
  std::string label_a, label_b;      // DiffOptions' labels
  std::string desc_a, desc_b;        // "A: toy tp (world 4)"
  bool per_iteration = false;        // a side traced more than one iteration
  bool torch = false;                // a side is a PyTorch dump: forward and backward only
  bool bytes = true;                 // bytes were compared (no PyTorch dump)
  std::vector<DiffModule> modules;
  std::vector<TotalChange> totals;
  std::vector<PhaseBus> bus;  // phases whose bus bytes differ (bytes compared)
};

DiffResult diff_traces(const Trace& a, const Trace& b, const DiffOptions& options = {});
// The aligned text tree and the totals line (a one-line "no differences" when equal).
std::string render_diff(const DiffResult& d, bool color = false);
// The same as JSON for scripts ("schema": "commtrace.diff", "version": "1.1"): equal, the two
// sides, per module its rows (phase, collective, count and bytes of each side), the totals and
// the bus bytes per phase.
std::string diff_json(const DiffResult& d);

}  // namespace commtrace
