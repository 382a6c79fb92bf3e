#include "report/html.h"

#include <algorithm>
#include <string_view>

#include "report/chrome_trace.h"
#include "report/counts.h"
#include "report/names.h"
#include "report/tree.h"
#include "tracer/collectives.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

constexpr Phase kPhases[] = {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Recompute};

// One side's figures, computed here so the page's script only lays them out.
Json side_json(const HtmlSide& side, int rank, const Topology& topo) {
  const auto it = std::find_if(side.traces.begin(), side.traces.end(),
                               [&](const Trace& t) { return t.rank == rank; });
  COMMTRACE_CHECK(it != side.traces.end(), ErrorCode::InvalidArgument,
                  "report: {} holds no rank {}", side.label, rank);
  const Trace& t = *it;
  const TraceCost cost(t, topo);
  const CountTree c = collective_counts_per_iteration(t, &cost);
  Json rows = Json::array();
  std::int64_t count = 0;
  std::uint64_t bytes = 0;
  double bus = 0, est = 0;
  for (Phase ph : kPhases) {
    for (const GroupStat& g : c.modules.at(0).phases[std::size_t(ph)]) {
      const double b = g.stat.bus_bytes;
      rows.push_back(Json{{"phase", phase_name(ph)},
                          {"collective", g.name()},
                          {"group", g.group},
                          {"n", g.group_size},
                          {"count", g.stat.count},
                          {"bytes", format_bytes(g.stat.bytes)},
                          {"bus", format_bytes(std::uint64_t(b + 0.5))},
                          {"est_us", g.stat.estimate_s * 1e6}});
      count += g.stat.count;
      bytes += g.stat.bytes;
      bus += b;
      est += g.stat.estimate_s;
    }
  }
  Json modules = Json::array();
  for (const ModuleCounts& m : c.modules) {
    Json phases = Json::object();
    for (Phase ph : kPhases) {
      const auto& list = m.phases[std::size_t(ph)];
      if (list.empty()) continue;
      std::int64_t n = 0;
      std::uint64_t by = 0;
      double e = 0;
      for (const GroupStat& g : list) n += g.stat.count, by += g.stat.bytes, e += g.stat.estimate_s;
      phases[phase_name(ph)] = Json{{"count", n}, {"bytes", format_bytes(by)}, {"est_us", e * 1e6}};
    }
    modules.push_back(Json{{"fqn", m.fqn}, {"depth", m.depth}, {"phases", std::move(phases)}});
  }
  std::string timeline;
  write_chrome_trace({t}, topo, [&](std::string_view s) { timeline += s; });
  Json side_out{{"label", side.label},
                {"desc", trace_description(t)},
                {"rank", t.rank},
                {"totals",
                 {{"count", count},
                  {"bytes", format_bytes(bytes)},
                  {"bus", format_bytes(std::uint64_t(bus + 0.5))},
                  {"est_us", est * 1e6}}},
                {"rows", std::move(rows)},
                {"modules", std::move(modules)},
                {"timeline", Json::parse(timeline)["traceEvents"]},
                {"times", has_times(t) ? "measured" : "estimated by the cost model"}};
  if (!t.memory.empty()) {
    const ModuleMemory m = memory_total(t);
    side_out["memory"] = Json{{"params", format_bytes(m.params)},
                              {"grads", format_bytes(m.grads)},
                              {"optimizer", format_bytes(m.optimizer)},
                              {"activations", format_bytes(m.activations)},
                              {"peak", format_bytes(memory_peak(t))}};
  }
  return side_out;
}

