// import kineto on synthetic torch.profiler traces: the NCCL-style record_param_comms events the
// CPU fixtures (tests/kineto, gloo) do not have, phases, iterations, module attribution (forward
// by range, backward by the autograd node's sequence number), and bad input. The real fixtures
// are checked end to end by tests/kineto/import.sh.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/counts.h"
#include "report/kineto.h"
#include "tests/catch_compat.h"
#include "tracer/json_io.h"

using namespace commtrace;
using json = nlohmann::ordered_json;

namespace {

json X(const std::string& name, double ts, double dur, json args = json::object(), int tid = 1) {
  return {{"ph", "X"},  {"cat", "cpu_op"}, {"name", name}, {"pid", 7},
          {"tid", tid}, {"ts", ts},        {"dur", dur},   {"args", args}};
}

// NCCL's record_param_comms for a collective of `in`/`out` elements on group `desc`.
json comms(const std::string& coll, double ts, std::int64_t in, std::int64_t out,
           const std::string& desc = "mesh_tp", int group = 4, int seq = -1,
           const std::string& dtype = "BFloat16") {
  json a = {{"Collective name", coll},
            {"dtype", dtype},
            {"In msg nelems", in},
            {"Out msg nelems", out},
            {"Group size", group},
            {"Process Group Name", "3"},
            {"Process Group Description", desc}};
  if (seq >= 0) a["Seq"] = seq;
  return X("record_param_comms", ts, 1, a);
}

std::string doc(const json& events, json extra = json::object()) {
  json d = {{"schemaVersion", 1}, {"traceEvents", events}};
  for (auto& [k, v] : extra.items()) d[k] = v;
  return d.dump();
}

// A step of a two-module model: forward all_gather in Net.proj (its c10d op around its
// record_param_comms), backward reduce_scatter of the node Net.proj's forward op created,
// an all_reduce in the optimizer.
json step(double t0, int step_no, int seq) {
  return json::array({
      X("ProfilerStep#" + std::to_string(step_no), t0, 100),
      X("module: Net (Net)", t0 + 1, 30),
      X("module: Net.proj (Linear)", t0 + 2, 20),
      X("Redistribute", t0 + 3, 10, {{"Sequence number", seq}}),
      X("c10d::allgather_into_tensor_coalesced_", t0 + 4, 5),
      comms("allgather_into_tensor_coalesced", t0 + 5, 8, 32),
      X("autograd::engine::evaluate_function: RedistributeBackward", t0 + 40, 10,
        {{"Sequence number", seq}}),
      X("RedistributeBackward", t0 + 41, 8, {{"Sequence number", seq}}),
      comms("reduce_scatter_tensor_coalesced", t0 + 42, 32, 8),
      X("Optimizer.step#AdamW.step", t0 + 60, 20),
      comms("allreduce", t0 + 61, 16, 16, "default_pg", 8, -1, "Float"),
  });
}

}  // namespace

TEST_CASE("kineto: record_param_comms, phases, iterations and modules", "[kineto]") {
  json events = step(0, 3, 10);
  for (const json& e : step(1000, 4, 20)) events.push_back(e);
  events.push_back({{"ph", "i"}, {"name", "an instant"}, {"ts", 5}});  // not a complete event
  std::vector<std::string> notes;
  const Trace t = read_kineto_trace(
      doc(events, {{"distributedInfo", {{"rank", 3}, {"world_size", 8}, {"backend", "nccl"}}}}),
      "t.json", 0, &notes);
  CHECK(t.rank == 3);
  CHECK(t.metadata.at("world_size") == "8");
  CHECK(t.metadata.at("iterations") == "2");
  CHECK(t.metadata.at("modules") == "from the trace's 'module: <FQN>' ranges");
  REQUIRE(t.blocks.size() == 2);
  REQUIRE(t.records.size() == 6);  // the c10d op is its record_param_comms' collective

  const Record& ag = t.records[0];
  CHECK(t.name(ag) == "all_gather");
  CHECK(ag.phase == Phase::Forward);
  CHECK(t.modules[ag.module].fqn == "Net.proj");
  CHECK(t.modules[ag.module].type == "Linear");
  CHECK(ag.dtype == DType::BF16);
  CHECK(ag.collective.bytes == 64);  // the gathered output: 32 bf16
  CHECK(t.str(ag.collective.group) == "tp");
  CHECK(ag.collective.group_size == 4);
  CHECK(ag.duration_s == Approx(1e-6));

  const Record& rs = t.records[1];
  CHECK(t.name(rs) == "reduce_scatter");
  CHECK(rs.phase == Phase::Backward);
  CHECK(t.modules[rs.module].fqn == "Net.proj");  // whose forward created RedistributeBackward
  CHECK(rs.collective.bytes == 64);

  const Record& ar = t.records[2];
  CHECK(ar.phase == Phase::Optimizer);
  CHECK(ar.module == 0);
  CHECK(ar.collective.bytes == 64);
  CHECK(t.str(ar.collective.group) == "default_pg");

  // Sequence numbers count per group when the trace has none.
  CHECK(t.records[0].collective.seq == 1);
  CHECK(t.records[3].collective.seq == 3);
  CHECK(t.records[5].collective.seq == 2);
  CHECK(t.records[3].start_s == Approx(1000e-6 + 5e-6));

  const CountTree c = collective_counts_per_iteration(t);
  CHECK(c.find("Net")->op(Phase::Forward, Collective::AllGather).count == 1);
  CHECK(c.find("Global")->op(Phase::Optimizer, Collective::AllReduce).count == 1);
  CHECK(notes.empty());
}

