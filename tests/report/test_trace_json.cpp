// commtrace's own JSON: a round trip keeps every field of every record (write → read → write is
// byte-identical), the reader is strict and names source and path, versions are checked, and a
// corpus of bad files (tests/report/data/bad) throws Error instead of crashing.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/plans/style.h"
#include "parallel/run/runner.h"
#include "report/baseline.h"
#include "report/trace_json.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using namespace commtrace::testing;
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

void require_same_args(const Trace& ta, std::span<const TensorArg> a, const Trace& tb,
                       std::span<const TensorArg> b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(shape_of(ta, a[i].shape) == shape_of(tb, b[i].shape));
    CHECK(shape_of(ta, a[i].global_shape) == shape_of(tb, b[i].global_shape));
    CHECK(placements_str(ta.placements(a[i].placements)) ==
          placements_str(tb.placements(b[i].placements)));
  }
}

// Every field of every record, compared as values (ids may differ between two pools).
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
      CHECK(placements_str(a.placements(x.params[k].placements)) ==
            placements_str(b.placements(y.params[k].placements)));
    }
  }
  const std::vector<Block> ba = a.block_list(), bb = b.block_list();
  REQUIRE(ba.size() == bb.size());
  for (std::size_t i = 0; i < ba.size(); ++i) {
    CHECK(ba[i].first == bb[i].first);
    CHECK(ba[i].count == bb[i].count);
    CHECK(ba[i].iteration == bb[i].iteration);
    CHECK(ba[i].repeat == bb[i].repeat);
    CHECK(ba[i].untimed == bb[i].untimed);
  }
  REQUIRE(a.records.size() == b.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    INFO("record " << i);
    const Record& x = a.records[i];
    const Record& y = b.records[i];
    CHECK(x.kind == y.kind);
    CHECK(a.name(x) == b.name(y));
    CHECK(a.str(x.overload) == b.str(y.overload));
    CHECK(x.phase == y.phase);
    CHECK(x.module == y.module);
    CHECK(x.dtype == y.dtype);
    require_same_args(a, a.inputs(x), b, b.inputs(y));
    require_same_args(a, a.outputs(x), b, b.outputs(y));
    CHECK(x.sharded == y.sharded);
    CHECK(mesh_of(a, x) == mesh_of(b, y));
    CHECK(a.str(x.reason) == b.str(y.reason));
    CHECK(x.start_s == y.start_s);  // exact: doubles round-trip in shortest form
    CHECK(x.duration_s == y.duration_s);
    CHECK(x.estimated == y.estimated);
    if (x.kind == EventKind::Collective) {
      const CollectiveInfo& c = x.collective;
      const CollectiveInfo& d = y.collective;
      CHECK(c.op == d.op);
      CHECK(c.seq == d.seq);
      CHECK(c.seq_stride == d.seq_stride);
      CHECK(a.str(c.group) == b.str(d.group));
      CHECK(c.group_size == d.group_size);
      CHECK(c.group_rank == d.group_rank);
      CHECK(c.peer == d.peer);
      CHECK(c.root == d.root);
      CHECK(c.bytes == d.bytes);
      CHECK(c.reduce_op == d.reduce_op);
      CHECK(placements_str(a.placements(c.before)) == placements_str(b.placements(d.before)));
      CHECK(placements_str(a.placements(c.after)) == placements_str(b.placements(d.after)));
    }
  }
}

// Runs f and returns the message of the Error it throws ("" when it throws nothing).
template <typename F>
std::string message_of(F f, ErrorCode code = ErrorCode::InvalidArgument) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  return "";
}

std::string text_of_toy_tp() {
  static const std::string text = trace_json_string(run("toy", "tp", 4));
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
  const Trace& t0 = traces[0];
  for (const Record& r : t0.records) {
    dp = dp || (r.kind == EventKind::Collective && t0.str(r.collective.group) == "dp");
    tp = tp || (r.kind == EventKind::Collective && t0.str(r.collective.group) == "tp");
    backward = backward || r.phase == Phase::Backward;
    for (const TensorArg& a : t0.inputs(r)) placements = placements || a.placements != 0;
  }
  REQUIRE(dp);
  REQUIRE(tp);
  REQUIRE(backward);
  REQUIRE(placements);

  for (bool pretty : {false, true}) {
    const std::string text = trace_json_string(traces, pretty);
    const std::vector<Trace> back = read_trace_json(text, "t.json");
    REQUIRE(back.size() == traces.size());
    for (std::size_t r = 0; r < traces.size(); ++r) require_same(traces[r], back[r]);
    REQUIRE(trace_json_string(back, pretty) == text);
  }
  REQUIRE(trace_json_string(traces, true).size() > trace_json_string(traces).size());
}