// The page: a static shell, its data as JSON, and the script that renders it.
constexpr const char* kHead = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>commtrace report</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
th{background:#f4f4f4}td.l,th.l{text-align:left}
.cards{display:flex;gap:16px;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:260px}
.card b{font-size:18px}.muted{color:#777}
.bar{height:10px;display:inline-block;vertical-align:middle}.a{background:#4a7bd0}.b{background:#e08a2c}
svg text{font:10px sans-serif}
</style></head><body data-status="loading">
<h1 id="title">commtrace report</h1><div id="app"></div>
<script id="data" type="application/json">)HTML";

constexpr const char* kScript = R"HTML(</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const app = document.getElementById("app");
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
const us = x => x.toFixed(1);
function table(head, rows, leftCols) {
  const t = el("table");
  t.append(el("tr", {}, ...head.map((h, i) => el("th", {class: i < leftCols ? "l" : ""}, h))));
  for (const r of rows) t.append(el("tr", {}, ...r.map((c, i) => el("td", {class: i < leftCols ? "l" : ""}, c))));
  return t;
}
const phases = ["forward", "backward", "optimizer", "recompute"];
document.getElementById("title").textContent = data.title;
app.append(el("p", {class: "muted"}, "Estimated times: " + data.topology));
const cards = el("div", {class: "cards"});
data.sides.forEach((s, i) => {
  const c = el("div", {class: "card", id: "card-" + i});
  c.append(el("div", {}, el("span", {class: i ? "bar b" : "bar a", style: "width:10px"}), " ", s.label));
  c.append(el("div", {class: "muted"}, s.desc + ", rank " + s.rank));
  c.append(el("div", {}, "collectives per iteration: ", el("b", {id: "total-count-" + i}, s.totals.count)));
  c.append(el("div", {}, "bytes: ", el("b", {id: "total-bytes-" + i}, s.totals.bytes), "  bus bytes: ", el("b", {id: "total-bus-" + i}, s.totals.bus)));
  c.append(el("div", {}, "estimated comm time: ", el("b", {id: "total-est-" + i}, us(s.totals.est_us) + " us")));
  if (s.memory) c.append(el("div", {}, "memory: parameters " + s.memory.params + ", activations " + s.memory.activations + ", peak " + s.memory.peak));
  cards.append(c);
});
app.append(cards);
data.sides.forEach((s, i) => {
  app.append(el("h2", {}, "Per iteration: " + s.label));
  app.append(table(["phase", "collective", "group", "n", "count", "bytes", "bus bytes", "est. time (us)"],
    s.rows.map(r => [r.phase, r.collective, r.group, r.n, r.count, r.bytes, r.bus, us(r.est_us)]), 3));
});
if (data.sides.length === 2) {
  app.append(el("h2", {}, "Estimated comm time per module: " + data.sides[0].label + " against " + data.sides[1].label));
  const est = s => Object.fromEntries(s.modules.map(m => [m.fqn, phases.reduce((a, p) => a + (m.phases[p] ? m.phases[p].est_us : 0), 0)]));
  const ea = est(data.sides[0]), eb = est(data.sides[1]);
  const order = [];
  for (const s of data.sides) for (const m of s.modules) if (!order.some(o => o.fqn === m.fqn)) order.push(m);
  const max = Math.max(1e-9, ...Object.values(ea), ...Object.values(eb));
  const rows = order.filter(m => (ea[m.fqn] || 0) + (eb[m.fqn] || 0) > 0).map(m => [
    "\u00a0".repeat(2 * m.depth) + m.fqn,
    el("span", {}, el("span", {class: "bar a", style: "width:" + (300 * (ea[m.fqn] || 0) / max) + "px"}), " " + us(ea[m.fqn] || 0)),
    el("span", {}, el("span", {class: "bar b", style: "width:" + (300 * (eb[m.fqn] || 0) / max) + "px"}), " " + us(eb[m.fqn] || 0))]);
  const t = table(["module", data.sides[0].label + " (us)", data.sides[1].label + " (us)"], rows, 3);
  t.id = "bars";
  app.append(t);
}
data.sides.forEach((s, i) => {
  app.append(el("h2", {}, "Module tree: " + s.label));
  const present = phases.filter(p => s.modules.some(m => m.phases[p]));
  app.append(table(["module", ...present.map(p => p + ": count, bytes, est. us")],
    s.modules.map(m => ["\u00a0".repeat(2 * m.depth) + m.fqn, ...present.map(p => m.phases[p] ?
      m.phases[p].count + ", " + m.phases[p].bytes + ", " + us(m.phases[p].est_us) : "")]), 1));
});
// The timeline: slices nested in lanes by depth (the order of start, longer first).
data.sides.forEach((s, i) => {
  app.append(el("h2", {}, "Timeline: " + s.label + " (rank " + s.rank + ", times " + s.times + ")"));
  // Ties (a module whose one op spans it) put the enclosing slice first.
  const rank = {iteration: 0, phase: 1, module: 2, collective: 3, gemm: 3};
  const xs = s.timeline.filter(e => e.ph === "X").sort((a, b) => a.ts - b.ts || b.dur - a.dur ||
    rank[a.cat] - rank[b.cat] || a.name.length - b.name.length);
  const open = [];
  let end = 0;
  for (const e of xs) {
    while (open.length && e.ts >= open[open.length - 1].ts + open[open.length - 1].dur) open.pop();
    e.lane = open.length;
    open.push(e);
    end = Math.max(end, e.ts + e.dur);
  }
  const lanes = Math.max(1, ...xs.map(e => e.lane + 1)), W = 1100, H = 16;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", lanes * H + 4); svg.id = "timeline-" + i;
  const colors = {iteration: "#bbb", phase: "#9ab", module: "#cde", collective: "#e08a2c", gemm: "#4a7bd0"};
  for (const e of xs) {
    const r = document.createElementNS(ns, "rect");
    const x = end > 0 ? W * e.ts / end : 0, w = end > 0 ? Math.max(0.5, W * e.dur / end) : 1;
    r.setAttribute("x", x); r.setAttribute("y", e.lane * H); r.setAttribute("width", w); r.setAttribute("height", H - 2);
    r.setAttribute("fill", colors[e.cat] || "#ccc");
    const title = document.createElementNS(ns, "title");
    title.textContent = e.name + " (" + e.cat + ") " + us(e.dur) + " us" + (e.args && e.args.reason ? "\n" + e.args.reason : "");
    r.append(title);
    svg.append(r);
    if (w > 60) {
      const t = document.createElementNS(ns, "text");
      t.setAttribute("x", x + 2); t.setAttribute("y", e.lane * H + 11); t.textContent = e.name;
      svg.append(t);
    }
  }
  app.append(svg);
});
document.body.dataset.status = "ok";
</script></body></html>
)HTML";

}  // namespace

std::string html_report(const std::vector<HtmlSide>& sides, int rank, const Topology& topo) {
  COMMTRACE_CHECK(sides.size() == 1 || sides.size() == 2, ErrorCode::InvalidArgument,
                  "report: one or two traces, got {}", sides.size());
  Json data{
      {"title", sides.size() == 1 ? "commtrace: " + sides[0].label
                                  : "commtrace: " + sides[0].label + " against " + sides[1].label},
      {"topology", fmt::format("{} ({})", topo.name, topo.description)},
      {"sides", Json::array()}};
  for (const HtmlSide& s : sides) data["sides"].push_back(side_json(s, rank, topo));
  std::string json = data.dump(-1, ' ', false, Json::error_handler_t::replace);
  // Inside <script> the text must not close the element: "</" becomes "<\/" (the same JSON).
  for (std::size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3)) {
    json.replace(at, 2, "<\\/");
  }
  return std::string(kHead) + json + kScript;
}

}  // namespace commtrace
