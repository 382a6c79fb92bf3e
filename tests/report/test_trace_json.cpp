// commtrace's own JSON: a round trip keeps every field of every record (write → read → write is
// byte-identical), the reader is strict and names source and path, versions are checked, and a
// corpus of bad files (tests/report/data/bad) throws Error instead of crashing.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/runner.h"
#include "report/baseline.h"
#include "report/trace_json.h"
#include "tests/catch_compat.h"

using namespace commtrace;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

std::vector<Trace> run(const std::string& model, const std::string& plan, int world,
                       std::vector<int> ranks = {}, std::vector<int> mesh = {},
                       bool input_requires_grad = false) {
  TraceOptions o;
  o.cfg.model = model;
  o.cfg.plan = plan;
  o.cfg.world_size = world;
  o.cfg.mesh = std::move(mesh);
  o.cfg.input_requires_grad = input_requires_grad;
  o.ranks = std::move(ranks);
  return trace_run(o);
}

// toy sp, input requires grad, 2x2 mesh, all four ranks: every kind of record and field.
const std::vector<Trace>& toy_sp_2x2() {
  static const std::vector<Trace> traces = run("toy", "sp", 4, {0, 1, 2, 3}, {2, 2}, true);
  return traces;
}

void require_same_tensors(const std::vector<TensorMeta>& a, const std::vector<TensorMeta>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].shape == b[i].shape);
    CHECK(a[i].global_shape == b[i].global_shape);
    CHECK(a[i].placements == b[i].placements);
  }
}

void require_same(const Trace& a, const Trace& b) {
  CHECK(a.rank == b.rank);
  CHECK(a.metadata == b.metadata);
  REQUIRE(a.modules.size() == b.modules.size());
  for (std::size_t i = 0; i < a.modules.size(); ++i) {
    const ModuleNode& x = a.modules[i];
    const ModuleNode& y = b.modules[i];
    CHECK(x.fqn == y.fqn);
    CHECK(x.type == y.type);
    CHECK(x.parent == y.parent);
    CHECK(x.depth == y.depth);
    CHECK(x.children == y.children);
    REQUIRE(x.params.size() == y.params.size());
    for (std::size_t k = 0; k < x.params.size(); ++k) {
      CHECK(x.params[k].name == y.params[k].name);
      CHECK(x.params[k].placements == y.params[k].placements);
    }
  }
  REQUIRE(a.records.size() == b.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    INFO("record " << i);
    const OpRecord& x = a.records[i];
    const OpRecord& y = b.records[i];
    CHECK(x.index == y.index);
    CHECK(x.kind == y.kind);
    CHECK(x.name == y.name);
    CHECK(x.overload == y.overload);
    CHECK(x.phase == y.phase);
    CHECK(x.module == y.module);
    CHECK(x.dtype == y.dtype);
    require_same_tensors(x.inputs, y.inputs);
    require_same_tensors(x.outputs, y.outputs);
    CHECK(x.sharded == y.sharded);
    CHECK(x.mesh == y.mesh);
    CHECK(x.reason == y.reason);
    CHECK(x.time_s == y.time_s);  // exact: doubles round-trip through 17 digits
    if (x.kind == EventKind::Collective) {
      CHECK(x.collective.seq == y.collective.seq);
      CHECK(x.collective.group == y.collective.group);
      CHECK(x.collective.group_size == y.collective.group_size);
      CHECK(x.collective.group_rank == y.collective.group_rank);
      CHECK(x.collective.bytes == y.collective.bytes);
      CHECK(x.collective.reduce_op == y.collective.reduce_op);
      CHECK(x.collective.placements_before == y.collective.placements_before);
      CHECK(x.collective.placements_after == y.collective.placements_after);
    }
  }
}

// Runs f and returns the message of the Error it throws ("" when it throws nothing).
template <typename F>
std::string error_of(F f, ErrorCode code = ErrorCode::InvalidArgument) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  return "";
}

std::string text_of_toy_tp() {
  static const std::string text = write_trace_json(run("toy", "tp", 4));
  return text;
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() /
         fmt::format("commtrace_test_{}_{}", static_cast<long>(::getpid()), name);
}

}  // namespace

