#include "report/summary.h"

namespace commtrace {

std::map<std::string, int> op_counts(const Trace& t, const CountQuery& q) {
  const int module = t.find_module(q.module);
  COMMTRACE_CHECK(module >= 0, ErrorCode::InvalidArgument, "trace has no module '{}'", q.module);
  std::map<std::string, int> counts;
  for (const OpRecord& r : t.records) {
    if (q.phase && r.phase != *q.phase) continue;
    if (q.kind && r.kind != *q.kind) continue;
    if (q.rollup ? !t.is_within(r.module, module) : r.module != module) continue;
    ++counts[r.name];
  }
  return counts;
}

}  // namespace commtrace
