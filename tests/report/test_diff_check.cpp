// Counts, diff, baseline check, expectations and cross-rank consistency on real traces of the
// runtime (toy and mlp, TP and SP, world 4), matching the DESIGN §2 table, plus one diff against
// PyTorch's golden CommDebugMode dump.
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/run/runner.h"
#include "report/baseline.h"
#include "report/consistency.h"
#include "report/counts.h"
#include "report/diff.h"
#include "report/trace_json.h"
#include "report/tree.h"
#include "tests/catch_compat.h"
#include "tracer/collectives.h"

using namespace commtrace;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

std::vector<Trace> run(const std::string& model = "toy", const std::string& plan = "tp",
                       bool input_requires_grad = false, int iters = 1,
                       std::vector<int> ranks = {}) {
  TraceOptions o;
  o.cfg.model = model;
  o.cfg.plan = plan;
  o.cfg.world_size = 4;
  o.cfg.input_requires_grad = input_requires_grad;
  o.iters = iters;
  o.ranks = std::move(ranks);
  return trace_run(o);
}

const Trace& toy_tp() {
  static const Trace t = run()[0];
  return t;
}
const Trace& toy_sp() {
  static const Trace t = run("toy", "sp")[0];
  return t;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// The rows under the module line `fqn` of a diff, with runs of spaces collapsed.
std::vector<std::string> block(const std::string& text, const std::string& fqn) {
  std::vector<std::string> rows;
  bool in = false;
  for (const std::string& line : lines_of(text)) {
    if (line.rfind("  ", 0) != 0) {
      in = line == fqn || line.rfind(fqn + "   (", 0) == 0;
      continue;
    }
    if (!in) continue;
    std::string squeezed;
    for (char c : line) {
      if (c != ' ' || (!squeezed.empty() && squeezed.back() != ' ')) squeezed += c;
    }
    while (!squeezed.empty() && squeezed.back() == ' ') squeezed.pop_back();
    rows.push_back(squeezed);
  }
  return rows;
}

bool has_line(const std::vector<std::string>& lines, const std::string& line) {
  for (const std::string& l : lines) {
    if (l == line) return true;
  }
  return false;
}

std::int64_t count_of(const ModuleCounts* m, Phase p, const std::string& op) {
  if (!m) return -1;
  return m->op(p, parse_collective(op)).count;
}

std::vector<std::string> lines_of(const std::vector<Mismatch>& ms) {
  std::vector<std::string> out;
  for (const Mismatch& m : ms) out.push_back(m.str());
  return out;
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.what();
  }
  return "";
}

// A hand-made trace: Global > M > {M.a, M.b}; collectives given as (module, phase, name).
Trace tiny(const std::vector<std::tuple<int, Phase, std::string>>& ops) {
  Trace t;
  t.modules.push_back(ModuleNode{"M", "Net", 0, 1, {2, 3}, {}});
  t.modules.push_back(ModuleNode{"M.a", "Linear", 1, 2, {}, {}});
  t.modules.push_back(ModuleNode{"M.b", "Linear", 1, 2, {}, {}});
  t.modules[0].children = {1};
  for (const auto& [m, p, name] : ops) {
    Record r;
    r.kind = EventKind::Collective;
    r.collective.op = parse_collective(name);
    r.name = t.pools.intern(collective_name(r.collective.op));
    r.phase = p;
    r.module = std::uint32_t(m);
    r.collective.bytes = 100;
    t.records.push_back(r);
  }
  t.metadata = {{"model", "tiny"}, {"plan", "x"}};
  return t;
}

}  // namespace

