#include "report/summary.h"

namespace commtrace {

std::map<std::string, std::int64_t> op_counts(const Trace& t, const CountQuery& q) {
  const int module = t.find_module(q.module);
  COMMTRACE_CHECK(module >= 0, ErrorCode::InvalidArgument, "trace has no module '{}'", q.module);
  std::map<std::string, std::int64_t> counts;
  t.for_each_record([&](const Record& r, std::uint64_t repeat) {
    if (q.phase && r.phase != *q.phase) return;
    if (q.kind && r.kind != *q.kind) return;
    if (q.rollup ? !t.is_within(int(r.module), module) : int(r.module) != module) return;
    counts[std::string(t.name(r))] += std::int64_t(repeat);
  });
  return counts;
}

}  // namespace commtrace
