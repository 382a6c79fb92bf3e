#include "report/kineto.h"

#if COMMTRACE_HAVE_ZLIB
#include <zlib.h>
#endif

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "tracer/collectives.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// A gzip file inflates to at most this: a small file that inflates without bound is refused.
constexpr std::size_t kMaxInflated = std::size_t(4) << 30;

// gzip bytes (one or more members) inflated; any other bytes returned as they are.
std::string inflate_if_gzip(const std::string& bytes, const std::string& source) {
  if (bytes.size() < 2 || static_cast<unsigned char>(bytes[0]) != 0x1f ||
      static_cast<unsigned char>(bytes[1]) != 0x8b) {
    return bytes;
  }
#if !COMMTRACE_HAVE_ZLIB
  throw Error(ErrorCode::Unsupported,
              fmt::format("{}: a gzip file, and this commtrace was built without zlib: gunzip "
                          "it first",
                          source));
#else
  z_stream zs{};
  COMMTRACE_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, ErrorCode::Internal,
                  "{}: zlib cannot start inflating", source);
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&zs};
  std::string out;
  std::size_t in_pos = 0;
  char buf[1 << 16];
  for (;;) {
    if (zs.avail_in == 0 && in_pos < bytes.size()) {
      const std::size_t n = std::min<std::size_t>(bytes.size() - in_pos, std::size_t(1) << 30);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data() + in_pos));
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
    COMMTRACE_CHECK(out.size() <= kMaxInflated, ErrorCode::InvalidArgument,
                    "{}: inflates to more than {} GiB: refused", source, kMaxInflated >> 30);
    const bool input_done = zs.avail_in == 0 && in_pos == bytes.size();
    if (rc == Z_STREAM_END) {
      if (input_done) break;
      inflateReset(&zs);  // another gzip member follows
      continue;
    }
    COMMTRACE_CHECK(!(rc == Z_BUF_ERROR && input_done), ErrorCode::InvalidArgument,
                    "{}: the gzip data ends early (a truncated file)", source);
    COMMTRACE_CHECK(rc == Z_OK, ErrorCode::InvalidArgument, "{}: not valid gzip data: {}", source,
                    zs.msg ? zs.msg : "corrupt data");
  }
  return out;
#endif
}

// Complete events of one thread nest; this answers "the innermost range around time ts" for a
// set of them (ids in insertion order).
class Nest {
 public:
  int add(std::int64_t tid, double ts, double end) {
    const int id = int(where_.size());
    where_.emplace_back(tid, 0);
    by_tid_[tid].push_back(Item{ts, end, id, -1});
    return id;
  }
  std::size_t size() const { return where_.size(); }

  // REQUIRES: called once, after the last add.
  void finish() {
    for (auto& [tid, v] : by_tid_) {
      std::sort(v.begin(), v.end(), [](const Item& a, const Item& b) {
        return a.ts != b.ts ? a.ts < b.ts : a.end > b.end;  // an outer range before its first child
      });
      std::vector<int> open;
      for (int k = 0; k < int(v.size()); ++k) {
        while (!open.empty() && v[open.back()].end < v[k].ts) open.pop_back();
        v[k].parent = open.empty() ? -1 : open.back();
        open.push_back(k);
        where_[v[k].id].second = k;
      }
    }
  }

  // The id of the innermost range of thread tid holding ts, or -1.
  int innermost(std::int64_t tid, double ts) const {
    const auto it = by_tid_.find(tid);
    if (it == by_tid_.end()) return -1;
    const std::vector<Item>& v = it->second;
    auto k = int(std::upper_bound(v.begin(), v.end(), ts,
                                  [](double t, const Item& i) { return t < i.ts; }) -
                 v.begin()) -
             1;
    while (k >= 0 && v[k].end < ts) k = v[k].parent;
    return k < 0 ? -1 : v[k].id;
  }
  // The id of the range directly around range `id`, or -1.
  int parent(int id) const {
    const auto& [tid, k] = where_[id];
    const std::vector<Item>& v = by_tid_.at(tid);
    return v[k].parent < 0 ? -1 : v[v[k].parent].id;
  }

 private:
  struct Item {
    double ts, end;
    int id, parent;  // parent: index in the same vector
  };
  std::map<std::int64_t, std::vector<Item>> by_tid_;
  std::vector<std::pair<std::int64_t, int>> where_;  // id → (tid, index)
};