TEST_CASE("trace json: round trip keeps every field", "[report][json]") {
  const std::vector<Trace>& traces = toy_sp_2x2();
  REQUIRE(traces.size() == 4);
  // The run exercises what the format must carry: collectives on both groups, GEMMs, both
  // passes, DTensor placements, parameters.
  bool dp = false, tp = false, backward = false, placements = false;
  for (const OpRecord& r : traces[0].records) {
    dp = dp || (r.kind == EventKind::Collective && r.collective.group == "dp");
    tp = tp || (r.kind == EventKind::Collective && r.collective.group == "tp");
    backward = backward || r.phase == Phase::Backward;
    for (const TensorMeta& m : r.inputs) placements = placements || !m.placements.empty();
  }
  REQUIRE(dp);
  REQUIRE(tp);
  REQUIRE(backward);
  REQUIRE(placements);

  const std::string text = write_trace_json(traces);
  const std::vector<Trace> back = read_trace_json(text, "t.json");
  REQUIRE(back.size() == traces.size());
  for (std::size_t r = 0; r < traces.size(); ++r) require_same(traces[r], back[r]);
  REQUIRE(write_trace_json(back) == text);
}

TEST_CASE("trace json: layout of the document", "[report][json]") {
  const json j = json::parse(text_of_toy_tp());
  REQUIRE(j["schema"] == "commtrace.trace");
  REQUIRE(j["version"] == "1.0");
  REQUIRE(j["metadata"]["model"] == "toy");
  REQUIRE(j["metadata"]["iterations"] == "1");
  REQUIRE(j["metadata"]["world_size"] == "4");
  REQUIRE(j["ranks"].size() == 1);
  const json& rank = j["ranks"][0];
  REQUIRE(rank["rank"] == 0);
  REQUIRE(rank["modules"][0]["fqn"] == "Global");
  REQUIRE(rank["modules"][0]["parent"] == -1);
  REQUIRE(rank["modules"][1]["fqn"] == "ToyModel");
  int collectives = 0;
  for (const json& r : rank["records"]) {
    REQUIRE(r["phase"].is_string());
    REQUIRE(r["dtype"] == "f32");
    REQUIRE(r.contains("collective") == (r["kind"] == "collective"));
    if (r["kind"] == "collective") {
      ++collectives;
      REQUIRE(r["name"] == "all_reduce");
      REQUIRE(r["collective"]["reduce_op"] == "sum");
      REQUIRE(r["collective"]["group"] == "tp");
      REQUIRE(r["collective"]["group_size"] == 4);
    }
  }
  REQUIRE(collectives == 1);
}