TEST_CASE("counts: bus bytes, and per iteration without blocks", "[report][counts]") {
  // toy TP at world 4: the forward all_reduce of 400 B carries 2·3/4 of it on the bus.
  const OpStat one =
      collective_counts(toy_tp()).modules[0].op(Phase::Forward, Collective::AllReduce);
  REQUIRE(one.bus_bytes == Approx(600));
  // Two iterations stored as plain records (no blocks, as an import may give): every sum,
  // bus bytes included, is halved back to one iteration's.
  Trace twice = toy_tp();
  twice.blocks.clear();
  const std::vector<Record> records = twice.records;
  twice.records.insert(twice.records.end(), records.begin(), records.end());
  twice.metadata["iterations"] = "2";
  const OpStat per =
      collective_counts_per_iteration(twice).modules[0].op(Phase::Forward, Collective::AllReduce);
  REQUIRE(per.count == one.count);
  REQUIRE(per.bytes == one.bytes);
  REQUIRE(per.bus_bytes == Approx(one.bus_bytes));
}

TEST_CASE("counts: rolled up per module and phase, Global first", "[report][counts]") {
  const CountTree c = collective_counts(toy_tp());
  REQUIRE(c.has_bytes);
  REQUIRE(c.modules.size() >= 4);
  REQUIRE(c.modules[0].fqn == "Global");
  REQUIRE(c.modules[1].fqn == "ToyModel");
  REQUIRE(c.modules[1].depth == 1);
  REQUIRE(c.find("ToyModel.in_proj")->depth == 2);
  REQUIRE(c.find("nope") == nullptr);
  for (const char* m : {"Global", "ToyModel", "ToyModel.out_proj"}) {
    INFO(m);
    REQUIRE(count_of(c.find(m), Phase::Forward, "all_reduce") == 1);
    // (20, 5) f32 activation all-reduced in forward.
    REQUIRE(c.find(m)->op(Phase::Forward, Collective::AllReduce).bytes == 20 * 5 * 4);
  }
  REQUIRE(count_of(c.find("ToyModel.in_proj"), Phase::Forward, "all_reduce") == 0);
  REQUIRE(c.find("Global")->phases[std::size_t(Phase::Backward)].empty());
  REQUIRE(c.find("Global")->phases[0].at(0).group == "tp");
  REQUIRE(c.find("Global")->phases[0].at(0).group_size == 4);

  const CountTree sp = collective_counts(toy_sp());
  REQUIRE(count_of(sp.find("Global"), Phase::Forward, "all_gather") == 1);
  REQUIRE(count_of(sp.find("Global"), Phase::Forward, "reduce_scatter") == 1);
  REQUIRE(count_of(sp.find("Global"), Phase::Backward, "all_gather") == 1);
  REQUIRE(count_of(sp.find("ToyModel.in_proj"), Phase::Forward, "all_gather") == 1);
  REQUIRE(count_of(sp.find("ToyModel.out_proj"), Phase::Forward, "reduce_scatter") == 1);

  SECTION("per iteration") {
    const Trace t3 = run("toy", "tp", false, 3)[0];
    REQUIRE(trace_iterations(t3) == 3);
    REQUIRE(count_of(collective_counts(t3).find("Global"), Phase::Forward, "all_reduce") == 3);
    REQUIRE(count_of(collective_counts_per_iteration(t3).find("Global"), Phase::Forward,
                     "all_reduce") == 1);
    Trace odd = t3;
    odd.metadata["iterations"] = "2";
    REQUIRE(contains(error_of([&] { collective_counts_per_iteration(odd); }), "not a whole"));
    odd.metadata["iterations"] = "zero";
    REQUIRE(contains(error_of([&] { trace_iterations(odd); }), "'zero'"));
  }
  SECTION("iterations that differ: the steady state") {
    // DDP (dp 2 × tp 2): its first iteration all-reduces one bucket, the later ones 4 (a cap of
    // 1 byte closes a bucket at every gradient).
    TraceOptions o;
    o.cfg.model = "mlp";
    o.cfg.world_size = 4;
    o.cfg.mesh = {2, 2};
    o.cfg.ddp_bucket_mb = 1.0 / (1 << 20);
    o.iters = 3;
    const Trace t = trace_run(o)[0];
    const CountTree all = collective_counts(t);
    const CountTree per = collective_counts_per_iteration(t);
    REQUIRE(per.steady_from == 1);
    const std::int64_t first = count_of(all.find("Global"), Phase::Backward, "all_reduce") -
                               2 * count_of(per.find("Global"), Phase::Backward, "all_reduce");
    REQUIRE(count_of(per.find("Global"), Phase::Backward, "all_reduce") == 4);
    REQUIRE(first == 1);
    REQUIRE(contains(render_summary(t), "iteration 1 on, the iterations before it differ"));
  }
  SECTION("PyTorch keys count under canonical names") {
    const Trace t = tiny({{2, Phase::Forward, "c10d_functional.all_gather_into_tensor"},
                          {3, Phase::Forward, "all_gather"}});
    const CountTree tc = collective_counts(t);
    REQUIRE(count_of(tc.find("M"), Phase::Forward, "all_gather") == 2);
    REQUIRE(count_of(tc.find("M.a"), Phase::Forward, "all_gather") == 1);
    REQUIRE(tc.find("M")->op(Phase::Forward, Collective::AllGather).bytes == 200);
  }
}

