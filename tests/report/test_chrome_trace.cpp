// The timeline: Chrome trace-event JSON checked against the format (every slice a complete 'X'
// event with name, cat, pid, tid, ts and dur; slices of one thread nest) and against the trace
// (one process per rank; iteration ⊃ phase ⊃ modules ⊃ every collective and GEMM; measured
// times on the threads backend, the cost model's on fake).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/run/runner.h"
#include "report/chrome_trace.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using namespace commtrace::testing;
using json = nlohmann::json;

namespace {

json timeline(const std::vector<Trace>& traces, const std::string& topology = "h100") {
  std::string out;
  write_chrome_trace(traces, load_topology(topology), [&](std::string_view s) { out += s; });
  return json::parse(out);
}

struct Slice {
  std::string name, cat;
  double ts, dur;
  json args;
};

// The X events per (pid, tid), checked for the fields the format requires and for nesting
// (sorted by start, longer first; each inside the innermost open one). Returns them per pid.
std::map<int, std::vector<Slice>> check_format(const json& doc) {
  REQUIRE(doc.contains("traceEvents"));
  std::map<std::pair<int, int>, std::vector<Slice>> by_thread;
  for (const json& e : doc["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    if (e["ph"] == "M") {
      REQUIRE(e["args"]["name"].is_string());
      continue;
    }
    REQUIRE(e["ph"] == "X");
    REQUIRE(e["name"].is_string());
    REQUIRE(e["cat"].is_string());
    REQUIRE(e["ts"].is_number());
    REQUIRE(e["dur"].is_number());
    REQUIRE(e["dur"].get<double>() >= 0);
    by_thread[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back(
        Slice{e["name"], e["cat"], e["ts"], e["dur"], e.value("args", json::object())});
  }
  std::map<int, std::vector<Slice>> out;
  for (auto& [key, v] : by_thread) {
    std::sort(v.begin(), v.end(), [](const Slice& a, const Slice& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
    });
    std::vector<const Slice*> open;
    const double eps = 1e-6;  // µs
    for (const Slice& s : v) {
      while (!open.empty() && s.ts >= open.back()->ts + open.back()->dur - eps &&
             !(s.dur == 0 && s.ts <= open.back()->ts + open.back()->dur + eps)) {
        open.pop_back();
      }
      if (!open.empty()) {
        INFO(s.name << " at " << s.ts << " in " << open.back()->name);
        REQUIRE(s.ts + s.dur <= open.back()->ts + open.back()->dur + eps);
      }
      open.push_back(&s);
    }
    out[key.first] = v;
  }
  return out;
}

std::size_t count(const std::vector<Slice>& v, const std::string& cat) {
  return std::size_t(
      std::count_if(v.begin(), v.end(), [&](const Slice& s) { return s.cat == cat; }));
}

}  // namespace

TEST_CASE("chrome trace: the format, one process per rank, nested slices", "[report][chrome]") {
  TraceOptions o;
  o.cfg.model = "transformer";
  o.cfg.plan = "sp";
  o.cfg.world_size = 2;
  o.iters = 3;
  o.ranks = {0, 1};
  const std::vector<Trace> traces = trace_run(o);
  const json doc = timeline(traces);
  REQUIRE(doc["otherData"]["times"] == "measured");
  const auto slices = check_format(doc);
  REQUIRE(slices.size() == 2);
  for (const auto& [rank, v] : slices) {
    CHECK(count(v, "iteration") == 3);
    // Each iteration: forward, backward, optimizer.
    CHECK(count(v, "phase") == 9);
    std::uint64_t collectives = 0;
    traces[std::size_t(rank)].for_each_record([&](const Record& r, std::uint64_t repeat) {
      if (r.kind == EventKind::Collective) collectives += repeat;
    });
    CHECK(count(v, "collective") == collectives);
    CHECK(count(v, "gemm") > 0);
    CHECK(count(v, "module") > 0);
    const auto rs =
        std::find_if(v.begin(), v.end(), [](const Slice& s) { return s.name == "reduce_scatter"; });
    REQUIRE(rs != v.end());
    CHECK(rs->args["group"] == "tp(2)");
    CHECK(rs->args["bytes"] == 4096);
    CHECK(contains(rs->args["reason"].get<std::string>(), "→ (Shard(dim=1),)"));
  }
}

TEST_CASE("chrome trace: the cost model's times where none were measured", "[report][chrome]") {
  TraceOptions o;
  o.cfg.model = "toy";
  o.cfg.world_size = 4;
  o.cfg.backend = "fake";
  const std::vector<Trace> traces = trace_run(o);
  const json doc = timeline(traces, "h100");
  REQUIRE(contains(doc["otherData"]["times"].get<std::string>(), "estimated by the cost model"));
  const auto slices = check_format(doc);
  const std::vector<Slice>& v = slices.at(0);
  const auto ar =
      std::find_if(v.begin(), v.end(), [](const Slice& s) { return s.name == "all_reduce"; });
  REQUIRE(ar != v.end());
  CHECK(ar->dur == Approx(ar->args["estimate_us"].get<double>()));
  CHECK(ar->dur == Approx(6.8 + 4 * 0.6 + 2 * 400 / 450e9 * 1e6));  // the tree, by hand
  // GEMMs from their FLOPs: in_proj's addmm, (20, 10) × (10, 8) per rank at 67 TFLOP/s (f32).
  const auto gemm =
      std::find_if(v.begin(), v.end(), [](const Slice& s) { return s.cat == "gemm"; });
  REQUIRE(gemm != v.end());
  CHECK(gemm->dur == Approx(2.0 * 20 * 10 * 8 / 67e12 * 1e6));
}
