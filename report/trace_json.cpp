// commtrace's own trace format (DESIGN §3). Version 2.2: per rank, the meshes, the module tree,
// the blocks of records and the memory per module (2.1); placements as lists of
// "Shard(dim=0)"-style strings; keys with their default value are omitted (overload "default",
// sharded false, no mesh, no reason, a block's untimed 0 and a record's estimated false (2.2), and
// in a collective: no reduce op, seq_stride 0, peer and root -1, no placements). Version 1.x
// (earlier releases) held display strings; they are parsed back into data. The reader is strict: a
// missing or mistyped field, an unknown enum name or a broken module link is an Error naming the
// source and the JSON path, never a crash.
#include "report/trace_json.h"

#include <limits>
#include <set>

#include "report/torch_compat.h"
#include "tracer/collectives.h"

namespace commtrace {

namespace {

// ---- writing ----

void write_shape(JsonWriter& w, std::span<const std::int64_t> s) {
  w.begin_array();
  for (std::int64_t d : s) w.value(d);
  w.end_array();
}

void write_placements(JsonWriter& w, std::span<const Placement> p) {
  w.begin_array();
  for (const Placement& x : p) w.value(x.str());
  w.end_array();
}

void write_args(JsonWriter& w, const Trace& t, std::span<const TensorArg> args) {
  w.begin_array();
  for (const TensorArg& a : args) {
    w.begin_object().key("shape");
    write_shape(w, t.shape(a.shape));
    if (a.global_shape != a.shape) {
      w.key("global");
      write_shape(w, t.shape(a.global_shape));
    }
    if (a.placements != 0) {
      w.key("placements");
      write_placements(w, t.placements(a.placements));
    }
    w.end_object();
  }
  w.end_array();
}

void write_record(JsonWriter& w, const Trace& t, const Record& r) {
  w.begin_object();
  w.key("kind").value(event_kind_name(r.kind));
  w.key("name").value(t.str(r.name));
  if (t.str(r.overload) != "default") w.key("overload").value(t.str(r.overload));
  w.key("phase").value(phase_name(r.phase));
  w.key("module").value(r.module);
  w.key("dtype").value(dtype_name(r.dtype));
  w.key("inputs");
  write_args(w, t, t.inputs(r));
  w.key("outputs");
  write_args(w, t, t.outputs(r));
  if (r.sharded) w.key("sharded").value(true);
  if (r.mesh != kNoMesh) w.key("mesh").value(r.mesh);
  if (r.reason != 0) w.key("reason").value(t.str(r.reason));
  w.key("start_s").value(r.start_s);
  w.key("duration_s").value(r.duration_s);
  if (r.estimated) w.key("estimated").value(true);  // 2.2
  if (r.kind == EventKind::Collective) {
    const CollectiveInfo& c = r.collective;
    w.key("collective").begin_object();
    w.key("op").value(collective_name(c.op));
    if (c.reduce_op != ReduceOp::None) w.key("reduce_op").value(reduce_op_name(c.reduce_op));
    w.key("seq").value(c.seq);
    if (c.seq_stride != 0) w.key("seq_stride").value(c.seq_stride);
    w.key("group").value(t.str(c.group));
    w.key("group_size").value(c.group_size);
    w.key("group_rank").value(c.group_rank);
    if (c.peer >= 0) w.key("peer").value(c.peer);
    if (c.root >= 0) w.key("root").value(c.root);
    w.key("bytes").value(c.bytes);
    if (c.before != 0) {
      w.key("before");
      write_placements(w, t.placements(c.before));
    }
    if (c.after != 0) {
      w.key("after");
      write_placements(w, t.placements(c.after));
    }
    w.end_object();
  }
  w.end_object();
}

void write_metadata(JsonWriter& w, const std::map<std::string, std::string>& md) {
  w.begin_object();
  for (const auto& [k, v] : md) w.key(k).value(v);
  w.end_object();
}

void write_rank(JsonWriter& w, const Trace& t, const std::map<std::string, std::string>& md) {
  w.begin_object();
  w.key("rank").value(t.rank);
  // A rank whose metadata differs from rank 0's keeps its own (rare; read back as such).
  if (t.metadata != md) {
    w.key("metadata");
    write_metadata(w, t.metadata);
  }
  w.key("meshes").begin_array();
  for (std::size_t i = 0; i < t.pools.mesh_count(); ++i) {
    const MeshInfo& m = t.pools.mesh(MeshId(i));
    w.begin_object().key("shape").begin_array();
    for (int s : m.shape) w.value(s);
    w.end_array().key("dim_names").begin_array();
    for (const std::string& n : m.dim_names) w.value(n);
    w.end_array();
    w.key("named").value(m.named).key("device").value(device_name(m.device)).end_object();
  }
  w.end_array();
  w.key("modules").begin_array();
  for (const ModuleNode& m : t.modules) {
    w.begin_object();
    w.key("fqn").value(m.fqn).key("type").value(m.type);
    w.key("parent").value(m.parent).key("depth").value(m.depth);
    w.key("children").begin_array();
    for (int c : m.children) w.value(c);
    w.end_array().key("params").begin_array();
    for (const ParamInfo& p : m.params) {
      w.begin_object().key("name").value(p.name);
      if (p.placements != 0) {
        w.key("placements");
        write_placements(w, t.placements(p.placements));
      }
      w.end_object();
    }
    w.end_array().end_object();
  }
  w.end_array();
  w.key("blocks").begin_array();
  for (const Block& b : t.block_list()) {
    w.begin_object().key("iteration").value(b.iteration).key("repeat").value(b.repeat);
    if (b.untimed != 0) w.key("untimed").value(b.untimed);  // 2.2
    w.key("records").begin_array();
    for (std::uint32_t i = b.first; i < b.first + b.count; ++i) write_record(w, t, t.records[i]);
    w.end_array().end_object();
  }
  w.end_array();
  if (!t.memory.empty()) {
    // Per module [params, grads, optimizer, activations] bytes (2.1).
    w.key("memory").begin_object().key("peak").value(t.memory_peak).key("modules").begin_array();
    for (const ModuleMemory& m : t.memory) {
      w.begin_array().value(m.params).value(m.grads).value(m.optimizer).value(m.activations);
      w.end_array();
    }
    w.end_array().end_object();
  }
  w.end_object();
}

// ---- reading ----

class TraceReader {
 public:
  explicit TraceReader(const std::string& source) : rd_(source) {}