TEST_CASE("diff: toy TP vs SP", "[report][diff]") {
  DiffOptions o;
  o.label_a = "tp.json";
  o.label_b = "sp.json";
  const DiffResult diff = diff_traces(toy_tp(), toy_sp(), o);
  const std::string text = render_diff(diff);
  INFO(text);
  REQUIRE_FALSE(diff.equal);
  REQUIRE(diff.modules.size() == 4);
  REQUIRE(diff.modules[0].fqn == "Global");
  REQUIRE(diff.modules[0].rows[0].op == Collective::AllReduce);
  REQUIRE(diff.modules[0].rows[0].a.count == 1);
  REQUIRE(diff.modules[0].rows[0].b.count == 0);
  REQUIRE(diff.totals.size() == 4);
  REQUIRE(contains(text, "--- tp.json: toy tp (world 4"));
  REQUIRE(contains(text, "+++ sp.json: toy sp (world 4"));
  // DESIGN §2, per module (spacing aside).
  REQUIRE(
      block(text, "ToyModel") ==
      std::vector<std::string>{"forward all_reduce 1 → 0 (-1) bytes 400 B → 0 B (-400 B)",
                               "all_gather 0 → 1 (+1) bytes 0 B → 3.12 KiB (+3.12 KiB)",
                               "reduce_scatter 0 → 1 (+1) bytes 0 B → 1.56 KiB (+1.56 KiB)",
                               "backward all_gather 0 → 1 (+1) bytes 0 B → 1.56 KiB (+1.56 KiB)"});
  REQUIRE(
      block(text, "ToyModel.in_proj") ==
      std::vector<std::string>{"forward all_gather 0 → 1 (+1) bytes 0 B → 3.12 KiB (+3.12 KiB)"});
  REQUIRE(block(text, "ToyModel.out_proj").size() == 3);
  REQUIRE(contains(text, "\ntotals: forward "));
  REQUIRE(contains(text, "+1 all_gather, +1 reduce_scatter; backward +1 all_gather\n"));
  // Bus bytes per phase (world 4): all_reduce 400 B × 2·3/4; all_gather 3200 B and
  // reduce_scatter 1600 B × 3/4; backward's all_gather 1600 B × 3/4.
  REQUIRE(contains(text,
                   "\nbus bytes: forward 600 B → 3.52 KiB (+2.93 KiB); backward 0 B → "
                   "1.17 KiB (+1.17 KiB)\n"));
  REQUIRE(diff.bus.size() == 2);
  REQUIRE(diff.bus[0].a == Approx(600));
  REQUIRE_FALSE(contains(text, "\x1b["));
  // Columns: every "→" of the module rows is in the same column.
  std::size_t column = std::string::npos;
  std::size_t rows = 0;
  for (const std::string& line : lines_of(text)) {
    const std::size_t arrow = line.find("→");
    if (line.rfind("  ", 0) != 0 || arrow == std::string::npos) continue;
    std::size_t col = 0;  // in characters
    for (std::size_t i = 0; i < arrow; ++i) {
      col += (static_cast<unsigned char>(line[i]) & 0xC0) != 0x80;
    }
    if (column == std::string::npos) column = col;
    REQUIRE(col == column);
    ++rows;
  }
  REQUIRE(rows >= 8);

  SECTION("colour only when asked") {
    const std::string c = render_diff(diff, true);
    REQUIRE(contains(c, "\x1b[31m"));
    REQUIRE(contains(c, "\x1b[32m"));
  }
}

