// PyTorch's CommDebugMode output rendered from a trace (the tracing table and the JSON dump of
// torch/distributed/tensor/debug/_comm_mode.py), and the reader of such a dump. Follows
// PyTorch's rules rather than commtrace's where they differ: trivial ops are PyTorch's set of
// names, counts roll up over descendants, a phase section appears when the module has
// collectives there or (noise >= 1) any recorded op at all, even one not shown.
#include "report/torch_compat.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "report/counts.h"
#include "report/names.h"
#include "tracer/collectives.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

constexpr Phase kShownPhases[] = {Phase::Forward, Phase::Backward};
constexpr const char* kYellow = "\x1b[1;33m";
constexpr const char* kRed = "\x1b[1;31m";
constexpr const char* kReset = "\x1b[0m";

// PyTorch's trivial_ops: hidden below noise 3.
bool is_trivial_torch_op(const std::string& torch_op) {
  static const std::set<std::string> kTrivial{"aten.detach.default",     "aten.t.default",
                                              "aten.view.default",       "aten._to_copy.default",
                                              "aten.as_strided.default", "aten.transpose.int"};
  return kTrivial.count(torch_op) != 0;
}

// Slots of a view: forward, backward, and the ops of activation checkpointing's recomputation
// (CommDebugMode counts its collectives as backward and lists its ops apart).
int phase_slot(Phase p) { return p == Phase::Forward ? 0 : p == Phase::Backward ? 1 : 2; }
bool is_shown_phase(Phase p) { return p != Phase::Optimizer; }

// What CommDebugMode holds per module: collective counts rolled up over the subtree (in order of
// first occurrence) and the module's own ops (every non-collective event) per phase.
struct ModuleView {
  int module = 0, depth = 0;
  std::array<std::vector<std::pair<std::string, std::int64_t>>, 2> collectives;
  std::array<std::vector<const Record*>, 3> ops;
};

std::vector<ModuleView> build_views(const Trace& t) {
  CountTree counts = collective_counts(t);
  fold_recompute_into_backward(counts);
  const auto order = module_preorder(t);
  std::vector<ModuleView> views(order.size());
  std::vector<std::size_t> slot(t.modules.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    ModuleView& v = views[i];
    v.module = order[i].first;
    v.depth = order[i].second;
    slot[std::size_t(v.module)] = i;
    for (Phase p : kShownPhases) {
      for (Collective c : counts.modules[i].ops(p)) {
        v.collectives[std::size_t(phase_slot(p))].emplace_back(collective_spec(c).torch_name,
                                                               counts.modules[i].op(p, c).count);
      }
    }
  }
  t.for_each_event([&](const Record& r, std::uint64_t) {
    if (!is_shown_phase(r.phase) || r.kind == EventKind::Collective) return;
    COMMTRACE_CHECK(r.module < t.modules.size(), ErrorCode::InvalidArgument,
                    "a record names module {} of {}", r.module, t.modules.size());
    views[slot[r.module]].ops[std::size_t(phase_slot(r.phase))].push_back(&r);
  });
  return views;
}

// PyTorch keeps the DTensor positional arguments only.
std::vector<TensorArg> dtensor_inputs(const Trace& t, const Record& r) {
  std::vector<TensorArg> out;
  if (!r.sharded) return out;
  for (const TensorArg& a : t.inputs(r)) {
    if (a.placements != 0) out.push_back(a);
  }
  return out;
}

// noise 1: DTensor ops; 2: + local ops; 3: + trivial ops.
bool op_listed(const Trace& t, const Record& r, int noise) {
  if (noise <= 0) return false;
  if (noise >= 3) return true;
  if (is_trivial_torch_op(torch_name(t, r))) return false;
  return noise >= 2 || !dtensor_inputs(t, r).empty();
}

std::vector<const ParamInfo*> dtensor_params(const ModuleNode& n) {
  std::vector<const ParamInfo*> out;
  for (const ParamInfo& p : n.params) {
    if (p.placements != 0) out.push_back(&p);
  }
  return out;
}

std::string mesh_of(const Trace& t, const Record& r) {
  return r.mesh == kNoMesh ? "" : mesh_str(t.pools.mesh(r.mesh));
}

std::string py_list(const std::vector<std::string>& items) {
  return fmt::format("[{}]", fmt::join(items, ", "));
}

}  // namespace

