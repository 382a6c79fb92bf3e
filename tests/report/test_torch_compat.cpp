// PyTorch compatibility: the MLP TP trace of our runtime rendered as CommDebugMode's table and
// JSON dump, compared with PyTorch 2.11's output for the same model and plan (world 4, rank 0,
// forward + sum loss + backward, no optimizer); and the reader of such dumps.
#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/comm/launch.h"
#include "parallel/run/runner.h"
#include "parallel/tensor/ops.h"
#include "report/names.h"
#include "report/torch_compat.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"
#include "tracer/collectives.h"
#include "tracer/tracer.h"

using namespace commtrace;
using namespace commtrace::testing;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string data_file(const std::string& name) {
  return slurp(std::string(COMMTRACE_TEST_DATA_DIR) + "/torch/" + name);
}

// The "===== noise_level=N =====" blocks of golden_mlp_tp_tables.txt.
std::map<int, std::string> golden_tables() {
  std::istringstream in(data_file("golden_mlp_tp_tables.txt"));
  std::map<int, std::string> blocks;
  std::string line;
  int current = -1;
  while (std::getline(in, line)) {
    if (line.rfind("===== noise_level=", 0) == 0) {
      current = std::stoi(line.substr(18));
      blocks[current];
      continue;
    }
    if (current >= 0) blocks[current] += line + "\n";
  }
  return blocks;
}