// DESIGN §2 totals: SP issues no all_reduce in forward (the backward seed of its Partial loss is
// made by ones_like, which reads only the shape: no collective, as in DTensor).
TEST_CASE("diff: toy TP vs SP totals as in DESIGN", "[report][diff]") {
  const std::string d = render_diff(diff_traces(toy_tp(), toy_sp()));
  INFO(d);
  REQUIRE(contains(d,
                   "totals: forward -1 all_reduce, +1 all_gather, +1 reduce_scatter; "
                   "backward +1 all_gather\n"));
}

TEST_CASE("diff: equal traces", "[report][diff]") {
  const DiffResult d = diff_traces(toy_tp(), toy_tp());
  REQUIRE(d.equal);
  REQUIRE(contains(render_diff(d), "no differences"));
  // Per iteration: three iterations of the same plan equal one.
  const DiffResult d3 = diff_traces(toy_tp(), run("toy", "tp", false, 3)[0]);
  INFO(render_diff(d3));
  REQUIRE(d3.equal);
}

TEST_CASE("diff: bytes, modules on one side only", "[report][diff]") {
  const Trace a = tiny({{2, Phase::Forward, "all_reduce"}});
  Trace b = tiny({{2, Phase::Forward, "all_reduce"}});
  b.records[0].collective.bytes = 300;
  const DiffResult bytes = diff_traces(a, b);
  INFO(render_diff(bytes));
  REQUIRE_FALSE(bytes.equal);
  REQUIRE(contains(render_diff(bytes), "bytes 100 B \u2192 300 B"));
  REQUIRE(contains(render_diff(bytes), "totals: forward all_reduce bytes +200 B"));

  Trace c = tiny({{2, Phase::Forward, "all_reduce"}, {4, Phase::Backward, "all_gather"}});
  c.modules.push_back(ModuleNode{"M.extra", "Linear", 1, 2, {}, {}});
  c.modules[1].children.push_back(4);
  const DiffResult only = diff_traces(a, c);
  INFO(render_diff(only));
  REQUIRE(contains(render_diff(only), "M.extra   (only in B)"));
  REQUIRE(contains(render_diff(only), "totals: backward +1 all_gather"));

  // A module without collectives on one side only is not a difference.
  Trace e = a;
  e.modules.push_back(ModuleNode{"M.idle", "ReLU", 1, 2, {}, {}});
  e.modules[1].children.push_back(4);
  REQUIRE(diff_traces(a, e).equal);
  // Collectives that moved between modules leave the totals unchanged.
  const DiffResult moved = diff_traces(a, tiny({{3, Phase::Forward, "all_reduce"}}));
  REQUIRE_FALSE(moved.equal);
  REQUIRE(contains(render_diff(moved), "totals: unchanged"));
}

TEST_CASE("load_traces + diff: PyTorch's golden MLP dump vs our MLP TP trace", "[report][diff]") {
  const std::string golden =
      (fs::path(COMMTRACE_TEST_DATA_DIR) / "torch" / "golden_mlp_tp_comm_mode_log_noise0.json")
          .string();
  const std::vector<Trace> torch = load_traces(golden);
  REQUIRE(torch.size() == 1);
  REQUIRE(torch[0].find_module("MLPModule.net2") > 0);
  REQUIRE_FALSE(collective_counts(torch[0]).has_bytes);
  const Trace ours = run("mlp", "tp")[0];
  DiffOptions o;
  o.label_a = "commtrace";
  o.label_b = "pytorch";
  const DiffResult d = diff_traces(ours, torch[0], o);
  INFO(render_diff(d));
  REQUIRE(d.equal);
  // ...and toy SP against it differs.
  REQUIRE_FALSE(diff_traces(toy_sp(), torch[0]).equal);
}

