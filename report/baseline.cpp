// CI baselines (DESIGN §3): expected collective counts per iteration, per phase (totals) and per
// module and phase, stored as small hand-editable JSON. check compares a trace with a baseline
// both ways (missing and extra collectives); --expect checks single counts. Counts are rolled up
// as CommDebugMode's (a module includes its descendants); only non-zero counts are stored.
#include "report/baseline.h"

#include "report/json_text.h"

#include <array>
#include <charconv>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "report/counts.h"
#include "tracer/collectives.h"

namespace commtrace {

namespace {

using json = nlohmann::ordered_json;

constexpr const char* kSchema = "commtrace.baseline";
constexpr const char* kVersion = "1.0";
constexpr int kMajor = 1;
constexpr int kMinor = 0;
constexpr const char* kComment =
    "expected collective counts per iteration (rolled up: a module includes its descendants; "
    "totals are the whole model), made by commtrace; regenerate with commtrace check --update";
const std::array<Phase, 4> kPhases{Phase::Forward, Phase::Backward, Phase::Optimizer,
                                   Phase::Recompute};

using Expected = std::array<std::map<std::string, int>, 4>;  // per phase: op -> count

std::string meta(const Trace& t, const char* key) {
  const auto it = t.metadata.find(key);
  return it == t.metadata.end() ? "" : it->second;
}

int world_size_of(const Trace& t) {
  const std::string s = meta(t, "world_size");
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && v > 0 ? v : 0;
}

// Ops in table order (all_reduce, all_gather, ...), then unknown names sorted.
std::vector<std::string> ordered_ops(const std::set<std::string>& names) {
  std::set<std::string> rest = names;
  std::vector<std::string> out;
  for (const CollectiveSpec& c : collective_table()) {
    if (rest.erase(c.name)) out.push_back(c.name);
  }
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

json phase_json(const PhaseCounts& p) {
  std::set<std::string> names;
  for (const auto& [n, s] : p) {
    if (s.count > 0) names.insert(n);
  }
  json j = json::object();
  for (const std::string& n : ordered_ops(names)) j[n] = p.at(n).count;
  return j;
}

[[noreturn]] void fail(const std::string& source, const std::string& path, const std::string& msg) {
  throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}: {}", source, path, msg));
}

const json& member(const std::string& source, const json& obj, const char* key,
                   const std::string& path) {
  const auto it = obj.find(key);
  if (it == obj.end()) fail(source, path, fmt::format("missing key '{}'", key));
  return *it;
}

std::string string_of(const std::string& source, const json& j, const std::string& path) {
  if (!j.is_string()) fail(source, path, fmt::format("expected a string, got {}", j.type_name()));
  return j.get<std::string>();
}

// {"forward": {"all_reduce": 1}, ...} -> Expected; op names may be PyTorch keys.
Expected read_phases(const std::string& source, const json& j, const std::string& path) {
  if (!j.is_object()) {
    fail(source, path, fmt::format("expected an object of phases, got {}", j.type_name()));
  }
  Expected e;
  for (const auto& [phase_key, ops] : j.items()) {
    const std::string pp = path.empty() ? phase_key : path + "." + phase_key;
    Phase ph;
    try {
      ph = parse_phase(phase_key);
    } catch (const Error&) {
      fail(source, pp, "unknown phase (expected forward, backward, optimizer or recompute)");
    }
    if (!ops.is_object()) {
      fail(source, pp,
           fmt::format("expected an object of collective counts, got {}", ops.type_name()));
    }
    for (const auto& [op_key, count] : ops.items()) {
      const std::string op_path = pp + "." + op_key;
      const CollectiveSpec* spec = find_collective(op_key);
      if (!spec) fail(source, op_path, "unknown collective");
      if (!count.is_number_integer()) {
        fail(source, op_path,
             fmt::format("expected a count (an integer), got {}",
                         count.is_number() ? "a fraction" : count.type_name()));
      }
      if (!count.is_number_unsigned()) {
        fail(source, op_path, fmt::format("count {} must not be negative", count.dump()));
      }
      if (count.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<int>::max())) {
        fail(source, op_path, fmt::format("count {} is too large", count.dump()));
      }
      auto& slot = e[std::size_t(ph)];
      if (slot.count(spec->name)) {
        fail(source, op_path, fmt::format("'{}' is listed twice in this phase", spec->name));
      }
      slot[spec->name] = int(count.get<std::uint64_t>());
    }
  }
  return e;
}

int actual_count(const ModuleCounts* m, Phase ph, const std::string& op) {
  if (!m) return 0;
  const PhaseCounts& p = m->phases[std::size_t(ph)];
  const auto it = p.find(op);
  return it == p.end() ? 0 : it->second.count;
}

// Appends "<prefix>phase.op: expected E, got A" for every differing count (both ways).
void compare(const std::string& prefix, const Expected& expected, const ModuleCounts* actual,
             const std::string& suffix, std::vector<std::string>& out) {
  for (Phase ph : kPhases) {
    std::set<std::string> names;
    for (const auto& [n, c] : expected[std::size_t(ph)]) names.insert(n);
    if (actual) {
      for (const auto& [n, s] : actual->phases[std::size_t(ph)]) names.insert(n);
    }
    for (const std::string& op : ordered_ops(names)) {
      const auto it = expected[std::size_t(ph)].find(op);
      const int want = it == expected[std::size_t(ph)].end() ? 0 : it->second;
      const int got = actual_count(actual, ph, op);
      if (want != got) {
        out.push_back(fmt::format("{}{}.{}: expected {}, got {}{}", prefix, phase_name(ph), op,
                                  want, got, suffix));
      }
    }
  }
}

bool has_counts(const ModuleCounts& m) {
  for (const PhaseCounts& p : m.phases) {
    for (const auto& [n, s] : p) {
      if (s.count > 0) return true;
    }
  }
  return false;
}

}  // namespace