// The raw noise-0 string of the header comment: a Python repr with \n and \x1b escapes.
std::string golden_raw_noise0() {
  std::istringstream in(data_file("golden_mlp_tp_tables.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# 'Global", 0) == 0) break;
  }
  REQUIRE(line.rfind("# '", 0) == 0);
  const std::string repr = line.substr(3, line.size() - 4);  // between the quotes
  std::string out;
  for (std::size_t i = 0; i < repr.size(); ++i) {
    if (repr[i] != '\\') {
      out += repr[i];
      continue;
    }
    const char c = repr[++i];
    if (c == 'n') {
      out += '\n';
    } else if (c == 'x') {
      out += char(std::stoi(repr.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::vector<std::string> without_module_types(const std::string& s) {
  std::vector<std::string> out;
  for (const std::string& l : lines_of(s)) {
    if (l.find("*module type:") == std::string::npos) out.push_back(l);
  }
  return out;
}

// Rank 0's trace of MLPModule under TP on 4 ranks: forward, sum loss, backward.
const Trace& mlp_tp_trace() {
  static const Trace trace = [] {
    ParallelConfig cfg;
    cfg.model = "mlp";
    cfg.plan = "tp";
    cfg.world_size = 4;
    Trace out;
    std::mutex mu;
    launch(4, [&](RankContext& ctx) {
      RankState s = setup_rank(ctx, cfg);
      Tracer tr(ctx.rank());
      {
        TracerActivation on(tr);
        Tensor y = (*s.model)(s.batch.input);
        sum(y).backward();
      }
      if (ctx.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        out = tr.take();
      }
    });
    return out;
  }();
  return trace;
}

// Collective counts per (module, phase, canonical name), own (not rolled up).
using OwnCounts = std::map<std::tuple<std::string, Phase, std::string>, std::int64_t>;
OwnCounts own_counts(const Trace& t) {
  OwnCounts out;
  t.for_each_record([&](const Record& r, std::uint64_t repeat) {
    if (r.kind != EventKind::Collective) return;
    out[{t.modules[std::size_t(r.module)].fqn, r.phase, collective_name(r.collective.op)}] +=
        std::int64_t(repeat);
  });
  return out;
}

std::int64_t rolled(const Trace& t, const std::string& fqn, Phase p, const std::string& name) {
  const int m = t.find_module(fqn);
  std::int64_t n = 0;
  t.for_each_record([&](const Record& r, std::uint64_t repeat) {
    if (r.kind == EventKind::Collective && r.phase == p &&
        collective_name(r.collective.op) == name && t.is_within(int(r.module), m)) {
      n += std::int64_t(repeat);
    }
  });
  return n;
}

void require_invalid(const std::string& text, const std::string& source,
                     const std::string& fragment) {
  try {
    read_torch_json_dump(text, source);
    FAIL("no error for " << fragment);
  } catch (const Error& e) {
    CAPTURE(e.what());
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE(std::string(e.what()).find(source + ":") == 0);
    REQUIRE(std::string(e.what()).find(fragment) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("torch names", "[report][torch]") {
  Trace t;
  Record r;
  r.kind = EventKind::Collective;
  r.collective.op = Collective::AllReduce;
  REQUIRE(torch_name(t, r) == "c10d_functional.all_reduce");
  r.collective.op = Collective::AllGather;
  REQUIRE(torch_name(t, r) == "c10d_functional.all_gather_into_tensor");
  r.collective.op = Collective::AllToAll;
  REQUIRE(torch_name(t, r) == "_dtensor.shard_dim_alltoall");
  r.kind = EventKind::Gemm;
  r.name = t.pools.intern("addmm");
  r.overload = t.pools.intern("default");
  REQUIRE(torch_name(t, r) == "aten.addmm.default");
  r.kind = EventKind::Compute;
  r.name = t.pools.intern("sum");
  r.overload = t.pools.intern("dim_IntList");
  REQUIRE(torch_name(t, r) == "aten.sum.dim_IntList");
  REQUIRE(format_bytes(400) == "400 B");
  REQUIRE(format_bytes(3200) == "3.12 KiB");
  REQUIRE(format_bytes(1023 * 1024 + 1000) == "1 MiB");
  REQUIRE(format_bytes(std::uint64_t(1) << 62) == "4 EiB");
  REQUIRE(parse_torch_size("torch.Size([8, 10])") == Shape{8, 10});
  REQUIRE(parse_torch_size("torch.Size([])").empty());
  REQUIRE_THROWS_AS(parse_torch_size("torch.Size([8, x])"), Error);
  REQUIRE_THROWS_AS(parse_torch_size("torch.Size([8,])"), Error);
  REQUIRE(torch_module_type("Linear") == "class 'commtrace.nn.Linear'");
  REQUIRE(torch_module_type("").empty());
  REQUIRE(torch_size(Shape{8, 10}) == "torch.Size([8, 10])");
  REQUIRE(torch_size(Shape{16}) == "torch.Size([16])");
  REQUIRE(torch_size(Shape{}) == "torch.Size([])");
}

TEST_CASE("torch table of the MLP TP trace equals PyTorch's at noise 0", "[report][torch]") {
  const Trace& t = mlp_tp_trace();
  const auto golden = golden_tables();
  REQUIRE(golden.size() == 4);
  REQUIRE(torch_table(t, 0, false) == golden.at(0));
  REQUIRE(torch_table(t, 0, true) == golden_raw_noise0());
}

TEST_CASE("torch JSON dump of the MLP TP trace equals PyTorch's at noise 0", "[report][torch]") {
  const Trace& t = mlp_tp_trace();
  REQUIRE(torch_json_dump(t, 0) == data_file("golden_mlp_tp_comm_mode_log_noise0.json"));
}

// Module type strings name commtrace's classes (the issue allows it); all else is PyTorch's.
TEST_CASE("torch table of the MLP TP trace at noise 1 equals PyTorch's but for module types",
          "[report][torch]") {
  const std::string ours = torch_table(mlp_tp_trace(), 1, false);
  CAPTURE(ours);
  REQUIRE(without_module_types(ours) == without_module_types(golden_tables().at(1)));
}

TEST_CASE("torch table colours collectives, op names and op details", "[report][torch]") {
  const std::string s = torch_table(mlp_tp_trace(), 1, true);
  REQUIRE(s.find("\x1b[1;33m            **aten.addmm.default\x1b[0m\n") != std::string::npos);
  REQUIRE(s.find("\x1b[1;31m              device mesh: DeviceMesh((4,), 'cpu', stride=(1,))"
                 "\x1b[0m\n") != std::string::npos);
  REQUIRE(s.find("\n          FORWARD PASS\n") != std::string::npos);  // headers stay plain
}

TEST_CASE("torch JSON dump lists ops by noise level", "[report][torch]") {
  // Placements as PyTorch shows them; the runtime does not record them yet. A plain parameter
  // is not listed (PyTorch lists DTensor parameters only).
  Trace t = mlp_tp_trace();
  const PlacementsId s0 = t.pools.intern_placements(Placements{Placement::shard(0)});
  t.modules[std::size_t(t.find_module("MLPModule.net1"))].params = {
      {"weight", s0}, {"bias", s0}, {"scale", 0}};
  const auto j0 = nlohmann::json::parse(torch_json_dump(t, 0));
  const auto j1 = nlohmann::json::parse(torch_json_dump(t, 1));
  const auto j3 = nlohmann::json::parse(torch_json_dump(t, 3));
  const auto& net1_0 = j0["children"][0]["children"][0];
  const auto& net1_1 = j1["children"][0]["children"][0];
  const auto& net1_3 = j3["children"][0]["children"][0];
  REQUIRE(net1_0["operations_forward"].empty());
  REQUIRE(net1_0["module_type"] == "");
  REQUIRE(net1_1["module_type"] == "class 'commtrace.nn.Linear'");
  REQUIRE(
      net1_1["parameters"] ==
      nlohmann::json::parse(R"J([["weight", "(Shard(dim=0),)"], ["bias", "(Shard(dim=0),)"]])J"));
  REQUIRE(net1_1["operations_forward"].size() == 1);
  REQUIRE(net1_1["operations_forward"][0]["name"] == "aten.addmm.default");
  REQUIRE(net1_1["operations_forward"][0]["input_shape"] ==
          nlohmann::json::parse(
              R"J(["torch.Size([16])", "torch.Size([8, 10])", "torch.Size([10, 16])"])J"));
  REQUIRE(net1_3["operations_forward"].size() > net1_1["operations_forward"].size());
  for (const auto& op : net1_3["operations_backward"]) REQUIRE(op["is_bw"] == true);
}

TEST_CASE("reading PyTorch's noise-0 dump and writing it back is byte-exact", "[report][torch]") {
  const std::string golden = data_file("golden_mlp_tp_comm_mode_log_noise0.json");
  REQUIRE(is_torch_json_dump(Json::parse(golden)));
  const Trace t = read_torch_json_dump(golden, "noise0.json");
  REQUIRE(t.metadata.at("format") == "torch");
  REQUIRE(t.modules.size() == 5);
  REQUIRE(t.modules[1].fqn == "MLPModule");
  REQUIRE(t.modules[1].children.size() == 3);
  REQUIRE(t.modules[t.find_module("MLPModule.relu")].depth == 2);
  // The rolled-up counts come back as one all_reduce, in net2.
  REQUIRE(own_counts(t) == OwnCounts{{{"MLPModule.net2", Phase::Forward, "all_reduce"}, 1}});
  REQUIRE(torch_json_dump(t, 0) == golden);
  REQUIRE(torch_table(t, 0, false) == golden_tables().at(0));
}

TEST_CASE("reading PyTorch's noise-3 dump", "[report][torch]") {
  const std::string golden = data_file("golden_mlp_tp_comm_mode_log_noise3.json");
  const Trace t = read_torch_json_dump(golden, "noise3.json");
  const int net1 = t.find_module("MLPModule.net1");
  REQUIRE(net1 > 0);
  REQUIRE(t.modules[std::size_t(net1)].type == "class 'torch.nn.modules.linear.Linear'");
  REQUIRE(t.modules[std::size_t(net1)].params.size() == 2);
  REQUIRE(placements_str(t.placements(t.modules[std::size_t(net1)].params[0].placements)) ==
          "(Shard(dim=0),)");
  REQUIRE(own_counts(t) == OwnCounts{{{"MLPModule.net2", Phase::Forward, "all_reduce"}, 1}});
  const Record* addmm = nullptr;
  for (const Record& r : t.records) {
    if (int(r.module) == net1 && t.name(r) == "addmm" && r.sharded) addmm = &r;
  }
  REQUIRE(addmm != nullptr);
  REQUIRE(addmm->kind == EventKind::Gemm);
  REQUIRE(addmm->phase == Phase::Forward);
  REQUIRE(t.inputs(*addmm).size() == 3);
  REQUIRE(in_global(t, *addmm, 2) == Shape{10, 16});
  REQUIRE(in_placements(t, *addmm, 2) == "(Shard(dim=1),)");
  REQUIRE(mesh_of(t, *addmm) == "DeviceMesh((4,), 'cpu', stride=(1,))");
  // Everything the dump holds comes back: the noise-3 dump and tables round-trip.
  REQUIRE(torch_json_dump(t, 3) == golden);
  const auto tables = golden_tables();
  for (int noise = 1; noise <= 3; ++noise) {
    CAPTURE(noise);
    REQUIRE(torch_table(t, noise, false) == tables.at(noise));
  }
}

TEST_CASE("reading PyTorch's transformer TP dump un-rolls the counts", "[report][torch]") {
  const std::string text =
      slurp(std::string(COMMTRACE_ORACLE_DIR) + "/transformer_tp_w4_noise1.json");
  const Trace t = read_torch_json_dump(text, "transformer_tp_w4_noise1.json");
  REQUIRE(rolled(t, "Global", Phase::Forward, "all_reduce") == 6);
  REQUIRE(rolled(t, "Global", Phase::Forward, "all_gather") == 1);
  REQUIRE(rolled(t, "Global", Phase::Backward, "all_reduce") == 9);
  REQUIRE(rolled(t, "Transformer.layers.0", Phase::Backward, "all_reduce") == 4);
  const OwnCounts own = own_counts(t);
  REQUIRE(own.at({"Transformer.layers.0.attention.wo", Phase::Forward, "all_reduce"}) == 1);
  REQUIRE(own.at({"Transformer.layers.0.attention.wq", Phase::Backward, "all_reduce"}) == 1);
  REQUIRE(own.at({"Transformer.output", Phase::Forward, "all_gather"}) == 1);
  REQUIRE(own.count({"Transformer.layers.0", Phase::Forward, "all_reduce"}) == 0);
  REQUIRE(own.count({"Global", Phase::Forward, "all_reduce"}) == 0);
  // Rolled up again, every module's collective lists equal the dump's.
  const auto ours = nlohmann::json::parse(torch_json_dump(t, 1));
  const auto theirs = nlohmann::json::parse(text);
  std::function<void(const nlohmann::json&, const nlohmann::json&)> same =
      [&](const nlohmann::json& a, const nlohmann::json& b) {
        CAPTURE(b["fqn"]);
        REQUIRE(a["fqn"] == b["fqn"]);
        REQUIRE(a["module_type"] == b["module_type"]);
        REQUIRE(a["parameters"] == b["parameters"]);
        REQUIRE(a["collectives_forward"] == b["collectives_forward"]);
        REQUIRE(a["collectives_backward"] == b["collectives_backward"]);
        REQUIRE(a["operations_forward"] == b["operations_forward"]);
        REQUIRE(a["operations_backward"] == b["operations_backward"]);
        REQUIRE(a["children"].size() == b["children"].size());
        for (std::size_t i = 0; i < a["children"].size(); ++i)
          same(a["children"][i], b["children"][i]);
      };
  same(ours, theirs);
}

TEST_CASE("malformed PyTorch dumps are rejected naming the source and the path",
          "[report][torch]") {
  const std::string golden = data_file("golden_mlp_tp_comm_mode_log_noise0.json");
  require_invalid(golden.substr(0, golden.size() / 2), "cut.json", "not valid JSON");
  require_invalid("[1, 2]", "arr.json", "expected a generate_json_dump object");
  require_invalid(R"({"fqn": "Model", "children": []})", "root.json", "\"Global\"");
  require_invalid(R"({"fqn": "Global", "collectives_forward": [], "collectives_backward": []})",
                  "nochildren.json", "missing key 'children'");

  auto j = nlohmann::ordered_json::parse(golden);
  auto bad = j;
  bad["children"][0]["collectives_forward"][0] = "c10d_functional.all_reduce";
  require_invalid(bad.dump(4), "x.json",
                  "x.json: children[0].collectives_forward[0]: expected [name, count]");
  bad = j;
  bad["children"][0]["collectives_forward"][0][1] = "1";
  require_invalid(bad.dump(4), "x.json",
                  "children[0].collectives_forward[0]: expected [name, count]");
  bad = j;
  bad["children"][0]["children"] = 3;
  require_invalid(bad.dump(4), "y.json", "y.json: children[0].children: expected an array");
  bad = j;
  bad["children"][0]["children"][1]["fqn"] = 7;
  require_invalid(bad.dump(4), "y.json", "children[0].children[1].fqn: expected a string");
  bad = j;
  bad["children"][0]["collectives_forward"][0][0] = "c10d_functional.frobnicate";
  require_invalid(bad.dump(4), "y.json", "unknown collective \"c10d_functional.frobnicate\"");
  bad = j;
  bad["children"][0]["operations_forward"] = nlohmann::ordered_json::parse(
      R"J([{"name": "aten.mm.default", "input_shape": ["torch.Size([8, x])"],
           "input_sharding": ["(Replicate(),)"], "device_mesh": ""}])J");
  require_invalid(bad.dump(4), "z.json", "children[0].operations_forward[0].input_shape[0]");
  // A parent that lists fewer collectives than its children: a negative own count.
  bad = j;
  bad["children"][0]["collectives_forward"] = nlohmann::ordered_json::array();
  require_invalid(bad.dump(4), "neg.json", "neg.json: children[0].collectives_forward:");
  bad = j;
  bad["collectives_forward"][0][1] = -1;
  require_invalid(bad.dump(4), "neg.json", "collectives_forward[0]: negative count -1");

  REQUIRE_FALSE(is_torch_json_dump(Json::parse("{\"schema\": \"commtrace.trace\"}")));
  REQUIRE_FALSE(is_torch_json_dump(Json::parse("{\"fqn\": \"Model\"}")));
  // A huge count is kept as a count (one record repeated), not as that many records.
  bad = j;
  bad["children"][0]["children"][2]["collectives_forward"][0][1] = 1000000000000;
  bad["children"][0]["collectives_forward"][0][1] = 1000000000000;
  bad["collectives_forward"][0][1] = 1000000000000;
  const Trace huge = read_torch_json_dump(bad.dump(), "huge.json");
  REQUIRE(huge.records.size() < 10);
  REQUIRE(rolled(huge, "Global", Phase::Forward, "all_reduce") == 1000000000000);
  bad["collectives_forward"][0][1] = 9223372036854775807;
  require_invalid(bad.dump(4), "max.json",
                  "collectives_forward[0]: count 9223372036854775807 is larger than");
  // A chain of modules deeper than a trace may hold (still within the JSON nesting limit),
  // each node the golden root with its lists emptied.
  nlohmann::ordered_json empty = j;
  for (auto& [key, value] : empty.items()) {
    if (value.is_array()) value = nlohmann::ordered_json::array();
  }
  nlohmann::ordered_json chain = nlohmann::ordered_json::array();
  for (int d = kMaxModuleDepth + 1; d >= 1; --d) {
    nlohmann::ordered_json node = empty;
    node["fqn"] = fmt::format("m{}", d);
    node["children"] = chain;
    chain = nlohmann::ordered_json::array({node});
  }
  nlohmann::ordered_json deep = empty;
  deep["children"] = chain;
  require_invalid(deep.dump(), "deep.json",
                  fmt::format("module 'm{}' nests {} levels deep, more than {}",
                              kMaxModuleDepth + 1, kMaxModuleDepth + 1, kMaxModuleDepth));
}
