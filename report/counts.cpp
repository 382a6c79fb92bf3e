// Collective counts per module and phase, rolled up over descendants (DESIGN §1). Records name
// collectives canonically or by PyTorch key; both count under the canonical name. Unknown names
// are kept as they are rather than dropped, so a diff still shows them.
#include "report/counts.h"

#include <charconv>
#include <utility>

#include "tracer/collectives.h"

namespace commtrace {

const ModuleCounts* CountTree::find(const std::string& fqn) const {
  for (const ModuleCounts& m : modules) {
    if (m.fqn == fqn) return &m;
  }
  return nullptr;
}

namespace {

std::string count_name(const std::string& name) {
  const CollectiveSpec* spec = find_collective(name);
  return spec ? spec->name : name;
}

}  // namespace

CountTree collective_counts(const Trace& t) {
  CountTree tree;
  const auto fmt_it = t.metadata.find("format");
  tree.has_bytes = fmt_it == t.metadata.end() || fmt_it->second != "torch";
  const int n = int(t.modules.size());
  if (n == 0) return tree;

  // Preorder from Global; `slot` maps a module index to its position in tree.modules. The
  // visited check keeps a malformed tree (a cycle, a shared child) from looping.
  std::vector<int> slot(std::size_t(n), -1);
  std::vector<std::pair<int, int>> stack{{0, 0}};  // (module, depth)
  while (!stack.empty()) {
    const auto [m, depth] = stack.back();
    stack.pop_back();
    if (m < 0 || m >= n || slot[std::size_t(m)] >= 0) continue;
    slot[std::size_t(m)] = int(tree.modules.size());
    tree.modules.push_back(ModuleCounts{t.modules[std::size_t(m)].fqn, depth, {}});
    const std::vector<int>& children = t.modules[std::size_t(m)].children;
    for (auto it = children.rbegin(); it != children.rend(); ++it)
      stack.push_back({*it, depth + 1});
  }
  // Modules not reachable from Global (not produced by our tracer) still get a row.
  for (int m = 0; m < n; ++m) {
    if (slot[std::size_t(m)] >= 0) continue;
    slot[std::size_t(m)] = int(tree.modules.size());
    tree.modules.push_back(
        ModuleCounts{t.modules[std::size_t(m)].fqn, t.modules[std::size_t(m)].depth, {}});
  }

  for (const OpRecord& r : t.records) {
    if (r.kind != EventKind::Collective) continue;
    const int phase = int(r.phase);
    if (phase < 0 || phase >= 4 || r.module < 0 || r.module >= n) continue;
    const std::string name = count_name(r.name);
    // Walk to the root; at most n steps even if parent links loop.
    int m = r.module;
    for (int steps = 0; m >= 0 && m < n && steps <= n; ++steps) {
      OpStat& s = tree.modules[std::size_t(slot[std::size_t(m)])].phases[std::size_t(phase)][name];
      ++s.count;
      s.bytes += r.collective.bytes;
      if (m == 0) break;
      m = t.modules[std::size_t(m)].parent;
    }
  }
  return tree;
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

CountTree collective_counts_per_iteration(const Trace& t) {
  CountTree tree = collective_counts(t);
  const int iters = trace_iterations(t);
  if (iters == 1) return tree;
  for (ModuleCounts& m : tree.modules) {
    for (std::size_t p = 0; p < m.phases.size(); ++p) {
      for (auto& [name, s] : m.phases[p]) {
        COMMTRACE_CHECK(s.count % iters == 0 && s.bytes % std::uint64_t(iters) == 0,
                        ErrorCode::InvalidArgument,
                        "{} {} {}: {} calls ({} bytes) over {} iterations is not a whole number "
                        "per iteration",
                        m.fqn, phase_name(Phase(p)), name, s.count, s.bytes, iters);
        s.count /= iters;
        s.bytes /= std::uint64_t(iters);
      }
    }
  }
  return tree;
}

}  // namespace commtrace