  std::vector<Trace> read(const Json& root) {
    const JsonPath top;
    major_ = rd_.check_header(root, kTraceSchema, {{1, 0}, {2, 2}}, "trace");
    rd_.check_keys(root, top, {"schema", "version", "metadata", "ranks"});
    const auto metadata = read_metadata(rd_.at(root, "metadata", top), top.key("metadata"));
    const JsonPath rpath = top.key("ranks");
    const Json& ranks = rd_.array(rd_.at(root, "ranks", top), rpath);
    if (ranks.empty()) rd_.fail(rpath, "no ranks");
    std::vector<Trace> traces;
    std::set<int> seen;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const JsonPath p = rpath.index(i);
      const Json& rj = rd_.object(ranks[i], p);
      if (major_ == 1) {
        rd_.check_keys(rj, p, {"rank", "metadata", "modules", "records"});
      } else {
        rd_.check_keys(rj, p, {"rank", "metadata", "meshes", "modules", "blocks", "memory"});
      }
      Trace t;
      t.rank = rd_.int32(rd_.at(rj, "rank", p), p.key("rank"), 0);
      if (!seen.insert(t.rank).second) {
        rd_.fail(p.key("rank"), fmt::format("rank {} appears twice", t.rank));
      }
      const Json* md = rd_.find(rj, "metadata");
      t.metadata = md ? read_metadata(*md, p.key("metadata")) : metadata;
      if (major_ >= 2) read_meshes(rd_.at(rj, "meshes", p), p.key("meshes"), t);
      read_modules(rd_.at(rj, "modules", p), p.key("modules"), t);
      if (major_ == 1) {
        const JsonPath recs = p.key("records");
        const Json& records = rd_.array(rd_.at(rj, "records", p), recs);
        t.records.reserve(records.size());
        for (std::size_t k = 0; k < records.size(); ++k) {
          t.records.push_back(read_record(records[k], recs.index(k), t));
        }
      } else {
        read_blocks(rd_.at(rj, "blocks", p), p.key("blocks"), t);
        if (const Json* m = rd_.find(rj, "memory")) read_memory(*m, p.key("memory"), t);
      }
      traces.push_back(std::move(t));
    }
    return traces;
  }

