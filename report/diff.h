// diff of two traces: per module and phase, the collective counts and bytes that differ,
// as an aligned tree with a totals line. Works between our traces and PyTorch's dumps (bytes
// are compared only when both sides have them).
#pragma once

#include <string>

#include "tracer/trace.h"

namespace commtrace {

struct DiffOptions {
  bool color = false;
  std::string label_a = "A";
  std::string label_b = "B";
  // Compare modules down to this depth only (0: Global's totals; 1: + the model; ...); -1: all.
  // Rolled-up counts make a shallow diff tolerant of attribution differences below it.
  int max_depth = -1;
};

struct DiffResult {
  bool equal = true;
  std::string text;  // the rendered report (also when equal: a one-line "no differences")
};

DiffResult diff_traces(const Trace& a, const Trace& b, const DiffOptions& options = {});

}  // namespace commtrace
