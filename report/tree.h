// commtrace's own text report: the module tree with, per phase, the collectives (count, bytes,
// group) and at higher noise the ops with shapes, shardings and mesh; the reasons with
// `explain`; and the per-iteration summary (op, count, bytes, group size, busbw factor).
#pragma once

#include <string>

#include "tracer/trace.h"

namespace commtrace {

struct TreeOptions {
  int noise = 0;
  bool explain = false;  // the reason of every collective (also shown at noise >= 1)
  bool color = false;
};

std::string render_tree(const Trace& t, const TreeOptions& options);
// Per iteration (counts and bytes divided by metadata "iterations").
std::string render_summary(const Trace& t);

}  // namespace commtrace
