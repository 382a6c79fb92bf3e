#include "report/advise.h"

#include <algorithm>

#include "report/counts.h"
#include "report/names.h"
#include "report/tree.h"
#include "tracer/collectives.h"
#include "tracer/json_io.h"

namespace commtrace {

std::vector<PlanAdvice> rank_plans(const std::vector<PlanCandidate>& candidates,
                                   const Topology& topo) {
  std::vector<PlanAdvice> out;
  for (const PlanCandidate& c : candidates) {
    PlanAdvice a;
    a.plan = c.plan;
    a.mesh = c.mesh;
    a.data_parallel = c.data_parallel;
    a.error = c.error;
    a.applies = c.error.empty() && !c.traces.empty();
    for (const Trace& t : c.traces) {
      const TraceCost cost(t, topo);
      const CountTree counts = collective_counts_per_iteration(t, &cost);
      double s = 0;
      std::int64_t n = 0;
      double bus = 0;
      for (const auto& phase : counts.modules.at(0).phases) {
        for (const GroupStat& g : phase) {
          s += g.stat.estimate_s;
          n += g.stat.count;
          bus += g.stat.bus_bytes;
        }
      }
      if (s >= a.comm_s) {
        a.comm_s = s, a.collectives = n, a.bus_bytes = std::uint64_t(bus + 0.5);
      }
      if (memory_peak(t) >= a.peak_memory) {
        a.peak_memory = memory_peak(t);
        a.activations = memory_total(t).activations;
      }
    }
    out.push_back(std::move(a));
  }
  std::stable_sort(out.begin(), out.end(), [](const PlanAdvice& x, const PlanAdvice& y) {
    if (x.applies != y.applies) return x.applies;
    if (x.comm_s != y.comm_s) return x.comm_s < y.comm_s;
    return x.peak_memory < y.peak_memory;
  });
  // Ranks 1.. by each measure; equal values share a rank.
  auto assign = [&](auto value, int PlanAdvice::*rank) {
    std::vector<PlanAdvice*> ok;
    for (PlanAdvice& a : out) {
      if (a.applies) ok.push_back(&a);
    }
    std::stable_sort(ok.begin(), ok.end(), [&](const PlanAdvice* x, const PlanAdvice* y) {
      return value(*x) < value(*y);
    });
    for (std::size_t i = 0; i < ok.size(); ++i) {
      ok[i]->*rank = i > 0 && value(*ok[i]) == value(*ok[i - 1]) ? ok[i - 1]->*rank : int(i) + 1;
    }
  };
  assign([](const PlanAdvice& a) { return a.comm_s; }, &PlanAdvice::time_rank);
  assign([](const PlanAdvice& a) { return double(a.peak_memory); }, &PlanAdvice::memory_rank);
  return out;
}

std::string render_advice(const std::vector<PlanAdvice>& advice, const std::string& title) {
  std::string out = title + "\n";
  std::size_t wp = 4, wm = 4;
  for (const PlanAdvice& a : advice) {
    wp = std::max(wp, a.plan.size());
    wm = std::max(wm, a.mesh.size() + (a.data_parallel.empty() ? 0 : a.data_parallel.size() + 1));
  }
  out += fmt::format("  {:<{}}  {:<{}}  {:>14}  {:>6}  {:>11}  {:>11}  {:>11}  {:>6}\n", "plan", wp,
                     "mesh", wm, "est. comm time", "(rank)", "collectives", "bus bytes",
                     "peak memory", "(rank)");
  std::string units =
      fmt::format("  {:<{}}  {:<{}}  {:>14}  {:>6}  {:>11}  {:>11}  {:>11}", "", wp, "", wm,
                  "(us/iter)", "", "(per iter)", "(per iter)", "(per rank)");
  out += units + "\n";
  bool any_error = false;
  for (const PlanAdvice& a : advice) {
    if (!a.applies) {
      any_error = true;
      continue;
    }
    const std::string mesh = a.data_parallel.empty() ? a.mesh : a.mesh + " " + a.data_parallel;
    out += fmt::format("  {:<{}}  {:<{}}  {:>14.1f}  {:>6}  {:>11}  {:>11}  {:>11}  {:>6}\n",
                       a.plan, wp, mesh, wm, a.comm_s * 1e6, a.time_rank, a.collectives,
                       format_bytes(a.bus_bytes), format_bytes(a.peak_memory), a.memory_rank);
  }
  if (any_error) {
    out += "not applicable:\n";
    for (const PlanAdvice& a : advice) {
      if (a.applies) continue;
      out += fmt::format("  {}{}: {}\n", a.plan, a.mesh.empty() ? "" : " on " + a.mesh, a.error);
    }
  }
  return out;
}

std::string advice_json(const std::vector<PlanAdvice>& advice, const std::string& model,
                        int world_size, const Topology& topo) {
  Json plans = Json::array();
  for (const PlanAdvice& a : advice) {
    Json j{{"plan", a.plan}, {"mesh", a.mesh}, {"applies", a.applies}};
    if (!a.data_parallel.empty()) j["data_parallel"] = a.data_parallel;
    if (a.applies) {
      j["comm_us_per_iteration"] = a.comm_s * 1e6;
      j["time_rank"] = a.time_rank;
      j["collectives_per_iteration"] = a.collectives;
      j["bus_bytes_per_iteration"] = a.bus_bytes;
      j["peak_memory_bytes"] = a.peak_memory;
      j["activation_bytes"] = a.activations;
      j["memory_rank"] = a.memory_rank;
    } else {
      j["error"] = a.error;
    }
    plans.push_back(std::move(j));
  }
  const Json root{{"schema", "commtrace.advice"}, {"version", "1.0"},      {"model", model},
                  {"world_size", world_size},     {"topology", topo.name}, {"plans", plans}};
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace commtrace