TEST_CASE("kineto: what a trace lacks is noted, not guessed", "[kineto]") {
  SECTION("no ProfilerStep: one iteration") {
    std::vector<std::string> notes;
    const Trace t = read_kineto_trace(
        doc(json::array({comms("allreduce", 1, 4, 4, "x", 2, 7, "Float")})), "t.json", 5, &notes);
    CHECK(t.rank == 5);  // no distributedInfo: the position
    CHECK(t.metadata.at("iterations") == "1");
    REQUIRE(t.records.size() == 1);
    CHECK(t.records[0].collective.seq == 8);  // PyTorch's Seq, from 0
    CHECK(t.metadata.at("modules").starts_with("not in the trace"));
    REQUIRE(notes.size() == 1);
    CHECK(notes[0] == "no ProfilerStep ranges: the whole trace is one iteration");
  }
  SECTION("outside the steps, no row, no element type, an inexact type") {
    std::vector<std::string> notes;
    json a = comms("allreduce", 20, 4, 4);
    a["args"].erase("dtype");
    const json events = {X("ProfilerStep#1", 10, 100),
                         comms("allreduce", 1, 4, 4),
                         comms("gather", 15, 4, 16),
                         comms("gather", 16, 4, 16),
                         X("c10d::reduce_", 17, 1),
                         a,
                         comms("allreduce", 30, 4, 4, "tp", 4, -1, "Half")};
    const Trace t = read_kineto_trace(doc(events), "t.json", 0, &notes);
    REQUIRE(t.records.size() == 2);
    CHECK(t.records[0].collective.bytes == 0);
    CHECK(t.records[1].collective.bytes == 8);
    const std::vector<std::string> want = {
        "1 collective without an element type (a TensorList outside any _c10d_functional op): "
        "bytes 0",
        "1 collective of an element type commtrace has no name for (half, int, byte, bool): bytes "
        "right, dtype shown as f32",
        "1 collective outside every ProfilerStep range: not counted",
        "1 × 'c10d::reduce_': a collective commtrace has no row for, not imported",
        "2 × 'gather': a collective commtrace has no row for, not imported"};
    CHECK(notes == want);
  }
}

TEST_CASE("kineto: gloo's c10d ops carry shapes, the functional op's dtype", "[kineto]") {
  const json pg = {{"rank", 1},
                   {"world_size", 2},
                   {"pg_config", {{{"pg_name", "0"}, {"pg_desc", "default_pg"}, {"pg_size", 2}}}}};
  const json events = {
      X("_c10d_functional::all_gather_into_tensor", 1, 10, {{"Input type", {"float", "Scalar"}}}),
      X("c10d::allgather_into_tensor_coalesced_", 2, 5,
        {{"Input type", {"TensorList", "TensorList", "", "Scalar"}},
         {"Input Dims", {{{40, 10}}, {{20, 10}}, json::array(), json::array()}}}),
      X("c10d::allreduce_", 20, 5,
        {{"Input type", {"TensorList", "", "", ""}}, {"Input Dims", {{{6, 2}, {3}}}}})};
  std::vector<std::string> notes;
  const Trace t = read_kineto_trace(doc(events, {{"distributedInfo", pg}}), "t.json", 0, &notes);
  REQUIRE(t.records.size() == 2);
  const Record& ag = t.records[0];
  CHECK(ag.collective.bytes == 40 * 10 * 4);
  CHECK(t.str(ag.collective.group) == "default_pg");
  CHECK(ag.collective.group_size == 2);
  REQUIRE(ag.n_inputs == 1);
  REQUIRE(ag.n_outputs == 1);
  CHECK(t.shape(t.inputs(ag)[0].shape).size() == 2);
  CHECK(t.shape(t.inputs(ag)[0].shape)[0] == 20);
  CHECK(t.shape(t.outputs(ag)[0].shape)[0] == 40);
  const Record& ar = t.records[1];
  CHECK(ar.n_inputs == 2);  // a coalesced list of two tensors, no element type
  CHECK(ar.collective.bytes == 0);
  CHECK(notes.size() == 2);  // no ProfilerStep; no element type

  // Several process groups: a gather's size from its buffers, an all_reduce's unknown.
  const Trace m = read_kineto_trace(doc(events), "t.json", 0);
  CHECK(m.records[0].collective.group_size == 2);
  CHECK(m.records[1].collective.group_size == 0);
  CHECK(m.metadata.count("group_size") == 1);
}

