// PyTorch's CommDebugMode output rendered from a trace (the tracing table and the JSON dump of
// torch/distributed/tensor/debug/_comm_mode.py), and the reader of such a dump. Follows
// PyTorch's rules rather than commtrace's where they differ: trivial ops are PyTorch's set of
// names, counts roll up over descendants, a phase section appears when the module has
// collectives there or (noise >= 1) any recorded op at all, even one not shown.
#include "report/torch_compat.h"

#include "report/json_text.h"

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/names.h"
#include "tracer/collectives.h"

namespace commtrace {

namespace {

using nlohmann::ordered_json;

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

int phase_slot(Phase p) { return p == Phase::Forward ? 0 : 1; }
bool is_shown_phase(Phase p) { return p == Phase::Forward || p == Phase::Backward; }

using CountList = std::vector<std::pair<std::string, std::int64_t>>;  // insertion-ordered

void add_count(CountList& list, const std::string& name, std::int64_t n) {
  for (auto& [k, v] : list) {
    if (k == name) {
      v += n;
      return;
    }
  }
  list.emplace_back(name, n);
}

// What CommDebugMode holds per module: collective counts rolled up over the subtree (in order of
// first occurrence), and the module's own ops (every non-collective record) per phase.
struct ModuleView {
  std::array<CountList, 2> collectives;
  std::array<std::vector<const OpRecord*>, 2> ops;
};

std::vector<ModuleView> build_views(const Trace& t) {
  std::vector<ModuleView> views(t.modules.size());
  for (const OpRecord& r : t.records) {
    if (!is_shown_phase(r.phase)) continue;
    COMMTRACE_CHECK(r.module >= 0 && std::size_t(r.module) < t.modules.size(),
                    ErrorCode::InvalidArgument, "record {} ({}): module {} is not in the tree",
                    r.index, r.name, r.module);
    const int slot = phase_slot(r.phase);
    if (r.kind == EventKind::Collective) {
      const std::string name = torch_name(r);
      for (int m = r.module; m >= 0; m = t.modules[std::size_t(m)].parent) {
        add_count(views[std::size_t(m)].collectives[std::size_t(slot)], name, 1);
      }
    } else {
      views[std::size_t(r.module)].ops[std::size_t(slot)].push_back(&r);
    }
  }
  return views;
}

// Modules in preorder (children in call order) with their depth.
void preorder(const Trace& t, int m, int depth, std::vector<std::pair<int, int>>& out) {
  out.emplace_back(m, depth);
  for (int c : t.modules[std::size_t(m)].children) preorder(t, c, depth + 1, out);
}

// PyTorch keeps the DTensor positional arguments only.
std::vector<const TensorMeta*> dtensor_inputs(const OpRecord& r) {
  std::vector<const TensorMeta*> out;
  if (!r.sharded) return out;
  for (const TensorMeta& m : r.inputs) {
    if (!m.placements.empty()) out.push_back(&m);
  }
  return out;
}

// noise 1: DTensor ops; 2: + local ops; 3: + trivial ops.
bool op_listed(const OpRecord& r, int noise) {
  if (noise <= 0) return false;
  if (noise >= 3) return true;
  if (is_trivial_torch_op(torch_name(r))) return false;
  return noise >= 2 || !dtensor_inputs(r).empty();
}

std::vector<const ParamInfo*> dtensor_params(const ModuleNode& n) {
  std::vector<const ParamInfo*> out;
  for (const ParamInfo& p : n.params) {
    if (!p.placements.empty()) out.push_back(&p);
  }
  return out;
}

std::string py_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += items[i];
  }
  return out + "]";
}

}  // namespace

