#include "report/diff.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include "report/names.h"
#include "tracer/collectives.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

constexpr const char* kRed = "\x1b[31m";
constexpr const char* kGreen = "\x1b[32m";
constexpr const char* kReset = "\x1b[0m";
constexpr const char* kMinus = "-";  // ASCII, so grep -- -1 finds it

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

std::string us(double seconds) { return fmt::format("{:.1f}", seconds * 1e6); }

std::string signed_str(std::int64_t d) {
  return d < 0 ? fmt::format("{}{}", kMinus, -d) : fmt::format("+{}", d);
}

std::string signed_bytes(std::int64_t d) {
  const std::uint64_t magnitude = d >= 0 ? std::uint64_t(d) : std::uint64_t(-(d + 1)) + 1;
  return fmt::format("{}{}", d >= 0 ? "+" : kMinus, format_bytes(magnitude));
}

// Collectives of either side in table order.
std::vector<Collective> op_union(const ModuleCounts* a, const ModuleCounts* b, Phase p) {
  std::vector<Collective> out;
  for (int i = 0; i < kCollectiveCount; ++i) {
    const Collective c = Collective(i);
    const bool in_a = a && a->op(p, c).count + std::int64_t(a->op(p, c).bytes) != 0;
    const bool in_b = b && b->op(p, c).count + std::int64_t(b->op(p, c).bytes) != 0;
    if (in_a || in_b) out.push_back(c);
  }
  return out;
}

}  // namespace

DiffResult diff_traces(const Trace& a, const Trace& b, const DiffOptions& options) {
  std::optional<TraceCost> cost_a, cost_b;
  if (options.topology) {
    cost_a.emplace(a, *options.topology);
    cost_b.emplace(b, *options.topology);
  }
  CountTree ca = collective_counts_per_iteration(a, cost_a ? &*cost_a : nullptr);
  CountTree cb = collective_counts_per_iteration(b, cost_b ? &*cost_b : nullptr);
  DiffResult d;
  if (options.topology) d.topology = options.topology->name;
  d.bytes = ca.has_bytes && cb.has_bytes;
  // PyTorch dumps hold forward and backward only (recomputed collectives under backward); other
  // phases are not comparable with them.
  d.torch = is_torch_dump(a) || is_torch_dump(b);
  if (d.torch) {
    fold_recompute_into_backward(ca);
    fold_recompute_into_backward(cb);
  }
  d.per_iteration = std::max(trace_iterations(a), trace_iterations(b)) > 1;
  d.label_a = options.label_a;
  d.label_b = options.label_b;
  d.desc_a = fmt::format("{}: {}", options.label_a, trace_description(a));
  d.desc_b = fmt::format("{}: {}", options.label_b, trace_description(b));
  std::vector<Phase> phases{Phase::Forward, Phase::Backward};
  if (!d.torch) phases.insert(phases.end(), {Phase::Optimizer, Phase::Recompute});

  std::vector<std::string> fqns;
  std::set<std::string> seen;
  for (const CountTree* c : {&ca, &cb}) {
    for (const ModuleCounts& m : c->modules) {
      if (options.max_depth >= 0 && m.depth > options.max_depth) continue;
      if (seen.insert(m.fqn).second) fqns.push_back(m.fqn);
    }
  }
  for (const std::string& fqn : fqns) {
    const ModuleCounts* ma = ca.find(fqn);
    const ModuleCounts* mb = cb.find(fqn);
    // A module without collectives on the one side that has it is structure, not traffic.
    if ((!ma && mb->empty()) || (!mb && ma->empty())) continue;
    DiffModule dm{fqn, !ma ? 2 : !mb ? 1 : 0, {}};
    for (Phase ph : phases) {
      for (Collective op : op_union(ma, mb, ph)) {
        const OpStat sa = ma ? ma->op(ph, op) : OpStat{}, sb = mb ? mb->op(ph, op) : OpStat{};
        const bool bytes_differ = d.bytes && sa.bytes != sb.bytes;
        if (sa.count == sb.count && !bytes_differ) continue;
        dm.rows.push_back(DiffRow{ph, op, sa, sb, bytes_differ});
      }
    }
    if (!dm.rows.empty()) d.modules.push_back(std::move(dm));
  }
  d.equal = d.modules.empty();

  const ModuleCounts* ga = ca.find("Global");
  const ModuleCounts* gb = cb.find("Global");
  for (Phase ph : phases) {
    for (Collective op : op_union(ga, gb, ph)) {
      const OpStat sa = ga ? ga->op(ph, op) : OpStat{}, sb = gb ? gb->op(ph, op) : OpStat{};
      const std::int64_t dc = sb.count - sa.count;
      const std::int64_t db = std::int64_t(sb.bytes) - std::int64_t(sa.bytes);
      if (dc != 0 || (d.bytes && db != 0)) d.totals.push_back(TotalChange{ph, op, dc, db});
    }
    if (d.bytes) {
      double ba = 0, bb = 0;
      for (Collective op : op_union(ga, gb, ph)) {
        ba += ga ? ga->op(ph, op).bus_bytes : 0;
        bb += gb ? gb->op(ph, op).bus_bytes : 0;
      }
      if (std::llround(ba) != std::llround(bb)) d.bus.push_back(PhaseBus{ph, ba, bb});
    }
    if (options.topology && d.bytes) {
      double ta = 0, tb = 0;
      bool any = false;
      for (Collective op : op_union(ga, gb, ph)) {
        ta += ga ? ga->op(ph, op).estimate_s : 0;
        tb += gb ? gb->op(ph, op).estimate_s : 0;
        any = true;
      }
      if (any) d.est_times.push_back(PhaseTime{ph, ta, tb});
    }
  }
  return d;
}