std::string torch_table(const Trace& t, int noise, bool color) {
  const std::vector<ModuleView> views = build_views(t);
  const std::string on_y = color ? kYellow : "";
  const std::string on_r = color ? kRed : "";
  const std::string off = color ? kReset : "";

  std::string out;
  for (const ModuleView& view : views) {
    const ModuleNode& node = t.modules[std::size_t(view.module)];
    const std::string indent(std::size_t(4 * view.depth), ' ');
    out += indent + node.fqn + "\n";
    if (noise >= 1) {
      if (view.module != 0) out += indent + "*module type: " + torch_module_type(node.type) + "\n";
      const auto params = dtensor_params(node);
      if (!params.empty()) {
        out += indent + "*Parameter List\n";
        for (const ParamInfo* p : params) {
          out +=
              indent + " *" + p->name + ": " + placements_str(t.placements(p->placements)) + "\n";
        }
      }
    }
    const std::string section = indent + "  ";
    const std::string coll_indent(std::size_t(4 * view.depth + 4), ' ');
    const std::string op_indent(std::size_t(4 * view.depth + 6), ' ');
    for (const Phase p : {Phase::Forward, Phase::Backward, Phase::Recompute}) {
      const std::size_t slot = std::size_t(phase_slot(p));
      static const std::vector<std::pair<std::string, std::int64_t>> kNone;
      const auto& colls = slot < 2 ? view.collectives[slot] : kNone;
      const bool has_ops = noise >= 1 && !view.ops[slot].empty();
      if (colls.empty() && !has_ops) continue;
      out += section + (p == Phase::Forward    ? "FORWARD PASS\n"
                        : p == Phase::Backward ? "BACKWARD PASS\n"
                                               : "ACTIVATION CHECKPOINTING\n");
      for (const auto& [name, count] : colls) {
        out += fmt::format("{}{}*{}: {}{}\n", on_y, coll_indent, name, count, off);
      }
      if (!has_ops) continue;
      for (const Record* r : view.ops[slot]) {
        if (!op_listed(t, *r, noise)) continue;
        out += on_y + coll_indent + "**" + torch_name(t, *r) + off + "\n";
        const auto ins = dtensor_inputs(t, *r);
        if (ins.empty()) continue;
        std::vector<std::string> shapes, shardings;
        for (const TensorArg& in : ins) {
          shapes.push_back(torch_size(t.shape(in.global_shape)));
          shardings.push_back(placements_str(t.placements(in.placements)));
        }
        out += on_r + op_indent + "shape: " + py_list(shapes) + off + "\n";
        out += on_r + op_indent + "sharding: " + py_list(shardings) + off + "\n";
        out += on_r + op_indent + "device mesh: " + mesh_of(t, *r) + off + "\n";
      }
    }
  }
  return out;
}

namespace {

Json op_json(const Trace& t, const Record& r) {
  Json j;
  j["name"] = torch_name(t, r);
  Json shapes = Json::array(), shardings = Json::array();
  const auto ins = dtensor_inputs(t, r);
  for (const TensorArg& in : ins) {
    shapes.push_back(torch_size(t.shape(in.global_shape)));
    shardings.push_back(placements_str(t.placements(in.placements)));
  }
  j["input_shape"] = std::move(shapes);
  j["input_sharding"] = std::move(shardings);
  j["device_mesh"] = ins.empty() ? std::string() : mesh_of(t, r);
  j["is_bw"] = r.phase == Phase::Backward || r.phase == Phase::Recompute;
  j["is_activation_checkpointing"] = r.phase == Phase::Recompute;
  return j;
}

Json node_json(const Trace& t, const std::vector<ModuleView>& views, std::size_t i, int noise) {
  const ModuleView& view = views[i];
  const ModuleNode& node = t.modules[std::size_t(view.module)];
  Json j;
  j["fqn"] = node.fqn;
  j["module_type"] = noise >= 1 && view.module != 0 ? torch_module_type(node.type) : std::string();
  Json params = Json::array();
  if (noise >= 1) {
    for (const ParamInfo* p : dtensor_params(node)) {
      params.push_back(Json::array({p->name, placements_str(t.placements(p->placements))}));
    }
  }
  j["parameters"] = std::move(params);
  Json children = Json::array();
  for (int c : node.children) {
    for (std::size_t k = 0; k < views.size(); ++k) {
      if (views[k].module == c) children.push_back(node_json(t, views, k, noise));
    }
  }
  j["children"] = std::move(children);
  for (Phase p : kShownPhases) {
    Json colls = Json::array();
    for (const auto& [name, count] : view.collectives[std::size_t(phase_slot(p))]) {
      colls.push_back(Json::array({name, count}));
    }
    j[p == Phase::Forward ? "collectives_forward" : "collectives_backward"] = std::move(colls);
  }
  static constexpr std::pair<const char*, Phase> kOpLists[] = {
      {"operations_forward", Phase::Forward},
      {"operations_backward", Phase::Backward},
      {"operations_checkpointing", Phase::Recompute}};
  for (const auto& [key, p] : kOpLists) {
    Json ops = Json::array();
    for (const Record* r : view.ops[std::size_t(phase_slot(p))]) {
      if (op_listed(t, *r, noise)) ops.push_back(op_json(t, *r));
    }
    j[key] = std::move(ops);
  }
  return j;
}

}  // namespace

