// Traces one training iteration of the Transformer (DESIGN §4) with the TP plan and with the SP
// plan on 4 ranks, prints each run's per-iteration summary and then their diff: TP's
// all_reduces become SP's all_gather + reduce_scatter pairs (same bytes moved, activations
// sharded along the sequence between them).
#include "parallel/run/runner.h"
#include "report/diff.h"
#include "report/tree.h"

int main() {
  using namespace commtrace;
  try {
    Trace traces[2];
    const char* plans[2] = {"tp", "sp"};
    for (int i = 0; i < 2; ++i) {
      TraceOptions o;
      o.cfg.model = "transformer";
      o.cfg.plan = plans[i];
      o.cfg.world_size = 4;
      traces[i] = trace_run(o).at(0);
      fmt::print("== transformer, plan {}, 4 ranks ==\n{}\n", plans[i], render_summary(traces[i]));
    }
    DiffOptions d;
    d.label_a = "transformer tp";
    d.label_b = "transformer sp";
    fmt::print("== diff tp → sp ==\n{}", render_diff(diff_traces(traces[0], traces[1], d)));
  } catch (const Error& e) {
    fmt::print(stderr, "transformer_tp_vs_sp: {}\n", e.what());
    return 1;
  }
  return 0;
}