std::string render_diff(const DiffResult& d, bool color) {
  if (d.equal) {
    return fmt::format("no differences between {} and {}{}\n", d.desc_a, d.desc_b,
                       d.torch ? " (forward and backward; PyTorch dumps hold no others)" : "");
  }
  auto paint = [&](const std::string& s, std::int64_t sign) {
    if (!color || sign == 0) return s;
    return fmt::format("{}{}{}", sign < 0 ? kRed : kGreen, s, kReset);
  };
  std::size_t w_phase = 0, w_op = 0, w_a = 0, w_b = 0, w_delta = 0, w_ba = 0, w_bb = 0, w_bd = 0;
  for (const DiffModule& m : d.modules) {
    for (const DiffRow& r : m.rows) {
      w_phase = std::max(w_phase, width(phase_name(r.phase)));
      w_op = std::max(w_op, width(collective_name(r.op)));
      w_a = std::max(w_a, std::to_string(r.a.count).size());
      w_b = std::max(w_b, std::to_string(r.b.count).size());
      if (r.a.count != r.b.count) {
        w_delta = std::max(w_delta, width(signed_str(r.b.count - r.a.count)) + 2);
      }
      if (r.bytes_differ) {
        w_ba = std::max(w_ba, format_bytes(r.a.bytes).size());
        w_bb = std::max(w_bb, format_bytes(r.b.bytes).size());
        const std::int64_t db = std::int64_t(r.b.bytes) - std::int64_t(r.a.bytes);
        w_bd = std::max(w_bd, signed_bytes(db).size() + 2);
      }
    }
  }
  std::string out;
  out += paint(fmt::format("--- {}", d.desc_a), -1) + "\n";
  out += paint(fmt::format("+++ {}", d.desc_b), +1) + "\n";
  if (d.per_iteration) out += "(collective counts per iteration)\n";
  if (d.torch) out += "(forward and backward only: PyTorch dumps hold no other phase)\n";
  if (!d.bytes) out += "(bytes not compared: a PyTorch dump has none)\n";
  for (const DiffModule& m : d.modules) {
    out += m.only_in == 0
               ? m.fqn + "\n"
               : fmt::format("{}   (only in {})\n", m.fqn, m.only_in == 1 ? d.label_a : d.label_b);
    Phase last = Phase(255);
    for (const DiffRow& r : m.rows) {
      const std::int64_t delta = r.b.count - r.a.count;
      const std::string phase = r.phase == last ? "" : phase_name(r.phase);
      last = r.phase;
      std::string line = fmt::format("  {}   {}   {} \u2192 {}", pad_right(phase, w_phase),
                                     pad_right(collective_name(r.op), w_op),
                                     pad_left(std::to_string(r.a.count), w_a),
                                     pad_left(std::to_string(r.b.count), w_b));
      const std::string delta_str = delta == 0 ? "" : "(" + signed_str(delta) + ")";
      if (r.bytes_differ) {
        const std::int64_t db = std::int64_t(r.b.bytes) - std::int64_t(r.a.bytes);
        line += "   " + paint(pad_right(delta_str, w_delta), delta);
        line += fmt::format("   bytes {} \u2192 {}   ", pad_left(format_bytes(r.a.bytes), w_ba),
                            pad_left(format_bytes(r.b.bytes), w_bb));
        const std::string bd = "(" + signed_bytes(db) + ")";
        line += paint(d.topology.empty() ? bd : pad_right(bd, w_bd), db > 0 ? 1 : -1);
      } else if (!delta_str.empty()) {
        line += "   " + paint(delta_str, delta);
      }
      if (!d.topology.empty() && d.bytes) {
        line += fmt::format("   est. {} → {} us", us(r.a.estimate_s), us(r.b.estimate_s));
      }
      out += line + "\n";
    }
  }
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < d.totals.size();) {
    const Phase ph = d.totals[i].phase;
    std::vector<std::string> items;
    for (; i < d.totals.size() && d.totals[i].phase == ph; ++i) {
      const TotalChange& c = d.totals[i];
      if (c.count_delta != 0) {
        items.push_back(paint(
            fmt::format("{} {}", signed_str(c.count_delta), collective_name(c.op)), c.count_delta));
      } else {
        items.push_back(
            paint(fmt::format("{} bytes {}", collective_name(c.op), signed_bytes(c.bytes_delta)),
                  c.bytes_delta > 0 ? 1 : -1));
      }
    }
    parts.push_back(fmt::format("{} {}", phase_name(ph), fmt::join(items, ", ")));
  }
  out += parts.empty() ? "totals: unchanged (collectives moved between modules)\n"
                       : fmt::format("totals: {}\n", fmt::join(parts, "; "));
  if (!d.bus.empty()) {
    std::vector<std::string> items;
    for (const PhaseBus& p : d.bus) {
      const auto a = std::int64_t(std::llround(p.a)), b = std::int64_t(std::llround(p.b));
      items.push_back(fmt::format("{} {} \u2192 {} ({})", phase_name(p.phase),
                                  format_bytes(std::uint64_t(a)), format_bytes(std::uint64_t(b)),
                                  paint(signed_bytes(b - a), b > a ? 1 : -1)));
    }
    out += fmt::format("bus bytes: {}\n", fmt::join(items, "; "));
  }
  if (!d.est_times.empty()) {
    std::vector<std::string> times;
    double ta = 0, tb = 0;
    for (const PhaseTime& p : d.est_times) {
      times.push_back(fmt::format("{} {} → {} us", phase_name(p.phase), us(p.a_s), us(p.b_s)));
      ta += p.a_s;
      tb += p.b_s;
    }
    out += fmt::format("estimated time per iteration on {}: {}; iteration {} → {} us ({}{} us)\n",
                       d.topology, fmt::join(times, ", "), us(ta), us(tb), tb >= ta ? "+" : kMinus,
                       us(std::abs(tb - ta)));
  }
  return out;
}