std::string torch_table(const Trace& t, int noise, bool color) {
  const std::vector<ModuleView> views = build_views(t);
  std::vector<std::pair<int, int>> order;
  preorder(t, 0, 0, order);
  const std::string on_y = color ? kYellow : "";
  const std::string on_r = color ? kRed : "";
  const std::string off = color ? kReset : "";

  std::string out;
  for (const auto& [m, depth] : order) {
    const ModuleNode& node = t.modules[std::size_t(m)];
    const ModuleView& view = views[std::size_t(m)];
    const std::string indent(std::size_t(4 * depth), ' ');
    out += indent + node.fqn + "\n";
    if (noise >= 1) {
      if (m != 0) out += indent + "*module type: " + torch_module_type(node.type) + "\n";
      const auto params = dtensor_params(node);
      if (!params.empty()) {
        out += indent + "*Parameter List\n";
        for (const ParamInfo* p : params)
          out += indent + " *" + p->name + ": " + p->placements + "\n";
      }
    }
    const std::string section = indent + "  ";
    const std::string coll_indent(std::size_t(4 * depth + 4), ' ');
    const std::string op_indent(std::size_t(4 * depth + 6), ' ');
    for (Phase p : kShownPhases) {
      const std::size_t slot = std::size_t(phase_slot(p));
      const CountList& colls = view.collectives[slot];
      const bool has_ops = noise >= 1 && !view.ops[slot].empty();
      if (colls.empty() && !has_ops) continue;
      out += section + (p == Phase::Forward ? "FORWARD PASS\n" : "BACKWARD PASS\n");
      for (const auto& [name, count] : colls) {
        out += fmt::format("{}{}*{}: {}{}\n", on_y, coll_indent, name, count, off);
      }
      if (!has_ops) continue;
      for (const OpRecord* r : view.ops[slot]) {
        if (!op_listed(*r, noise)) continue;
        out += on_y + coll_indent + "**" + torch_name(*r) + off + "\n";
        const auto ins = dtensor_inputs(*r);
        if (ins.empty()) continue;
        std::vector<std::string> shapes, shardings;
        for (const TensorMeta* in : ins) {
          shapes.push_back(torch_size(in->global_shape));
          shardings.push_back(in->placements);
        }
        out += on_r + op_indent + "shape: " + py_list(shapes) + off + "\n";
        out += on_r + op_indent + "sharding: " + py_list(shardings) + off + "\n";
        out += on_r + op_indent + "device mesh: " + r->mesh + off + "\n";
      }
    }
  }
  return out;
}

namespace {

ordered_json op_json(const OpRecord& r) {
  ordered_json j;
  j["name"] = torch_name(r);
  ordered_json shapes = ordered_json::array(), shardings = ordered_json::array();
  const auto ins = dtensor_inputs(r);
  for (const TensorMeta* in : ins) {
    shapes.push_back(torch_size(in->global_shape));
    shardings.push_back(in->placements);
  }
  j["input_shape"] = std::move(shapes);
  j["input_sharding"] = std::move(shardings);
  j["device_mesh"] = ins.empty() ? std::string() : r.mesh;
  j["is_bw"] = r.phase == Phase::Backward;
  j["is_activation_checkpointing"] = false;
  return j;
}

ordered_json node_json(const Trace& t, const std::vector<ModuleView>& views, int m, int noise) {
  const ModuleNode& node = t.modules[std::size_t(m)];
  const ModuleView& view = views[std::size_t(m)];
  ordered_json j;
  j["fqn"] = node.fqn;
  j["module_type"] = noise >= 1 && m != 0 ? torch_module_type(node.type) : std::string();
  ordered_json params = ordered_json::array();
  if (noise >= 1) {
    for (const ParamInfo* p : dtensor_params(node)) {
      params.push_back(ordered_json::array({p->name, p->placements}));
    }
  }
  j["parameters"] = std::move(params);
  ordered_json children = ordered_json::array();
  for (int c : node.children) children.push_back(node_json(t, views, c, noise));
  j["children"] = std::move(children);
  for (Phase p : kShownPhases) {
    ordered_json colls = ordered_json::array();
    for (const auto& [name, count] : view.collectives[std::size_t(phase_slot(p))]) {
      colls.push_back(ordered_json::array({name, count}));
    }
    j[p == Phase::Forward ? "collectives_forward" : "collectives_backward"] = std::move(colls);
  }
  for (Phase p : kShownPhases) {
    ordered_json ops = ordered_json::array();
    for (const OpRecord* r : view.ops[std::size_t(phase_slot(p))]) {
      if (op_listed(*r, noise)) ops.push_back(op_json(*r));
    }
    j[p == Phase::Forward ? "operations_forward" : "operations_backward"] = std::move(ops);
  }
  j["operations_checkpointing"] = ordered_json::array();
  return j;
}

}  // namespace