// PyTorch's element type names, in record_shapes ("float") and record_param_comms ("Float").
struct TypeInfo {
  DType dtype;
  std::size_t size;
  bool exact;  // false: the bytes are right, the record shows the dtype as f32
};
std::optional<TypeInfo> type_of(std::string_view n) {
  static const std::map<std::string_view, TypeInfo> kTypes{
      {"float", {DType::F32, 4, true}},          {"Float", {DType::F32, 4, true}},
      {"double", {DType::F64, 8, true}},         {"Double", {DType::F64, 8, true}},
      {"c10::BFloat16", {DType::BF16, 2, true}}, {"BFloat16", {DType::BF16, 2, true}},
      {"long int", {DType::I64, 8, true}},       {"Long", {DType::I64, 8, true}},
      {"c10::Half", {DType::F32, 2, false}},     {"Half", {DType::F32, 2, false}},
      {"int", {DType::F32, 4, false}},           {"Int", {DType::F32, 4, false}},
      {"unsigned char", {DType::F32, 1, false}}, {"Byte", {DType::F32, 1, false}},
      {"bool", {DType::F32, 1, false}},          {"Bool", {DType::F32, 1, false}},
  };
  auto it = kTypes.find(n);
  if (it == kTypes.end()) return std::nullopt;
  return it->second;
}

// record_param_comms' "Collective name" → commtrace's collective; null for one it has no row
// for (gather, scatter, reduce, ...).
const CollectiveSpec* comms_collective(std::string_view n) {
  static const std::map<std::string_view, Collective> kNames{
      {"allreduce", Collective::AllReduce},
      {"allreduce_coalesced", Collective::AllReduce},
      {"all_reduce", Collective::AllReduce},
      {"_allgather_base", Collective::AllGather},
      {"allgather", Collective::AllGather},
      {"all_gather", Collective::AllGather},
      {"allgather_into_tensor_coalesced", Collective::AllGather},
      {"all_gather_into_tensor", Collective::AllGather},
      {"allgather_coalesced", Collective::AllGather},
      {"_reduce_scatter_base", Collective::ReduceScatter},
      {"reduce_scatter", Collective::ReduceScatter},
      {"reduce_scatter_tensor_coalesced", Collective::ReduceScatter},
      {"reduce_scatter_tensor", Collective::ReduceScatter},
      {"all_to_all", Collective::AllToAll},
      {"alltoall", Collective::AllToAll},
      {"alltoall_base", Collective::AllToAll},
      {"all_to_all_single", Collective::AllToAll},
      {"broadcast", Collective::Broadcast},
      {"_broadcast_oop", Collective::Broadcast},
      {"send", Collective::Send},
      {"recv", Collective::Recv},
      {"barrier", Collective::Barrier},
  };
  auto it = kNames.find(n);
  return it == kNames.end() ? nullptr : &collective_spec(it->second);
}

// A process group's description as commtrace names groups: DeviceMesh names its dims' groups
// "mesh_<dim>", which is commtrace's group name <dim>.
std::string group_name(std::string desc) {
  return starts_with(desc, "mesh_") && desc.size() > 5 ? desc.substr(5) : desc;
}

enum class Kind { Step, Backward, Optimizer, Comms, C10d, Functional, Module, PyModule, Other };

Kind classify(std::string_view name) {
  if (starts_with(name, "ProfilerStep#")) return Kind::Step;
  if (starts_with(name, "autograd::engine::evaluate_function")) return Kind::Backward;
  if (starts_with(name, "Optimizer.step#") || starts_with(name, "Optimizer.zero_grad#")) {
    return Kind::Optimizer;
  }
  if (name == "record_param_comms") return Kind::Comms;
  if (starts_with(name, "c10d::")) return Kind::C10d;
  if (starts_with(name, "_c10d_functional::")) return Kind::Functional;
  if (starts_with(name, "module: ")) return Kind::Module;
  if (starts_with(name, "nn.Module: ")) return Kind::PyModule;
  return Kind::Other;
}

// A collective event kept for the records.
struct CollEvent {
  std::size_t index = 0;  // in traceEvents, for errors
  std::string name;
  const CollectiveSpec* spec = nullptr;
  bool from_comms = false;  // record_param_comms (else a c10d op)
  std::int64_t tid = 0;
  double ts = 0, dur = 0;  // µs
  Json args;
};

// A forward op that may have created an autograd node ("Sequence number").
struct ForwardOp {
  std::int64_t seq;
  double ts;
  std::int64_t tid;
};

