#include "report/tree.h"

#include <array>
#include <map>
#include <tuple>
#include <vector>

#include "report/names.h"
#include "tracer/collectives.h"

namespace commtrace {

namespace {

constexpr Phase kPhases[] = {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Recompute};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

struct Style {
  bool on;
  std::string coll(const std::string& s) const { return on ? "\x1b[1;33m" + s + "\x1b[0m" : s; }
  std::string detail(const std::string& s) const { return on ? "\x1b[1;31m" + s + "\x1b[0m" : s; }
  std::string dim(const std::string& s) const { return on ? "\x1b[2m" + s + "\x1b[0m" : s; }
};

// (op, group, group size) -> count and bytes, over a module's subtree and one phase.
using GroupKey = std::tuple<std::string, std::string, int>;
struct Agg {
  int count = 0;
  std::uint64_t bytes = 0;
};

// Noise 1: sharded ops; 2: + local ops; 3: + trivial ops (views, transposes), as CommDebugMode.
bool shown_at(const OpRecord& r, int noise) {
  if (r.kind == EventKind::Collective) return false;
  if (r.kind == EventKind::Trivial) return noise >= 3;
  return noise >= (r.sharded ? 1 : 2);
}

std::string meta_str(const TensorMeta& m, bool sharded) {
  if (!sharded || m.placements.empty()) return shape_str(m.shape);
  return fmt::format("{} {}", shape_str(m.global_shape), m.placements);
}

std::string collective_line(const OpRecord& r) {
  const TensorMeta* in = r.inputs.empty() ? nullptr : &r.inputs[0];
  std::string shape = in ? fmt::format("{}{}", dtype_name(r.dtype), shape_str(in->shape)) : "";
  std::string op = r.name;
  if (r.collective.reduce_op != ReduceOp::None) {
    op += fmt::format("({})", reduce_op_name(r.collective.reduce_op));
  }
  return fmt::format("#{} {} {} {} on {}({})", r.collective.seq, op, shape,
                     human_bytes(double(r.collective.bytes)), r.collective.group,
                     r.collective.group_size);
}

std::string why_line(const OpRecord& r) {
  std::string why = r.reason.empty() ? "(no reason recorded)" : r.reason;
  if (!r.collective.placements_before.empty() || !r.collective.placements_after.empty()) {
    why += fmt::format(": {} → {}", r.collective.placements_before, r.collective.placements_after);
  }
  return why;
}

}  // namespace

std::string render_tree(const Trace& t, const TreeOptions& o) {
  const Style st{o.color};
  std::string out;
  const int n = int(t.modules.size());
  // Rolled-up aggregation per module and phase.
  std::vector<std::array<std::map<GroupKey, Agg>, 4>> agg(static_cast<std::size_t>(n));
  std::vector<std::array<std::vector<const OpRecord*>, 4>> own(static_cast<std::size_t>(n));
  for (const OpRecord& r : t.records) {
    COMMTRACE_CHECK(r.module >= 0 && r.module < n, ErrorCode::InvalidArgument,
                    "trace: record {} names module {} of {}", r.index, r.module, n);
    own[std::size_t(r.module)][std::size_t(r.phase)].push_back(&r);
    if (r.kind != EventKind::Collective) continue;
    for (int m = r.module; m >= 0; m = t.modules[std::size_t(m)].parent) {
      Agg& a = agg[std::size_t(m)][std::size_t(r.phase)]
                  [GroupKey{r.name, r.collective.group, r.collective.group_size}];
      ++a.count;
      a.bytes += r.collective.bytes;
    }
  }
  const bool explain = o.explain || o.noise >= 1;

  // Preorder walk from Global.
  std::vector<int> stack{0};
  while (!stack.empty()) {
    const int m = stack.back();
    stack.pop_back();
    const ModuleNode& node = t.modules[std::size_t(m)];
    for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) stack.push_back(*it);
    const std::string pad(std::size_t(2 * node.depth), ' ');
    std::string head = pad + node.fqn;
    if (!node.type.empty()) head += st.dim(fmt::format("  ({})", node.type));
    out += head + "\n";
    if (o.noise >= 1) {
      for (const ParamInfo& p : node.params) {
        out += fmt::format("{}  param {}: {}\n", pad, p.name,
                           p.placements.empty() ? "plain tensor" : p.placements);
      }
    }
    for (Phase ph : kPhases) {
      const auto& a = agg[std::size_t(m)][std::size_t(ph)];
      const auto& mine = own[std::size_t(m)][std::size_t(ph)];
      bool has_ops = false;
      for (const OpRecord* r : mine) has_ops = has_ops || shown_at(*r, o.noise);
      if (a.empty() && !has_ops) continue;
      out += fmt::format("{}  {}\n", pad, phase_name(ph));
      for (const auto& [key, v] : a) {
        const auto& [name, group, size] = key;
        out += st.coll(fmt::format("{}    {:<15} ×{:<3} {:>10}  {}({})", pad, name, v.count,
                                   human_bytes(double(v.bytes)), group, size)) +
               "\n";
      }
      for (const OpRecord* r : mine) {
        if (r->kind == EventKind::Collective) {
          if (!explain) continue;
          out += fmt::format("{}      {}\n", pad, st.detail(collective_line(*r)));
          out += fmt::format("{}        why: {}\n", pad, why_line(*r));
          continue;
        }
        if (!shown_at(*r, o.noise)) continue;
        std::vector<std::string> ins;
        for (const TensorMeta& in : r->inputs) ins.push_back(meta_str(in, r->sharded));
        out += fmt::format("{}    {}{}\n", pad, st.coll(torch_name(*r)),
                           st.detail(fmt::format("  {}{}", fmt::join(ins, ", "),
                                                 r->sharded ? "  " + r->mesh : "")));
      }
    }
  }
  return out;
}

std::string render_summary(const Trace& t) {
  int iters = 1;
  if (auto it = t.metadata.find("iterations"); it != t.metadata.end()) {
    try {
      iters = std::max(1, std::stoi(it->second));
    } catch (const std::exception&) {
      iters = 1;
    }
  }
  std::map<std::tuple<int, std::string, std::string, int>, Agg> rows;
  for (const OpRecord& r : t.records) {
    if (r.kind != EventKind::Collective) continue;
    Agg& a = rows[{int(r.phase), r.name, r.collective.group, r.collective.group_size}];
    ++a.count;
    a.bytes += r.collective.bytes;
  }
  std::string out = fmt::format("per iteration ({} iteration{} traced, rank {}):\n", iters,
                                iters == 1 ? "" : "s", t.rank);
  out += fmt::format("  {:<10} {:<15} {:<6} {:>4} {:>7} {:>12} {:>13}\n", "phase", "collective",
                     "group", "n", "count", "bytes", "busbw factor");
  int total = 0;
  double total_bytes = 0;
  for (const auto& [key, a] : rows) {
    const auto& [phase, name, group, size] = key;
    const double count = double(a.count) / iters, bytes = double(a.bytes) / iters;
    out += fmt::format("  {:<10} {:<15} {:<6} {:>4} {:>7g} {:>12} {:>13.3f}\n",
                       phase_name(Phase(phase)), name, group, size, count, human_bytes(bytes),
                       busbw_factor(name, size));
    total += a.count;
    total_bytes += bytes;
  }
  if (rows.empty()) out += "  (no collectives)\n";
  out += fmt::format("  {:<10} {:<15} {:<6} {:>4} {:>7g} {:>12}\n", "total", "", "", "",
                     double(total) / iters, human_bytes(total_bytes));
  return out;
}

}  // namespace commtrace
