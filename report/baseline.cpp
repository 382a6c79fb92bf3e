// CI baselines (DESIGN §3): expected collectives per iteration (count, bytes; in the totals also
// groups and dtypes), per phase (totals) and per module and phase, stored as small hand-editable
// JSON. check compares a trace with a baseline
// both ways (missing and extra collectives); --expect checks single counts. Counts are rolled up
// as CommDebugMode's (a module includes its descendants); only non-zero counts are stored.
#include "report/baseline.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include "report/counts.h"
#include "report/names.h"
#include "tracer/collectives.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

constexpr const char* kSchema = "commtrace.baseline";
constexpr const char* kVersion = "1.1";
constexpr const char* kComment =
    "expected collectives per iteration: count and bytes per collective (rolled up: a module "
    "includes its descendants; totals are the whole model, with the groups and dtypes), made by "
    "commtrace; regenerate with commtrace check --update";
const std::array<Phase, 4> kPhases{Phase::Forward, Phase::Backward, Phase::Optimizer,
                                   Phase::Recompute};

// One collective of one phase as the baseline expects it; what a file leaves out is not checked.
struct Entry {
  std::int64_t count = 0;
  std::optional<std::uint64_t> bytes;
  std::optional<std::vector<std::string>> groups;  // sorted: "dp(2)", "tp(4)"
  std::optional<std::vector<std::string>> dtypes;  // sorted: "bf16", "f32"
};
using Expected = std::array<std::array<Entry, kCollectiveCount>, kPhaseCount>;

int world_size_of(const Trace& t) {
  const std::string s = metadata_of(t, "world_size");
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && v > 0 ? v : 0;
}

std::vector<std::string> groups_of(const ModuleCounts& m, Phase ph, Collective op) {
  std::set<std::string> s;
  for (const GroupStat& g : m.phases[std::size_t(ph)]) {
    if (g.op == op && g.stat.count > 0) s.insert(fmt::format("{}({})", g.group, g.group_size));
  }
  return {s.begin(), s.end()};
}