TEST_CASE("baseline: make and check", "[report][baseline]") {
  const std::string text = make_baseline(toy_tp());
  const json j = json::parse(text);
  REQUIRE(j["schema"] == "commtrace.baseline");
  REQUIRE(j["version"] == "1.1");
  REQUIRE(contains(j["_comment"].get<std::string>(), "commtrace check --update"));
  REQUIRE(j["model"] == "toy");
  REQUIRE(j["plan"] == toy_tp().metadata.at("plan"));
  REQUIRE(j["world_size"] == 4);
  REQUIRE(j["source"] == "commtrace");
  REQUIRE(j["totals"] == json::parse(R"J({"forward": {"all_reduce": {"count": 1, "bytes": 400,
                                          "groups": ["tp(4)"], "dtypes": ["f32"]}},
                                          "backward": {}, "optimizer": {}})J"));
  REQUIRE(j["modules"] ==
          json::parse(R"({"ToyModel": {"forward": {"all_reduce": {"count": 1, "bytes": 400}}},
                          "ToyModel.out_proj": {"forward": {"all_reduce":
                                                            {"count": 1, "bytes": 400}}}})"));

  const CheckResult same = check_baseline(toy_tp(), text, "baseline.json");
  REQUIRE(same.ok);
  REQUIRE(same.differences.empty());
  // Per iteration: a 2-iteration trace makes the same baseline.
  REQUIRE(make_baseline(run("toy", "tp", false, 2)[0]) == text);

  SECTION("a change: TP with input requires grad adds a backward all_reduce") {
    const Trace changed = run("toy", "tp", true)[0];
    const CheckResult r = check_baseline(changed, text, "baseline.json");
    const std::vector<std::string> lines = lines_of(r.differences);
    INFO(fmt::format("{}", fmt::join(lines, "\n")));
    REQUIRE_FALSE(r.ok);
    REQUIRE(has_line(lines, "backward.all_reduce: expected 0, got 1"));
    REQUIRE(has_line(lines, "ToyModel.in_proj.backward.all_reduce: expected 0, got 1"));
    REQUIRE(has_line(lines, "ToyModel.backward.all_reduce: expected 0, got 1"));
    REQUIRE(r.differences[0].module.empty());
    REQUIRE(r.differences[0].phase == Phase::Backward);
    REQUIRE(r.differences[0].op == Collective::AllReduce);
    REQUIRE(r.differences[0].got == 1);
    REQUIRE(r.differences.size() == 3);
  }
  SECTION("missing collectives and modules are reported too") {
    json edited = j;
    edited["totals"]["backward"]["reduce_scatter"] = 1;
    edited["modules"]["ToyModel.in_proj"] = json{{"backward", {{"reduce_scatter", 1}}}};
    edited["modules"]["ToyModel.gone"] = json{{"forward", {{"all_gather", 2}}}};
    edited["modules"].erase("ToyModel.out_proj");
    const CheckResult r = check_baseline(toy_tp(), edited.dump(2), "baseline.json");
    REQUIRE_FALSE(r.ok);
    REQUIRE(
        lines_of(r.differences) ==
        std::vector<std::string>{"backward.reduce_scatter: expected 1, got 0",
                                 "ToyModel.in_proj.backward.reduce_scatter: expected 1, got 0",
                                 "ToyModel.out_proj.forward.all_reduce: expected 0, got 1",
                                 "ToyModel.gone.forward.all_gather: expected 2, got 0 (the trace "
                                 "has no such module)"});
  }
  SECTION("PyTorch keys, count-only entries and comments are accepted") {
    json edited = j;
    edited["totals"]["forward"] = json{{"c10d_functional.all_reduce", 1}};
    edited["_note"] = "hand-edited";
    REQUIRE(check_baseline(toy_tp(), edited.dump(), "baseline.json").ok);
  }
  SECTION("bytes, groups and dtypes are pinned; --tolerance lets bytes stray") {
    Trace doubled = toy_tp();
    for (Record& r : doubled.records) r.collective.bytes *= 2;
    CheckResult r = check_baseline(doubled, text, "b.json");
    REQUIRE_FALSE(r.ok);
    REQUIRE(lines_of(r.differences) ==
            std::vector<std::string>{
                "forward.all_reduce bytes: expected 400 B (400 B), got 800 B (800 B)",
                "ToyModel.forward.all_reduce bytes: expected 400 B (400 B), got 800 B (800 B)",
                "ToyModel.out_proj.forward.all_reduce bytes: expected 400 B (400 B), got 800 B "
                "(800 B)"});
    Trace plus = toy_tp();
    for (Record& r2 : plus.records) r2.collective.bytes += r2.collective.bytes / 20;  // +5%
    REQUIRE_FALSE(check_baseline(plus, text, "b.json").ok);
    REQUIRE(check_baseline(plus, text, "b.json", CheckOptions{0.05}).ok);
    REQUIRE_FALSE(check_baseline(plus, text, "b.json", CheckOptions{0.04}).ok);

    Trace regrouped = toy_tp();
    for (Record& r2 : regrouped.records) {
      if (r2.kind == EventKind::Collective) {
        r2.collective.group = regrouped.pools.intern("dp");
        r2.dtype = DType::BF16;
      }
    }
    r = check_baseline(regrouped, text, "b.json");
    REQUIRE(lines_of(r.differences) ==
            std::vector<std::string>{"forward.all_reduce groups: expected tp(4), got dp(4)",
                                     "forward.all_reduce dtypes: expected f32, got bf16"});
    const json out = json::parse(check_json(r, "t.json", "b.json"));
    REQUIRE(out["schema"] == "commtrace.check");
    REQUIRE(out["ok"] == false);
    REQUIRE(out["differences"][0]["what"] == "groups");
    REQUIRE(out["differences"][0]["expected"] == "tp(4)");
    REQUIRE(out["differences"][0]["module"] == "Global");
  }
  SECTION("a 1.0 baseline (counts only) still checks") {
    json old = j;
    old["version"] = "1.0";
    old.erase("source");
    old["totals"]["forward"]["all_reduce"] = 1;
    old["modules"]["ToyModel"]["forward"]["all_reduce"] = 1;
    old["modules"]["ToyModel.out_proj"]["forward"]["all_reduce"] = 1;
    Trace doubled = toy_tp();
    for (Record& r : doubled.records) r.collective.bytes *= 2;
    REQUIRE(check_baseline(doubled, old.dump(), "b.json").ok);
    REQUIRE_FALSE(check_baseline(
                      toy_sp(),
                      [&] {
                        json o = old;
                        o["plan"] = toy_sp().metadata.at("plan");
                        return o.dump();
                      }(),
                      "b.json")
                      .ok);
  }
  SECTION("another model or plan is an error naming both") {
    const std::string mlp = make_baseline(run("mlp", "tp")[0]);
    Trace toy = toy_tp();
    toy.metadata["plan"] = "tp";
    json other = json::parse(mlp);
    other["plan"] = "tp";
    REQUIRE(error_of([&] { check_baseline(toy, other.dump(), "baseline.json"); }) ==
            "baseline.json was made for model 'mlp' plan 'tp', the trace is model 'toy' plan 'tp'");
    REQUIRE(contains(error_of([&] { check_baseline(toy_tp(), mlp, "baseline.json"); }),
                     "made for model 'mlp'"));
    REQUIRE(
        contains(error_of([&] { check_baseline(toy_sp(), text, "b.json"); }),
                 fmt::format("the trace is model 'toy' plan '{}'", toy_sp().metadata.at("plan"))));
  }
  SECTION("malformed baselines") {
    json v2 = j;
    v2["version"] = "2.0";
    REQUIRE(error_of([&] { check_baseline(toy_tp(), v2.dump(), "b.json"); }) ==
            "b.json: baseline version 2.0 is not supported (this build reads 1.x)");
    json neg = j;
    neg["totals"]["forward"]["all_reduce"] = -1;
    REQUIRE(error_of([&] { check_baseline(toy_tp(), neg.dump(), "b.json"); }) ==
            "b.json: totals.forward.all_reduce: -1 is out of range [0, 2147483647]");
    json typed = j;
    typed["modules"]["ToyModel"]["forward"]["all_reduce"] = "1";
    REQUIRE(error_of([&] { check_baseline(toy_tp(), typed.dump(), "b.json"); }) ==
            "b.json: modules.ToyModel.forward.all_reduce: expected an integer, got string");
    json phase = j;
    phase["totals"]["sideways"] = json::object();
    REQUIRE(contains(error_of([&] { check_baseline(toy_tp(), phase.dump(), "b.json"); }),
                     "b.json: totals.sideways: unknown phase"));
    REQUIRE(contains(
        error_of([&] { check_baseline(toy_tp(), trace_json_string({toy_tp()}), "b.json"); }),
        "schema is 'commtrace.trace'"));
  }
}

