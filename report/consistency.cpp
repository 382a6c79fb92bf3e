// Cross-rank consistency: on every group, each rank must issue the same collectives in the same
// order (op, sequence number, dtype, global shape of the first input, reduce op, group size), and
// every send between traced ranks must meet its recv.
// Rank 0's trace (the first given) is the reference; every other rank is compared with it. A
// divergence usually shifts everything after it, so each group reports its first few only.
#include "report/consistency.h"

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <tuple>

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

// Point-to-point: a message is (group, sender, receiver) in global ranks, numbered per direction.
struct Message {
  std::uint64_t seq;
  std::uint64_t bytes;
  DType dtype;
  bool operator<(const Message& o) const { return seq < o.seq; }
};
using Channel = std::tuple<std::string, int, int>;  // group, from, to (global ranks)

// The global rank of group rank `peer` of the group the trace's rank has group rank `self` in:
// the group is a dim of the run's mesh (row-major); -1 when the trace's mesh does not say.
int global_peer(const Trace& t, const MeshInfo& mesh, const std::string& group, int self,
                int peer) {
  for (std::size_t d = 0; d < mesh.dim_names.size(); ++d) {
    if (mesh.dim_names[d] != group) continue;
    int stride = 1;
    for (std::size_t e = d + 1; e < mesh.shape.size(); ++e) stride *= mesh.shape[e];
    return t.rank + (peer - self) * stride;
  }
  return -1;
}

// Every send between two traced ranks has the receiver's recv with the same number, bytes and
// dtype, and every recv its send.
void check_p2p(const std::vector<Trace>& ranks, std::vector<std::string>& out) {
  std::set<int> traced;
  for (const Trace& t : ranks) traced.insert(t.rank);
  std::map<Channel, std::vector<Message>> sent, received;
  for (const Trace& t : ranks) {
    const auto it = t.metadata.find("mesh");
    if (it == t.metadata.end()) return;  // no mesh: peers cannot be placed
    MeshInfo mesh;
    try {
      mesh = parse_mesh_str(it->second);
    } catch (const Error&) {
      return;
    }
    if (mesh.dim_names.empty()) mesh.dim_names = default_mesh_dim_names(mesh.shape.size());
    t.for_each_event([&](const Record& r, std::uint64_t seq) {
      const CollectiveInfo& c = r.collective;
      if (r.kind != EventKind::Collective || c.peer < 0 ||
          (c.op != Collective::Send && c.op != Collective::Recv)) {
        return;
      }
      const std::string group(t.str(c.group));
      const int peer = global_peer(t, mesh, group, c.group_rank, c.peer);
      if (peer < 0 || !traced.count(peer)) return;
      const bool send = c.op == Collective::Send;
      const Channel ch{group, send ? t.rank : peer, send ? peer : t.rank};
      (send ? sent : received)[ch].push_back(Message{seq, c.bytes, r.dtype});
    });
  }
  std::set<Channel> channels;
  for (const auto* m : {&sent, &received}) {
    for (const auto& [ch, msgs] : *m) channels.insert(ch);
  }
  static const std::vector<Message> kNone;
  for (const Channel& ch : channels) {
    const auto& [group, from, to] = ch;
    auto s = sent.count(ch) ? sent.at(ch) : kNone, r = received.count(ch) ? received.at(ch) : kNone;
    std::sort(s.begin(), s.end());
    std::sort(r.begin(), r.end());
    if (s.size() != r.size()) {
      out.push_back(
          fmt::format("group '{}': rank {} sent {} messages to rank {}, which received {} from it",
                      group, from, s.size(), to, r.size()));
      continue;
    }
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i].seq == r[i].seq && s[i].bytes == r[i].bytes && s[i].dtype == r[i].dtype) continue;
      out.push_back(fmt::format(
          "group '{}': rank {}'s send seq {} to rank {} ({} {} bytes) meets recv seq {} ({} {} "
          "bytes)",
          group, from, s[i].seq, to, dtype_name(s[i].dtype), s[i].bytes, r[i].seq,
          dtype_name(r[i].dtype), r[i].bytes));
      break;
    }
  }
}

}  // namespace

std::vector<std::string> check_rank_consistency(const std::vector<Trace>& ranks) {
  std::vector<std::string> out;
  if (ranks.size() < 2) return out;
  check_p2p(ranks, out);
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
