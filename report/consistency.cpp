// Cross-rank consistency: on every group, each rank must issue the same collectives in the same
// order (op, sequence number, dtype, global shape of the first input, reduce op, group size).
// Rank 0's trace (the first given) is the reference; every other rank is compared with it. A
// divergence usually shifts everything after it, so each group reports its first few only.
#include "report/consistency.h"

#include <algorithm>
#include <map>
#include <set>
#include <span>

#include "tracer/collectives.h"

namespace commtrace {

namespace {

constexpr std::size_t kMaxPerGroup = 5;

// One collective as compared across ranks (the expanded sequence: repeats unrolled).
struct Call {
  Collective op;
  std::uint64_t seq;
  DType dtype;
  std::span<const std::int64_t> global;  // of the first input
  ReduceOp reduce;
  int group_size;
};
using Calls = std::vector<Call>;

// group -> its collectives by sequence number; groups in first-call order.
std::vector<std::pair<std::string, Calls>> by_group(const Trace& t) {
  std::vector<std::pair<std::string, Calls>> groups;
  std::map<std::string, std::size_t> slot;
  t.for_each_event([&](const Record& r, std::uint64_t seq) {
    if (r.kind != EventKind::Collective) return;
    const std::string group(t.str(r.collective.group));
    auto [it, inserted] = slot.emplace(group, groups.size());
    if (inserted) groups.push_back({group, {}});
    const auto ins = t.inputs(r);
    groups[it->second].second.push_back(
        Call{r.collective.op, seq, r.dtype,
             ins.empty() ? std::span<const std::int64_t>() : t.shape(ins[0].global_shape),
             r.collective.reduce_op, r.collective.group_size});
  });
  for (auto& [g, calls] : groups) {
    std::stable_sort(calls.begin(), calls.end(),
                     [](const Call& a, const Call& b) { return a.seq < b.seq; });
  }
  return groups;
}

// "all_reduce f32[8, 10] sum" (+ " group size 2" when asked).
std::string describe(const Call& c, bool with_seq, bool with_size) {
  std::string s = collective_name(c.op);
  if (with_seq) s = fmt::format("seq {} {}", c.seq, s);
  s += fmt::format(" {}{}", dtype_name(c.dtype), shape_str(c.global));
  const std::string op = reduce_op_name(c.reduce);
  if (!op.empty()) s += " " + op;
  if (with_size) s += fmt::format(" group size {}", c.group_size);
  return s;
}

bool same_call(const Call& a, const Call& b) {
  return a.op == b.op && a.seq == b.seq && a.dtype == b.dtype &&
         std::equal(a.global.begin(), a.global.end(), b.global.begin(), b.global.end()) &&
         a.reduce == b.reduce && a.group_size == b.group_size;
}

void compare_group(const std::string& group, int rank_a, const Calls& a, int rank_b, const Calls& b,
                   std::vector<std::string>& out) {
  std::size_t reported = 0, more = 0;
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const Call& x = a[i];
    const Call& y = b[i];
    if (same_call(x, y)) continue;
    if (reported == kMaxPerGroup) {
      ++more;
      continue;
    }
    ++reported;
    const bool seq_differs = x.seq != y.seq;
    const bool size_differs = x.group_size != y.group_size;
    const std::string where =
        seq_differs ? fmt::format("call {}", i) : fmt::format("seq {}", x.seq);
    out.push_back(fmt::format("group '{}' {}: rank {} {}, rank {} {}", group, where, rank_a,
                              describe(x, seq_differs, size_differs), rank_b,
                              describe(y, seq_differs, size_differs)));
  }
  if (more > 0) {
    out.push_back(fmt::format("group '{}': {} more mismatches between rank {} and rank {}", group,
                              more, rank_a, rank_b));
  }
  if (a.size() != b.size()) {
    const bool a_more = a.size() > b.size();
    const Call& first_extra = (a_more ? a : b)[n];
    out.push_back(fmt::format(
        "group '{}': rank {} issued {} collectives, rank {} issued {} (first extra on rank {}: "
        "{})",
        group, rank_a, a.size(), rank_b, b.size(), a_more ? rank_a : rank_b,
        describe(first_extra, true, false)));
  }
}

}  // namespace

std::vector<std::string> check_rank_consistency(const std::vector<Trace>& ranks) {
  std::vector<std::string> out;
  if (ranks.size() < 2) return out;
  const auto ref = by_group(ranks[0]);
  static const Calls kEmpty;
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    const auto other = by_group(ranks[r]);
    std::vector<std::string> names;
    std::set<std::string> seen;
    for (const auto* gs : {&ref, &other}) {
      for (const auto& [g, calls] : *gs) {
        if (seen.insert(g).second) names.push_back(g);
      }
    }
    auto find = [](const std::vector<std::pair<std::string, Calls>>& gs,
                   const std::string& g) -> const Calls& {
      for (const auto& [name, calls] : gs) {
        if (name == g) return calls;
      }
      return kEmpty;
    };
    for (const std::string& g : names) {
      compare_group(g, ranks[0].rank, find(ref, g), ranks[r].rank, find(other, g), out);
    }
  }
  return out;
}

}  // namespace commtrace