TEST_CASE("baseline from a PyTorch dump checks our trace by module path", "[report][baseline]") {
  const Trace dump = load_traces((fs::path(COMMTRACE_TEST_DATA_DIR) / "torch" /
                                  "golden_mlp_tp_comm_mode_log_noise3.json")
                                     .string())
                         .at(0);
  const json j = json::parse(make_baseline(dump));
  REQUIRE(j["source"] == "torch");
  REQUIRE(j["model"] == "");
  REQUIRE(j["totals"] == json::parse(R"({"forward": {"all_reduce": 1}, "backward": {}})"));
  const CheckResult ok = check_baseline(run("mlp", "tp")[0], j.dump(), "torch.baseline.json");
  REQUIRE(ok.ok);
  REQUIRE(ok.notes == std::vector<std::string>{
                          "forward and backward only: a PyTorch dump holds no other phase"});
  const CheckResult bad = check_baseline(run("mlp", "tp", true)[0], j.dump(), "b.json");
  REQUIRE(has_line(lines_of(bad.differences), "backward.all_reduce: expected 0, got 1"));
}

TEST_CASE("diff as JSON", "[report][diff]") {
  const DiffResult d = diff_traces(toy_tp(), toy_sp());
  const json j = json::parse(diff_json(d));
  REQUIRE(j["schema"] == "commtrace.diff");
  REQUIRE(j["equal"] == false);
  REQUIRE(j["bytes_compared"] == true);
  REQUIRE(j["modules"][0]["fqn"] == "Global");
  REQUIRE(j["modules"][0]["rows"][0] == json::parse(R"({"phase": "forward", "collective":
      "all_reduce", "count_a": 1, "count_b": 0, "bytes_a": 400, "bytes_b": 0})"));
  REQUIRE(j["totals"][0]["count_delta"] == -1);
  REQUIRE(json::parse(diff_json(diff_traces(toy_tp(), toy_tp())))["equal"] == true);
}