// Elements of a record_shapes "Input Dims" entry: a shape, or a (nested) list of shapes.
bool is_shape(const Json& dims) {
  return dims.is_array() && std::all_of(dims.begin(), dims.end(), [](const Json& d) {
           return d.is_number_integer() || d.is_number_unsigned();
         });
}

class KinetoReader {
 public:
  KinetoReader(const std::string& source, std::vector<std::string>* notes)
      : rd_(source), notes_(notes) {}

  Trace read(const std::string& text, int position) {
    const JsonPath top;
    const JsonPath ep = top.key("traceEvents");
    std::string top_key;
    std::size_t index = 0;
    // Events are read as they are parsed and dropped: only what the import needs stays.
    const Json::parser_callback_t filter = [&](int depth, Json::parse_event_t ev, Json& parsed) {
      if (depth == 1 && ev == Json::parse_event_t::key) {
        top_key = parsed.is_string() ? parsed.get<std::string>() : std::string();
        return true;
      }
      if (depth != 2 || top_key != "traceEvents") return true;
      if (ev == Json::parse_event_t::object_end) {
        take(parsed, index++, ep);
        return false;
      }
      if (ev == Json::parse_event_t::value || ev == Json::parse_event_t::array_end) {
        rd_.fail(ep.index(index),
                 fmt::format("expected an event object, got {}",
                             ev == Json::parse_event_t::value ? parsed.type_name() : "array"));
      }
      return true;
    };
    const Json root = rd_.parse(text, "a PyTorch profiler trace (Chrome trace JSON)", filter);
    rd_.array(rd_.at(root, "traceEvents", top), ep);

    Trace t;
    t.rank = position;
    read_distributed_info(root, top, t);
    for (Nest* n : {&backward_, &optimizer_, &modules_, &py_modules_, &functional_}) n->finish();
    std::sort(steps_.begin(), steps_.end());
    // The autograd nodes' own events carry their sequence numbers too: only forward ops count.
    std::erase_if(forward_ops_,
                  [&](const ForwardOp& op) { return backward_.innermost(op.tid, op.ts) >= 0; });
    std::sort(forward_ops_.begin(), forward_ops_.end(), [](const ForwardOp& a, const ForwardOp& b) {
      return a.seq != b.seq ? a.seq < b.seq : a.ts < b.ts;
    });
    build_modules(t);
    build_records(t, ep);

    t.metadata["format"] = "kineto";
    t.metadata["source"] = rd_.source();
    t.metadata["iterations"] = std::to_string(std::max<std::size_t>(1, steps_.size()));
    t.metadata["modules"] =
        modules_.size() > 0 ? "from the trace's 'module: <FQN>' ranges"
        : py_modules_.size() > 0
            ? "instance names of the trace's nn.Module ranges (with_stack=True), not FQNs"
            : "not in the trace (no 'module: <FQN>' or nn.Module ranges): every collective is "
              "filed under Global";
    if (unknown_group_) {
      t.metadata["group_size"] =
          "unknown (0) for some c10d ops: the run has several process groups and the trace does "
          "not say which one an op used";
    }
    if (steps_.empty()) note("no ProfilerStep ranges: the whole trace is one iteration");
    if (unknown_bytes_ > 0) {
      note(
          fmt::format("{} collective{} without an element type (a TensorList outside any "
                      "_c10d_functional op): bytes 0",
                      unknown_bytes_, unknown_bytes_ == 1 ? "" : "s"));
    }
    if (inexact_types_ > 0) {
      note(
          fmt::format("{} collective{} of an element type commtrace has no name for (half, int, "
                      "byte, bool): bytes right, dtype shown as f32",
                      inexact_types_, inexact_types_ == 1 ? "" : "s"));
    }
    if (outside_steps_ > 0) {
      note(fmt::format("{} collective{} outside every ProfilerStep range: not counted",
                       outside_steps_, outside_steps_ == 1 ? "" : "s"));
    }
    for (const auto& [name, n] : skipped_) {
      note(fmt::format("{} × '{}': a collective commtrace has no row for, not imported", n, name));
    }
    return t;
  }

 private:
  void note(std::string s) {
    if (notes_) notes_->push_back(std::move(s));
  }

  const Json* arg(const Json& args, const char* key) const {
    return args.is_object() ? rd_.find(args, key) : nullptr;
  }