TEST_CASE("trace json: repeated iterations are stored once", "[report][json]") {
  const Trace one = run("toy", "tp", 4)[0];
  TraceOptions o;
  o.cfg.model = "toy";
  o.cfg.plan = "tp";
  o.cfg.world_size = 4;
  o.iters = 50;
  const std::vector<Trace> many = trace_run(o);
  REQUIRE(many[0].blocks.size() == 1);
  REQUIRE(many[0].blocks[0].repeat == 50);
  // The default timing sample: the first 4 occurrences, then repeats 16, 32 and 48.
  REQUIRE(many[0].blocks[0].untimed == 50 - 4 - 3);
  REQUIRE(many[0].records.size() == one.records.size());
  const std::string text = trace_json_string(many);
  REQUIRE(text.size() < trace_json_string({one}).size() + 200);
  const std::vector<Trace> back = read_trace_json(text, "t.json");
  require_same(many[0], back[0]);
  REQUIRE(back[0].event_count() == 50 * one.records.size());
  REQUIRE(json::parse(text)["ranks"][0]["blocks"][0]["untimed"] == 43);
}

TEST_CASE("trace json: a record's estimated times and a block's untimed repeats",
          "[report][json]") {
  json j = json::parse(text_of_toy_tp());
  json& block = j["ranks"][0]["blocks"][0];
  block["repeat"] = 5;
  block["untimed"] = 3;
  block["records"][1]["estimated"] = true;
  const std::vector<Trace> t = read_trace_json(j.dump(), "t.json");
  REQUIRE(t[0].blocks[0].untimed == 3);
  REQUIRE(t[0].records[1].estimated);
  REQUIRE_FALSE(t[0].records[0].estimated);
  const json again = json::parse(trace_json_string(t));
  REQUIRE(again["ranks"][0]["blocks"][0]["untimed"] == 3);
  REQUIRE(again["ranks"][0]["blocks"][0]["records"][1]["estimated"] == true);
  REQUIRE_FALSE(again["ranks"][0]["blocks"][0]["records"][0].contains("estimated"));
  block["untimed"] = 5;
  REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
          "t.json: ranks[0].blocks[0].untimed: 5 of 5 repeats untimed: at least one is timed");
}

TEST_CASE("trace json: layout of the document", "[report][json]") {
  const json j = json::parse(text_of_toy_tp());
  REQUIRE(j["schema"] == "commtrace.trace");
  REQUIRE(j["version"] == "2.2");
  REQUIRE(j["metadata"]["model"] == "toy");
  REQUIRE(j["metadata"]["iterations"] == "1");
  REQUIRE(j["metadata"]["world_size"] == "4");
  REQUIRE(j["ranks"].size() == 1);
  const json& rank = j["ranks"][0];
  REQUIRE(rank["rank"] == 0);
  REQUIRE(rank["meshes"] == json::parse(R"([{"shape": [4], "dim_names": ["tp"], "named": false,
                                             "device": "cpu"}])"));
  REQUIRE(rank["modules"][0]["fqn"] == "Global");
  REQUIRE(rank["modules"][0]["parent"] == -1);
  REQUIRE(rank["modules"][1]["fqn"] == "ToyModel");
  REQUIRE(rank["blocks"].size() == 1);
  REQUIRE(rank["blocks"][0]["iteration"] == 0);
  REQUIRE(rank["blocks"][0]["repeat"] == 1);
  int collectives = 0, sharded = 0;
  for (const json& r : rank["blocks"][0]["records"]) {
    REQUIRE(r["phase"].is_string());
    REQUIRE(r["dtype"] == "f32");
    REQUIRE(r.contains("collective") == (r["kind"] == "collective"));
    REQUIRE(r["start_s"].is_number());
    if (r.value("sharded", false)) {
      ++sharded;
      REQUIRE(r["mesh"] == 0);
    }
    if (r["kind"] == "collective") {
      ++collectives;
      REQUIRE(r["name"] == "all_reduce");
      REQUIRE(r["collective"]["op"] == "all_reduce");
      REQUIRE(r["collective"]["reduce_op"] == "sum");
      REQUIRE(r["collective"]["group"] == "tp");
      REQUIRE(r["collective"]["group_size"] == 4);
      REQUIRE(r["collective"]["before"] == json::parse(R"j(["Partial(sum)"])j"));
      REQUIRE(r["collective"]["after"] == json::parse(R"j(["Replicate()"])j"));
      REQUIRE(r["inputs"][0]["shape"] == json::parse("[20, 5]"));
      REQUIRE(r["inputs"][0]["placements"] == json::parse(R"j(["Partial(sum)"])j"));
    }
  }
  REQUIRE(collectives == 1);
  REQUIRE(sharded > 0);
}