std::string torch_json_dump(const Trace& t, int noise) {
  const std::vector<ModuleView> views = build_views(t);
  // Python's json.dump: ensure_ascii, indent 4, no trailing newline.
  return node_json(t, views, 0, noise).dump(4, ' ', true);
}

// ---------------------------------------------------------------- reading a dump

namespace {

// Reads one generate_json_dump tree into a Trace. Errors name the source and the JSON path.
class DumpReader {
 public:
  explicit DumpReader(std::string source) : source_(std::move(source)) {}

  Trace read(const std::string& text) {
    const ordered_json root = parse_report_json(text, source_, "a generate_json_dump object");
    const std::string fqn = string_at(root, "", "fqn");
    expect(fqn == "Global", "fqn",
           fmt::format("the root node is \"{}\", expected \"Global\"", fqn));

    Trace t;
    t.metadata["format"] = "torch";
    t.metadata["source"] = source_;
    nodes_.push_back(Node{});
    read_node(root, "", 0, t);
    subtract_children(t);
    emit_records(t);
    return t;
  }

 private:
  struct Node {
    std::string path;
    std::array<CountList, 2> rolled;  // canonical name -> count, as listed (rolled up)
    std::array<CountList, 2> own;
    std::array<std::vector<OpRecord>, 3> ops;  // forward, backward, checkpointing
  };

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw Error(ErrorCode::InvalidArgument, path.empty()
                                                ? fmt::format("{}: {}", source_, msg)
                                                : fmt::format("{}: {}: {}", source_, path, msg));
  }
  void expect(bool cond, const std::string& path, const std::string& msg) const {
    if (!cond) fail(path, msg);
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string index(const std::string& path, std::size_t i) {
    return fmt::format("{}[{}]", path, i);
  }

  const ordered_json& required(const ordered_json& j, const std::string& path,
                               const char* key) const {
    auto it = j.find(key);
    if (it == j.end()) fail(path, fmt::format("missing key \"{}\"", key));
    return *it;
  }
  std::string string_at(const ordered_json& j, const std::string& path, const char* key) const {
    const ordered_json& v = required(j, path, key);
    expect(v.is_string(), join(path, key), "expected a string");
    return v.get<std::string>();
  }
  // An optional array: absent reads as empty.
  const ordered_json& array_at(const ordered_json& j, const std::string& path, const char* key,
                               bool must_exist) const {
    static const ordered_json kEmpty = ordered_json::array();
    auto it = j.find(key);
    if (it == j.end()) {
      if (must_exist) fail(path, fmt::format("missing key \"{}\"", key));
      return kEmpty;
    }
    expect(it->is_array(), join(path, key), "expected an array");
    return *it;
  }

  void read_node(const ordered_json& j, const std::string& path, int m, Trace& t) {
    nodes_[std::size_t(m)].path = path;
    ModuleNode& node = t.modules[std::size_t(m)];
    node.fqn = string_at(j, path, "fqn");
    if (j.contains("module_type")) node.type = string_at(j, path, "module_type");

    const std::string ppath = join(path, "parameters");
    const ordered_json& params = array_at(j, path, "parameters", false);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const ordered_json& p = params[i];
      expect(p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_string(), index(ppath, i),
             "expected [name, placements]");
      node.params.push_back(ParamInfo{p[0].get<std::string>(), p[1].get<std::string>()});
    }

    const ordered_json& children = array_at(j, path, "children", true);
    read_collectives(j, path, "collectives_forward", nodes_[std::size_t(m)].rolled[0]);
    read_collectives(j, path, "collectives_backward", nodes_[std::size_t(m)].rolled[1]);
    static const char* kOpKeys[] = {"operations_forward", "operations_backward",
                                    "operations_checkpointing"};
    static const Phase kOpPhases[] = {Phase::Forward, Phase::Backward, Phase::Recompute};
    for (std::size_t k = 0; k < 3; ++k) {
      const ordered_json& ops = array_at(j, path, kOpKeys[k], k < 2);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        OpRecord r = read_op(ops[i], index(join(path, kOpKeys[k]), i));
        r.phase = kOpPhases[k];
        r.module = m;
        nodes_[std::size_t(m)].ops[k].push_back(std::move(r));
      }
    }