  // One traceEvents element: kept in the tables above when the import reads it.
  void take(const Json& e, std::size_t index, const JsonPath& ep) {
    const JsonPath p = ep.index(index);
    const Json* ph = rd_.find(e, "ph");
    if (!ph || !ph->is_string() || ph->get_ref<const std::string&>() != "X") return;
    const Json* name_j = rd_.find(e, "name");
    if (!name_j || !name_j->is_string()) return;  // metadata-like events without a name
    const std::string& name = name_j->get_ref<const std::string&>();
    const Kind kind = classify(name);
    const Json* args = rd_.find(e, "args");
    const Json* seq = args && args->is_object() ? rd_.find(*args, "Sequence number") : nullptr;
    if (kind == Kind::Other && !seq) return;
    const double ts = rd_.number(rd_.at(e, "ts", p), p.key("ts"));
    const double dur = rd_.number(rd_.at(e, "dur", p), p.key("dur"));
    if (dur < 0) rd_.fail(p.key("dur"), "a negative duration");
    std::int64_t tid = 0;
    if (const Json* t = rd_.find(e, "tid")) {
      if (t->is_number_integer()) {
        tid = t->get<std::int64_t>();
      } else if (t->is_string()) {
        tid = std::int64_t(std::hash<std::string>{}(t->get<std::string>()) >> 1);
      }
    }
    const JsonPath ap = p.key("args");
    auto seq_of = [&]() -> std::int64_t {
      return seq ? rd_.integer(*seq, ap.key("Sequence number"), 0) : -1;
    };
    switch (kind) {
      case Kind::Step:
        steps_.emplace_back(ts, ts + dur);
        break;
      case Kind::Backward:
        backward_.add(tid, ts, ts + dur);
        backward_seq_.push_back(seq_of());
        break;
      case Kind::Optimizer:
        optimizer_.add(tid, ts, ts + dur);
        break;
      case Kind::Functional: {
        std::string type;
        if (const Json* it = args ? arg(*args, "Input type") : nullptr;
            it && it->is_array() && !it->empty() && (*it)[0].is_string()) {
          type = (*it)[0].get<std::string>();
        }
        functional_.add(tid, ts, ts + dur);
        functional_type_.push_back(std::move(type));
        break;
      }
      case Kind::Module:
      case Kind::PyModule:
        rd_.check_printable(*name_j, p.key("name"));
        (kind == Kind::Module ? modules_ : py_modules_).add(tid, ts, ts + dur);
        (kind == Kind::Module ? module_names_ : py_module_names_)
            .push_back({name, p.str(), ts, ts + dur});
        break;
      case Kind::Comms:
      case Kind::C10d: {
        const CollectiveSpec* spec = nullptr;
        if (kind == Kind::Comms) {
          const std::string cname =
              rd_.str(rd_.at(args ? *args : e, "Collective name", ap), ap.key("Collective name"));
          rd_.check_printable(cname, ap.key("Collective name"));
          spec = comms_collective(cname);
          if (!spec) {
            ++skipped_[cname];
            break;
          }
        } else {
          spec = find_collective("c10d." + name.substr(6));
          if (!spec) {
            rd_.check_printable(*name_j, p.key("name"));
            ++skipped_[name];
            break;
          }
        }
        if (args) rd_.check_printable(*args, ap);
        colls_.push_back(
            CollEvent{index, name, spec, kind == Kind::Comms, tid, ts, dur, args ? *args : Json()});
        break;
      }
      case Kind::Other:
        forward_ops_.push_back(ForwardOp{seq_of(), ts, tid});
        break;
    }
  }

  void read_distributed_info(const Json& root, const JsonPath& top, Trace& t) {
    const Json* di = rd_.find(root, "distributedInfo");
    if (!di) return;
    const JsonPath p = top.key("distributedInfo");
    rd_.object(*di, p);
    if (const Json* r = rd_.find(*di, "rank")) t.rank = rd_.int32(*r, p.key("rank"), 0, 1 << 20);
    if (const Json* w = rd_.find(*di, "world_size")) {
      t.metadata["world_size"] = std::to_string(rd_.int32(*w, p.key("world_size"), 1, 1 << 20));
    }
    if (const Json* b = rd_.find(*di, "backend")) {
      t.metadata["backend"] = rd_.str(*b, p.key("backend"));
    }
    const Json* pgs = rd_.find(*di, "pg_config");
    if (!pgs || !pgs->is_array() || pgs->size() != 1) return;
    const JsonPath pgp = p.key("pg_config");
    const JsonPath pp = pgp.index(0);
    const Json& pg = rd_.object((*pgs)[0], pp);
    if (const Json* n = rd_.find(pg, "pg_size")) {
      single_pg_size_ = rd_.int32(*n, pp.key("pg_size"), 1, 1 << 20);
    }
    if (const Json* d = rd_.find(pg, "pg_desc")) {
      single_pg_name_ = group_name(rd_.str(*d, pp.key("pg_desc")));
    }
  }