TEST_CASE("kineto: with_stack's nn.Module ranges give instance paths", "[kineto]") {
  const json events = {X("nn.Module: Toy_0", 1, 50), X("nn.Module: Linear_1", 2, 20),
                       comms("allreduce", 3, 4, 4), X("nn.Module: Linear_0", 30, 5)};
  const Trace t = read_kineto_trace(doc(events), "t.json", 0);
  REQUIRE(t.modules.size() == 4);
  CHECK(t.modules[1].fqn == "Toy_0");
  CHECK(t.modules[2].fqn == "Toy_0.Linear_1");
  CHECK(t.modules[2].type == "Linear");
  CHECK(t.modules[2].parent == 1);
  CHECK(t.modules[3].fqn == "Toy_0.Linear_0");
  CHECK(t.modules[t.records[0].module].fqn == "Toy_0.Linear_1");
}

TEST_CASE("kineto: bad input is refused naming file and event", "[kineto]") {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      (void)read_kineto_trace(text, "bad.json", 0);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      return e.what();
    }
    return "no error";
  };
  CHECK(error_of("{").starts_with("bad.json: not valid JSON"));
  CHECK(error_of("[]") ==
        "bad.json: expected a PyTorch profiler trace (Chrome trace JSON), got array");
  CHECK(error_of(R"({"traceEvents": 3})").find("traceEvents") != std::string::npos);
  CHECK(error_of(R"({"traceEvents": [1]})") ==
        "bad.json: traceEvents[0]: expected an event object, got number");
  CHECK(error_of(doc(json::array({X("ProfilerStep#1", 0, -1)}))) ==
        "bad.json: traceEvents[0].dur: a negative duration");
  CHECK(error_of(doc(
            json::array({X("a", 0, 1), comms("allreduce", 0, 4, 4, "tp", 4, -1, "Complex")}))) ==
        "bad.json: traceEvents[1].args.dtype: unknown element type 'Complex'");
  CHECK(error_of(doc(json::array({comms("allreduce", 0, -4, 4)}))).find("args.In msg nelems") !=
        std::string::npos);
  CHECK(error_of(doc(json::array({X("module: ", 0, 1)}))) ==
        "bad.json: traceEvents[0]: a module range without a name");
  json c = comms("allreduce", 0, 4, 4);
  c["args"]["Process Group Description"] = "tp\x1b[2J";
  CHECK(error_of(doc(json::array({c}))).find("control character U+001B") != std::string::npos);

  // Module ranges nested deeper than a trace may hold.
  json deep = json::array();
  for (int i = 0; i < 40; ++i) deep.push_back(X("module: m" + std::to_string(i), i, 100 - i));
  CHECK(error_of(doc(deep)) == "bad.json: traceEvents[30]: module 'm30' nests more than 30 levels");
}

TEST_CASE("kineto: a real gzipped fixture, and a corrupt one", "[kineto]") {
  const std::string path =
      std::string(COMMTRACE_SOURCE_DIR) + "/tests/kineto/data/toy_tp_w2/rank1.json.gz";
  std::string bytes = read_text_file(path);
  const Trace t = read_kineto_trace(bytes, path, 0);
  CHECK(t.rank == 1);
  CHECK(t.metadata.at("iterations") == "2");
  CHECK(collective_counts_per_iteration(t)
            .find("ToyModel.out_proj")
            ->op(Phase::Forward, Collective::AllReduce)
            .count == 1);
  bytes[bytes.size() / 2] ^= 0x55;
  CHECK_THROWS_AS(read_kineto_trace(bytes, path, 0), Error);
}
