// The HTML report: one self-contained file (its CSS, script and data inline; nothing is fetched
// at view time) showing one trace, or two side by side (TP against SP, plan A against plan B):
// per trace the totals, the per-iteration summary (bytes, bus bytes, estimated time), the module
// tree with per-phase counts, bytes and estimated time, and the timeline of its first rank (the
// slices of report/chrome_trace.h, nested in lanes); with two traces, bars per module of each
// side's estimated time. The page marks itself rendered (body data-status="ok") once its script
// has built it, so a headless browser can check it.
#pragma once

#include <string>
#include <vector>

#include "report/cost.h"
#include "tracer/trace.h"

namespace commtrace {

struct HtmlSide {
  std::string label;          // the file's name
  std::vector<Trace> traces;  // the file's ranks; the report shows rank `rank` of them
};

// REQUIRES 1 or 2 sides, each with the rank `rank`.
std::string html_report(const std::vector<HtmlSide>& sides, int rank, const Topology& topo);

}  // namespace commtrace
