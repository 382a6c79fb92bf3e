// commtrace's own text report: the module tree with, per phase, the collectives rolled up per
// (collective, group) with count and bytes, the records themselves (reasons) at noise >= 1 or
// with explain, the ops by noise level, and the per-iteration summary. A record of a repeated
// block is shown once with its repeat count.
#include "report/tree.h"

#include <algorithm>
#include <vector>

#include <fmt/ranges.h>

#include "report/cost.h"
#include "report/counts.h"
#include "report/names.h"
#include "tracer/collectives.h"

namespace commtrace {

namespace {

constexpr Phase kPhases[] = {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Recompute};

struct Style {
  bool on;
  std::string coll(const std::string& s) const { return on ? "\x1b[1;33m" + s + "\x1b[0m" : s; }
  std::string detail(const std::string& s) const { return on ? "\x1b[1;31m" + s + "\x1b[0m" : s; }
  std::string dim(const std::string& s) const { return on ? "\x1b[2m" + s + "\x1b[0m" : s; }
};

// Noise 1: sharded ops; 2: + local ops; 3: + trivial ops (views, transposes), as CommDebugMode.
bool shown_at(const Record& r, int noise) {
  if (r.kind == EventKind::Collective) return false;
  if (r.kind == EventKind::Trivial) return noise >= 3;
  return noise >= (r.sharded ? 1 : 2);
}

std::string collective_line(const Trace& t, const Record& r, std::uint32_t repeat) {
  const CollectiveInfo& c = r.collective;
  const auto ins = t.inputs(r);
  std::string shape;
  if (!ins.empty()) {
    shape = fmt::format("{}{}", dtype_name(r.dtype), shape_str(t.shape(ins[0].shape)));
  }
  std::string op = collective_name(c.op);
  if (c.reduce_op != ReduceOp::None) op += fmt::format("({})", reduce_op_name(c.reduce_op));
  std::string peer;
  if (c.peer >= 0)
    peer = fmt::format(" {} rank {}", c.op == Collective::Recv ? "from" : "to", c.peer);
  std::string line = fmt::format("#{} {} {} {} on {}({}){}", c.seq, op, shape,
                                 format_bytes(c.bytes), t.str(c.group), c.group_size, peer);
  if (repeat > 1) line += fmt::format("  (×{}, every iteration)", repeat);
  return line;
}

// (collective name, group, size, direction) order: the order rows are listed in.
bool row_less(const GroupStat& a, const GroupStat& b) {
  const std::string_view na = collective_name(a.op), nb = collective_name(b.op);
  if (na != nb) return na < nb;
  if (a.group != b.group) return a.group < b.group;
  if (a.group_size != b.group_size) return a.group_size < b.group_size;
  return std::pair(a.from, a.to) < std::pair(b.from, b.to);
}

std::vector<GroupStat> sorted_rows(std::vector<GroupStat> rows) {
  std::sort(rows.begin(), rows.end(), row_less);
  return rows;
}

}  // namespace

std::string render_tree(const Trace& t, const TreeOptions& o) {
  const Style st{o.color};
  const int n = int(t.modules.size());
  const CountTree counts = collective_counts(t, o.cost);
  // Each module's own records per phase, with their repeats.
  std::vector<std::array<std::vector<std::pair<const Record*, std::uint32_t>>, kPhaseCount>> own(
      static_cast<std::size_t>(n));
  t.for_each_record([&](const Record& r, std::uint32_t repeat) {
    COMMTRACE_CHECK(int(r.module) < n && std::size_t(r.phase) < std::size_t(kPhaseCount),
                    ErrorCode::InvalidArgument, "trace: a record names module {} of {}", r.module,
                    n);
    own[r.module][std::size_t(r.phase)].emplace_back(&r, repeat);
  });
  const bool explain = o.explain || o.noise >= 1;

  std::string out;
  const auto order = module_preorder(t);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int m = order[i].first;
    const ModuleNode& node = t.modules[std::size_t(m)];
    const ModuleCounts& mc = counts.modules[i];
    const std::string pad(std::size_t(2 * order[i].second), ' ');
    std::string head = pad + node.fqn;
    if (!node.type.empty()) head += st.dim(fmt::format("  ({})", node.type));
    out += head + "\n";
    if (o.noise >= 1) {
      for (const ParamInfo& p : node.params) {
        out += fmt::format(
            "{}  param {}: {}\n", pad, p.name,
            p.placements == 0 ? "plain tensor" : placements_str(t.placements(p.placements)));
      }
    }
    for (Phase ph : kPhases) {
      const auto& rows = mc.phases[std::size_t(ph)];
      const auto& mine = own[std::size_t(m)][std::size_t(ph)];
      bool has_ops = false;
      for (const auto& [r, repeat] : mine) has_ops = has_ops || shown_at(*r, o.noise);
      if (rows.empty() && !has_ops) continue;
      double est = 0;
      for (const GroupStat& g : rows) est += g.stat.estimate_s;
      out += o.cost && !rows.empty()
                 ? fmt::format("{}  {}{}\n", pad, phase_name(ph),
                               st.dim(fmt::format("  (est. {:.1f} us)", est * 1e6)))
                 : fmt::format("{}  {}\n", pad, phase_name(ph));
      for (const GroupStat& g : sorted_rows(rows)) {
        // A PyTorch dump has neither bytes nor groups: its rows show the count alone.
        const std::string bytes = counts.has_bytes ? format_bytes(g.stat.bytes) : "-";
        const std::string group =
            g.group_size > 0 ? fmt::format("  {}({})", g.group, g.group_size) : "";
        out += st.coll(fmt::format("{}    {:<15} ×{:<3} {:>10}{}", pad, g.name(), g.stat.count,
                                   bytes, group)) +
               "\n";
      }
      for (const auto& [r, repeat] : mine) {
        if (r->kind == EventKind::Collective) {
          if (!explain) continue;
          out += fmt::format("{}      {}\n", pad, st.detail(collective_line(t, *r, repeat)));
          out += fmt::format("{}        why: {}\n", pad, reason_str(t, *r));
          continue;
        }
        if (!shown_at(*r, o.noise)) continue;
        std::vector<std::string> ins;
        for (const TensorArg& a : t.inputs(*r)) ins.push_back(tensor_arg_str(t, a, r->sharded));
        std::string detail = fmt::format("  {}", fmt::join(ins, ", "));
        if (r->sharded && r->mesh != kNoMesh) detail += "  " + mesh_str(t.pools.mesh(r->mesh));
        if (repeat > 1) detail += fmt::format("  ×{}", repeat);
        out += fmt::format("{}    {}{}\n", pad, st.coll(torch_name(t, *r)), st.detail(detail));
      }
    }
  }
  return out;
}