TEST_CASE("expectations", "[report][baseline]") {
  const CheckResult ok = check_expectations(
      toy_tp(), {"forward.all_reduce=1", "ToyModel.in_proj.backward.all_gather=0",
                 "ToyModel.out_proj.forward.all_reduce=1", "Global.backward.all_reduce=0",
                 "forward.c10d_functional.all_reduce=1", "optimizer.all_gather=0"});
  REQUIRE(ok.ok);
  const CheckResult bad = check_expectations(
      toy_sp(), {"forward.reduce_scatter=2", "ToyModel.out_proj.forward.reduce_scatter=1",
                 "ToyModel.out_proj.backward.all_gather=0"});
  REQUIRE_FALSE(bad.ok);
  REQUIRE(lines_of(bad.differences) ==
          std::vector<std::string>{"forward.reduce_scatter: expected 2, got 1",
                                   "ToyModel.out_proj.backward.all_gather: expected 0, got 1"});
  // Per iteration.
  REQUIRE(check_expectations(run("toy", "tp", false, 2)[0], {"forward.all_reduce=1"}).ok);

  for (const char* e : {"forward.all_reduce", "forward.all_reduce=x", "forward.all_reduce=-1",
                        "all_reduce=1", "sideways.all_reduce=1", "forward.frobnicate=1",
                        "NoSuch.forward.all_reduce=1", "forward..all_reduce=1", "=1", ""}) {
    INFO(e);
    const std::string msg = error_of([&] { check_expectations(toy_tp(), {e}); });
    REQUIRE(contains(msg, fmt::format("expectation '{}'", e)));
  }
  REQUIRE(contains(error_of([&] { check_expectations(toy_tp(), {"NoSuch.forward.all_reduce=1"}); }),
                   "no module 'NoSuch'"));
}

