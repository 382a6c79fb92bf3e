// CI baselines: a small, readable JSON of expected collective counts per phase (totals) and per
// module and phase, with the model and plan it was made for ("schema": "commtrace.baseline",
// "version": "1.0"). check compares a trace with it; --expect adds ad-hoc phase.op=N checks.
// Results are data (one Mismatch per differing count); Mismatch::str() renders one line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

std::string make_baseline(const Trace& t);

struct Mismatch {
  std::string module;       // the module's FQN; "" for the totals (Global)
  bool world_size = false;  // the run's world size rather than a count
  Phase phase = Phase::Forward;
  Collective op = Collective::AllReduce;
  std::int64_t expected = 0, got = 0;
  bool module_missing = false;  // the trace has no such module
  // "backward.all_gather: expected 1, got 2", "M.a.forward.all_reduce: ...", "world_size: ..."
  std::string str() const;
};

struct CheckResult {
  bool ok = true;
  std::vector<Mismatch> differences;
};

// Throws Error(InvalidArgument) on a malformed baseline, a wrong schema or major version, or a
// baseline made for another model or plan (naming both).
CheckResult check_baseline(const Trace& t, const std::string& baseline_text,
                           const std::string& source);

// "forward.all_reduce=1" or "Transformer.output.backward.all_reduce=1": the total (or the
// module's rolled-up count) of a phase and collective. Throws InvalidArgument on bad syntax.
CheckResult check_expectations(const Trace& t, const std::vector<std::string>& expectations);

}  // namespace commtrace
