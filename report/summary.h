// Summaries of a trace: op counts per module and phase, rolled up over descendants as
// CommDebugMode does (a module's counts include its children's; Global holds the total).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "tracer/trace.h"

namespace commtrace {

struct CountQuery {
  std::string module = "Global";  // FQN
  std::optional<Phase> phase;     // any phase when empty
  std::optional<EventKind> kind;  // any kind when empty
  bool rollup = true;             // include descendants
};

// name -> count of the records matching q. Throws InvalidArgument when the module is absent.
std::map<std::string, std::int64_t> op_counts(const Trace& t, const CountQuery& q);

}  // namespace commtrace