TEST_CASE("consistency: every rank issues the same collectives", "[report][consistency]") {
  const std::vector<Trace> ranks = run("toy", "sp", true, 1, {0, 1, 2, 3});
  REQUIRE(ranks.size() == 4);
  REQUIRE(check_rank_consistency(ranks).empty());
  REQUIRE(check_rank_consistency({ranks[0]}).empty());

  SECTION("a different op") {
    std::vector<Trace> bad = ranks;
    Record* first = nullptr;
    for (Record& r : bad[2].records) {
      if (r.kind == EventKind::Collective && !first) first = &r;
    }
    REQUIRE(first);
    const std::string before = collective_name(first->collective.op);
    first->collective.op = before == "all_gather" ? Collective::AllReduce : Collective::AllGather;
    const std::vector<std::string> lines = check_rank_consistency(bad);
    REQUIRE(lines.size() == 1);
    INFO(lines[0]);
    REQUIRE(contains(lines[0],
                     fmt::format("group 'tp' seq {}: rank 0 {} ", first->collective.seq, before)));
    REQUIRE(contains(lines[0], fmt::format(", rank 2 {} ", collective_name(first->collective.op))));
  }
  SECTION("a different global shape and reduce op") {
    std::vector<Trace> bad = ranks;
    const ShapeId other = bad[1].pools.intern_shape(Shape{8, 10});
    for (Record& r : bad[1].records) {
      if (r.kind == EventKind::Collective && r.collective.op == Collective::ReduceScatter) {
        bad[1].args[r.inputs_begin].global_shape = other;
        r.collective.reduce_op = ReduceOp::Max;
      }
    }
    const std::vector<std::string> lines = check_rank_consistency(bad);
    REQUIRE(lines.size() >= 1);
    INFO(lines[0]);
    REQUIRE(contains(lines[0], "rank 1 reduce_scatter f32[8, 10] max"));
  }
  SECTION("one rank issues more") {
    std::vector<Trace> bad = ranks;
    for (auto it = bad[3].records.rbegin(); it != bad[3].records.rend(); ++it) {
      if (it->kind == EventKind::Collective && bad[3].str(it->collective.group) == "tp") {
        bad[3].records.erase(std::next(it).base());
        break;
      }
    }
    const std::vector<std::string> lines = check_rank_consistency(bad);
    REQUIRE(lines.size() == 1);
    INFO(lines[0]);
    REQUIRE(contains(lines[0], "group 'tp': rank 0 issued"));
    REQUIRE(contains(lines[0], "rank 3 issued"));
  }
}

TEST_CASE("diff: max_depth compares rolled-up counts down to a depth", "[report][diff]") {
  DiffOptions o;
  o.max_depth = 0;
  const DiffResult d = diff_traces(toy_tp(), toy_sp(), o);
  REQUIRE_FALSE(d.equal);
  REQUIRE(contains(render_diff(d), "Global\n"));
  REQUIRE_FALSE(contains(render_diff(d), "ToyModel"));
  o.max_depth = 1;
  REQUIRE(contains(render_diff(diff_traces(toy_tp(), toy_sp(), o)), "ToyModel\n"));
  REQUIRE_FALSE(contains(render_diff(diff_traces(toy_tp(), toy_sp(), o)), "ToyModel.in_proj"));
}
