// PyTorch compatibility: CommDebugMode's text table (generate_comm_debug_tracing_table) and
// JSON dump (generate_json_dump) rendered from a trace, and a reader that turns such a dump back
// into a trace so that show, diff and check work on PyTorch's files. Like PyTorch, both hold the
// forward and backward phases only. Layout: DESIGN §3 and shared/reference/torch/golden_*.
#pragma once

#include <string>

#include "tracer/json_io.h"
#include "tracer/trace.h"

namespace commtrace {

// noise 0: collective counts; 1: + module types, parameter placements, sharded ops with shape,
// sharding and mesh; 2: + local ops; 3: + trivial ops. Colour codes only when `color`.
std::string torch_table(const Trace& t, int noise, bool color);
// Indent 4, keys in PyTorch's order, no trailing newline.
std::string torch_json_dump(const Trace& t, int noise);
// Parses a generate_json_dump file: modules, ops as records, and each module's own collective
// counts as one record repeated that many times. Throws Error(InvalidArgument) naming the
// source and the JSON path on malformed input.
Trace read_torch_json_dump(const std::string& text, const std::string& source);
Trace read_torch_json_dump(const Json& root, const std::string& source);
// True when the document looks like a generate_json_dump (a node with "fqn": "Global").
bool is_torch_json_dump(const Json& root);

}  // namespace commtrace
