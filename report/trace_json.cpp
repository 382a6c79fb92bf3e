// commtrace's own trace format (DESIGN §3): every field of every record, the module trees and
// the run's metadata, as versioned JSON. The reader is strict: a missing or mistyped field, an
// unknown enum name or a broken module link is an Error naming the source and the JSON path,
// never a crash. Version 1.0 files must hold only known keys; later 1.x minors may add keys.
#include "report/trace_json.h"

#include "report/json_text.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "report/torch_compat.h"

namespace commtrace {

namespace {

using json = nlohmann::ordered_json;

constexpr int kMajor = 1;
constexpr int kMinor = 0;

// ---- writing ----

json shape_json(const Shape& s) {
  json a = json::array();
  for (std::int64_t d : s) a.push_back(d);
  return a;
}

json tensors_json(const std::vector<TensorMeta>& ts) {
  json a = json::array();
  for (const TensorMeta& m : ts) {
    a.push_back(json{{"shape", shape_json(m.shape)},
                     {"global_shape", shape_json(m.global_shape)},
                     {"placements", m.placements}});
  }
  return a;
}

json module_json(const ModuleNode& m) {
  json params = json::array();
  for (const ParamInfo& p : m.params) {
    params.push_back(json{{"name", p.name}, {"placements", p.placements}});
  }
  return json{{"fqn", m.fqn},     {"type", m.type},         {"parent", m.parent},
              {"depth", m.depth}, {"children", m.children}, {"params", params}};
}

json record_json(const OpRecord& r) {
  json j{{"index", r.index},
         {"kind", event_kind_name(r.kind)},
         {"name", r.name},
         {"overload", r.overload},
         {"phase", phase_name(r.phase)},
         {"module", r.module},
         {"dtype", dtype_name(r.dtype)},
         {"inputs", tensors_json(r.inputs)},
         {"outputs", tensors_json(r.outputs)},
         {"sharded", r.sharded},
         {"mesh", r.mesh},
         {"reason", r.reason},
         {"time_s", r.time_s}};
  if (r.kind == EventKind::Collective) {
    const CollectiveInfo& c = r.collective;
    j["collective"] = json{{"seq", c.seq},
                           {"group", c.group},
                           {"group_size", c.group_size},
                           {"group_rank", c.group_rank},
                           {"bytes", c.bytes},
                           {"reduce_op", reduce_op_name(c.reduce_op)},
                           {"placements_before", c.placements_before},
                           {"placements_after", c.placements_after}};
  }
  return j;
}

// ---- reading: every accessor names source and path in its error ----

class Reader {
 public:
  Reader(const std::string& source, bool strict_keys) : source_(source), strict_(strict_keys) {}

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}: {}", source_, path, msg));
  }

  // REQUIRES: j is an object. Rejects keys outside `known` in strict mode (version 1.0).
  void check_keys(const json& j, const std::string& path,
                  std::initializer_list<const char*> known) const {
    if (!strict_) return;
    for (const auto& [key, value] : j.items()) {
      bool ok = false;
      for (const char* k : known) ok = ok || key == k;
      if (!ok) fail(path, fmt::format("unknown key '{}' (not in version 1.0)", key));
    }
  }

  const json& object(const json& j, const std::string& path) const {
    if (!j.is_object()) fail(path, fmt::format("expected an object, got {}", j.type_name()));
    return j;
  }
  const json& array(const json& j, const std::string& path) const {
    if (!j.is_array()) fail(path, fmt::format("expected an array, got {}", j.type_name()));
    return j;
  }
  const json& at(const json& obj, const char* key, const std::string& path) const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail(path, fmt::format("missing key '{}'", key));
    return *it;
  }

  std::string str(const json& j, const std::string& path) const {
    if (!j.is_string()) fail(path, fmt::format("expected a string, got {}", j.type_name()));
    return j.get<std::string>();
  }
  bool boolean(const json& j, const std::string& path) const {
    if (!j.is_boolean()) fail(path, fmt::format("expected true or false, got {}", j.type_name()));
    return j.get<bool>();
  }
  double number(const json& j, const std::string& path) const {
    if (!j.is_number()) fail(path, fmt::format("expected a number, got {}", j.type_name()));
    return j.get<double>();
  }
  std::int64_t integer(const json& j, const std::string& path, std::int64_t lo,
                       std::int64_t hi) const {
    if (j.is_number_unsigned()) {
      const std::uint64_t v = j.get<std::uint64_t>();
      if (v > std::uint64_t(hi)) fail(path, fmt::format("{} is out of range [{}, {}]", v, lo, hi));
      return std::int64_t(v);
    }
    if (!j.is_number_integer()) {
      fail(path, fmt::format("expected an integer, got {}", j.type_name()));
    }
    const std::int64_t v = j.get<std::int64_t>();
    if (v < lo || v > hi) fail(path, fmt::format("{} is out of range [{}, {}]", v, lo, hi));
    return v;
  }
  std::uint64_t unsigned_integer(const json& j, const std::string& path) const {
    if (j.is_number_unsigned()) return j.get<std::uint64_t>();
    if (j.is_number_integer()) fail(path, fmt::format("{} must not be negative", j.dump()));
    fail(path, fmt::format("expected a non-negative integer, got {}", j.type_name()));
  }
  int int32(const json& j, const std::string& path, int lo = std::numeric_limits<int>::min(),
            int hi = std::numeric_limits<int>::max()) const {
    return int(integer(j, path, lo, hi));
  }

  // Runs an enum parser (which throws "unknown phase 'x'") and prefixes the path.
  template <typename F>
  auto parse(const json& j, const std::string& path, F parser) const {
    const std::string s = str(j, path);
    try {
      return parser(s);
    } catch (const Error& e) {
      fail(path, e.what());
    }
  }

 private:
  const std::string& source_;
  bool strict_;
};