  // One node per module, in first-call order, under the module whose range encloses its first
  // call (as PyTorch's module tracker nests them); range_node_ maps ranges to nodes.
  void build_modules(Trace& t) {
    const bool annotated = modules_.size() > 0;
    const Nest& nest = annotated ? modules_ : py_modules_;
    const std::vector<RangeName>& names = annotated ? module_names_ : py_module_names_;
    std::vector<int> order(names.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return names[a].ts != names[b].ts ? names[a].ts < names[b].ts : names[a].end > names[b].end;
    });
    std::map<std::string, int> node_of;
    range_node_.assign(names.size(), -1);
    for (const int id : order) {
      // The chain of enclosing ranges without a node yet, innermost first.
      std::vector<int> chain;
      for (int r = id; r >= 0 && range_node_[r] < 0; r = nest.parent(r)) {
        chain.push_back(r);
        COMMTRACE_CHECK(chain.size() <= std::size_t(kMaxModuleDepth), ErrorCode::InvalidArgument,
                        "{}: {}: module ranges nest more than {} levels", rd_.source(),
                        names[id].path, kMaxModuleDepth);
      }
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        const int r = *it;
        const int up = nest.parent(r);
        const int parent = up < 0 ? 0 : range_node_[up];
        std::string fqn, type;
        if (annotated) {
          std::string_view s = std::string_view(names[r].name).substr(8);  // after "module: "
          if (s.size() > 1 && s.back() == ')') {
            if (const auto open = s.rfind(" ("); open != std::string_view::npos) {
              type = std::string(s.substr(open + 2, s.size() - open - 3));
              s = s.substr(0, open);
            }
          }
          fqn = std::string(s);
          COMMTRACE_CHECK(!fqn.empty(), ErrorCode::InvalidArgument,
                          "{}: {}: a module range without a name", rd_.source(), names[r].path);
        } else {
          // "nn.Module: Linear_1" under "Toy_0" is "Toy_0.Linear_1", of type "Linear".
          const std::string_view inst = std::string_view(names[r].name).substr(11);
          fqn = parent == 0 ? std::string(inst) : t.modules[parent].fqn + "." + std::string(inst);
          type = std::string(inst.substr(0, inst.rfind('_')));
        }
        const auto [found, fresh] = node_of.emplace(fqn, int(t.modules.size()));
        if (fresh) {
          COMMTRACE_CHECK(t.modules[parent].depth < kMaxModuleDepth, ErrorCode::InvalidArgument,
                          "{}: {}: module '{}' nests more than {} levels", rd_.source(),
                          names[r].path, fqn, kMaxModuleDepth);
          t.modules.push_back(ModuleNode{fqn, type, parent, t.modules[parent].depth + 1, {}, {}});
          t.modules[parent].children.push_back(found->second);
        }
        range_node_[r] = found->second;
      }
    }
  }

  // The module of a forward op at (tid, ts): its innermost module range's node, else Global.
  std::uint32_t module_at(std::int64_t tid, double ts) const {
    const Nest& n = modules_.size() > 0 ? modules_ : py_modules_;
    const int r = n.innermost(tid, ts);
    return r < 0 ? 0 : std::uint32_t(range_node_[r]);
  }

  // The module of a backward collective inside autograd node range `bw`: the module of the
  // latest forward op, before ts, that has the node's sequence number.
  std::uint32_t backward_module(int bw, double ts) const {
    const std::int64_t seq = backward_seq_[bw];
    if (seq < 0) return 0;
    auto [lo, hi] =
        std::equal_range(forward_ops_.begin(), forward_ops_.end(), ForwardOp{seq, 0, 0},
                         [](const ForwardOp& a, const ForwardOp& b) { return a.seq < b.seq; });
    const ForwardOp* best = nullptr;
    for (auto it = lo; it != hi && it->ts <= ts; ++it) best = &*it;
    return best ? module_at(best->tid, best->ts) : 0;
  }

  void build_records(Trace& t, const JsonPath& ep) {
    // A c10d op with a collective event inside it (its record_param_comms, or the op it calls)
    // is that event's, not a second collective.
    std::sort(colls_.begin(), colls_.end(), [](const CollEvent& a, const CollEvent& b) {
      if (a.tid != b.tid) return a.tid < b.tid;
      return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
    });
    std::vector<const CollEvent*> kept;
    for (std::size_t i = 0; i < colls_.size(); ++i) {
      const CollEvent& c = colls_[i];
      const bool contains_next =
          i + 1 < colls_.size() && colls_[i + 1].tid == c.tid && colls_[i + 1].ts <= c.ts + c.dur;
      if (c.from_comms || !contains_next) kept.push_back(&c);
    }
    std::stable_sort(kept.begin(), kept.end(),
                     [](const CollEvent* a, const CollEvent* b) { return a->ts < b->ts; });

    const double t0 = !steps_.empty() ? steps_.front().first : kept.empty() ? 0 : kept[0]->ts;
    const std::size_t n_steps = std::max<std::size_t>(1, steps_.size());
    std::vector<std::vector<Record>> per_step(n_steps);
    std::map<std::string, std::uint64_t> seq_of_group;
    for (const CollEvent* e : kept) {
      std::size_t step = 0;
      if (!steps_.empty()) {
        const auto it = std::upper_bound(steps_.begin(), steps_.end(), e->ts,
                                         [](double ts, const auto& s) { return ts < s.first; });
        if (it == steps_.begin() || std::prev(it)->second < e->ts) {
          ++outside_steps_;
          continue;
        }
        step = std::size_t(std::prev(it) - steps_.begin());
      }
      const JsonPath p = ep.index(e->index);
      Record r = e->from_comms ? from_comms(*e, p, t) : from_c10d(*e, p, t);
      if (optimizer_.innermost(e->tid, e->ts) >= 0) {
        r.phase = Phase::Optimizer;
      } else if (const int bw = backward_.innermost(e->tid, e->ts); bw >= 0) {
        r.phase = Phase::Backward;
        r.module = backward_module(bw, e->ts);
      } else {
        r.phase = Phase::Forward;
        r.module = module_at(e->tid, e->ts);
      }
      r.start_s = (e->ts - t0) * 1e-6;
      r.duration_s = e->dur * 1e-6;
      if (r.collective.seq == 0) {
        r.collective.seq = ++seq_of_group[std::string(t.str(r.collective.group))];
      }
      per_step[step].push_back(r);
    }
    for (std::size_t s = 0; s < n_steps; ++s) {
      t.blocks.push_back(Block{std::uint32_t(t.records.size()), std::uint32_t(per_step[s].size()),
                               std::uint32_t(s), 1});
      for (const Record& r : per_step[s]) t.records.push_back(r);
    }
  }

  Record base(const CollectiveSpec& spec, Trace& t) const {
    Record r;
    r.kind = EventKind::Collective;
    r.name = t.pools.intern(spec.name);
    r.collective.op = spec.op;
    r.inputs_begin = r.outputs_begin = std::uint32_t(t.args.size());
    return r;
  }

  void set_type(Record& r, const TypeInfo& ti, std::int64_t elements) {
    r.dtype = ti.dtype;
    r.collective.bytes = std::uint64_t(elements) * ti.size;
    if (!ti.exact) ++inexact_types_;
  }

  Record from_comms(const CollEvent& e, const JsonPath& p, Trace& t) {
    const JsonPath ap = p.key("args");
    const CollectiveSpec& spec = *e.spec;
    Record r = base(spec, t);
    auto count = [&](const char* key) -> std::int64_t {
      const Json* j = arg(e.args, key);
      return j ? rd_.integer(*j, ap.key(key), 0, std::int64_t(1) << 50) : 0;
    };
    const std::int64_t n =
        count(spec.bytes == ByteSource::Output ? "Out msg nelems" : "In msg nelems");
    if (const Json* d = arg(e.args, "dtype")) {
      const std::string dt = rd_.str(*d, ap.key("dtype"));
      const auto ti = type_of(dt);
      if (!ti) rd_.fail(ap.key("dtype"), fmt::format("unknown element type '{}'", dt));
      set_type(r, *ti, n);
    } else if (spec.bytes != ByteSource::None) {
      ++unknown_bytes_;
    }
    if (const Json* g = arg(e.args, "Group size")) {
      r.collective.group_size = rd_.int32(*g, ap.key("Group size"), 0, 1 << 20);
    }
    std::string group;
    if (const Json* d = arg(e.args, "Process Group Description")) {
      group = rd_.str(*d, ap.key("Process Group Description"));
    }
    if (group.empty() || group == "undefined") {
      if (const Json* d = arg(e.args, "Process Group Name")) {
        group = rd_.str(*d, ap.key("Process Group Name"));
      }
    }
    r.collective.group = t.pools.intern(group_name(group));
    if (const Json* s = arg(e.args, "Seq")) {
      r.collective.seq = std::uint64_t(rd_.integer(*s, ap.key("Seq"), 0)) + 1;
    }
    return r;
  }

  // The shapes of record_shapes' entry k: one shape, or a list of them.
  std::vector<ShapeId> shapes(const Json& dims, std::size_t k, const JsonPath& dp, Trace& t) {
    std::vector<ShapeId> out;
    if (!dims.is_array() || k >= dims.size()) return out;
    const JsonPath kp = dp.index(k);
    auto one = [&](const Json& s, const JsonPath& sp) {
      std::vector<std::int64_t> d;
      for (std::size_t i = 0; i < s.size(); ++i) {
        d.push_back(rd_.integer(s[i], sp.index(i), 0, std::int64_t(1) << 40));
      }
      out.push_back(t.pools.intern_shape(d));
    };
    const Json& entry = dims[k];
    if (is_shape(entry) && !entry.empty()) {
      one(entry, kp);
    } else if (entry.is_array()) {
      for (std::size_t i = 0; i < entry.size(); ++i) {
        const JsonPath ip = kp.index(i);
        if (!is_shape(entry[i])) rd_.fail(ip, "expected a shape (a list of integers)");
        one(entry[i], ip);
      }
    }
    return out;
  }

  Record from_c10d(const CollEvent& e, const JsonPath& p, Trace& t) {
    const JsonPath ap = p.key("args");
    const JsonPath dp = ap.key("Input Dims");
    const CollectiveSpec& spec = *e.spec;
    Record r = base(spec, t);
    // The op's tensors: (outputs, inputs) for gather, scatter and exchange ops, else one list.
    const bool two = spec.buffers == BufferRule::Gather || spec.buffers == BufferRule::Scatter ||
                     spec.buffers == BufferRule::Exchange;
    const Json* dims = arg(e.args, "Input Dims");
    const Json empty = Json::array();
    const std::vector<ShapeId> first = shapes(dims ? *dims : empty, 0, dp, t);
    const std::vector<ShapeId> second = two ? shapes(dims ? *dims : empty, 1, dp, t) : first;
    const std::vector<ShapeId>& ins = spec.buffers == BufferRule::Recv ? std::vector<ShapeId>{}
                                      : two                            ? second
                                                                       : first;
    const std::vector<ShapeId>& outs =
        spec.buffers == BufferRule::Send ? std::vector<ShapeId>{} : first;
    auto elements = [&](const std::vector<ShapeId>& v) {
      std::int64_t n = 0;
      for (const ShapeId s : v) {
        std::int64_t m = 1;
        for (const std::int64_t d : t.shape(s)) m *= d;
        n += m;
      }
      return n;
    };
    r.inputs_begin = std::uint32_t(t.args.size());
    for (const ShapeId s : ins) t.args.push_back(TensorArg{s, s, 0});
    r.outputs_begin = std::uint32_t(t.args.size());
    for (const ShapeId s : outs) t.args.push_back(TensorArg{s, s, 0});
    r.n_inputs = std::uint16_t(std::min<std::size_t>(ins.size(), 0xffff));
    r.n_outputs = std::uint16_t(std::min<std::size_t>(outs.size(), 0xffff));
    const std::int64_t n = elements(spec.bytes == ByteSource::Output ? outs : ins);

    // The element type: the op's own for a tensor, else that of the functional op around it.
    std::string type;
    const std::size_t idx = two && spec.bytes == ByteSource::Input ? 1 : 0;
    if (const Json* types = arg(e.args, "Input type");
        types && types->is_array() && idx < types->size() && (*types)[idx].is_string()) {
      type = (*types)[idx].get<std::string>();
    }
    std::optional<TypeInfo> ti = type_of(type);
    if (!ti) {
      if (const int f = functional_.innermost(e.tid, e.ts); f >= 0) {
        ti = type_of(functional_type_[f]);
      }
    }
    if (ti) {
      set_type(r, *ti, n);
    } else if (spec.bytes != ByteSource::None) {
      ++unknown_bytes_;
    }
    if (single_pg_size_ > 0) {
      r.collective.group_size = single_pg_size_;
      r.collective.group = t.pools.intern(single_pg_name_);
    } else {
      // Several groups: a gather's or scatter's size is its buffers' ratio; else unknown.
      const std::int64_t a = elements(first), b = elements(second);
      if (two && spec.buffers != BufferRule::Exchange && a > 0 && b > 0) {
        const std::int64_t big = std::max(a, b), small = std::min(a, b);
        if (big % small == 0 && big / small <= (1 << 20))
          r.collective.group_size = int(big / small);
      }
      if (r.collective.group_size == 0) unknown_group_ = true;
    }
    return r;
  }

  // A module range's name, where it is in the file, and when it began.
  struct RangeName {
    std::string name;
    std::string path;
    double ts, end;
  };

  JsonReader rd_;
  std::vector<std::string>* notes_;

  std::vector<std::pair<double, double>> steps_;  // (start, end), by start
  Nest backward_, optimizer_, modules_, py_modules_, functional_;
  std::vector<std::int64_t> backward_seq_;    // per backward_ range: the node's, or -1
  std::vector<std::string> functional_type_;  // per functional_ range: its first input's type
  std::vector<RangeName> module_names_, py_module_names_;  // per modules_ / py_modules_ range
  std::vector<int> range_node_;         // per module range (of the style used): its node
  std::vector<ForwardOp> forward_ops_;  // by (seq, ts) once read
  std::vector<CollEvent> colls_;

  int single_pg_size_ = 0;
  std::string single_pg_name_;
  bool unknown_group_ = false;
  int unknown_bytes_ = 0, inexact_types_ = 0, outside_steps_ = 0;
  std::map<std::string, int> skipped_;
};

}  // namespace