    const std::string cpath = join(path, "children");
    const int depth = t.modules[std::size_t(m)].depth;
    for (std::size_t i = 0; i < children.size(); ++i) {
      const std::string child_path = index(cpath, i);
      const ordered_json& c = children[i];
      expect(c.is_object(), child_path, "expected an object");
      const std::string fqn = string_at(c, child_path, "fqn");
      // PyTorch lists a module once per call; the repeats carry the same data.
      bool repeat = false;
      for (int existing : t.modules[std::size_t(m)].children) {
        repeat = repeat || t.modules[std::size_t(existing)].fqn == fqn;
      }
      if (repeat) continue;
      const int id = int(t.modules.size());
      ModuleNode child;
      child.parent = m;
      child.depth = depth + 1;
      t.modules.push_back(std::move(child));
      t.modules[std::size_t(m)].children.push_back(id);
      nodes_.push_back(Node{});
      read_node(c, child_path, id, t);
    }
  }

  void read_collectives(const ordered_json& j, const std::string& path, const char* key,
                        CountList& out) const {
    const std::string kpath = join(path, key);
    const ordered_json& list = array_at(j, path, key, true);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const ordered_json& e = list[i];
      const std::string epath = index(kpath, i);
      expect(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number_integer(), epath,
             "expected [name, count]");
      const std::string name = e[0].get<std::string>();
      const std::int64_t count = e[1].get<std::int64_t>();
      expect(count >= 0, epath, fmt::format("negative count {}", count));
      const CollectiveSpec* spec = find_collective(name);
      expect(spec != nullptr, epath, fmt::format("unknown collective \"{}\"", name));
      add_count(out, spec->name, count);
    }
  }

  static Shape parse_torch_size(const std::string& s, bool& ok) {
    static constexpr std::string_view kHead = "torch.Size([", kTail = "])";
    Shape shape;
    ok = s.size() >= kHead.size() + kTail.size() && s.compare(0, kHead.size(), kHead) == 0 &&
         s.compare(s.size() - kTail.size(), kTail.size(), kTail) == 0;
    if (!ok) return shape;
    const std::string body = s.substr(kHead.size(), s.size() - kHead.size() - kTail.size());
    std::size_t pos = 0;
    while (ok && pos < body.size()) {
      std::size_t end = body.find(',', pos);
      if (end == std::string::npos) end = body.size();
      std::string item = body.substr(pos, end - pos);
      while (!item.empty() && item.front() == ' ') item.erase(item.begin());
      ok = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos &&
           item.size() < 19;
      if (ok) shape.push_back(std::stoll(item));
      pos = end + 1;
      if (end + 1 == body.size()) ok = false;  // trailing comma
    }
    return shape;
  }

  OpRecord read_op(const ordered_json& j, const std::string& path) const {
    expect(j.is_object(), path, "expected an operation object");
    OpRecord r;
    const std::string full = string_at(j, path, "name");
    const std::size_t dot = full.rfind('.');
    expect(dot != std::string::npos && dot > 0, join(path, "name"),
           fmt::format("expected an op name like \"aten.mm.default\", got \"{}\"", full));
    // aten.<name>.<overload>; another namespace stays part of the name.
    const bool aten = full.rfind("aten.", 0) == 0;
    const std::size_t first = full.find('.');
    if (aten && first == dot) {  // "aten.mm": no overload
      r.name = full.substr(5);
      r.overload = "";
    } else {
      r.name = full.substr(aten ? 5 : 0, dot - (aten ? 5 : 0));
      r.overload = full.substr(dot + 1);
    }
    const bool gemm = aten && (r.name == "mm" || r.name == "addmm" || r.name == "bmm");
    r.kind = gemm ? EventKind::Gemm
                  : (is_trivial_torch_op(full) ? EventKind::Trivial : EventKind::Compute);

    const ordered_json& shapes = array_at(j, path, "input_shape", true);
    const ordered_json& shardings = array_at(j, path, "input_sharding", true);
    expect(shapes.size() == shardings.size(), path,
           fmt::format("input_shape has {} entries, input_sharding {}", shapes.size(),
                       shardings.size()));
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const std::string spath = index(join(path, "input_shape"), i);
      expect(shapes[i].is_string(), spath, "expected \"torch.Size([...])\"");
      bool ok = false;
      const Shape shape = parse_torch_size(shapes[i].get<std::string>(), ok);
      expect(
          ok, spath,
          fmt::format("expected \"torch.Size([...])\", got \"{}\"", shapes[i].get<std::string>()));
      expect(shardings[i].is_string(), index(join(path, "input_sharding"), i),
             "expected a placements string");
      r.inputs.push_back(TensorMeta{shape, shape, shardings[i].get<std::string>()});
    }
    r.sharded = !shardings.empty();
    if (j.contains("device_mesh")) r.mesh = string_at(j, path, "device_mesh");
    for (const char* key : {"is_bw", "is_activation_checkpointing"}) {
      if (j.contains(key)) expect(j[key].is_boolean(), join(path, key), "expected true or false");
    }
    return r;
  }

  // PyTorch's counts include the descendants'; a module's own count is its listed count less
  // its children's listed counts.
  void subtract_children(const Trace& t) {
    for (std::size_t m = 0; m < t.modules.size(); ++m) {
      Node& node = nodes_[m];
      for (std::size_t slot = 0; slot < 2; ++slot) {
        CountList below;
        for (int c : t.modules[m].children) {
          for (const auto& [name, n] : nodes_[std::size_t(c)].rolled[slot]) {
            add_count(below, name, n);
          }
        }
        node.own[slot] = node.rolled[slot];
        for (const auto& [name, n] : below) {
          std::int64_t listed = 0;
          for (const auto& [k, v] : node.rolled[slot]) {
            if (k == name) listed = v;
          }
          expect(listed >= n,
                 join(node.path, slot == 0 ? "collectives_forward" : "collectives_backward"),
                 fmt::format("{} counted {} times in the children but {} times here (counts must "
                             "include the children's)",
                             find_collective(name)->torch_name, n, listed));
          add_count(node.own[slot], name, -n);
        }
      }
    }
  }

  void emit_records(Trace& t) {
    std::vector<std::pair<int, int>> order;
    preorder(t, 0, 0, order);
    for (const auto& [m, depth] : order) {
      Node& node = nodes_[std::size_t(m)];
      for (std::size_t k = 0; k < 3; ++k) {
        if (k < 2) {
          for (const auto& [name, n] : node.own[k]) {
            for (std::int64_t i = 0; i < n; ++i) {
              OpRecord r;
              r.kind = EventKind::Collective;
              r.name = name;
              r.phase = k == 0 ? Phase::Forward : Phase::Backward;
              r.module = m;
              push(t, std::move(r));
            }
          }
        }
        for (OpRecord& r : node.ops[k]) push(t, std::move(r));
      }
    }
  }

  static void push(Trace& t, OpRecord r) {
    r.index = t.records.size();
    t.records.push_back(std::move(r));
  }

  std::string source_;
  std::vector<Node> nodes_;  // parallel to Trace::modules
};

}  // namespace

Trace read_torch_json_dump(const std::string& text, const std::string& source) {
  return DumpReader(source).read(text);
}

bool is_torch_json_dump(const std::string& text) {
  const ordered_json j = ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto it = j.find("fqn");
  return it != j.end() && it->is_string() && it->get<std::string>() == "Global";
}

}  // namespace commtrace