Shape read_shape(const Reader& rd, const json& j, const std::string& path) {
  rd.array(j, path);
  Shape s;
  for (std::size_t i = 0; i < j.size(); ++i) {
    s.push_back(rd.integer(j[i], fmt::format("{}[{}]", path, i), 0,
                           std::numeric_limits<std::int64_t>::max()));
  }
  return s;
}

std::vector<TensorMeta> read_tensors(const Reader& rd, const json& j, const std::string& path) {
  rd.array(j, path);
  std::vector<TensorMeta> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", path, i);
    const json& t = rd.object(j[i], p);
    rd.check_keys(t, p, {"shape", "global_shape", "placements"});
    TensorMeta m;
    m.shape = read_shape(rd, rd.at(t, "shape", p), p + ".shape");
    m.global_shape = read_shape(rd, rd.at(t, "global_shape", p), p + ".global_shape");
    m.placements = rd.str(rd.at(t, "placements", p), p + ".placements");
    out.push_back(std::move(m));
  }
  return out;
}

// Reads the module table and checks that it is a tree rooted at Global: parents precede their
// children, children lists and parent links agree, depths follow the parents.
std::vector<ModuleNode> read_modules(const Reader& rd, const json& j, const std::string& path) {
  rd.array(j, path);
  if (j.empty()) rd.fail(path, "no modules (module 0 must be \"Global\")");
  const int n = j.size() > std::size_t(std::numeric_limits<int>::max())
                    ? std::numeric_limits<int>::max()
                    : int(j.size());
  std::vector<ModuleNode> mods;
  for (int i = 0; i < n; ++i) {
    const std::string p = fmt::format("{}[{}]", path, i);
    const json& m = rd.object(j[std::size_t(i)], p);
    rd.check_keys(m, p, {"fqn", "type", "parent", "depth", "children", "params"});
    ModuleNode node;
    node.fqn = rd.str(rd.at(m, "fqn", p), p + ".fqn");
    node.type = rd.str(rd.at(m, "type", p), p + ".type");
    node.parent = rd.int32(rd.at(m, "parent", p), p + ".parent", -1, n - 1);
    node.depth = rd.int32(rd.at(m, "depth", p), p + ".depth", 0);
    const json& children = rd.array(rd.at(m, "children", p), p + ".children");
    for (std::size_t c = 0; c < children.size(); ++c) {
      node.children.push_back(
          rd.int32(children[c], fmt::format("{}.children[{}]", p, c), 1, n - 1));
    }
    const json& params = rd.array(rd.at(m, "params", p), p + ".params");
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::string pp = fmt::format("{}.params[{}]", p, k);
      const json& pj = rd.object(params[k], pp);
      rd.check_keys(pj, pp, {"name", "placements"});
      node.params.push_back(ParamInfo{rd.str(rd.at(pj, "name", pp), pp + ".name"),
                                      rd.str(rd.at(pj, "placements", pp), pp + ".placements")});
    }
    if (i == 0) {
      if (node.fqn != "Global" || node.parent != -1 || node.depth != 0) {
        rd.fail(p, fmt::format("module 0 must be \"Global\" with parent -1 and depth 0, got '{}' "
                               "with parent {} and depth {}",
                               node.fqn, node.parent, node.depth));
      }
    } else {
      if (node.parent < 0 || node.parent >= i) {
        rd.fail(p + ".parent",
                fmt::format("parent {} of module '{}' must be a module listed before it [0, {})",
                            node.parent, node.fqn, i));
      }
      const int want = mods[std::size_t(node.parent)].depth + 1;
      if (node.depth != want) {
        rd.fail(p + ".depth", fmt::format("depth {} of module '{}' must be its parent's + 1 = {}",
                                          node.depth, node.fqn, want));
      }
    }
    mods.push_back(std::move(node));
  }
  // Every non-root module appears exactly once, in its parent's children.
  std::vector<int> seen(std::size_t(n), 0);
  for (int i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < mods[std::size_t(i)].children.size(); ++c) {
      const int child = mods[std::size_t(i)].children[c];
      const std::string p = fmt::format("{}[{}].children[{}]", path, i, c);
      if (mods[std::size_t(child)].parent != i) {
        rd.fail(p, fmt::format("module {} ('{}') has parent {}, not {}", child,
                               mods[std::size_t(child)].fqn, mods[std::size_t(child)].parent, i));
      }
      if (seen[std::size_t(child)]++) rd.fail(p, fmt::format("module {} listed twice", child));
    }
  }
  for (int i = 1; i < n; ++i) {
    if (!seen[std::size_t(i)]) {
      rd.fail(fmt::format("{}[{}]", path, i),
              fmt::format("module '{}' is missing from the children of its parent {}",
                          mods[std::size_t(i)].fqn, mods[std::size_t(i)].parent));
    }
  }
  return mods;
}