namespace {

// "12.3" µs, or "-" when there is no time.
std::string micros(double seconds, bool known) {
  return known ? fmt::format("{:.1f}", seconds * 1e6) : "-";
}
// GB/s (1e9 bytes per second, nccl-tests' unit), or "-".
std::string gbps(double bytes, double seconds, bool known) {
  return known && seconds > 0 ? fmt::format("{:.2f}", bytes / seconds * 1e-9) : "-";
}

}  // namespace

namespace {

// Each module's memory with its descendants', by module index.
std::vector<ModuleMemory> rolled_up_memory(const Trace& t) {
  std::vector<ModuleMemory> up(t.modules.size());
  if (t.memory.size() != t.modules.size()) return up;
  const auto order = module_preorder(t);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {  // children before parents
    const int m = it->first;
    ModuleMemory& u = up[std::size_t(m)];
    const ModuleMemory& own = t.memory[std::size_t(m)];
    u.params += own.params, u.grads += own.grads, u.optimizer += own.optimizer;
    u.activations += own.activations;
    const int parent = t.modules[std::size_t(m)].parent;
    if (m == 0 || parent < 0 || parent >= int(t.modules.size())) continue;
    ModuleMemory& p = up[std::size_t(parent)];
    p.params += u.params, p.grads += u.grads, p.optimizer += u.optimizer;
    p.activations += u.activations;
  }
  return up;
}

}  // namespace

std::uint64_t memory_peak(const Trace& t) {
  const ModuleMemory m = memory_total(t);
  return m.params + m.optimizer + t.memory_peak;
}

ModuleMemory memory_total(const Trace& t) {
  const std::vector<ModuleMemory> up = rolled_up_memory(t);
  return up.empty() ? ModuleMemory{} : up[0];
}

std::string render_memory(const Trace& t) {
  if (t.memory.empty()) return "";
  const std::vector<ModuleMemory> up = rolled_up_memory(t);
  std::size_t w = 6;
  const auto order = module_preorder(t);
  for (const auto& [m, depth] : order) {
    w = std::max(w, t.modules[std::size_t(m)].fqn.size() + std::size_t(2 * depth));
  }
  std::string out =
      fmt::format("memory of rank {} per module (a module includes its descendants):\n", t.rank);
  out += fmt::format("  {:<{}} {:>12} {:>12} {:>12} {:>12}\n", "module", w, "parameters",
                     "gradients", "optimizer", "activations");
  for (const auto& [m, depth] : order) {
    const ModuleMemory& u = up[std::size_t(m)];
    if (u == ModuleMemory{} && m != 0) continue;
    out += fmt::format("  {:<{}} {:>12} {:>12} {:>12} {:>12}\n",
                       std::string(std::size_t(2 * depth), ' ') + t.modules[std::size_t(m)].fqn, w,
                       format_bytes(u.params), format_bytes(u.grads), format_bytes(u.optimizer),
                       format_bytes(u.activations));
  }
  return out;
}

