// CI baselines: a small, readable JSON of what a trace's collectives must be per iteration, per
// phase (totals) and per module and phase, with the model and plan it was made for ("schema":
// "commtrace.baseline", "version": "1.1"): per collective its count and bytes, and in the totals
// its groups ("tp(4)") and dtypes. 1.0 files (counts only) still check. A baseline made from a
// PyTorch dump holds counts of forward and backward only and no model or plan: it checks any
// trace of the same model by module path. check compares a trace with it; --expect adds ad-hoc
// phase.op=N checks. Results are data (one Mismatch per difference); Mismatch::str() renders one
// line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

std::string make_baseline(const Trace& t);

struct Mismatch {
  enum class What { Count, Bytes, Groups, Dtypes, WorldSize };
  std::string module;  // the module's FQN; "" for the totals (Global)
  What what = What::Count;
  Phase phase = Phase::Forward;
  Collective op = Collective::AllReduce;
  std::int64_t expected = 0, got = 0;   // Count, Bytes, WorldSize
  std::string expected_text, got_text;  // Groups, Dtypes: "tp(4), dp(2)"
  bool module_missing = false;          // the trace has no such module
  // "backward.all_gather: expected 1, got 2", "M.a.forward.all_reduce bytes: ...",
  // "world_size: ..."
  std::string str() const;
};

struct CheckResult {
  bool ok = true;
  std::vector<Mismatch> differences;
  std::vector<std::string> notes;  // what was not compared, and why
};

struct CheckOptions {
  double tolerance = 0;  // bytes may differ by this fraction of the expected bytes (>= 0)
};

// Throws Error(InvalidArgument) on a malformed baseline, a wrong schema or major version, or a
// baseline made for another model or plan (naming both).
CheckResult check_baseline(const Trace& t, const std::string& baseline_text,
                           const std::string& source, const CheckOptions& options = {});

// The result as JSON for scripts ("schema": "commtrace.check", "version": "1.0"): ok, the trace
// and baseline names, every difference (module, phase, collective, what, expected, got, the
// line str() renders) and the notes.
std::string check_json(const CheckResult& r, const std::string& trace, const std::string& baseline);

// "forward.all_reduce=1" or "Transformer.output.backward.all_reduce=1": the total (or the
// module's rolled-up count) of a phase and collective. Throws InvalidArgument on bad syntax.
CheckResult check_expectations(const Trace& t, const std::vector<std::string>& expectations);
// The same syntax, phase and collective checks without a trace (a run validates its --expect
// before it starts); whether the module exists is known only after the run.
void validate_expectations(const std::vector<std::string>& expectations);

}  // namespace commtrace