TEST_CASE("trace json: version 1.x files of earlier releases still load", "[report][json]") {
  // The corpus's valid reference file is a 1.0 trace of toy tp at world 4.
  const fs::path v1 = fs::path(COMMTRACE_TEST_DATA_DIR) / "bad" / "reference_trace.json.valid";
  REQUIRE(json::parse(read_text_file(v1.string()))["version"] == "1.0");
  const std::vector<Trace> old = load_traces(v1.string());
  REQUIRE(old.size() == 1);
  const Trace& t = old[0];
  const Record* ar = nullptr;
  const Record* addmm = nullptr;
  for (const Record& r : t.records) {
    if (r.kind == EventKind::Collective) ar = &r;
    if (r.sharded && t.name(r) == "addmm") addmm = &r;
  }
  REQUIRE(ar != nullptr);
  REQUIRE(ar->collective.op == Collective::AllReduce);
  REQUIRE(placements_str(t.placements(ar->collective.before)) == "(Partial(sum),)");
  REQUIRE(addmm != nullptr);
  // 1.x meshes read "DeviceMesh((tp=4))": named dims.
  REQUIRE(mesh_of(t, *addmm) == "DeviceMesh((4,), 'cpu', mesh_dim_names=('tp',), stride=(1,))");
  REQUIRE(in_placements(t, *addmm, 0) == "(Shard(dim=1),)");
  // Written back as 2.0 and read again: the same trace.
  const std::vector<Trace> again = read_trace_json(trace_json_string(old), "again.json");
  require_same(t, again[0]);
}

TEST_CASE("trace json: control characters are refused, not printed", "[report][json]") {
  json j = json::parse(text_of_toy_tp());
  SECTION("an escape sequence in a module name") {
    j["ranks"][0]["modules"][1]["fqn"] = "Toy\x1b]0;title\x07Model";
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: ranks[0].modules[1].fqn: control character U+001B in a string");
  }
  SECTION("a C1 control (CSI) in a metadata key") {
    j["metadata"]["model\u009b31m"] = "x";
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: metadata: control character U+009B in a key");
  }
  SECTION("every reader shares the check: a plan") {
    const std::string plan =
        R"({"schema": "commtrace.plan", "version": "1.0", "name": "x\u001b[2J", "plan": {}})";
    REQUIRE(message_of([&] { plan_from_json_text(plan, "p.json"); }) ==
            "p.json: name: control character U+001B in a string");
  }
}

TEST_CASE("trace json: versions", "[report][json]") {
  json j = json::parse(text_of_toy_tp());

  SECTION("another major version is rejected with a clear message") {
    j["version"] = "3.0";
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: trace version 3.0 is not supported (this build reads 1.x, 2.x)");
  }
  SECTION("a later minor version may add keys") {
    j["version"] = "2.3";
    j["created_by"] = "a newer commtrace";
    j["ranks"][0]["blocks"][0]["records"][0]["energy_j"] = 0.5;
    const std::vector<Trace> t = read_trace_json(j.dump(), "t.json");
    REQUIRE(t.size() == 1);
    REQUIRE(t[0].records.size() ==
            json::parse(text_of_toy_tp())["ranks"][0]["blocks"][0]["records"].size());
  }
  SECTION("version 2.2 holds only known keys") {
    j["ranks"][0]["blocks"][0]["records"][2]["energy_j"] = 0.5;
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            "t.json: ranks[0].blocks[0].records[2]: unknown key 'energy_j' (not in version 2.2)");
  }
  SECTION("a malformed version") {
    for (const char* v : {"one", "1.banana", "2.", ".0", "2.0.1"}) {
      j["version"] = v;
      REQUIRE(message_of([&] {
                read_trace_json(j.dump(), "t.json");
              }).find(fmt::format("version '{}' is not of the form", v)) != std::string::npos);
    }
  }
}