 private:
  void read_memory(const Json& j, const JsonPath& p, Trace& t) const {
    rd_.object(j, p);
    rd_.check_keys(j, p, {"peak", "modules"});
    t.memory_peak = rd_.unsigned_integer(rd_.at(j, "peak", p), p.key("peak"));
    const JsonPath mp = p.key("modules");
    const Json& mods = rd_.array(rd_.at(j, "modules", p), mp);
    if (mods.size() != t.modules.size()) {
      rd_.fail(mp, fmt::format("{} entries for {} modules", mods.size(), t.modules.size()));
    }
    for (std::size_t i = 0; i < mods.size(); ++i) {
      const JsonPath q = mp.index(i);
      const Json& m = rd_.array(mods[i], q);
      if (m.size() != 4) rd_.fail(q, "expected [params, grads, optimizer, activations]");
      const JsonPath q0 = q.index(0), q1 = q.index(1), q2 = q.index(2), q3 = q.index(3);
      t.memory.push_back(
          ModuleMemory{rd_.unsigned_integer(m[0], q0), rd_.unsigned_integer(m[1], q1),
                       rd_.unsigned_integer(m[2], q2), rd_.unsigned_integer(m[3], q3)});
    }
  }

  std::map<std::string, std::string> read_metadata(const Json& j, const JsonPath& path) const {
    rd_.object(j, path);
    std::map<std::string, std::string> md;
    for (const auto& [key, value] : j.items()) md[key] = rd_.str(value, path.key(key.c_str()));
    return md;
  }

  Shape read_shape(const Json& j, const JsonPath& path) const {
    rd_.array(j, path);
    Shape s;
    s.reserve(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      s.push_back(rd_.integer(j[i], path.index(i), 0));
    }
    return s;
  }

  // 2.x: a list of placement strings; 1.x: PyTorch's tuple string.
  PlacementsId read_placements(const Json& j, const JsonPath& path, Trace& t) const {
    std::vector<Placement> p;
    if (major_ == 1) {
      p = rd_.parse_with(j, path, [](const std::string& s) { return parse_placements(s); });
    } else {
      rd_.array(j, path);
      for (std::size_t i = 0; i < j.size(); ++i) {
        p.push_back(rd_.parse_with(j[i], path.index(i),
                                   [](const std::string& s) { return parse_placement(s); }));
      }
    }
    return t.pools.intern_placements(p);
  }

  void read_meshes(const Json& j, const JsonPath& path, Trace& t) const {
    rd_.array(j, path);
    for (std::size_t i = 0; i < j.size(); ++i) {
      const JsonPath p = path.index(i);
      const Json& m = rd_.object(j[i], p);
      rd_.check_keys(m, p, {"shape", "dim_names", "named", "device"});
      MeshInfo info;
      const JsonPath sp = p.key("shape"), np = p.key("dim_names");
      const Json& shape = rd_.array(rd_.at(m, "shape", p), sp);
      for (std::size_t k = 0; k < shape.size(); ++k) {
        info.shape.push_back(rd_.int32(shape[k], sp.index(k), 1));
      }
      const Json& names = rd_.array(rd_.at(m, "dim_names", p), np);
      for (std::size_t k = 0; k < names.size(); ++k) {
        info.dim_names.push_back(rd_.str(names[k], np.index(k)));
      }
      if (info.dim_names.size() != info.shape.size()) {
        rd_.fail(p,
                 fmt::format("{} dim names for {} dims", info.dim_names.size(), info.shape.size()));
      }
      info.named = rd_.boolean(rd_.at(m, "named", p), p.key("named"));
      info.device = rd_.parse_with(rd_.at(m, "device", p), p.key("device"),
                                   [](const std::string& s) { return parse_device(s); });
      if (t.pools.intern_mesh(info) != MeshId(i)) rd_.fail(p, "the same mesh is listed twice");
    }
  }