Trace read_kineto_trace(const std::string& bytes, const std::string& source, int position,
                        std::vector<std::string>* notes) {
  return KinetoReader(source, notes).read(inflate_if_gzip(bytes, source), position);
}

KinetoImport import_kineto(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  auto is_trace = [](const fs::path& p) {
    const std::string n = p.filename().string();
    return n.size() > 5 && (n.ends_with(".json") || n.ends_with(".json.gz"));
  };
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> in_dir;
      for (const auto& entry : fs::directory_iterator(p, ec)) {
        if (is_trace(entry.path())) in_dir.push_back(entry.path().string());
      }
      COMMTRACE_CHECK(!ec, ErrorCode::Io, "{}: cannot list the folder: {}", p, ec.message());
      COMMTRACE_CHECK(!in_dir.empty(), ErrorCode::InvalidArgument,
                      "{}: no .json or .json.gz file in it", p);
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(p);
    }
  }
  COMMTRACE_CHECK(!files.empty(), ErrorCode::InvalidArgument, "import kineto: no trace file");
  KinetoImport out;
  std::set<std::string> seen_notes;
  std::map<int, std::string> rank_file;
  for (std::size_t i = 0; i < files.size(); ++i) {
    std::vector<std::string> notes;
    Trace t = read_kineto_trace(read_text_file(files[i], "PyTorch profiler trace"), files[i],
                                int(i), &notes);
    const auto [it, fresh] = rank_file.emplace(t.rank, files[i]);
    COMMTRACE_CHECK(fresh, ErrorCode::InvalidArgument,
                    "{} and {} both hold rank {}: give one trace file per rank", it->second,
                    files[i], t.rank);
    for (std::string& n : notes) {
      if (seen_notes.insert(n).second) out.notes.push_back(std::move(n));
    }
    out.traces.push_back(std::move(t));
  }
  std::sort(out.traces.begin(), out.traces.end(),
            [](const Trace& a, const Trace& b) { return a.rank < b.rank; });
  // One run: the ranks agree on the world size and the iteration count.
  const std::map<std::string, std::string>& first = out.traces.front().metadata;
  for (const Trace& t : out.traces) {
    for (const char* key : {"world_size", "iterations"}) {
      const auto a = first.find(key);
      const auto b = t.metadata.find(key);
      const bool both = a != first.end() && b != t.metadata.end();
      COMMTRACE_CHECK(!both || a->second == b->second, ErrorCode::InvalidArgument,
                      "ranks {} and {} differ in {} ({} vs {}): not one run's traces",
                      out.traces.front().rank, t.rank, key, a->second, b->second);
    }
  }
  // A multi-rank trace file holds one metadata: the source names the set.
  if (out.traces.size() > 1) {
    for (Trace& t : out.traces) t.metadata["source"] = fmt::format("{} files", files.size());
  }
  return out;
}

}  // namespace commtrace