OpRecord read_record(const Reader& rd, const json& j, const std::string& p, int n_modules) {
  rd.object(j, p);
  rd.check_keys(j, p,
                {"index", "kind", "name", "overload", "phase", "module", "dtype", "inputs",
                 "outputs", "sharded", "mesh", "reason", "time_s", "collective"});
  OpRecord r;
  r.index = rd.unsigned_integer(rd.at(j, "index", p), p + ".index");
  r.kind = rd.parse(rd.at(j, "kind", p), p + ".kind", parse_event_kind);
  r.name = rd.str(rd.at(j, "name", p), p + ".name");
  r.overload = rd.str(rd.at(j, "overload", p), p + ".overload");
  r.phase = rd.parse(rd.at(j, "phase", p), p + ".phase", parse_phase);
  r.module = rd.int32(rd.at(j, "module", p), p + ".module");
  if (r.module < 0 || r.module >= n_modules) {
    rd.fail(p + ".module",
            fmt::format("module index {} is out of range [0, {})", r.module, n_modules));
  }
  r.dtype = rd.parse(rd.at(j, "dtype", p), p + ".dtype", parse_dtype);
  r.inputs = read_tensors(rd, rd.at(j, "inputs", p), p + ".inputs");
  r.outputs = read_tensors(rd, rd.at(j, "outputs", p), p + ".outputs");
  r.sharded = rd.boolean(rd.at(j, "sharded", p), p + ".sharded");
  r.mesh = rd.str(rd.at(j, "mesh", p), p + ".mesh");
  r.reason = rd.str(rd.at(j, "reason", p), p + ".reason");
  r.time_s = rd.number(rd.at(j, "time_s", p), p + ".time_s");
  if (r.kind == EventKind::Collective) {
    const std::string cp = p + ".collective";
    const json& c = rd.object(rd.at(j, "collective", p), cp);
    rd.check_keys(c, cp,
                  {"seq", "group", "group_size", "group_rank", "bytes", "reduce_op",
                   "placements_before", "placements_after"});
    CollectiveInfo& ci = r.collective;
    ci.seq = rd.unsigned_integer(rd.at(c, "seq", cp), cp + ".seq");
    ci.group = rd.str(rd.at(c, "group", cp), cp + ".group");
    ci.group_size = rd.int32(rd.at(c, "group_size", cp), cp + ".group_size", 1);
    ci.group_rank = rd.int32(rd.at(c, "group_rank", cp), cp + ".group_rank", 0);
    if (ci.group_rank >= ci.group_size) {
      rd.fail(cp + ".group_rank",
              fmt::format("group rank {} is out of range [0, {})", ci.group_rank, ci.group_size));
    }
    ci.bytes = rd.unsigned_integer(rd.at(c, "bytes", cp), cp + ".bytes");
    ci.reduce_op = rd.parse(rd.at(c, "reduce_op", cp), cp + ".reduce_op", parse_reduce_op);
    ci.placements_before = rd.str(rd.at(c, "placements_before", cp), cp + ".placements_before");
    ci.placements_after = rd.str(rd.at(c, "placements_after", cp), cp + ".placements_after");
  } else if (j.contains("collective")) {
    rd.fail(p + ".collective", fmt::format("only collective records have this key (kind is '{}')",
                                           event_kind_name(r.kind)));
  }
  return r;
}