  // The module table must be a tree rooted at Global: parents precede their children, children
  // lists and parent links agree, depths follow the parents.
  void read_modules(const Json& j, const JsonPath& path, Trace& t) const {
    rd_.array(j, path);
    if (j.empty()) rd_.fail(path, "no modules (module 0 must be \"Global\")");
    const int n = j.size() > std::size_t(std::numeric_limits<int>::max())
                      ? std::numeric_limits<int>::max()
                      : int(j.size());
    std::vector<ModuleNode> mods;
    for (int i = 0; i < n; ++i) {
      const JsonPath p = path.index(std::size_t(i));
      const Json& m = rd_.object(j[std::size_t(i)], p);
      rd_.check_keys(m, p, {"fqn", "type", "parent", "depth", "children", "params"});
      ModuleNode node;
      node.fqn = rd_.str(rd_.at(m, "fqn", p), p.key("fqn"));
      node.type = rd_.str(rd_.at(m, "type", p), p.key("type"));
      node.parent = rd_.int32(rd_.at(m, "parent", p), p.key("parent"), -1, n - 1);
      node.depth = rd_.int32(rd_.at(m, "depth", p), p.key("depth"), 0, kMaxModuleDepth);
      const JsonPath cp = p.key("children");
      const Json& children = rd_.array(rd_.at(m, "children", p), cp);
      for (std::size_t c = 0; c < children.size(); ++c) {
        node.children.push_back(rd_.int32(children[c], cp.index(c), 1, n - 1));
      }
      const JsonPath pp = p.key("params");
      const Json& params = rd_.array(rd_.at(m, "params", p), pp);
      for (std::size_t k = 0; k < params.size(); ++k) {
        const JsonPath q = pp.index(k);
        const Json& pj = rd_.object(params[k], q);
        rd_.check_keys(pj, q, {"name", "placements"});
        ParamInfo info{rd_.str(rd_.at(pj, "name", q), q.key("name")), 0};
        const Json* pl = major_ == 1 ? &rd_.at(pj, "placements", q) : rd_.find(pj, "placements");
        if (pl) info.placements = read_placements(*pl, q.key("placements"), t);
        node.params.push_back(std::move(info));
      }
      if (i == 0) {
        if (node.fqn != "Global" || node.parent != -1 || node.depth != 0) {
          rd_.fail(p, fmt::format("module 0 must be \"Global\" with parent -1 and depth 0, got "
                                  "'{}' with parent {} and depth {}",
                                  node.fqn, node.parent, node.depth));
        }
      } else {
        if (node.parent < 0 || node.parent >= i) {
          rd_.fail(p.key("parent"),
                   fmt::format("parent {} of module '{}' must be a module listed before it "
                               "[0, {})",
                               node.parent, node.fqn, i));
        }
        const int want = mods[std::size_t(node.parent)].depth + 1;
        if (node.depth != want) {
          rd_.fail(p.key("depth"),
                   fmt::format("depth {} of module '{}' must be its parent's + 1 = {}", node.depth,
                               node.fqn, want));
        }
      }
      mods.push_back(std::move(node));
    }
    // Every non-root module appears exactly once, in its parent's children.
    std::vector<int> seen(std::size_t(n), 0);
    for (int i = 0; i < n; ++i) {
      for (std::size_t c = 0; c < mods[std::size_t(i)].children.size(); ++c) {
        const int child = mods[std::size_t(i)].children[c];
        const JsonPath mp = path.index(std::size_t(i));
        const JsonPath cp = mp.key("children");
        const JsonPath p = cp.index(c);
        if (mods[std::size_t(child)].parent != i) {
          rd_.fail(p,
                   fmt::format("module {} ('{}') has parent {}, not {}", child,
                               mods[std::size_t(child)].fqn, mods[std::size_t(child)].parent, i));
        }
        if (seen[std::size_t(child)]++) rd_.fail(p, fmt::format("module {} listed twice", child));
      }
    }
    for (int i = 1; i < n; ++i) {
      if (!seen[std::size_t(i)]) {
        rd_.fail(path.index(std::size_t(i)),
                 fmt::format("module '{}' is missing from the children of its parent {}",
                             mods[std::size_t(i)].fqn, mods[std::size_t(i)].parent));
      }
    }
    t.modules = std::move(mods);
  }