std::string render_summary(const Trace& t, const TraceCost* cost) {
  const int iters = trace_iterations(t);
  const CountTree counts = collective_counts_per_iteration(t, cost);
  std::string out = fmt::format(
      "per iteration ({} iteration{} traced, rank {}{}):\n", iters, iters == 1 ? "" : "s", t.rank,
      counts.steady_from > 0
          ? fmt::format("; iteration {} on, the iterations before it differ", counts.steady_from)
          : "");
  // The group column fits the longest group name (an imported trace's "default_pg").
  std::size_t gw = 6;
  for (Phase ph : kPhases) {
    if (counts.modules.empty()) break;
    for (const GroupStat& g : counts.modules[0].phases[std::size_t(ph)]) {
      gw = std::max(gw, g.group.size());
    }
  }
  // nccl-tests' columns: bus bytes = bytes × the busbw factor of the group size; algbw =
  // bytes / time, busbw = bus bytes / time, over the iteration's calls of the row; then the
  // cost model's estimate.
  const auto row = [&](const std::string& phase, const std::string& coll, const std::string& group,
                       const std::string& n, const std::string& count, const std::string& bytes,
                       const std::string& bus, const std::string& time, const std::string& algbw,
                       const std::string& busbw, const std::string& est) {
    std::string s =
        fmt::format("  {:<10} {:<15} {:<{}} {:>4} {:>7} {:>12} {:>12} {:>10} {:>8} {:>8}", phase,
                    coll, group, gw, n, count, bytes, bus, time, algbw, busbw);
    if (cost) s += fmt::format(" {:>10}", est);
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  out += row("phase", "collective", "group", "n", "count", "bytes", "bus bytes", "time", "algbw",
             "busbw", "est. time");
  out += row("", "", "", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)");
  const bool times = counts.has_times, bytes = counts.has_bytes;
  std::int64_t total = 0;
  std::uint64_t total_bytes = 0;
  double total_bus = 0, total_s = 0, total_est = 0;
  std::vector<std::string> per_phase;
  bool any = false, bus_known = true;
  for (Phase ph : kPhases) {
    if (counts.modules.empty()) break;
    double phase_est = 0;
    bool phase_any = false;
    for (const GroupStat& g : sorted_rows(counts.modules[0].phases[std::size_t(ph)])) {
      const bool sized = g.group_size > 0;  // 0: unknown, no bus bytes
      const double bus = g.stat.bus_bytes;
      out += row(phase_name(ph), g.name(), g.group.empty() ? "-" : g.group,
                 sized ? std::to_string(g.group_size) : "?", std::to_string(g.stat.count),
                 bytes ? format_bytes(g.stat.bytes) : "-",
                 bytes && sized ? format_bytes(std::uint64_t(bus + 0.5)) : "-",
                 micros(g.stat.seconds, times),
                 gbps(double(g.stat.bytes), g.stat.seconds, times && bytes),
                 gbps(bus, g.stat.seconds, times && bytes && sized),
                 micros(g.stat.estimate_s, bytes && sized));
      total += g.stat.count;
      total_bytes += g.stat.bytes;
      total_bus += bus;
      total_s += g.stat.seconds;
      total_est += g.stat.estimate_s;
      phase_est += g.stat.estimate_s;
      bus_known = bus_known && sized;
      any = phase_any = true;
    }
    if (phase_any)
      per_phase.push_back(fmt::format("{} {:.1f} us", phase_name(ph), phase_est * 1e6));
  }
  if (!any) out += "  (no collectives)\n";
  out += row("total", "", "", "", std::to_string(total), bytes ? format_bytes(total_bytes) : "-",
             bytes && bus_known ? format_bytes(std::uint64_t(total_bus + 0.5)) : "-",
             micros(total_s, times), "", "", micros(total_est, bytes && bus_known));
  if (!bytes) {
    out += "  (a PyTorch CommDebugMode dump holds counts only: no bytes, groups or times)\n";
  } else if (!times) {
    out += fmt::format("  (no times: {} moves no data)\n",
                       metadata_of(t, "device") == "meta" ? "the meta device" : "the fake backend");
  }
  if (!t.memory.empty()) {
    const ModuleMemory m = memory_total(t);
    out += fmt::format(
        "memory of rank {}: parameters {}, gradients {}, optimizer state {}, activations saved for "
        "backward {}; peak {} (parameters, optimizer state and the iteration's allocations at "
        "their most)\n",
        t.rank, format_bytes(m.params), format_bytes(m.grads), format_bytes(m.optimizer),
        format_bytes(m.activations), format_bytes(memory_peak(t)));
  }
  if (cost && bytes && bus_known) {
    out += fmt::format("estimated on {} ({}): {}; iteration {:.1f} us\n", cost->topology().name,
                       cost->topology().description, fmt::join(per_phase, ", "), total_est * 1e6);
  }
  return out;
}

}  // namespace commtrace
