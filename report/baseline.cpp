// CI baselines (DESIGN §3): expected collective counts per iteration, per phase (totals) and per
// module and phase, stored as small hand-editable JSON. check compares a trace with a baseline
// both ways (missing and extra collectives); --expect checks single counts. Counts are rolled up
// as CommDebugMode's (a module includes its descendants); only non-zero counts are stored.
#include "report/baseline.h"

#include <array>
#include <charconv>
#include <limits>
#include <map>

#include "report/counts.h"
#include "tracer/collectives.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

constexpr const char* kSchema = "commtrace.baseline";
constexpr const char* kVersion = "1.0";
constexpr const char* kComment =
    "expected collective counts per iteration (rolled up: a module includes its descendants; "
    "totals are the whole model), made by commtrace; regenerate with commtrace check --update";
const std::array<Phase, 4> kPhases{Phase::Forward, Phase::Backward, Phase::Optimizer,
                                   Phase::Recompute};

// Per phase, per collective (table order): the expected count.
using Expected = std::array<std::array<std::int64_t, kCollectiveCount>, kPhaseCount>;

int world_size_of(const Trace& t) {
  const std::string s = metadata_of(t, "world_size");
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && v > 0 ? v : 0;
}

Json phase_json(const ModuleCounts* m, Phase ph) {
  Json j = Json::object();
  if (!m) return j;
  for (int i = 0; i < kCollectiveCount; ++i) {
    const std::int64_t n = m->op(ph, Collective(i)).count;
    if (n > 0) j[collective_name(Collective(i))] = n;
  }
  return j;
}

// {"forward": {"all_reduce": 1}, ...}; op names may be PyTorch keys.
Expected read_phases(const JsonReader& rd, const Json& j, const JsonPath& path) {
  rd.object(j, path);
  Expected e{};
  std::array<std::array<bool, kCollectiveCount>, kPhaseCount> seen{};
  for (const auto& [phase_key, ops] : j.items()) {
    const JsonPath pp = path.key(phase_key.c_str());
    Phase ph = Phase::Forward;
    try {
      ph = parse_phase(phase_key);
    } catch (const Error&) {
      rd.fail(pp, "unknown phase (expected forward, backward, optimizer or recompute)");
    }
    if (!ops.is_object()) {
      rd.fail(pp, fmt::format("expected an object of collective counts, got {}", ops.type_name()));
    }
    for (const auto& [op_key, count] : ops.items()) {
      const JsonPath op_path = pp.key(op_key.c_str());
      const CollectiveSpec* spec = find_collective(op_key);
      if (!spec) rd.fail(op_path, "unknown collective");
      const std::int64_t n = rd.integer(count, op_path, 0, std::numeric_limits<int>::max());
      auto& slot = seen[std::size_t(ph)][std::size_t(spec->op)];
      if (slot) rd.fail(op_path, fmt::format("'{}' is listed twice in this phase", spec->name));
      slot = true;
      e[std::size_t(ph)][std::size_t(spec->op)] = n;
    }
  }
  return e;
}

// A Mismatch for every differing count of `module` (both ways).
void compare(const std::string& module, const Expected& expected, const ModuleCounts* actual,
             bool missing, std::vector<Mismatch>& out) {
  for (Phase ph : kPhases) {
    for (int i = 0; i < kCollectiveCount; ++i) {
      const Collective op = Collective(i);
      const std::int64_t want = expected[std::size_t(ph)][std::size_t(i)];
      const std::int64_t got = actual ? actual->op(ph, op).count : 0;
      if (want != got) out.push_back(Mismatch{module, false, ph, op, want, got, missing});
    }
  }
}

bool has_counts(const ModuleCounts& m) {
  for (const auto& p : m.phases) {
    for (const GroupStat& g : p) {
      if (g.stat.count > 0) return true;
    }
  }
  return false;
}

}  // namespace

std::string Mismatch::str() const {
  if (world_size) return fmt::format("world_size: expected {}, got {}", expected, got);
  return fmt::format("{}{}.{}: expected {}, got {}{}", module.empty() ? "" : module + ".",
                     phase_name(phase), collective_name(op), expected, got,
                     module_missing ? " (the trace has no such module)" : "");
}