std::map<std::string, std::string> read_metadata(const Reader& rd, const json& j,
                                                 const std::string& path) {
  rd.object(j, path);
  std::map<std::string, std::string> md;
  for (const auto& [key, value] : j.items()) md[key] = rd.str(value, path + "." + key);
  return md;
}

}  // namespace

std::string write_trace_json(const std::vector<Trace>& traces) {
  COMMTRACE_CHECK(!traces.empty(), ErrorCode::InvalidArgument,
                  "write_trace_json: no traces to write");
  const auto& md = traces[0].metadata;
  json root{{"schema", kTraceSchema}, {"version", kTraceVersion}, {"metadata", json(md)}};
  json ranks = json::array();
  for (const Trace& t : traces) {
    json rank{{"rank", t.rank}};
    // A rank whose metadata differs from rank 0's keeps its own (rare; read back as such).
    if (t.metadata != md) rank["metadata"] = json(t.metadata);
    json modules = json::array();
    for (const ModuleNode& m : t.modules) modules.push_back(module_json(m));
    json records = json::array();
    for (const OpRecord& r : t.records) records.push_back(record_json(r));
    rank["modules"] = std::move(modules);
    rank["records"] = std::move(records);
    ranks.push_back(std::move(rank));
  }
  root["ranks"] = std::move(ranks);
  return root.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::vector<Trace> read_trace_json(const std::string& text, const std::string& source) {
  const json root = parse_report_json(
      text, source, fmt::format("a JSON object with \"schema\": \"{}\"", kTraceSchema).c_str());
  const Reader loose(source, false);
  const std::string schema = loose.str(loose.at(root, "schema", "(top level)"), "schema");
  COMMTRACE_CHECK(schema == kTraceSchema, ErrorCode::InvalidArgument,
                  "{}: schema is '{}', expected '{}'", source, schema, kTraceSchema);
  const std::string version = loose.str(loose.at(root, "version", "(top level)"), "version");
  const auto [major, minor] = parse_json_version(source, version);
  COMMTRACE_CHECK(major == kMajor, ErrorCode::InvalidArgument,
                  "{}: trace version {} is not supported (this build reads {}.x)", source, version,
                  kMajor);
  const Reader rd(source, minor <= kMinor);
  rd.check_keys(root, "(top level)", {"schema", "version", "metadata", "ranks"});

  const auto metadata = read_metadata(rd, rd.at(root, "metadata", "(top level)"), "metadata");
  const json& ranks = rd.array(rd.at(root, "ranks", "(top level)"), "ranks");
  if (ranks.empty()) rd.fail("ranks", "no ranks");
  std::vector<Trace> traces;
  std::set<int> seen;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string p = fmt::format("ranks[{}]", i);
    const json& rj = rd.object(ranks[i], p);
    rd.check_keys(rj, p, {"rank", "metadata", "modules", "records"});
    Trace t;
    t.rank = rd.int32(rd.at(rj, "rank", p), p + ".rank", 0);
    if (!seen.insert(t.rank).second) {
      rd.fail(p + ".rank", fmt::format("rank {} appears twice", t.rank));
    }
    t.metadata =
        rj.contains("metadata") ? read_metadata(rd, rj["metadata"], p + ".metadata") : metadata;
    t.modules = read_modules(rd, rd.at(rj, "modules", p), p + ".modules");
    const json& records = rd.array(rd.at(rj, "records", p), p + ".records");
    t.records.reserve(records.size());
    for (std::size_t k = 0; k < records.size(); ++k) {
      t.records.push_back(
          read_record(rd, records[k], fmt::format("{}.records[{}]", p, k), int(t.modules.size())));
    }
    traces.push_back(std::move(t));
  }
  return traces;
}

std::vector<Trace> load_traces(const std::string& path) {
  const std::string text = read_file(path);
  if (is_torch_json_dump(text)) return {read_torch_json_dump(text, path)};
  return read_trace_json(text, path);
}

void write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    throw Error(ErrorCode::Io,
                fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  }
  const std::size_t written = std::fwrite(text.data(), 1, text.size(), f);
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (written != text.size() || !closed) {
    throw Error(ErrorCode::Io,
                fmt::format("{}: cannot write: {}", path,
                            std::strerror(written != text.size() ? write_errno : errno)));
  }
}

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    throw Error(ErrorCode::Io, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::string text;
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int read_errno = errno;
  std::fclose(f);
  if (failed) {
    throw Error(ErrorCode::Io, fmt::format("{}: cannot read: {}", path, std::strerror(read_errno)));
  }
  return text;
}

}  // namespace commtrace
