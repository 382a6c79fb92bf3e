// libFuzzer targets for every reader of an input file (COMMTRACE_FUZZ=ON, clang). Each target
// parses the bytes as that file and, when they parse, walks the result the way the CLI would.
// Bad input must end in commtrace::Error (a clear message, exit 2 in the CLI); anything else
// (another exception, a crash, a sanitizer report, a hang) is a finding. One source, one binary
// per reader: COMMTRACE_FUZZ_TARGET selects which (trace, torch, baseline, plan, model, kineto,
// topology).
#include <cstddef>
#include <cstdint>
#include <string>

#include "parallel/nn/models.h"
#include "parallel/plans/style.h"
#include "report/baseline.h"
#include "report/cost.h"
#include "report/kineto.h"
#include "report/torch_compat.h"
#include "report/trace_json.h"
#include "report/tree.h"

namespace {

using namespace commtrace;

// Rendering is part of reading: a loaded tree must also print and serialize.
[[maybe_unused]] void walk(const Trace& t) {
  (void)render_tree(t, TreeOptions{3, true, false});
  (void)render_summary(t);
  (void)torch_table(t, 3, false);
}

// A small real trace the baseline target checks against.
[[maybe_unused]] const Trace& reference_trace() {
  static const Trace t = [] {
    Trace r;
    r.metadata = {{"model", "toy"}, {"plan", "tp"}, {"world_size", "4"}, {"iterations", "1"}};
    return r;
  }();
  return t;
}

void run(const std::string& text) {
#if COMMTRACE_FUZZ_TARGET == 1
  const std::vector<Trace> traces = read_trace_json(text, "fuzz.json");
  for (const Trace& t : traces) walk(t);
  (void)trace_json_string(traces);
#elif COMMTRACE_FUZZ_TARGET == 2
  const Trace t = read_torch_json_dump(text, "fuzz.json");
  walk(t);
  (void)torch_json_dump(t, 3);
#elif COMMTRACE_FUZZ_TARGET == 3
  (void)check_baseline(reference_trace(), text, "fuzz.json");
#elif COMMTRACE_FUZZ_TARGET == 4
  (void)plan_from_json_text(text, "fuzz.json");
#elif COMMTRACE_FUZZ_TARGET == 5
  (void)model_from_json_text(text, "fuzz.json");
#elif COMMTRACE_FUZZ_TARGET == 6
  const Trace t = read_kineto_trace(text, "fuzz.json", 0);
  walk(t);
  (void)trace_json_string({t});
#elif COMMTRACE_FUZZ_TARGET == 7
  const Topology topo = topology_from_json(text, "fuzz.json");
  (void)estimate_collective(Collective::AllReduce, 1 << 20, 8, true, topo);
#else
#error "COMMTRACE_FUZZ_TARGET must be 1 (trace) .. 7 (topology)"
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    run(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const commtrace::Error&) {
    // the expected end of bad input
  }
  return 0;
}
