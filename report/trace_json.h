// commtrace's own trace format: versioned JSON ("schema": "commtrace.trace", "version": "1.0";
// minor = field added, major = field changed) holding every field of every record of every
// traced rank, the module trees, and the run's metadata. Readers reject another major version.
#pragma once

#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

inline constexpr const char* kTraceSchema = "commtrace.trace";
inline constexpr const char* kTraceVersion = "1.0";

// REQUIRES: at least one trace. Metadata comes from traces[0].metadata.
std::string write_trace_json(const std::vector<Trace>& traces);
// Throws Error(InvalidArgument) naming the source and the bad key or value.
std::vector<Trace> read_trace_json(const std::string& text, const std::string& source);
// Reads a file in either our format or PyTorch's generate_json_dump (one trace). Io on a
// missing or unreadable file.
std::vector<Trace> load_traces(const std::string& path);
void write_file(const std::string& path, const std::string& text);  // Io on failure
std::string read_file(const std::string& path);                     // Io on failure

}  // namespace commtrace