TEST_CASE("trace json: errors name the source and the JSON path", "[report][json]") {
  json j = json::parse(text_of_toy_tp());
  json& records = j["ranks"][0]["blocks"][0]["records"];
  REQUIRE(records.size() > 4);
  const std::string at = "t.json: ranks[0].blocks[0].records";

  SECTION("unknown enum name") {
    records[3]["phase"] = "sideways";
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            at + "[3].phase: unknown phase 'sideways'");
  }
  SECTION("missing key") {
    records[1].erase("dtype");
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            at + "[1]: missing key 'dtype'");
  }
  SECTION("mistyped field") {
    records[0]["inputs"][0]["shape"][0] = "twenty";
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            at + "[0].inputs[0].shape[0]: expected an integer, got string");
  }
  SECTION("a number that is not an integer names itself") {
    records[0]["inputs"][0]["shape"][0] = 2.5;
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            at + "[0].inputs[0].shape[0]: expected an integer, got 2.5");
    records[0]["inputs"][0]["shape"][0] = 1e30;
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            at + "[0].inputs[0].shape[0]: expected an integer, got 1e+30");
  }
  SECTION("module index out of range") {
    records[4]["module"] = 99;
    const std::string msg = message_of([&] { read_trace_json(j.dump(), "t.json"); });
    REQUIRE(msg.find(at + "[4].module: 99 is out of range") == 0);
  }
  SECTION("mesh index out of range") {
    std::size_t k = 0;
    while (!records[k].contains("mesh")) ++k;
    records[k]["mesh"] = 3;
    REQUIRE(message_of([&] {
              read_trace_json(j.dump(), "t.json");
            }).find(fmt::format("{}[{}].mesh: 3 is out of range [0, 0]", at, k)) == 0);
  }
  SECTION("broken parent link") {
    j["ranks"][0]["modules"][2]["parent"] = 2;
    REQUIRE(message_of([&] {
              read_trace_json(j.dump(), "t.json");
            }).find("t.json: ranks[0].modules[2].parent") == 0);
  }
  SECTION("child missing from its parent's list") {
    j["ranks"][0]["modules"][1]["children"] = json::array();
    REQUIRE(message_of([&] {
              read_trace_json(j.dump(), "t.json");
            }).find("is missing from the children of its parent") != std::string::npos);
  }
  SECTION("collective fields on a GEMM") {
    std::size_t gemm = 0;
    while (records[gemm]["kind"] != "gemm") ++gemm;
    records[gemm]["collective"] = json::object();
    REQUIRE(message_of([&] {
              read_trace_json(j.dump(), "t.json");
            }).find(fmt::format("{}[{}].collective", at, gemm)) != std::string::npos);
  }
  SECTION("negative counters, a repeat of zero, an unknown collective") {
    std::size_t c = 0;
    while (records[c]["kind"] != "collective") ++c;
    json neg = j;
    neg["ranks"][0]["blocks"][0]["records"][c]["collective"]["bytes"] = -400;
    REQUIRE(message_of([&] { read_trace_json(neg.dump(), "t.json"); }) ==
            fmt::format("{}[{}].collective.bytes: -400 must not be negative", at, c));
    json zero = j;
    zero["ranks"][0]["blocks"][0]["repeat"] = 0;
    REQUIRE(message_of([&] { read_trace_json(zero.dump(), "t.json"); }) ==
            "t.json: ranks[0].blocks[0].repeat: a block repeats at least once");
    json op = j;
    op["ranks"][0]["blocks"][0]["records"][c]["collective"]["op"] = "allreduce";
    REQUIRE(message_of([&] { read_trace_json(op.dump(), "t.json"); }) ==
            fmt::format("{}[{}].collective.op: unknown collective 'allreduce'", at, c));
  }
  SECTION("a module chain nested deeper than kMaxModuleDepth") {
    // Global, then a chain of kMaxModuleDepth + 1 modules: the last one is one level too deep.
    json mods = json::array();
    mods.push_back({{"fqn", "Global"},
                    {"type", ""},
                    {"parent", -1},
                    {"depth", 0},
                    {"children", {1}},
                    {"params", json::array()}});
    const int n = kMaxModuleDepth + 1;
    for (int i = 1; i <= n; ++i) {
      json children = i < n ? json::array({i + 1}) : json::array();
      mods.push_back({{"fqn", fmt::format("m{}", i)},
                      {"type", "X"},
                      {"parent", i - 1},
                      {"depth", i},
                      {"children", children},
                      {"params", json::array()}});
    }
    j["ranks"][0]["modules"] = mods;
    for (json& r : records) r["module"] = 1;
    REQUIRE(message_of([&] { read_trace_json(j.dump(), "t.json"); }) ==
            fmt::format("t.json: ranks[0].modules[{}].depth: {} is out of range [0, {}]", n, n,
                        kMaxModuleDepth));
  }
  SECTION("not JSON, wrong schema, too deep") {
    REQUIRE(message_of([] { read_trace_json("{\"schema\": ", "t.json"); })
                .find("t.json: not valid "
                      "JSON") == 0);
    REQUIRE(message_of([] { read_trace_json("[1, 2]", "t.json"); }).find("t.json:") == 0);
    REQUIRE(message_of([] {
              read_trace_json(R"({"schema": "commtrace.baseline", "version": "1.0"})", "t.json");
            }) == "t.json: schema is 'commtrace.baseline', expected 'commtrace.trace'");
    const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
    REQUIRE(message_of([&] { read_trace_json(deep, "deep.json"); }) ==
            "deep.json: JSON nested deeper than 64 levels");
  }
}

