// diff of two traces on their per-iteration collective counts (report/counts.h): per module and
// phase, every collective whose count (or bytes, when both sides have bytes) differs, as an
// aligned tree with a totals line. Not a record-by-record diff: shapes and reasons are out of
// scope here (show both traces for those).
#include "report/diff.h"

#include <algorithm>
#include <set>
#include <vector>

#include <fmt/ranges.h>

#include "report/counts.h"
#include "tracer/collectives.h"

namespace commtrace {

namespace {

constexpr const char* kRed = "\x1b[31m";
constexpr const char* kGreen = "\x1b[32m";
constexpr const char* kReset = "\x1b[0m";
constexpr const char* kMinus = "\u2212";  // typographic minus, as in "−1"

bool is_torch(const Trace& t) {
  const auto it = t.metadata.find("format");
  return it != t.metadata.end() && it->second == "torch";
}

std::string meta(const Trace& t, const char* key) {
  const auto it = t.metadata.find(key);
  return it == t.metadata.end() ? "" : it->second;
}

// Columns on screen: UTF-8 continuation bytes take none.
std::size_t width(const std::string& s) {
  std::size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

std::string pad_right(const std::string& s, std::size_t w) {
  return s + std::string(w > width(s) ? w - width(s) : 0, ' ');
}
std::string pad_left(const std::string& s, std::size_t w) {
  return std::string(w > width(s) ? w - width(s) : 0, ' ') + s;
}

std::string signed_str(std::int64_t d) {
  return d < 0 ? fmt::format("{}{}", kMinus, -d) : fmt::format("+{}", d);
}

std::string bytes_str(std::uint64_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (b < 1024) return fmt::format("{} B", b);
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.3g} {}", v, units[u]);
}

std::string signed_bytes(std::uint64_t a, std::uint64_t b) {
  return b >= a ? fmt::format("+{}", bytes_str(b - a))
                : fmt::format("{}{}", kMinus, bytes_str(a - b));
}

// "toy tp (world 4)" from the metadata that is present.
std::string describe(const Trace& t) {
  std::vector<std::string> head, details;
  const std::string model = meta(t, "model"), plan = meta(t, "plan");
  // Built-in plans are named after their model ("toy tp"): do not repeat the model.
  if (!model.empty() && plan.rfind(model + " ", 0) != 0) head.push_back(model);
  if (!plan.empty()) head.push_back(plan);
  if (is_torch(t)) head.push_back("PyTorch CommDebugMode dump");
  if (!meta(t, "world_size").empty()) details.push_back("world " + meta(t, "world_size"));
  if (meta(t, "input_requires_grad") == "true") details.push_back("input requires grad");
  if (!meta(t, "source").empty()) details.push_back(meta(t, "source"));
  const int iters = trace_iterations(t);
  if (iters > 1) details.push_back(fmt::format("{} iterations", iters));
  std::string s = fmt::format("{}", fmt::join(head, " "));
  if (s.empty()) s = "trace";
  if (!details.empty()) s += fmt::format(" ({})", fmt::join(details, ", "));
  return s;
}

// Ops of both sides in table order (all_reduce, all_gather, ...), then unknown names sorted.
std::vector<std::string> op_union(const PhaseCounts* a, const PhaseCounts* b) {
  std::set<std::string> names;
  if (a) {
    for (const auto& [n, s] : *a) names.insert(n);
  }
  if (b) {
    for (const auto& [n, s] : *b) names.insert(n);
  }
  std::vector<std::string> out;
  for (const CollectiveSpec& c : collective_table()) {
    if (names.erase(c.name)) out.push_back(c.name);
  }
  out.insert(out.end(), names.begin(), names.end());
  return out;
}

OpStat stat_of(const PhaseCounts* p, const std::string& op) {
  if (!p) return {};
  const auto it = p->find(op);
  return it == p->end() ? OpStat{} : it->second;
}

bool has_any(const ModuleCounts* m) {
  if (!m) return false;
  for (const PhaseCounts& p : m->phases) {
    for (const auto& [n, s] : p) {
      if (s.count != 0 || s.bytes != 0) return true;
    }
  }
  return false;
}

struct Row {
  std::string phase;  // empty when it repeats the previous row's
  std::string op;
  OpStat a, b;
  bool show_bytes = false;
};

struct Block {
  std::string fqn;
  std::string note;  // "(only in B)"
  std::vector<Row> rows;
};

}  // namespace

DiffResult diff_traces(const Trace& a, const Trace& b, const DiffOptions& options) {
  const CountTree ca = collective_counts_per_iteration(a);
  const CountTree cb = collective_counts_per_iteration(b);
  const bool bytes = ca.has_bytes && cb.has_bytes;
  // PyTorch dumps hold forward and backward only; other phases are not comparable with them.
  const bool torch = is_torch(a) || is_torch(b);
  std::vector<Phase> phases{Phase::Forward, Phase::Backward};
  if (!torch) phases.insert(phases.end(), {Phase::Optimizer, Phase::Recompute});

  std::vector<std::string> fqns;
  std::set<std::string> seen;
  for (const CountTree* c : {&ca, &cb}) {
    for (const ModuleCounts& m : c->modules) {
      if (options.max_depth >= 0 && m.depth > options.max_depth) continue;
      if (seen.insert(m.fqn).second) fqns.push_back(m.fqn);
    }
  }

  std::vector<Block> blocks;
  for (const std::string& fqn : fqns) {
    const ModuleCounts* ma = ca.find(fqn);
    const ModuleCounts* mb = cb.find(fqn);
    // A module without collectives on the one side that has it is structure, not traffic.
    if ((!ma && !has_any(mb)) || (!mb && !has_any(ma))) continue;
    Block block{fqn,
                !ma   ? fmt::format("(only in {})", options.label_b)
                : !mb ? fmt::format("(only in {})", options.label_a)
                      : "",
                {}};
    for (Phase ph : phases) {
      const PhaseCounts* pa = ma ? &ma->phases[std::size_t(ph)] : nullptr;
      const PhaseCounts* pb = mb ? &mb->phases[std::size_t(ph)] : nullptr;
      bool first = true;
      for (const std::string& op : op_union(pa, pb)) {
        const OpStat sa = stat_of(pa, op), sb = stat_of(pb, op);
        const bool bytes_differ = bytes && sa.bytes != sb.bytes;
        if (sa.count == sb.count && !bytes_differ) continue;
        block.rows.push_back(Row{first ? phase_name(ph) : "", op, sa, sb, bytes_differ});
        first = false;
      }
    }
    if (!block.rows.empty()) blocks.push_back(std::move(block));
  }

  const std::string desc_a = fmt::format("{}: {}", options.label_a, describe(a));
  const std::string desc_b = fmt::format("{}: {}", options.label_b, describe(b));
  DiffResult result;
  if (blocks.empty()) {
    result.equal = true;
    result.text = fmt::format("no differences between {} and {}{}\n", desc_a, desc_b,
                              torch ? " (forward and backward; PyTorch dumps hold no others)" : "");
    return result;
  }
  result.equal = false;

  auto paint = [&](const std::string& s, std::int64_t sign) {
    if (!options.color || sign == 0) return s;
    return fmt::format("{}{}{}", sign < 0 ? kRed : kGreen, s, kReset);
  };

  std::size_t w_phase = 0, w_op = 0, w_a = 0, w_b = 0, w_delta = 0, w_ba = 0, w_bb = 0;
  for (const Block& bl : blocks) {
    for (const Row& r : bl.rows) {
      w_phase = std::max(w_phase, width(r.phase));
      w_op = std::max(w_op, width(r.op));
      w_a = std::max(w_a, std::to_string(r.a.count).size());
      w_b = std::max(w_b, std::to_string(r.b.count).size());
      if (r.a.count != r.b.count) {
        w_delta = std::max(w_delta, width(signed_str(r.b.count - r.a.count)) + 2);
      }
      if (r.show_bytes) {
        w_ba = std::max(w_ba, bytes_str(r.a.bytes).size());
        w_bb = std::max(w_bb, bytes_str(r.b.bytes).size());
      }
    }
  }

  std::string out;
  out += paint(fmt::format("--- {}", desc_a), -1) + "\n";
  out += paint(fmt::format("+++ {}", desc_b), +1) + "\n";
  const int iters = std::max(trace_iterations(a), trace_iterations(b));
  if (iters > 1) out += "(collective counts per iteration)\n";
  if (torch) out += "(forward and backward only: PyTorch dumps hold no other phase)\n";
  if (!bytes) out += "(bytes not compared: a PyTorch dump has none)\n";
  for (const Block& bl : blocks) {
    out += bl.note.empty() ? bl.fqn + "\n" : fmt::format("{}   {}\n", bl.fqn, bl.note);
    for (const Row& r : bl.rows) {
      const std::int64_t d = std::int64_t(r.b.count) - std::int64_t(r.a.count);
      std::string line = fmt::format(
          "  {}   {}   {} \u2192 {}", pad_right(r.phase, w_phase), pad_right(r.op, w_op),
          pad_left(std::to_string(r.a.count), w_a), pad_left(std::to_string(r.b.count), w_b));
      const std::string delta = d == 0 ? "" : "(" + signed_str(d) + ")";
      if (r.show_bytes) {
        line += "   " + paint(pad_right(delta, w_delta), d);
        line += fmt::format("   bytes {} \u2192 {}   ", pad_left(bytes_str(r.a.bytes), w_ba),
                            pad_left(bytes_str(r.b.bytes), w_bb));
        line +=
            paint("(" + signed_bytes(r.a.bytes, r.b.bytes) + ")", r.b.bytes > r.a.bytes ? 1 : -1);
      } else if (!delta.empty()) {
        line += "   " + paint(delta, d);
      }
      out += line + "\n";
    }
  }

  // Totals from Global (node 0 on both sides).
  const ModuleCounts* ga = ca.find("Global");
  const ModuleCounts* gb = cb.find("Global");
  std::vector<std::string> parts;
  for (Phase ph : phases) {
    const PhaseCounts* pa = ga ? &ga->phases[std::size_t(ph)] : nullptr;
    const PhaseCounts* pb = gb ? &gb->phases[std::size_t(ph)] : nullptr;
    std::vector<std::string> items;
    for (const std::string& op : op_union(pa, pb)) {
      const OpStat sa = stat_of(pa, op), sb = stat_of(pb, op);
      const std::int64_t d = std::int64_t(sb.count) - std::int64_t(sa.count);
      if (d != 0) {
        items.push_back(paint(fmt::format("{} {}", signed_str(d), op), d));
      } else if (bytes && sa.bytes != sb.bytes) {
        items.push_back(paint(fmt::format("{} bytes {}", op, signed_bytes(sa.bytes, sb.bytes)),
                              sb.bytes > sa.bytes ? 1 : -1));
      }
    }
    if (!items.empty()) {
      parts.push_back(fmt::format("{} {}", phase_name(ph), fmt::join(items, ", ")));
    }
  }
  out += parts.empty() ? "totals: unchanged (collectives moved between modules)\n"
                       : fmt::format("totals: {}\n", fmt::join(parts, "; "));
  result.text = std::move(out);
  return result;
}

}  // namespace commtrace