  void read_blocks(const Json& j, const JsonPath& path, Trace& t) const {
    rd_.array(j, path);
    for (std::size_t i = 0; i < j.size(); ++i) {
      const JsonPath p = path.index(i);
      const Json& b = rd_.object(j[i], p);
      rd_.check_keys(b, p, {"iteration", "repeat", "untimed", "records"});
      Block block;
      block.first = std::uint32_t(t.records.size());
      block.iteration =
          std::uint32_t(rd_.integer(rd_.at(b, "iteration", p), p.key("iteration"), 0, 0xffffffff));
      block.repeat = rd_.unsigned_integer(rd_.at(b, "repeat", p), p.key("repeat"));
      if (block.repeat == 0) rd_.fail(p.key("repeat"), "a block repeats at least once");
      if (const Json* u = rd_.find(b, "untimed")) {
        block.untimed = rd_.unsigned_integer(*u, p.key("untimed"));
        if (block.untimed >= block.repeat) {
          rd_.fail(p.key("untimed"), fmt::format("{} of {} repeats untimed: at least one is timed",
                                                 block.untimed, block.repeat));
        }
      }
      const JsonPath rp = p.key("records");
      const Json& records = rd_.array(rd_.at(b, "records", p), rp);
      for (std::size_t k = 0; k < records.size(); ++k) {
        t.records.push_back(read_record(records[k], rp.index(k), t));
      }
      block.count = std::uint32_t(t.records.size()) - block.first;
      t.blocks.push_back(block);
    }
  }

  void read_args(const Json& j, const JsonPath& path, Trace& t, std::uint32_t& begin,
                 std::uint16_t& count) const {
    rd_.array(j, path);
    if (j.size() > 0xffff) rd_.fail(path, fmt::format("{} tensors in one record", j.size()));
    begin = std::uint32_t(t.args.size());
    count = std::uint16_t(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      const JsonPath p = path.index(i);
      const Json& a = rd_.object(j[i], p);
      TensorArg arg;
      if (major_ == 1) {
        rd_.check_keys(a, p, {"shape", "global_shape", "placements"});
        arg.shape = t.pools.intern_shape(read_shape(rd_.at(a, "shape", p), p.key("shape")));
        arg.global_shape =
            t.pools.intern_shape(read_shape(rd_.at(a, "global_shape", p), p.key("global_shape")));
        arg.placements = read_placements(rd_.at(a, "placements", p), p.key("placements"), t);
      } else {
        rd_.check_keys(a, p, {"shape", "global", "placements"});
        arg.shape = t.pools.intern_shape(read_shape(rd_.at(a, "shape", p), p.key("shape")));
        const Json* g = rd_.find(a, "global");
        arg.global_shape = g ? t.pools.intern_shape(read_shape(*g, p.key("global"))) : arg.shape;
        if (const Json* pl = rd_.find(a, "placements")) {
          arg.placements = read_placements(*pl, p.key("placements"), t);
        }
      }
      t.args.push_back(arg);
    }
  }

