#include "report/counts.h"

#include <algorithm>
#include <charconv>
#include <tuple>
#include <utility>

#include "report/cost.h"

namespace commtrace {

std::string GroupStat::name() const {
  if (from < 0) return collective_name(op);
  return fmt::format("{} {}\u2192{}", collective_name(op), from, to);
}

OpStat ModuleCounts::op(Phase p, Collective c) const {
  OpStat s;
  for (const GroupStat& g : phases[std::size_t(p)]) {
    if (g.op != c) continue;
    s.count += g.stat.count;
    s.bytes += g.stat.bytes;
    s.bus_bytes += g.stat.bus_bytes;
    s.seconds += g.stat.seconds;
    s.estimate_s += g.stat.estimate_s;
    s.dtype_mask |= g.stat.dtype_mask;
  }
  return s;
}

std::vector<Collective> ModuleCounts::ops(Phase p) const {
  std::vector<Collective> out;
  for (const GroupStat& g : phases[std::size_t(p)]) {
    bool seen = false;
    for (Collective c : out) seen = seen || c == g.op;
    if (!seen) out.push_back(g.op);
  }
  return out;
}

bool ModuleCounts::empty() const {
  for (const auto& p : phases) {
    for (const GroupStat& g : p) {
      if (g.stat.count != 0 || g.stat.bytes != 0) return false;
    }
  }
  return true;
}

const ModuleCounts* CountTree::find(const std::string& fqn) const {
  for (const ModuleCounts& m : modules) {
    if (m.fqn == fqn) return &m;
  }
  return nullptr;
}

std::vector<std::pair<int, int>> module_preorder(const Trace& t) {
  const int n = int(t.modules.size());
  std::vector<std::pair<int, int>> order;
  std::vector<char> seen(std::size_t(n), 0);
  // The seen check keeps a malformed tree (a cycle, a shared child) from looping.
  std::vector<std::pair<int, int>> stack{{0, 0}};
  while (!stack.empty() && n > 0) {
    const auto [m, depth] = stack.back();
    stack.pop_back();
    if (m < 0 || m >= n || seen[std::size_t(m)]) continue;
    seen[std::size_t(m)] = 1;
    order.emplace_back(m, depth);
    const std::vector<int>& children = t.modules[std::size_t(m)].children;
    for (auto it = children.rbegin(); it != children.rend(); ++it)
      stack.push_back({*it, depth + 1});
  }
  for (int m = 0; m < n; ++m) {
    if (!seen[std::size_t(m)]) order.emplace_back(m, t.modules[std::size_t(m)].depth);
  }
  return order;
}

bool is_torch_dump(const Trace& t) { return metadata_of(t, "format") == "torch"; }

bool has_times(const Trace& t) {
  return !is_torch_dump(t) && metadata_of(t, "backend") != "fake" &&
         metadata_of(t, "device") != "meta";
}

std::string metadata_of(const Trace& t, const char* key) {
  const auto it = t.metadata.find(key);
  return it == t.metadata.end() ? "" : it->second;
}

namespace {

// collective_counts over every block, or over one block counted once.
CountTree count_blocks(const Trace& t, const Block* only, const TraceCost* cost) {
  CountTree tree;
  tree.has_estimates = cost != nullptr;
  tree.has_bytes = !is_torch_dump(t);
  tree.has_times = has_times(t);
  const int n = int(t.modules.size());
  std::vector<int> slot(std::size_t(n), -1);
  for (const auto& [m, depth] : module_preorder(t)) {
    slot[std::size_t(m)] = int(tree.modules.size());
    tree.modules.push_back(ModuleCounts{t.modules[std::size_t(m)].fqn, depth, {}});
  }
  auto each = [&](auto&& f) {
    if (!only) return t.for_each_record(f);
    for (std::uint32_t i = only->first; i < only->first + only->count; ++i) f(t.records[i], 1);
  };
  each([&](const Record& r, std::uint64_t repeat) {
    if (r.kind != EventKind::Collective || std::size_t(r.phase) >= std::size_t(kPhaseCount)) {
      return;
    }
    const std::string_view group = t.str(r.collective.group);
    const double estimate = cost ? cost->of(r).seconds : 0.0;
    const CollectiveInfo& c = r.collective;
    const bool p2p = (c.op == Collective::Send || c.op == Collective::Recv) && c.peer >= 0;
    const int from = !p2p ? -1 : c.op == Collective::Send ? c.group_rank : c.peer;
    const int to = !p2p ? -1 : c.op == Collective::Send ? c.peer : c.group_rank;
    // Walk to the root; at most n steps even if parent links loop.
    int m = int(r.module);
    for (int steps = 0; m >= 0 && m < n && steps <= n; ++steps) {
      auto& list = tree.modules[std::size_t(slot[std::size_t(m)])].phases[std::size_t(r.phase)];
      GroupStat* g = nullptr;
      for (GroupStat& x : list) {
        if (x.op == c.op && x.group_size == c.group_size && x.group == group && x.from == from &&
            x.to == to) {
          g = &x;
        }
      }
      if (!g) {
        g = &list.emplace_back(GroupStat{c.op, std::string(group), c.group_size, from, to, {}});
      }
      g->stat.count += repeat;
      g->stat.bytes += c.bytes * repeat;
      // A group size of 0 is unknown (a PyTorch dump, an import that does not say): no factor.
      if (c.group_size > 0) {
        g->stat.bus_bytes += double(c.bytes * repeat) * busbw_factor(c.op, c.group_size);
      }
      g->stat.seconds += r.duration_s * double(repeat);
      g->stat.estimate_s += estimate * double(repeat);
      g->stat.dtype_mask |= 1u << unsigned(r.dtype);
      if (m == 0) break;
      m = t.modules[std::size_t(m)].parent;
    }
  });
  return tree;
}

// Every (module, phase, collective, group) with its count and bytes, sorted: equal for two trees
// with the same counts whatever their order of first occurrence.
std::vector<
    std::tuple<std::string, std::size_t, int, std::string, int, std::int64_t, std::uint64_t>>
canonical(const CountTree& c) {
  std::vector<
      std::tuple<std::string, std::size_t, int, std::string, int, std::int64_t, std::uint64_t>>
      out;
  for (const ModuleCounts& m : c.modules) {
    for (std::size_t p = 0; p < m.phases.size(); ++p) {
      for (const GroupStat& g : m.phases[p]) {
        out.emplace_back(m.fqn, p, int(g.op), g.group, g.group_size, g.stat.count, g.stat.bytes);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

CountTree collective_counts(const Trace& t, const TraceCost* cost) {
  return count_blocks(t, nullptr, cost);
}

int trace_iterations(const Trace& t) {
  const auto it = t.metadata.find("iterations");
  if (it == t.metadata.end()) return 1;
  const std::string& s = it->second;
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  COMMTRACE_CHECK(ec == std::errc() && end == s.data() + s.size() && value >= 1,
                  ErrorCode::InvalidArgument,
                  "trace metadata 'iterations' is '{}', expected a positive integer", s);
  return value;
}

void fold_recompute_into_backward(CountTree& c) {
  for (ModuleCounts& m : c.modules) {
    auto& recompute = m.phases[std::size_t(Phase::Recompute)];
    auto& backward = m.phases[std::size_t(Phase::Backward)];
    backward.insert(backward.end(), recompute.begin(), recompute.end());
    recompute.clear();
  }
}

CountTree collective_counts_per_iteration(const Trace& t, const TraceCost* cost) {
  const int iters = trace_iterations(t);
  if (iters == 1) return collective_counts(t, cost);
  // When the blocks are the iterations, each distinct block is one iteration's counts.
  const std::vector<Block> blocks = t.block_list();
  std::uint64_t covered = 0;
  for (const Block& b : blocks) covered += b.repeat;
  if (covered == std::uint64_t(iters) && !blocks.empty()) {
    std::vector<CountTree> trees;
    std::vector<decltype(canonical(CountTree{}))> keys;
    for (const Block& b : blocks) {
      trees.push_back(count_blocks(t, &b, cost));
      keys.push_back(canonical(trees.back()));
    }
    // The trailing run of blocks alike: every block when all iterations are alike, else the
    // steady state after the ones that differ (DDP buckets its first iteration differently).
    std::size_t k = blocks.size() - 1;
    while (k > 0 && keys[k - 1] == keys.back()) --k;
    CountTree out = std::move(trees[k]);
    out.steady_from = k == 0 ? 0 : int(blocks[k].iteration);
    return out;
  }
  CountTree tree = collective_counts(t, cost);
  for (ModuleCounts& m : tree.modules) {
    for (std::size_t p = 0; p < m.phases.size(); ++p) {
      for (GroupStat& g : m.phases[p]) {
        COMMTRACE_CHECK(g.stat.count % iters == 0 && g.stat.bytes % std::uint64_t(iters) == 0,
                        ErrorCode::InvalidArgument,
                        "{} {} {}: {} calls ({} bytes) over {} iterations is not a whole number "
                        "per iteration",
                        m.fqn, phase_name(Phase(p)), collective_name(g.op), g.stat.count,
                        g.stat.bytes, iters);
        g.stat.count /= iters;
        g.stat.bytes /= std::uint64_t(iters);
        g.stat.bus_bytes /= iters;
        g.stat.seconds /= iters;
        g.stat.estimate_s /= iters;
      }
    }
  }
  return tree;
}

}  // namespace commtrace