std::string torch_json_dump(const Trace& t, int noise) {
  const std::vector<ModuleView> views = build_views(t);
  // Python's json.dump: ensure_ascii, indent 4, no trailing newline.
  return node_json(t, views, 0, noise).dump(4, ' ', true, Json::error_handler_t::replace);
}

// ---------------------------------------------------------------- reading a dump

namespace {

// Reads one generate_json_dump tree into a Trace: a module per node (a module listed again for
// a repeated call is read once), the ops as records, and each module's own collective counts
// (its listed counts less its children's) as one record repeated that many times.
class DumpReader {
 public:
  explicit DumpReader(std::string source) : rd_(std::move(source)) {}

  Trace read(const Json& root) {
    const JsonPath top;
    const std::string fqn = rd_.str(rd_.at(root, "fqn", top), top.key("fqn"));
    if (fqn != "Global") {
      rd_.fail(top.key("fqn"), fmt::format("the root node is \"{}\", expected \"Global\"", fqn));
    }
    Trace t;
    t.metadata["format"] = "torch";
    t.metadata["source"] = rd_.source();
    nodes_.push_back(Node{});
    read_node(root, top, 0, t);
    strip_fsdp_class_prefix(t);
    subtract_children(t);
    emit_records(t);
    return t;
  }

 private:
  using Counts = std::vector<std::pair<Collective, std::int64_t>>;  // first-occurrence order
  // Counts beyond 2^40 calls are no real run's; sums of them stay far from overflow.
  static constexpr std::int64_t kMaxCount = std::int64_t(1) << 40;
  struct Node {
    std::string path;
    std::array<Counts, 2> rolled, own;
    std::array<std::vector<Record>, 3> ops;  // forward, backward, checkpointing
  };

  static void add(Counts& list, Collective c, std::int64_t n) {
    for (auto& [k, v] : list) {
      if (k == c) {
        v += n;
        return;
      }
    }
    list.emplace_back(c, n);
  }

  const Json& optional_array(const Json& j, const JsonPath& path, const char* key,
                             bool required) const {
    static const Json kEmpty = Json::array();
    const Json* v = rd_.find(j, key);
    if (!v) {
      if (required) rd_.at(j, key, path);  // throws "missing key"
      return kEmpty;
    }
    return rd_.array(*v, path.key(key));
  }