  Record read_record(const Json& j, const JsonPath& p, Trace& t) const {
    rd_.object(j, p);
    if (major_ == 1) {
      rd_.check_keys(j, p,
                     {"index", "kind", "name", "overload", "phase", "module", "dtype", "inputs",
                      "outputs", "sharded", "mesh", "reason", "time_s", "collective"});
      rd_.unsigned_integer(rd_.at(j, "index", p), p.key("index"));
    } else {
      rd_.check_keys(
          j, p,
          {"kind", "name", "overload", "phase", "module", "dtype", "inputs", "outputs", "sharded",
           "mesh", "reason", "start_s", "duration_s", "estimated", "collective"});
    }
    Record r;
    r.kind = rd_.parse_with(rd_.at(j, "kind", p), p.key("kind"), parse_event_kind);
    const std::string name = rd_.str(rd_.at(j, "name", p), p.key("name"));
    const Json* overload = major_ == 1 ? &rd_.at(j, "overload", p) : rd_.find(j, "overload");
    r.overload = t.pools.intern(overload ? rd_.str(*overload, p.key("overload")) : "default");
    r.phase = rd_.parse_with(rd_.at(j, "phase", p), p.key("phase"), parse_phase);
    const int n_modules = int(t.modules.size());
    r.module = std::uint32_t(
        rd_.integer(rd_.at(j, "module", p), p.key("module"), 0, std::max(0, n_modules - 1)));
    r.dtype = rd_.parse_with(rd_.at(j, "dtype", p), p.key("dtype"), parse_dtype);
    read_args(rd_.at(j, "inputs", p), p.key("inputs"), t, r.inputs_begin, r.n_inputs);
    read_args(rd_.at(j, "outputs", p), p.key("outputs"), t, r.outputs_begin, r.n_outputs);
    if (const Json* s = major_ == 1 ? &rd_.at(j, "sharded", p) : rd_.find(j, "sharded")) {
      r.sharded = rd_.boolean(*s, p.key("sharded"));
    }
    if (major_ == 1) {
      const std::string mesh = rd_.str(rd_.at(j, "mesh", p), p.key("mesh"));
      if (!mesh.empty()) {
        r.mesh = t.pools.intern_mesh(
            rd_.parse_with(rd_.at(j, "mesh", p), p.key("mesh"),
                           [](const std::string& s) { return parse_mesh_str(s); }));
      }
      r.reason = t.pools.intern(rd_.str(rd_.at(j, "reason", p), p.key("reason")));
      r.duration_s = rd_.number(rd_.at(j, "time_s", p), p.key("time_s"));
    } else {
      if (const Json* m = rd_.find(j, "mesh")) {
        r.mesh = MeshId(rd_.integer(*m, p.key("mesh"), 0, std::int64_t(t.pools.mesh_count()) - 1));
      }
      if (const Json* reason = rd_.find(j, "reason")) {
        r.reason = t.pools.intern(rd_.str(*reason, p.key("reason")));
      }
      r.start_s = rd_.number(rd_.at(j, "start_s", p), p.key("start_s"));
      r.duration_s = rd_.number(rd_.at(j, "duration_s", p), p.key("duration_s"));
      if (const Json* e = rd_.find(j, "estimated")) {
        r.estimated = rd_.boolean(*e, p.key("estimated"));
      }
    }
    const Json* coll = rd_.find(j, "collective");
    if (r.kind == EventKind::Collective) {
      // 1.x names the collective in the record's name (canonical or a PyTorch key).
      const Collective v1_op =
          major_ == 1 ? rd_.parse_with(rd_.at(j, "name", p), p.key("name"),
                                       [](const std::string& s) { return parse_collective(s); })
                      : Collective::AllReduce;
      read_collective(rd_.at(j, "collective", p), p.key("collective"), r, t, v1_op);
    } else if (coll) {
      rd_.fail(p.key("collective"), fmt::format("only collective records have this key (kind is "
                                                "'{}')",
                                                event_kind_name(r.kind)));
    }
    r.name =
        t.pools.intern(r.kind == EventKind::Collective ? collective_name(r.collective.op) : name);
    return r;
  }

