// The timeline: Chrome's trace-event JSON (what Perfetto and chrome://tracing open) of a run's
// traces: one process per rank, and on its one thread nested slices: iteration ⊃ phase ⊃ the
// module chain (modules nest as they ran) ⊃ every collective and GEMM, each with its args
// (shapes, placements, bytes, group, reason). Times are the records' measured ones when the
// run measured time (threads, mpi, imports); on the fake backend or the meta device the
// records are laid end to end with the cost model's times (collectives from their bytes, GEMMs
// from their FLOPs at the topology's rate), and the metadata says so.
#pragma once

#include <vector>

#include "report/cost.h"
#include "tracer/json_io.h"
#include "tracer/trace.h"

namespace commtrace {

// REQUIRES at least one trace. `topo` prices a run without measured times.
void write_chrome_trace(const std::vector<Trace>& traces, const Topology& topo,
                        const JsonWriter::Sink& sink);

}  // namespace commtrace