  void read_node(const Json& j, const JsonPath& path, int m, Trace& t) {
    nodes_[std::size_t(m)].path = path.str();
    t.modules[std::size_t(m)].fqn = rd_.str(rd_.at(j, "fqn", path), path.key("fqn"));
    if (const Json* type = rd_.find(j, "module_type")) {
      t.modules[std::size_t(m)].type = rd_.str(*type, path.key("module_type"));
    }
    const JsonPath ppath = path.key("parameters");
    const Json& params = optional_array(j, path, "parameters", false);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Json& p = params[i];
      if (!(p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_string())) {
        rd_.fail(ppath.index(i), "expected [name, placements]");
      }
      const auto placements = rd_.parse_with(
          p[1], ppath.index(i), [](const std::string& s) { return parse_placements(s); });
      t.modules[std::size_t(m)].params.push_back(
          ParamInfo{p[0].get<std::string>(), t.pools.intern_placements(placements)});
    }
    const Json& children = optional_array(j, path, "children", true);
    read_collectives(j, path, "collectives_forward", nodes_[std::size_t(m)].rolled[0]);
    read_collectives(j, path, "collectives_backward", nodes_[std::size_t(m)].rolled[1]);
    static const char* kOpKeys[] = {"operations_forward", "operations_backward",
                                    "operations_checkpointing"};
    static const Phase kOpPhases[] = {Phase::Forward, Phase::Backward, Phase::Recompute};
    for (std::size_t k = 0; k < 3; ++k) {
      const Json& ops = optional_array(j, path, kOpKeys[k], k < 2);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const JsonPath ops_path = path.key(kOpKeys[k]);
        Record r = read_op(ops[i], ops_path.index(i), t);
        r.phase = kOpPhases[k];
        r.module = std::uint32_t(m);
        nodes_[std::size_t(m)].ops[k].push_back(r);
      }
    }
    const JsonPath cpath = path.key("children");
    const int depth = t.modules[std::size_t(m)].depth;
    for (std::size_t i = 0; i < children.size(); ++i) {
      const JsonPath child_path = cpath.index(i);
      const Json& c = rd_.object(children[i], child_path);
      const std::string fqn = rd_.str(rd_.at(c, "fqn", child_path), child_path.key("fqn"));
      // PyTorch lists a module once per call; the repeats carry the same data.
      bool repeat = false;
      for (int existing : t.modules[std::size_t(m)].children) {
        repeat = repeat || t.modules[std::size_t(existing)].fqn == fqn;
      }
      if (repeat) continue;
      if (depth + 1 > kMaxModuleDepth) {
        rd_.fail(child_path, fmt::format("module '{}' nests {} levels deep, more than {}", fqn,
                                         depth + 1, kMaxModuleDepth));
      }
      const int id = int(t.modules.size());
      t.modules.push_back(ModuleNode{"", "", m, depth + 1, {}, {}});
      t.modules[std::size_t(m)].children.push_back(id);
      nodes_.push_back(Node{});
      read_node(c, child_path, id, t);
    }
  }

  // FSDP2's fully_shard renames a module's class X to FSDPX, and the root's class starts every
  // FQN ("FSDPTransformer.layers.0"): read as X, so the dump compares with an unsharded run's.
  static void strip_fsdp_class_prefix(Trace& t) {
    for (ModuleNode& m : t.modules) {
      const std::string& f = m.fqn;
      if (m.depth >= 1 && f.size() > 4 && f.compare(0, 4, "FSDP") == 0 &&
          std::isupper(static_cast<unsigned char>(f[4]))) {
        m.fqn = f.substr(4);
        t.metadata["fsdp"] = "class names read without FSDP2's FSDP prefix";
      }
    }
  }

  void read_collectives(const Json& j, const JsonPath& path, const char* key, Counts& out) const {
    const JsonPath kpath = path.key(key);
    const Json& list = optional_array(j, path, key, true);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Json& e = list[i];
      if (!(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number_integer())) {
        rd_.fail(kpath.index(i), "expected [name, count]");
      }
      const std::string name = e[0].get<std::string>();
      const JsonPath epath = kpath.index(i);
      const std::int64_t count = rd_.integer(e[1], epath.index(1));
      if (count < 0) rd_.fail(kpath.index(i), fmt::format("negative count {}", count));
      if (count > kMaxCount) {
        rd_.fail(kpath.index(i), fmt::format("count {} is larger than {}", count, kMaxCount));
      }
      const CollectiveSpec* spec = find_collective(name);
      if (!spec) rd_.fail(kpath.index(i), fmt::format("unknown collective \"{}\"", name));
      add(out, spec->op, count);
    }
  }

  Record read_op(const Json& j, const JsonPath& path, Trace& t) const {
    rd_.object(j, path);
    Record r;
    const std::string full = rd_.str(rd_.at(j, "name", path), path.key("name"));
    const std::size_t dot = full.rfind('.');
    if (dot == std::string::npos || dot == 0) {
      rd_.fail(path.key("name"),
               fmt::format("expected an op name like \"aten.mm.default\", got \"{}\"", full));
    }
    // aten.<name>.<overload>; another namespace stays part of the name.
    const bool aten = full.rfind("aten.", 0) == 0;
    const std::size_t first = full.find('.');
    std::string name, overload;
    if (aten && first == dot) {  // "aten.mm": no overload
      name = full.substr(5);
    } else {
      name = full.substr(aten ? 5 : 0, dot - (aten ? 5 : 0));
      overload = full.substr(dot + 1);
    }
    r.name = t.pools.intern(name);
    r.overload = t.pools.intern(overload);
    const bool gemm = aten && (name == "mm" || name == "addmm" || name == "bmm");
    r.kind = gemm ? EventKind::Gemm
                  : (is_trivial_torch_op(full) ? EventKind::Trivial : EventKind::Compute);

    const Json& shapes = optional_array(j, path, "input_shape", true);
    const Json& shardings = optional_array(j, path, "input_sharding", true);
    if (shapes.size() != shardings.size()) {
      rd_.fail(path, fmt::format("input_shape has {} entries, input_sharding {}", shapes.size(),
                                 shardings.size()));
    }
    r.inputs_begin = std::uint32_t(t.args.size());
    const JsonPath shapes_path = path.key("input_shape"),
                   shardings_path = path.key("input_sharding");
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Shape shape = rd_.parse_with(shapes[i], shapes_path.index(i),
                                         [](const std::string& s) { return parse_torch_size(s); });
      const auto placements =
          rd_.parse_with(shardings[i], shardings_path.index(i),
                         [](const std::string& s) { return parse_placements(s); });
      const ShapeId sid = t.pools.intern_shape(shape);
      t.args.push_back(TensorArg{sid, sid, t.pools.intern_placements(placements)});
    }
    r.n_inputs = std::uint16_t(shapes.size());
    r.outputs_begin = std::uint32_t(t.args.size());
    r.sharded = !shardings.empty();
    if (const Json* mesh = rd_.find(j, "device_mesh")) {
      const std::string s = rd_.str(*mesh, path.key("device_mesh"));
      if (!s.empty()) {
        r.mesh = t.pools.intern_mesh(
            rd_.parse_with(*mesh, path.key("device_mesh"),
                           [](const std::string& m) { return parse_mesh_str(m); }));
      }
    }
    for (const char* key : {"is_bw", "is_activation_checkpointing"}) {
      if (const Json* v = rd_.find(j, key)) rd_.boolean(*v, path.key(key));
    }
    return r;
  }

  // PyTorch's counts include the descendants'; a module's own count is its listed count less
  // its children's listed counts.
  void subtract_children(const Trace& t) {
    for (std::size_t m = 0; m < t.modules.size(); ++m) {
      Node& node = nodes_[m];
      for (std::size_t slot = 0; slot < 2; ++slot) {
        Counts below;
        for (int c : t.modules[m].children) {
          for (const auto& [op, n] : nodes_[std::size_t(c)].rolled[slot]) add(below, op, n);
        }
        node.own[slot] = node.rolled[slot];
        for (const auto& [op, n] : below) {
          std::int64_t listed = 0;
          for (const auto& [k, v] : node.rolled[slot]) {
            if (k == op) listed = v;
          }
          if (listed < n) {
            throw Error(ErrorCode::InvalidArgument,
                        fmt::format("{}: {}{}{}: {} counted {} times in the children but {} "
                                    "times here (counts must include the children's)",
                                    rd_.source(), node.path == "(top level)" ? "" : node.path,
                                    node.path == "(top level)" ? "" : ".",
                                    slot == 0 ? "collectives_forward" : "collectives_backward",
                                    collective_spec(op).torch_name, n, listed));
          }
          add(node.own[slot], op, -n);
        }
      }
    }
  }

  void emit_records(Trace& t) {
    auto open_block = [&](std::uint64_t repeat) {
      t.blocks.push_back(Block{std::uint32_t(t.records.size()), 0, 0, repeat});
    };
    for (const auto& [m, depth] : module_preorder(t)) {
      Node& node = nodes_[std::size_t(m)];
      for (std::size_t k = 0; k < 3; ++k) {
        if (k < 2) {
          for (const auto& [op, n] : node.own[k]) {
            if (n == 0) continue;
            Record r;
            r.kind = EventKind::Collective;
            r.name = t.pools.intern(collective_name(op));
            r.phase = k == 0 ? Phase::Forward : Phase::Backward;
            r.module = std::uint32_t(m);
            r.collective.op = op;
            r.collective.seq_stride = 1;
            r.inputs_begin = r.outputs_begin = std::uint32_t(t.args.size());
            open_block(std::uint64_t(n));
            t.records.push_back(r);
            t.blocks.back().count = 1;
          }
        }
        for (Record& r : node.ops[k]) {
          if (t.blocks.empty() || t.blocks.back().repeat != 1) open_block(1);
          t.records.push_back(r);
          ++t.blocks.back().count;
        }
      }
    }
  }

  JsonReader rd_;
  std::vector<Node> nodes_;  // parallel to Trace::modules
};

}  // namespace

Trace read_torch_json_dump(const std::string& text, const std::string& source) {
  return read_torch_json_dump(JsonReader(source).parse(text, "a generate_json_dump object"),
                              source);
}

Trace read_torch_json_dump(const Json& root, const std::string& source) {
  return DumpReader(source).read(root);
}

bool is_torch_json_dump(const Json& root) {
  auto it = root.find("fqn");
  return root.is_object() && it != root.end() && it->is_string() &&
         it->get<std::string>() == "Global";
}

}  // namespace commtrace