TEST_CASE("trace json: versions", "[report][json]") {
  json j = json::parse(text_of_toy_tp());

  SECTION("another major version is rejected with a clear message") {
    j["version"] = "2.0";
    REQUIRE(error_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: trace version 2.0 is not supported (this build reads 1.x)");
  }
  SECTION("a later minor version may add keys") {
    j["version"] = "1.3";
    j["created_by"] = "a newer commtrace";
    j["ranks"][0]["records"][0]["energy_j"] = 0.5;
    const std::vector<Trace> t = read_trace_json(j.dump(), "t.json");
    REQUIRE(t.size() == 1);
    REQUIRE(t[0].records.size() == json::parse(text_of_toy_tp())["ranks"][0]["records"].size());
  }
  SECTION("version 1.0 holds only known keys") {
    j["ranks"][0]["records"][2]["energy_j"] = 0.5;
    REQUIRE(error_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: ranks[0].records[2]: unknown key 'energy_j' (not in version 1.0)");
  }
  SECTION("a malformed version") {
    j["version"] = "one";
    REQUIRE(error_of([&] { read_trace_json(j.dump(), "t.json"); }).find("'one'") !=
            std::string::npos);
  }
}

TEST_CASE("trace json: errors name the source and the JSON path", "[report][json]") {
  json j = json::parse(text_of_toy_tp());
  json& records = j["ranks"][0]["records"];
  REQUIRE(records.size() > 4);

  SECTION("unknown enum name") {
    records[3]["phase"] = "sideways";
    REQUIRE(error_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: ranks[0].records[3].phase: unknown phase 'sideways'");
  }
  SECTION("missing key") {
    records[1].erase("dtype");
    REQUIRE(error_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: ranks[0].records[1]: missing key 'dtype'");
  }
  SECTION("mistyped field") {
    records[0]["inputs"][0]["shape"][0] = "twenty";
    REQUIRE(error_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: ranks[0].records[0].inputs[0].shape[0]: expected an integer, got string");
  }
  SECTION("module index out of range") {
    records[4]["module"] = 99;
    const std::string msg = error_of([&] { read_trace_json(j.dump(), "t.json"); });
    REQUIRE(msg.find("t.json: ranks[0].records[4].module: module index 99 is out of range") == 0);
  }
  SECTION("broken parent link") {
    j["ranks"][0]["modules"][2]["parent"] = 2;
    REQUIRE(error_of([&] {
              read_trace_json(j.dump(), "t.json");
            }).find("t.json: ranks[0].modules[2].parent") == 0);
  }
  SECTION("child missing from its parent's list") {
    j["ranks"][0]["modules"][1]["children"] = json::array();
    REQUIRE(error_of([&] {
              read_trace_json(j.dump(), "t.json");
            }).find("is missing from the children of its parent") != std::string::npos);
  }
  SECTION("collective fields on a GEMM") {
    std::size_t gemm = 0;
    while (records[gemm]["kind"] != "gemm") ++gemm;
    records[gemm]["collective"] = json::object();
    REQUIRE(error_of([&] {
              read_trace_json(j.dump(), "t.json");
            }).find(fmt::format("ranks[0].records[{}].collective", gemm)) != std::string::npos);
  }
  SECTION("negative counters") {
    std::size_t c = 0;
    while (records[c]["kind"] != "collective") ++c;
    records[c]["collective"]["bytes"] = -400;
    REQUIRE(
        error_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
        fmt::format("t.json: ranks[0].records[{}].collective.bytes: -400 must not be negative", c));
  }
  SECTION("not JSON, wrong schema") {
    REQUIRE(error_of([] { read_trace_json("{\"schema\": ", "t.json"); })
                .find("t.json: not valid "
                      "JSON") == 0);
    REQUIRE(error_of([] { read_trace_json("[1, 2]", "t.json"); }).find("t.json:") == 0);
    REQUIRE(error_of([] {
              read_trace_json(R"({"schema": "commtrace.baseline", "version": "1.0"})", "t.json");
            }) == "t.json: schema is 'commtrace.baseline', expected 'commtrace.trace'");
  }
}

TEST_CASE("trace json: files", "[report][json]") {
  const fs::path p = temp_path("trace.json");
  const std::vector<Trace> traces = run("toy", "tp", 4, {0, 3});
  write_file(p.string(), write_trace_json(traces));
  const std::vector<Trace> back = load_traces(p.string());
  REQUIRE(back.size() == 2);
  REQUIRE(back[1].rank == 3);
  require_same(traces[1], back[1]);
  fs::remove(p);

  const std::string missing = (fs::temp_directory_path() / "commtrace_no_such_dir/x.json").string();
  const std::string msg = error_of([&] { read_file(missing); }, ErrorCode::Io);
  REQUIRE(msg.find(missing) != std::string::npos);
  REQUIRE(msg.find("No such file or directory") != std::string::npos);
  REQUIRE(error_of([&] { load_traces(missing); }, ErrorCode::Io).find(missing) !=
          std::string::npos);
  REQUIRE(error_of([&] { write_file(missing, "x"); }, ErrorCode::Io).find(missing) !=
          std::string::npos);
  REQUIRE(!error_of([&] { read_file(fs::temp_directory_path().string()); }, ErrorCode::Io).empty());
}

// Every file of tests/report/data/bad must throw Error: trace_*.json through load_traces,
// baseline_*.json through check_baseline against a toy tp trace.
TEST_CASE("bad inputs: every file of the corpus throws Error", "[report][json][baseline]") {
  const fs::path dir = fs::path(COMMTRACE_TEST_DATA_DIR) / "bad";
  REQUIRE(fs::is_directory(dir));
  Trace toy = run("toy", "tp", 4)[0];
  toy.metadata["plan"] = "tp";  // the corpus's baselines name the plan "tp"
  // The valid files the bad ones were derived from load: each bad file fails for its own reason.
  REQUIRE(load_traces((dir / "reference_trace.json.valid").string()).size() == 1);
  REQUIRE(
      check_baseline(toy, read_file((dir / "reference_baseline.json.valid").string()), "ref").ok);
  int traces = 0, baselines = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json") continue;
    INFO(name);
    std::string msg;
    bool other = false;
    try {
      if (name.rfind("trace_", 0) == 0) {
        ++traces;
        load_traces(e.path().string());
      } else if (name.rfind("baseline_", 0) == 0) {
        ++baselines;
        check_baseline(toy, read_file(e.path().string()), name);
      } else {
        FAIL("corpus files are named trace_*.json or baseline_*.json");
      }
    } catch (const Error& err) {
      msg = err.what();
    } catch (...) {
      other = true;
    }
    CHECK_FALSE(other);
    CHECK_FALSE(msg.empty());
    // The message names the file (its path for traces, its name for baselines).
    CHECK(msg.find(name) != std::string::npos);
  }
  REQUIRE(traces >= 10);
  REQUIRE(baselines >= 5);
}