  void read_collective(const Json& c, const JsonPath& cp, Record& r, Trace& t,
                       Collective v1_op) const {
    rd_.object(c, cp);
    CollectiveInfo& ci = r.collective;
    if (major_ == 1) {
      rd_.check_keys(c, cp,
                     {"seq", "group", "group_size", "group_rank", "bytes", "reduce_op",
                      "placements_before", "placements_after"});
      ci.op = v1_op;
    } else {
      rd_.check_keys(c, cp,
                     {"op", "reduce_op", "seq", "seq_stride", "group", "group_size", "group_rank",
                      "peer", "root", "bytes", "before", "after"});
      ci.op = rd_.parse_with(rd_.at(c, "op", cp), cp.key("op"),
                             [](const std::string& s) { return parse_collective(s); });
    }
    ci.seq = rd_.unsigned_integer(rd_.at(c, "seq", cp), cp.key("seq"));
    ci.group = t.pools.intern(rd_.str(rd_.at(c, "group", cp), cp.key("group")));
    ci.group_size = rd_.int32(rd_.at(c, "group_size", cp), cp.key("group_size"), 1);
    ci.group_rank = rd_.int32(rd_.at(c, "group_rank", cp), cp.key("group_rank"), 0);
    if (ci.group_rank >= ci.group_size) {
      rd_.fail(cp.key("group_rank"),
               fmt::format("group rank {} is out of range [0, {})", ci.group_rank, ci.group_size));
    }
    ci.bytes = rd_.unsigned_integer(rd_.at(c, "bytes", cp), cp.key("bytes"));
    const Json* rop = major_ == 1 ? &rd_.at(c, "reduce_op", cp) : rd_.find(c, "reduce_op");
    if (rop) ci.reduce_op = rd_.parse_with(*rop, cp.key("reduce_op"), parse_reduce_op);
    const char* before = major_ == 1 ? "placements_before" : "before";
    const char* after = major_ == 1 ? "placements_after" : "after";
    const Json* b = major_ == 1 ? &rd_.at(c, before, cp) : rd_.find(c, before);
    if (b) ci.before = read_placements(*b, cp.key(before), t);
    const Json* a = major_ == 1 ? &rd_.at(c, after, cp) : rd_.find(c, after);
    if (a) ci.after = read_placements(*a, cp.key(after), t);
    if (major_ >= 2) {
      if (const Json* s = rd_.find(c, "seq_stride")) {
        ci.seq_stride = rd_.unsigned_integer(*s, cp.key("seq_stride"));
      }
      if (const Json* peer = rd_.find(c, "peer")) {
        ci.peer = rd_.int32(*peer, cp.key("peer"), 0, ci.group_size - 1);
      }
      if (const Json* root = rd_.find(c, "root")) {
        ci.root = rd_.int32(*root, cp.key("root"), 0, ci.group_size - 1);
      }
    }
  }

  JsonReader rd_;
  int major_ = 2;
};

}  // namespace

void write_trace_json(const std::vector<Trace>& traces, const JsonWriter::Sink& sink, bool pretty) {
  COMMTRACE_CHECK(!traces.empty(), ErrorCode::InvalidArgument,
                  "write_trace_json: no traces to write");
  const auto& md = traces[0].metadata;
  JsonWriter w(sink, pretty);
  w.begin_object();
  w.key("schema").value(kTraceSchema).key("version").value(kTraceVersion);
  w.key("metadata");
  write_metadata(w, md);
  w.key("ranks").begin_array();
  for (const Trace& t : traces) write_rank(w, t, md);
  w.end_array().end_object();
  w.flush();
}

std::string trace_json_string(const std::vector<Trace>& traces, bool pretty) {
  std::string out;
  write_trace_json(
      traces, [&](std::string_view s) { out += s; }, pretty);
  return out;
}

void write_trace_file(const std::string& path, const std::vector<Trace>& traces, bool pretty) {
  AtomicFile f(path);
  write_trace_json(
      traces, [&](std::string_view s) { f.write(s); }, pretty);
  f.commit();
}

std::vector<Trace> read_trace_json(const std::string& text, const std::string& source) {
  const Json root = JsonReader(source).parse(
      text, fmt::format("a JSON object with \"schema\": \"{}\"", kTraceSchema));
  return TraceReader(source).read(root);
}

std::vector<Trace> load_traces(const std::string& path) {
  const std::string text = read_text_file(path, "trace");
  const Json root = JsonReader(path).parse(
      text, fmt::format("a JSON object with \"schema\": \"{}\"", kTraceSchema));
  if (is_torch_json_dump(root)) return {read_torch_json_dump(root, path)};
  return TraceReader(path).read(root);
}

}  // namespace commtrace