std::string diff_json(const DiffResult& d) {
  Json modules = Json::array();
  for (const DiffModule& m : d.modules) {
    Json rows = Json::array();
    for (const DiffRow& r : m.rows) {
      Json row{{"phase", phase_name(r.phase)},
               {"collective", collective_name(r.op)},
               {"count_a", r.a.count},
               {"count_b", r.b.count}};
      if (d.bytes) {
        row["bytes_a"] = r.a.bytes;
        row["bytes_b"] = r.b.bytes;
      }
      if (!d.topology.empty() && d.bytes) {
        row["est_a_us"] = r.a.estimate_s * 1e6;
        row["est_b_us"] = r.b.estimate_s * 1e6;
      }
      rows.push_back(std::move(row));
    }
    modules.push_back(
        Json{{"fqn", m.fqn},
             {"only_in", m.only_in == 0 ? Json(nullptr) : Json(m.only_in == 1 ? "a" : "b")},
             {"rows", std::move(rows)}});
  }
  Json totals = Json::array();
  for (const TotalChange& c : d.totals) {
    Json t{{"phase", phase_name(c.phase)},
           {"collective", collective_name(c.op)},
           {"count_delta", c.count_delta}};
    if (d.bytes) t["bytes_delta"] = c.bytes_delta;
    totals.push_back(std::move(t));
  }
  Json bus = Json::array();
  for (const PhaseBus& p : d.bus) {
    bus.push_back(Json{{"phase", phase_name(p.phase)}, {"a", p.a}, {"b", p.b}});
  }
  const Json root{{"schema", "commtrace.diff"},
                  {"version", "1.1"},
                  {"equal", d.equal},
                  {"a", d.desc_a},
                  {"b", d.desc_b},
                  {"per_iteration", d.per_iteration},
                  {"bytes_compared", d.bytes},
                  {"phases", d.torch ? Json{"forward", "backward"}
                                     : Json{"forward", "backward", "optimizer", "recompute"}},
                  {"modules", std::move(modules)},
                  {"totals", std::move(totals)},
                  {"bus_bytes", std::move(bus)}};
  Json root_out = root;
  if (!d.topology.empty()) {
    Json times = Json::array();
    for (const PhaseTime& p : d.est_times) {
      times.push_back(
          Json{{"phase", phase_name(p.phase)}, {"a_us", p.a_s * 1e6}, {"b_us", p.b_s * 1e6}});
    }
    root_out["topology"] = d.topology;
    root_out["estimated_times"] = std::move(times);
  }
  return root_out.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace commtrace