std::string make_baseline(const Trace& t) {
  const CountTree c = collective_counts_per_iteration(t);
  Json root{{"schema", kSchema},
            {"version", kVersion},
            {"_comment", kComment},
            {"model", metadata_of(t, "model")},
            {"plan", metadata_of(t, "plan")},
            {"world_size", world_size_of(t)}};
  const ModuleCounts* global = c.find("Global");
  Json totals = Json::object();
  for (Phase ph : kPhases) {
    const Json p = phase_json(global, ph);
    if (ph != Phase::Recompute || !p.empty()) totals[phase_name(ph)] = p;
  }
  root["totals"] = std::move(totals);
  Json modules = Json::object();
  for (const ModuleCounts& m : c.modules) {
    if (m.fqn == "Global") continue;
    Json phases = Json::object();
    for (Phase ph : kPhases) {
      Json p = phase_json(&m, ph);
      if (!p.empty()) phases[phase_name(ph)] = std::move(p);
    }
    if (!phases.empty()) modules[m.fqn] = std::move(phases);
  }
  root["modules"] = std::move(modules);
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

CheckResult check_baseline(const Trace& t, const std::string& baseline_text,
                           const std::string& source) {
  JsonReader rd(source);
  const Json root =
      rd.parse(baseline_text, fmt::format("a JSON object with \"schema\": \"{}\"", kSchema));
  const JsonPath top;
  rd.check_header(root, kSchema, {{1, 0}}, "baseline");
  rd.check_keys(root, top,
                {"schema", "version", "model", "plan", "world_size", "totals", "modules"});
  const std::string model = rd.str(rd.at(root, "model", top), top.key("model"));
  const std::string plan = rd.str(rd.at(root, "plan", top), top.key("plan"));
  const int world_size = rd.int32(rd.at(root, "world_size", top), top.key("world_size"), 0);
  const Expected totals = read_phases(rd, rd.at(root, "totals", top), top.key("totals"));
  const JsonPath mpath = top.key("modules");
  const Json& modules_json = rd.object(rd.at(root, "modules", top), mpath);
  std::vector<std::pair<std::string, Expected>> modules;
  for (const auto& [fqn, phases] : modules_json.items()) {
    modules.emplace_back(fqn, read_phases(rd, phases, mpath.key(fqn.c_str())));
  }

  const std::string t_model = metadata_of(t, "model"), t_plan = metadata_of(t, "plan");
  COMMTRACE_CHECK(model == t_model && plan == t_plan, ErrorCode::InvalidArgument,
                  "{} was made for model '{}' plan '{}', the trace is model '{}' plan '{}'", source,
                  model, plan, t_model, t_plan);

  const CountTree c = collective_counts_per_iteration(t);
  CheckResult result;
  const int t_world = world_size_of(t);
  if (world_size != 0 && t_world != 0 && world_size != t_world) {
    Mismatch m;
    m.world_size = true;
    m.expected = world_size;
    m.got = t_world;
    result.differences.push_back(m);
  }
  compare("", totals, c.find("Global"), false, result.differences);

  std::map<std::string, const Expected*> expected;
  for (const auto& [fqn, e] : modules) expected[fqn] = &e;
  static const Expected kNone{};
  for (const ModuleCounts& m : c.modules) {  // preorder: modules of the trace
    if (m.fqn == "Global") continue;
    const auto it = expected.find(m.fqn);
    if (it == expected.end() && !has_counts(m)) continue;
    compare(m.fqn, it == expected.end() ? kNone : *it->second, &m, false, result.differences);
  }
  for (const auto& [fqn, e] : modules) {  // then modules the trace lacks
    if (c.find(fqn)) continue;
    compare(fqn, e, nullptr, true, result.differences);
  }
  result.ok = result.differences.empty();
  return result;
}

CheckResult check_expectations(const Trace& t, const std::vector<std::string>& expectations) {
  const CountTree c = collective_counts_per_iteration(t);
  CheckResult result;
  for (const std::string& e : expectations) {
    auto bad = [&](const std::string& why) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("expectation '{}': {} (expected [<module>.]<phase>.<collective>="
                              "<count>, e.g. forward.all_reduce=1)",
                              e, why));
    };
    const std::size_t eq = e.rfind('=');
    if (eq == std::string::npos) bad("no '='");
    const std::string lhs = e.substr(0, eq), rhs = e.substr(eq + 1);
    std::int64_t want = 0;
    {
      const auto [end, ec] = std::from_chars(rhs.data(), rhs.data() + rhs.size(), want);
      if (rhs.empty() || ec != std::errc() || end != rhs.data() + rhs.size() || want < 0) {
        bad(fmt::format("count '{}' is not a non-negative integer", rhs));
      }
    }
    std::vector<std::string> segs;
    for (std::size_t start = 0;;) {
      const std::size_t dot = lhs.find('.', start);
      segs.push_back(lhs.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    for (const std::string& s : segs) {
      if (s.empty()) bad("empty name between dots");
    }
    if (segs.size() < 2) bad("no phase");
    auto join = [&](std::size_t from, std::size_t to) {
      std::string s;
      for (std::size_t i = from; i < to; ++i) s += (i > from ? "." : "") + segs[i];
      return s;
    };
    // The op is the last segment, or a dotted PyTorch key ("c10d_functional.all_reduce").
    std::size_t phase_at = segs.size() - 2;
    for (std::size_t i = 0; i + 2 < segs.size(); ++i) {
      const std::string op = join(i + 1, segs.size());
      if (find_collective(op) && (segs[i] == "forward" || segs[i] == "backward" ||
                                  segs[i] == "optimizer" || segs[i] == "recompute")) {
        phase_at = i;
        break;
      }
    }
    const std::string module = phase_at == 0 ? "Global" : join(0, phase_at);
    const std::string phase_str = segs[phase_at];
    const std::string op_str = join(phase_at + 1, segs.size());
    Phase ph = Phase::Forward;
    try {
      ph = parse_phase(phase_str);
    } catch (const Error&) {
      bad(fmt::format("unknown phase '{}' (forward, backward, optimizer or recompute)", phase_str));
    }
    const CollectiveSpec* spec = find_collective(op_str);
    if (!spec) bad(fmt::format("unknown collective '{}'", op_str));
    const ModuleCounts* m = c.find(module);
    if (!m) bad(fmt::format("the trace has no module '{}'", module));
    const std::int64_t got = m->op(ph, spec->op).count;
    if (got != want) {
      result.differences.push_back(
          Mismatch{phase_at == 0 ? "" : module, false, ph, spec->op, want, got, false});
    }
  }
  result.ok = result.differences.empty();
  return result;
}

}  // namespace commtrace