std::vector<std::string> dtypes_of(unsigned mask) {
  std::vector<std::string> out;
  for (int d = 0; d < 32; ++d) {
    if (mask & (1u << d)) out.push_back(dtype_name(DType(d)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  return v.empty() ? "none" : fmt::format("{}", fmt::join(v, ", "));
}

// The phase's collectives as the baseline stores them: an object per collective, count-only
// integers for a PyTorch dump.
Json phase_json(const ModuleCounts* m, Phase ph, bool details, bool bytes) {
  Json j = Json::object();
  if (!m) return j;
  for (int i = 0; i < kCollectiveCount; ++i) {
    const Collective op = Collective(i);
    const OpStat s = m->op(ph, op);
    if (s.count <= 0) continue;
    if (!bytes) {
      j[collective_name(op)] = s.count;
      continue;
    }
    Json e{{"count", s.count}, {"bytes", s.bytes}};
    if (details) {
      e["groups"] = groups_of(*m, ph, op);
      e["dtypes"] = dtypes_of(s.dtype_mask);
    }
    j[collective_name(op)] = std::move(e);
  }
  return j;
}

std::vector<std::string> string_list(const JsonReader& rd, const Json& j, const JsonPath& path) {
  std::vector<std::string> out = rd.strings(j, path);
  std::sort(out.begin(), out.end());
  return out;
}

// {"forward": {"all_reduce": 1 or {"count": 1, "bytes": 400, ...}}, ...}; op names may be
// PyTorch keys.
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
    for (const auto& [op_key, value] : ops.items()) {
      const JsonPath op_path = pp.key(op_key.c_str());
      const CollectiveSpec* spec = find_collective(op_key);
      if (!spec) rd.fail(op_path, "unknown collective");
      auto& slot = seen[std::size_t(ph)][std::size_t(spec->op)];
      if (slot) rd.fail(op_path, fmt::format("'{}' is listed twice in this phase", spec->name));
      slot = true;
      Entry& entry = e[std::size_t(ph)][std::size_t(spec->op)];
      constexpr std::int64_t kMaxCount = std::numeric_limits<int>::max();
      if (!value.is_object()) {
        entry.count = rd.integer(value, op_path, 0, kMaxCount);
        continue;
      }
      rd.check_keys(value, op_path, {"count", "bytes", "groups", "dtypes"});
      entry.count = rd.integer(rd.at(value, "count", op_path), op_path.key("count"), 0, kMaxCount);
      if (const Json* b = rd.find(value, "bytes")) {
        entry.bytes = rd.unsigned_integer(*b, op_path.key("bytes"));
      }
      if (const Json* g = rd.find(value, "groups")) {
        entry.groups = string_list(rd, *g, op_path.key("groups"));
      }
      if (const Json* d = rd.find(value, "dtypes")) {
        entry.dtypes = string_list(rd, *d, op_path.key("dtypes"));
      }
    }
  }
  return e;
}

// A Mismatch for every difference of `module` from what the baseline expects (both ways: a
// collective the baseline lacks is expected 0 times).
void compare(const std::string& module, const Expected& expected, const ModuleCounts* actual,
             bool missing, const std::vector<Phase>& phases, bool bytes, double tolerance,
             std::vector<Mismatch>& out) {
  for (Phase ph : phases) {
    for (int i = 0; i < kCollectiveCount; ++i) {
      const Collective op = Collective(i);
      const Entry& want = expected[std::size_t(ph)][std::size_t(i)];
      const OpStat got = actual ? actual->op(ph, op) : OpStat{};
      Mismatch m;
      m.module = module;
      m.phase = ph;
      m.op = op;
      m.module_missing = missing;
      if (want.count != got.count) {
        m.expected = want.count;
        m.got = got.count;
        out.push_back(m);
        continue;
      }
      if (!bytes || !actual || got.count == 0) continue;
      const auto outside = [&](double expected, double actual) {
        return actual > expected * (1 + tolerance) + 0.5 ||
               actual < expected * (1 - tolerance) - 0.5;
      };
      if (want.bytes && outside(double(*want.bytes), double(got.bytes))) {
        m.what = Mismatch::What::Bytes;
        m.expected = std::int64_t(*want.bytes);
        m.got = std::int64_t(got.bytes);
        out.push_back(m);
      }
      if (want.groups) {
        const std::vector<std::string> g = groups_of(*actual, ph, op);
        if (g != *want.groups) {
          m.what = Mismatch::What::Groups;
          m.expected_text = joined(*want.groups);
          m.got_text = joined(g);
          out.push_back(m);
        }
      }
      if (want.dtypes) {
        const std::vector<std::string> d = dtypes_of(got.dtype_mask);
        if (d != *want.dtypes) {
          m.what = Mismatch::What::Dtypes;
          m.expected_text = joined(*want.dtypes);
          m.got_text = joined(d);
          out.push_back(m);
        }
      }
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
  if (what == What::WorldSize) return fmt::format("world_size: expected {}, got {}", expected, got);
  const std::string where = fmt::format("{}{}.{}", module.empty() ? "" : module + ".",
                                        phase_name(phase), collective_name(op));
  const char* absent = module_missing ? " (the trace has no such module)" : "";
  switch (what) {
    case What::Bytes:
      return fmt::format("{} bytes: expected {} ({} B), got {} ({} B)", where,
                         format_bytes(std::uint64_t(expected)), expected,
                         format_bytes(std::uint64_t(got)), got);
    case What::Groups:
      return fmt::format("{} groups: expected {}, got {}", where, expected_text, got_text);
    case What::Dtypes:
      return fmt::format("{} dtypes: expected {}, got {}", where, expected_text, got_text);
    default:
      return fmt::format("{}: expected {}, got {}{}", where, expected, got, absent);
  }
}

std::string make_baseline(const Trace& t) {
  const CountTree c = collective_counts_per_iteration(t);
  const bool torch = is_torch_dump(t);
  Json root{{"schema", kSchema},
            {"version", kVersion},
            {"_comment", kComment},
            {"model", metadata_of(t, "model")},
            {"plan", metadata_of(t, "plan")},
            {"world_size", world_size_of(t)},
            {"source", torch ? "torch" : "commtrace"}};
  const ModuleCounts* global = c.find("Global");
  Json totals = Json::object();
  for (Phase ph : kPhases) {
    if (torch && ph != Phase::Forward && ph != Phase::Backward) continue;
    const Json p = phase_json(global, ph, true, c.has_bytes);
    if (ph != Phase::Recompute || !p.empty()) totals[phase_name(ph)] = p;
  }
  root["totals"] = std::move(totals);
  Json modules = Json::object();
  for (const ModuleCounts& m : c.modules) {
    if (m.fqn == "Global") continue;
    Json phases = Json::object();
    for (Phase ph : kPhases) {
      Json p = phase_json(&m, ph, false, c.has_bytes);
      if (!p.empty()) phases[phase_name(ph)] = std::move(p);
    }
    if (!phases.empty()) modules[m.fqn] = std::move(phases);
  }
  root["modules"] = std::move(modules);
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

CheckResult check_baseline(const Trace& t, const std::string& baseline_text,
                           const std::string& source, const CheckOptions& options) {
  COMMTRACE_CHECK(options.tolerance >= 0 && std::isfinite(options.tolerance),
                  ErrorCode::InvalidArgument, "tolerance {} must be a non-negative number",
                  options.tolerance);
  JsonReader rd(source);
  const Json root =
      rd.parse(baseline_text, fmt::format("a JSON object with \"schema\": \"{}\"", kSchema));
  const JsonPath top;
  rd.check_header(root, kSchema, {{1, 1}}, "baseline");
  rd.check_keys(
      root, top,
      {"schema", "version", "model", "plan", "world_size", "source", "totals", "modules"});
  const std::string model = rd.str(rd.at(root, "model", top), top.key("model"));
  const std::string plan = rd.str(rd.at(root, "plan", top), top.key("plan"));
  const int world_size = rd.int32(rd.at(root, "world_size", top), top.key("world_size"), 0);
  std::string from = "commtrace";
  if (const Json* s = rd.find(root, "source")) from = rd.str(*s, top.key("source"));
  if (from != "commtrace" && from != "torch") {
    rd.fail(top.key("source"), fmt::format("'{}' is neither commtrace nor torch", from));
  }
  const Expected totals = read_phases(rd, rd.at(root, "totals", top), top.key("totals"));
  const JsonPath mpath = top.key("modules");
  const Json& modules_json = rd.object(rd.at(root, "modules", top), mpath);
  std::vector<std::pair<std::string, Expected>> modules;
  for (const auto& [fqn, phases] : modules_json.items()) {
    modules.emplace_back(fqn, read_phases(rd, phases, mpath.key(fqn.c_str())));
  }

  // A baseline that names no model or plan (made from a PyTorch dump) matches by module path.
  const std::string t_model = metadata_of(t, "model"), t_plan = metadata_of(t, "plan");
  COMMTRACE_CHECK((model.empty() && plan.empty()) || (model == t_model && plan == t_plan),
                  ErrorCode::InvalidArgument,
                  "{} was made for model '{}' plan '{}', the trace is model '{}' plan '{}'", source,
                  model, plan, t_model, t_plan);

  CountTree c = collective_counts_per_iteration(t);
  CheckResult result;
  std::vector<Phase> phases(kPhases.begin(), kPhases.end());
  if (from == "torch" || is_torch_dump(t)) {
    phases = {Phase::Forward, Phase::Backward};
    fold_recompute_into_backward(c);
    result.notes.push_back("forward and backward only: a PyTorch dump holds no other phase");
  }
  const bool bytes = c.has_bytes;
  if (!bytes) result.notes.push_back("counts only: the trace is a PyTorch dump (no bytes)");
  const int t_world = world_size_of(t);
  if (world_size != 0 && t_world != 0 && world_size != t_world) {
    Mismatch m;
    m.what = Mismatch::What::WorldSize;
    m.expected = world_size;
    m.got = t_world;
    result.differences.push_back(m);
  }
  compare("", totals, c.find("Global"), false, phases, bytes, options.tolerance,
          result.differences);

  std::map<std::string, const Expected*> expected;
  for (const auto& [fqn, e] : modules) expected[fqn] = &e;
  static const Expected kNone{};
  for (const ModuleCounts& m : c.modules) {  // preorder: modules of the trace
    if (m.fqn == "Global") continue;
    const auto it = expected.find(m.fqn);
    if (it == expected.end() && !has_counts(m)) continue;
    compare(m.fqn, it == expected.end() ? kNone : *it->second, &m, false, phases, bytes,
            options.tolerance, result.differences);
  }
  for (const auto& [fqn, e] : modules) {  // then modules the trace lacks
    if (c.find(fqn)) continue;
    compare(fqn, e, nullptr, true, phases, bytes, options.tolerance, result.differences);
  }
  result.ok = result.differences.empty();
  return result;
}

std::string check_json(const CheckResult& r, const std::string& trace,
                       const std::string& baseline) {
  static const char* const kWhat[] = {"count", "bytes", "groups", "dtypes", "world_size"};
  Json diffs = Json::array();
  for (const Mismatch& m : r.differences) {
    Json d{{"module", m.module.empty() ? "Global" : m.module},
           {"what", kWhat[int(m.what)]},
           {"message", m.str()}};
    if (m.what != Mismatch::What::WorldSize) {
      d["phase"] = phase_name(m.phase);
      d["collective"] = collective_name(m.op);
    }
    if (m.what == Mismatch::What::Groups || m.what == Mismatch::What::Dtypes) {
      d["expected"] = m.expected_text;
      d["got"] = m.got_text;
    } else {
      d["expected"] = m.expected;
      d["got"] = m.got;
    }
    if (m.module_missing) d["module_missing"] = true;
    diffs.push_back(std::move(d));
  }
  const Json root{
      {"schema", "commtrace.check"}, {"version", "1.0"},     {"ok", r.ok},      {"trace", trace},
      {"baseline", baseline},        {"differences", diffs}, {"notes", r.notes}};
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

namespace {

// One --expect: [<module>.]<phase>.<collective>=<count>.
struct Expectation {
  std::string module;  // "Global" when none is named
  bool named = false;
  Phase phase = Phase::Forward;
  const CollectiveSpec* spec = nullptr;
  std::int64_t count = 0;
};

Expectation parse_expectation(const std::string& e) {
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("expectation '{}': {} (expected [<module>.]<phase>.<collective>="
                            "<count>, e.g. forward.all_reduce=1)",
                            e, why));
  };
  const std::size_t eq = e.rfind('=');
  if (eq == std::string::npos) bad("no '='");
  const std::string lhs = e.substr(0, eq), rhs = e.substr(eq + 1);
  Expectation x;
  {
    const auto [end, ec] = std::from_chars(rhs.data(), rhs.data() + rhs.size(), x.count);
    if (rhs.empty() || ec != std::errc() || end != rhs.data() + rhs.size() || x.count < 0) {
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
  x.named = phase_at > 0;
  x.module = x.named ? join(0, phase_at) : "Global";
  const std::string phase_str = segs[phase_at];
  const std::string op_str = join(phase_at + 1, segs.size());
  static const std::vector<std::string> kPhaseNames{"forward", "backward", "optimizer",
                                                    "recompute"};
  try {
    x.phase = parse_phase(phase_str);
  } catch (const Error&) {
    bad(fmt::format("unknown phase '{}'{} (forward, backward, optimizer or recompute)", phase_str,
                    did_you_mean(phase_str, kPhaseNames)));
  }
  x.spec = find_collective(op_str);
  if (!x.spec) {
    std::vector<std::string> names;
    for (int i = 0; i < kCollectiveCount; ++i) names.push_back(collective_name(Collective(i)));
    bad(fmt::format("unknown collective '{}'{}", op_str, did_you_mean(op_str, names)));
  }
  return x;
}

}  // namespace

void validate_expectations(const std::vector<std::string>& expectations) {
  for (const std::string& e : expectations) (void)parse_expectation(e);
}

CheckResult check_expectations(const Trace& t, const std::vector<std::string>& expectations) {
  const CountTree c = collective_counts_per_iteration(t);
  CheckResult result;
  for (const std::string& e : expectations) {
    const Expectation x = parse_expectation(e);
    const ModuleCounts* m = c.find(x.module);
    if (!m) {
      std::vector<std::string> fqns;
      for (const ModuleCounts& mc : c.modules) fqns.push_back(mc.fqn);
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("expectation '{}': the trace has no module '{}'{}", e, x.module,
                              did_you_mean(x.module, fqns)));
    }
    const std::int64_t got = m->op(x.phase, x.spec->op).count;
    if (got != x.count) {
      Mismatch mm;
      mm.module = x.named ? x.module : "";
      mm.phase = x.phase;
      mm.op = x.spec->op;
      mm.expected = x.count;
      mm.got = got;
      result.differences.push_back(mm);
    }
  }
  result.ok = result.differences.empty();
  return result;
}

}  // namespace commtrace