TEST_CASE("trace json: files", "[report][json]") {
  const fs::path p = temp_path("trace.json");
  const std::vector<Trace> traces = run("toy", "tp", 4, {0, 3});
  write_trace_file(p.string(), traces);
  const std::vector<Trace> back = load_traces(p.string());
  REQUIRE(back.size() == 2);
  REQUIRE(back[1].rank == 3);
  require_same(traces[1], back[1]);
  fs::remove(p);

  const std::string missing = (fs::temp_directory_path() / "commtrace_no_such_dir/x.json").string();
  const std::string msg = message_of([&] { read_text_file(missing); }, ErrorCode::Io);
  REQUIRE(msg.find(missing) != std::string::npos);
  REQUIRE(msg.find("No such file or directory") != std::string::npos);
  REQUIRE(message_of([&] { load_traces(missing); }, ErrorCode::Io).find(missing) !=
          std::string::npos);
  REQUIRE(message_of([&] { write_text_file(missing, "x"); }, ErrorCode::Io).find(missing) !=
          std::string::npos);
  REQUIRE(!message_of([&] { read_text_file(fs::temp_directory_path().string()); }, ErrorCode::Io)
               .empty());
}

TEST_CASE("trace json: a failed write leaves the previous file intact", "[report][json]") {
  const fs::path p = temp_path("kept.json");
  write_text_file(p.string(), "previous contents\n");
  {
    // Abandoned before commit: the target is untouched and no temporary file remains.
    AtomicFile f(p.string());
    f.write("half a trace");
  }
  REQUIRE(read_text_file(p.string()) == "previous contents\n");
  // A file-size limit makes the write fail half-way (in a child process: the limit is global).
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      write_trace_file(p.string(), toy_sp_2x2());
    } catch (const Error& e) {
      ::_exit(e.code() == ErrorCode::Io ? 3 : 4);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 3);
  REQUIRE(read_text_file(p.string()) == "previous contents\n");
  for (const auto& e : fs::directory_iterator(p.parent_path())) {
    REQUIRE(e.path().filename().string().rfind(p.filename().string() + ".tmp", 0) != 0);
  }
  fs::remove(p);
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
      check_baseline(toy, read_text_file((dir / "reference_baseline.json.valid").string()), "ref")
          .ok);
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
        check_baseline(toy, read_text_file(e.path().string()), name);
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