std::string make_baseline(const Trace& t) {
  const CountTree c = collective_counts_per_iteration(t);
  json root{{"schema", kSchema},       {"version", kVersion},
            {"_comment", kComment},    {"model", meta(t, "model")},
            {"plan", meta(t, "plan")}, {"world_size", world_size_of(t)}};
  const ModuleCounts* global = c.find("Global");
  json totals = json::object();
  for (Phase ph : kPhases) {
    const json p = global ? phase_json(global->phases[std::size_t(ph)]) : json::object();
    if (ph != Phase::Recompute || !p.empty()) totals[phase_name(ph)] = p;
  }
  root["totals"] = std::move(totals);
  json modules = json::object();
  for (const ModuleCounts& m : c.modules) {
    if (m.fqn == "Global") continue;
    json phases = json::object();
    for (Phase ph : kPhases) {
      json p = phase_json(m.phases[std::size_t(ph)]);
      if (!p.empty()) phases[phase_name(ph)] = std::move(p);
    }
    if (!phases.empty()) modules[m.fqn] = std::move(phases);
  }
  root["modules"] = std::move(modules);
  return root.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

CheckResult check_baseline(const Trace& t, const std::string& baseline_text,
                           const std::string& source) {
  const json root = parse_report_json(
      baseline_text, source, fmt::format("a JSON object with \"schema\": \"{}\"", kSchema).c_str());
  const std::string top = "(top level)";
  const std::string schema = string_of(source, member(source, root, "schema", top), "schema");
  COMMTRACE_CHECK(schema == kSchema, ErrorCode::InvalidArgument,
                  "{}: schema is '{}', expected '{}'", source, schema, kSchema);
  const std::string version = string_of(source, member(source, root, "version", top), "version");
  const auto [major, minor] = parse_json_version(source, version);
  COMMTRACE_CHECK(major == kMajor, ErrorCode::InvalidArgument,
                  "{}: baseline version {} is not supported (this build reads {}.x)", source,
                  version, kMajor);
  if (minor <= kMinor) {
    // Version 1.0 knows these keys; "_"-prefixed keys are comments.
    static const std::set<std::string> known{"schema",     "version", "model",  "plan",
                                             "world_size", "totals",  "modules"};
    for (const auto& [key, value] : root.items()) {
      if (!known.count(key) && key.rfind('_', 0) != 0) {
        fail(source, top, fmt::format("unknown key '{}' (not in version 1.0)", key));
      }
    }
  }
  const std::string model = string_of(source, member(source, root, "model", top), "model");
  const std::string plan = string_of(source, member(source, root, "plan", top), "plan");
  const json& ws = member(source, root, "world_size", top);
  if (!ws.is_number_unsigned() ||
      ws.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<int>::max())) {
    fail(source, "world_size",
         fmt::format("expected a non-negative integer (0: unknown), got {}", ws.dump()));
  }
  const int world_size = int(ws.get<std::uint64_t>());
  const Expected totals = read_phases(source, member(source, root, "totals", top), "totals");
  const json& modules_json = member(source, root, "modules", top);
  if (!modules_json.is_object()) {
    fail(source, "modules",
         fmt::format("expected an object of modules, got {}", modules_json.type_name()));
  }
  std::vector<std::pair<std::string, Expected>> modules;
  for (const auto& [fqn, phases] : modules_json.items()) {
    modules.emplace_back(fqn, read_phases(source, phases, "modules." + fqn));
  }

  const std::string t_model = meta(t, "model"), t_plan = meta(t, "plan");
  COMMTRACE_CHECK(model == t_model && plan == t_plan, ErrorCode::InvalidArgument,
                  "{} was made for model '{}' plan '{}', the trace is model '{}' plan '{}'", source,
                  model, plan, t_model, t_plan);

  const CountTree c = collective_counts_per_iteration(t);
  CheckResult result;
  const int t_world = world_size_of(t);
  if (world_size != 0 && t_world != 0 && world_size != t_world) {
    result.differences.push_back(
        fmt::format("world_size: expected {}, got {}", world_size, t_world));
  }
  compare("", totals, c.find("Global"), "", result.differences);

  std::map<std::string, const Expected*> expected;
  for (const auto& [fqn, e] : modules) expected[fqn] = &e;
  static const Expected kNone{};
  for (const ModuleCounts& m : c.modules) {  // preorder: modules of the trace
    if (m.fqn == "Global") continue;
    const auto it = expected.find(m.fqn);
    if (it == expected.end() && !has_counts(m)) continue;
    compare(m.fqn + ".", it == expected.end() ? kNone : *it->second, &m, "", result.differences);
  }
  for (const auto& [fqn, e] : modules) {  // then modules the trace lacks
    if (c.find(fqn)) continue;
    compare(fqn + ".", e, nullptr, " (the trace has no such module)", result.differences);
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
    int want = 0;
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
    Phase ph;
    try {
      ph = parse_phase(phase_str);
    } catch (const Error&) {
      bad(fmt::format("unknown phase '{}' (forward, backward, optimizer or recompute)", phase_str));
    }
    const CollectiveSpec* spec = find_collective(op_str);
    if (!spec) bad(fmt::format("unknown collective '{}'", op_str));
    const ModuleCounts* m = c.find(module);
    if (!m) bad(fmt::format("the trace has no module '{}'", module));
    const int got = actual_count(m, ph, spec->name);
    if (got != want) {
      result.differences.push_back(fmt::format("{}{}.{}: expected {}, got {}",
                                               phase_at == 0 ? "" : module + ".", phase_name(ph),
                                               spec->name, want, got));
    }
  }
  result.ok = result.differences.empty();
  return result;
}

}  // namespace commtrace
