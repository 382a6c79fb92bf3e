// Cross-rank consistency: on every group, each rank must issue the same collectives in the same
// order (op, sequence number, dtype, global shape of the first input, reduce op, group size).
// Rank 0's trace (the first given) is the reference; every other rank is compared with it. A
// divergence usually shifts everything after it, so each group reports its first few only.
#include "report/consistency.h"

#include <algorithm>
#include <map>
#include <set>

namespace commtrace {

namespace {

constexpr std::size_t kMaxPerGroup = 5;

using Calls = std::vector<const OpRecord*>;

// group -> its collectives by sequence number; groups in first-call order.
std::vector<std::pair<std::string, Calls>> by_group(const Trace& t) {
  std::vector<std::pair<std::string, Calls>> groups;
  std::map<std::string, std::size_t> slot;
  for (const OpRecord& r : t.records) {
    if (r.kind != EventKind::Collective) continue;
    auto [it, inserted] = slot.emplace(r.collective.group, groups.size());
    if (inserted) groups.push_back({r.collective.group, {}});
    groups[it->second].second.push_back(&r);
  }
  for (auto& [g, calls] : groups) {
    std::stable_sort(calls.begin(), calls.end(), [](const OpRecord* a, const OpRecord* b) {
      return a->collective.seq < b->collective.seq;
    });
  }
  return groups;
}

const Shape& global_shape0(const OpRecord& r) {
  static const Shape kNone;
  return r.inputs.empty() ? kNone : r.inputs[0].global_shape;
}

// "all_reduce f32[8, 10] sum" (+ " group size 2" when asked).
std::string describe(const OpRecord& r, bool with_seq, bool with_size) {
  std::string s = r.name;
  if (with_seq) s = fmt::format("seq {} {}", r.collective.seq, s);
  s += fmt::format(" {}{}", dtype_name(r.dtype), shape_str(global_shape0(r)));
  const std::string op = reduce_op_name(r.collective.reduce_op);
  if (!op.empty()) s += " " + op;
  if (with_size) s += fmt::format(" group size {}", r.collective.group_size);
  return s;
}

bool same_call(const OpRecord& a, const OpRecord& b) {
  return a.name == b.name && a.collective.seq == b.collective.seq && a.dtype == b.dtype &&
         global_shape0(a) == global_shape0(b) && a.collective.reduce_op == b.collective.reduce_op &&
         a.collective.group_size == b.collective.group_size;
}

void compare_group(const std::string& group, int rank_a, const Calls& a, int rank_b, const Calls& b,
                   std::vector<std::string>& out) {
  std::size_t reported = 0, more = 0;
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const OpRecord& x = *a[i];
    const OpRecord& y = *b[i];
    if (same_call(x, y)) continue;
    if (reported == kMaxPerGroup) {
      ++more;
      continue;
    }
    ++reported;
    const bool seq_differs = x.collective.seq != y.collective.seq;
    const bool size_differs = x.collective.group_size != y.collective.group_size;
    const std::string where =
        seq_differs ? fmt::format("call {}", i) : fmt::format("seq {}", x.collective.seq);
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
    const OpRecord& first_extra = *(a_more ? a : b)[n];
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
