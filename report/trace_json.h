// commtrace's own trace format: versioned JSON ("schema": "commtrace.trace", "version": "2.2";
// minor = field added, major = field changed) holding every traced rank's module tree, meshes
// and records (blocks of iterations, a repeated block stored once with its repeat count), and
// the run's metadata, (2.1) each rank's memory per module, and (2.2) the repeats whose times
// were not sampled (a block's "untimed") and records whose times are estimates ("estimated").
// Written streamed, compact unless pretty. The reader takes 2.x and the 1.x files of earlier
// releases (display strings parsed back into data).
#pragma once

#include <string>
#include <vector>

#include "tracer/json_io.h"
#include "tracer/trace.h"

namespace commtrace {

inline constexpr const char* kTraceSchema = "commtrace.trace";
inline constexpr const char* kTraceVersion = "2.2";

// REQUIRES: at least one trace. Metadata comes from traces[0].metadata.
void write_trace_json(const std::vector<Trace>& traces, const JsonWriter::Sink& sink,
                      bool pretty = false);
std::string trace_json_string(const std::vector<Trace>& traces, bool pretty = false);
// Writes through an AtomicFile (the old file survives a failed write).
void write_trace_file(const std::string& path, const std::vector<Trace>& traces,
                      bool pretty = false);

// Throws Error(InvalidArgument) naming the source and the JSON path of the bad key or value.
std::vector<Trace> read_trace_json(const std::string& text, const std::string& source);
// Reads a file in either our format or PyTorch's generate_json_dump (one trace). Io on a
// missing or unreadable file.
std::vector<Trace> load_traces(const std::string& path);

}  // namespace commtrace
