#include "tracer/trace.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>

namespace commtrace {

namespace {

template <typename E, std::size_t N>
E parse_enum(const std::string& s, const char* (*name)(E), const E (&all)[N], const char* what) {
  for (E e : all) {
    if (s == name(e)) return e;
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("unknown {} '{}'", what, s));
}

// FNV-1a over the bytes of n values.
template <typename T>
std::uint64_t hash_of(std::span<const T> v) {
  std::uint64_t h = 1469598103934665603ull;
  for (const T& x : v) {
    std::uint64_t k = 0;
    std::memcpy(&k, &x, std::min(sizeof k, sizeof x));
    h = (h ^ k) * 1099511628211ull;
  }
  h ^= v.size();
  return h ^ (h >> 29);
}

std::uint64_t hash_placements(std::span<const Placement> p) {
  std::uint64_t h = 1469598103934665603ull;
  for (const Placement& x : p) {
    const std::uint64_t k = std::uint64_t(x.kind) | std::uint64_t(x.op) << 8 |
                            std::uint64_t(std::uint32_t(x.is_shard() ? x.dim : 0)) << 16;
    h = (h ^ k) * 1099511628211ull;
  }
  h ^= p.size();
  return h ^ (h >> 29);
}

std::string tuple_str(const std::vector<std::string>& items) {
  if (items.size() == 1) return "(" + items[0] + ",)";
  return fmt::format("({})", fmt::join(items, ", "));
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Optimizer:
      return "optimizer";
    case Phase::Recompute:
      return "recompute";
  }
  return "?";
}

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::Collective:
      return "collective";
    case EventKind::Gemm:
      return "gemm";
    case EventKind::Compute:
      return "compute";
    case EventKind::Trivial:
      return "trivial";
  }
  return "?";
}

Phase parse_phase(const std::string& s) {
  static const Phase all[] = {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Recompute};
  return parse_enum(s, phase_name, all, "phase");
}

EventKind parse_event_kind(const std::string& s) {
  static const EventKind all[] = {EventKind::Collective, EventKind::Gemm, EventKind::Compute,
                                  EventKind::Trivial};
  return parse_enum(s, event_kind_name, all, "event kind");
}

ReduceOp parse_reduce_op(const std::string& s) {
  static const ReduceOp all[] = {ReduceOp::None, ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};
  return parse_enum(s, reduce_op_name, all, "reduce op");
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard:
      return fmt::format("Shard(dim={})", dim);
    case Kind::Replicate:
      return "Replicate()";
    case Kind::Partial:
      return fmt::format("Partial({})", reduce_op_name(op));
  }
  return "?";
}

std::string placements_str(std::span<const Placement> p) {
  if (p.empty()) return "";
  std::vector<std::string> parts;
  for (const Placement& x : p) parts.push_back(x.str());
  return tuple_str(parts);
}

std::string mesh_str(const MeshInfo& m) {
  std::vector<std::string> dims, strides(m.shape.size()), quoted;
  int stride = 1;
  for (std::size_t i = m.shape.size(); i-- > 0;) {
    strides[i] = std::to_string(stride);
    stride *= m.shape[i];
  }
  for (int s : m.shape) dims.push_back(std::to_string(s));
  for (const auto& n : m.dim_names) quoted.push_back("'" + n + "'");
  const std::string device = device_name(m.device);
  if (!m.named) {
    return fmt::format("DeviceMesh({}, '{}', stride={})", tuple_str(dims), device,
                       tuple_str(strides));
  }
  return fmt::format("DeviceMesh({}, '{}', mesh_dim_names={}, stride={})", tuple_str(dims), device,
                     tuple_str(quoted), tuple_str(strides));
}

Placement parse_placement(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  }
  const auto open = s.find('(');
  const std::string head = s.substr(0, open);
  std::string arg;
  if (open != std::string::npos) {
    COMMTRACE_CHECK(s.back() == ')', ErrorCode::InvalidArgument, "placement '{}': missing ')'",
                    text);
    arg = s.substr(open + 1, s.size() - open - 2);
  }
  if (head == "R" || head == "Replicate") {
    COMMTRACE_CHECK(arg.empty(), ErrorCode::InvalidArgument,
                    "placement '{}': Replicate takes no argument", text);
    return Placement::replicate();
  }
  if (head == "S" || head == "Shard") {
    if (arg.rfind("dim=", 0) == 0) arg = arg.substr(4);
    int d = 0;
    const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), d);
    COMMTRACE_CHECK(!arg.empty() && ec == std::errc() && end == arg.data() + arg.size(),
                    ErrorCode::InvalidArgument,
                    "placement '{}': Shard needs an integer dim, e.g. Shard(0)", text);
    return Placement::shard(d);
  }
  if (head == "P" || head == "Partial") {
    if (arg.rfind("reduce_op=", 0) == 0) arg = arg.substr(10);
    arg.erase(std::remove(arg.begin(), arg.end(), '\''), arg.end());
    if (arg.empty() || arg == "sum") return Placement::partial(ReduceOp::Sum);
    if (arg == "avg") return Placement::partial(ReduceOp::Avg);
    if (arg == "max") return Placement::partial(ReduceOp::Max);
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("placement '{}': Partial takes sum, avg or max", text));
  }
  throw Error(
      ErrorCode::InvalidArgument,
      fmt::format("unknown placement '{}' (expected Shard(d), Replicate() or Partial(op))", text));
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The top-level comma-separated items of s (brackets, parentheses and quotes nest); an empty
// last item (a trailing comma) is dropped.
std::vector<std::string_view> split_items(std::string_view s, std::string_view what) {
  std::vector<std::string_view> items;
  int depth = 0;
  char quote = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '(' || c == '[') {
      ++depth;
    } else if (c == ')' || c == ']') {
      COMMTRACE_CHECK(--depth >= 0, ErrorCode::InvalidArgument, "{} '{}': unbalanced brackets",
                      what, s);
    } else if (c == ',' && depth == 0) {
      items.push_back(trim(s.substr(start, i - start)));
      COMMTRACE_CHECK(!items.back().empty(), ErrorCode::InvalidArgument, "{} '{}': empty item",
                      what, s);
      start = i + 1;
    }
  }
  COMMTRACE_CHECK(depth == 0 && quote == 0, ErrorCode::InvalidArgument,
                  "{} '{}': unbalanced brackets or quotes", what, s);
  const std::string_view last = trim(s.substr(start));
  if (!last.empty()) items.push_back(last);
  return items;
}

// "(a, b)" or "[a, b]" → its items.
std::vector<std::string_view> unwrap(std::string_view s, std::string_view what) {
  s = trim(s);
  COMMTRACE_CHECK(s.size() >= 2 && ((s.front() == '(' && s.back() == ')') ||
                                    (s.front() == '[' && s.back() == ']')),
                  ErrorCode::InvalidArgument, "{} '{}': expected a tuple or a list", what, s);
  return split_items(s.substr(1, s.size() - 2), what);
}

int parse_int(std::string_view s, std::string_view what) {
  s = trim(s);
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  COMMTRACE_CHECK(!s.empty() && ec == std::errc() && end == s.data() + s.size(),
                  ErrorCode::InvalidArgument, "{}: '{}' is not an integer", what, s);
  return v;
}

std::string unquote(std::string_view s, std::string_view what) {
  s = trim(s);
  COMMTRACE_CHECK(s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front(),
                  ErrorCode::InvalidArgument, "{}: expected a quoted name, got '{}'", what, s);
  return std::string(s.substr(1, s.size() - 2));
}

// The shape of a nested list of ranks: [[0, 1], [2, 3]] is (2, 2). Returns the depth of the
// leaves, which every sibling must share (split_items gives no empty item).
std::size_t list_shape(std::string_view s, std::vector<int>& shape, std::size_t level) {
  const auto items = unwrap(s, "device mesh ranks");
  if (shape.size() == level) shape.push_back(int(items.size()));
  COMMTRACE_CHECK(shape[level] == int(items.size()), ErrorCode::InvalidArgument,
                  "device mesh ranks '{}' are not rectangular", s);
  std::size_t depth = level + 1;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const bool nested = items[i][0] == '[' || items[i][0] == '(';
    const std::size_t d = nested ? list_shape(items[i], shape, level + 1) : level + 1;
    if (i == 0) depth = d;
    COMMTRACE_CHECK(d == depth, ErrorCode::InvalidArgument,
                    "device mesh ranks '{}' are not rectangular", s);
  }
  return depth;
}

}  // namespace

std::vector<Placement> parse_placements(std::string_view text) {
  std::vector<Placement> out;
  if (trim(text).empty()) return out;
  for (std::string_view item : unwrap(text, "placements")) out.push_back(parse_placement(item));
  return out;
}

std::vector<std::string> default_mesh_dim_names(std::size_t ndim) {
  if (ndim == 1) return {"tp"};
  if (ndim == 2) return {"dp", "tp"};
  std::vector<std::string> names;
  for (std::size_t i = 0; i < ndim; ++i) names.push_back(fmt::format("dim{}", i));
  return names;
}

MeshInfo parse_mesh_str(std::string_view text) {
  const std::string_view t = trim(text);
  constexpr std::string_view kHead = "DeviceMesh(";
  COMMTRACE_CHECK(t.substr(0, kHead.size()) == kHead && t.back() == ')', ErrorCode::InvalidArgument,
                  "device mesh '{}': expected DeviceMesh(...)", text);
  const auto args = split_items(t.substr(kHead.size(), t.size() - kHead.size() - 1), "device mesh");
  MeshInfo m;
  bool have_device = false;
  for (std::string_view a : args) {
    if (a.substr(0, 15) == "mesh_dim_names=") {
      for (std::string_view n : unwrap(a.substr(15), "mesh_dim_names")) {
        m.dim_names.push_back(unquote(n, "mesh_dim_names"));
      }
      m.named = true;
    } else if (a.substr(0, 7) == "stride=") {
      continue;  // implied by the shape (row-major)
    } else if (!a.empty() && (a.front() == '\'' || a.front() == '"')) {
      m.device = parse_device(unquote(a, "device mesh device"));
      have_device = true;
    } else if (!a.empty() && a.front() == '(') {
      // (4,) or, in commtrace 1.x traces, (tp=4) / (dp=2, tp=2): named dims.
      for (std::string_view d : unwrap(a, "device mesh shape")) {
        const std::size_t eq = d.find('=');
        if (eq != std::string_view::npos) {
          m.dim_names.emplace_back(trim(d.substr(0, eq)));
          m.named = true;
          d = d.substr(eq + 1);
        }
        m.shape.push_back(parse_int(d, "device mesh shape"));
      }
    } else if (!a.empty() && a.front() == '[') {
      list_shape(a, m.shape, 0);
    } else {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("device mesh '{}': unexpected '{}'", text, a));
    }
  }
  COMMTRACE_CHECK(!m.shape.empty(), ErrorCode::InvalidArgument, "device mesh '{}': needs a shape",
                  text);
  if (!have_device) m.device = Device::CPU;  // commtrace 1.x traces name none
  for (int s : m.shape) {
    COMMTRACE_CHECK(s >= 1, ErrorCode::InvalidArgument, "device mesh '{}': dim size {} < 1", text,
                    s);
  }
  if (!m.named) m.dim_names = default_mesh_dim_names(m.shape.size());
  COMMTRACE_CHECK(m.dim_names.size() == m.shape.size(), ErrorCode::InvalidArgument,
                  "device mesh '{}': {} names for {} dims", text, m.dim_names.size(),
                  m.shape.size());
  return m;
}

// ---------------------------------------------------------------- pools

TracePools::TracePools() {
  intern(std::string_view());
  intern_shape({});
  placement_lists_.push_back(Span{});  // id 0: no placements
}

TracePools::TracePools(const TracePools& o)
    : strings_(o.strings_),
      dims_(o.dims_),
      shapes_(o.shapes_),
      shape_ids_(o.shape_ids_),
      placement_items_(o.placement_items_),
      placement_lists_(o.placement_lists_),
      placement_ids_(o.placement_ids_),
      meshes_(o.meshes_) {
  for (std::size_t i = 0; i < strings_.size(); ++i) string_ids_.emplace(strings_[i], StrId(i));
}

TracePools& TracePools::operator=(const TracePools& o) {
  if (this != &o) *this = TracePools(o);
  return *this;
}

StrId TracePools::intern(std::string_view s) {
  if (auto it = string_ids_.find(s); it != string_ids_.end()) return it->second;
  const StrId id = StrId(strings_.size());
  strings_.emplace_back(s);
  string_ids_.emplace(strings_.back(), id);
  return id;
}

void HashIndex::insert(std::uint64_t h, std::uint32_t id) {
  if (2 * (count_ + 1) > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(std::max<std::size_t>(64, old.size() * 2), Slot{});
    count_ = 0;
    for (const Slot& s : old) {
      if (s.id != kNone) insert(s.hash, s.id);
    }
  }
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = std::size_t(h) & mask;
  while (slots_[i].id != kNone) i = (i + 1) & mask;
  slots_[i] = Slot{h, id};
  ++count_;
}

ShapeId TracePools::intern_shape(std::span<const std::int64_t> dims) {
  const std::uint64_t h = hash_of(dims);
  const ShapeId found = shape_ids_.find(h, [&](ShapeId id) {
    const auto s = shape(id);
    return std::equal(s.begin(), s.end(), dims.begin(), dims.end());
  });
  if (found != HashIndex::kNone) return found;
  const ShapeId id = ShapeId(shapes_.size());
  shapes_.push_back(Span{std::uint32_t(dims_.size()), std::uint32_t(dims.size())});
  dims_.insert(dims_.end(), dims.begin(), dims.end());
  shape_ids_.insert(h, id);
  return id;
}

PlacementsId TracePools::intern_placements(std::span<const Placement> p) {
  if (p.empty()) return 0;
  const std::uint64_t h = hash_placements(p);
  const PlacementsId found = placement_ids_.find(h, [&](PlacementsId id) {
    const auto s = placements(id);
    return std::equal(s.begin(), s.end(), p.begin(), p.end());
  });
  if (found != HashIndex::kNone) return found;
  const PlacementsId id = PlacementsId(placement_lists_.size());
  placement_lists_.push_back(Span{std::uint32_t(placement_items_.size()), std::uint32_t(p.size())});
  placement_items_.insert(placement_items_.end(), p.begin(), p.end());
  placement_ids_.insert(h, id);
  return id;
}

MeshId TracePools::intern_mesh(const MeshInfo& m) {
  for (std::size_t i = 0; i < meshes_.size(); ++i) {
    if (meshes_[i] == m) return MeshId(i);
  }
  meshes_.push_back(m);
  return MeshId(meshes_.size() - 1);
}

std::size_t TracePools::bytes() const {
  std::size_t b = dims_.capacity() * sizeof(std::int64_t) + shapes_.capacity() * sizeof(Span) +
                  placement_items_.capacity() * sizeof(Placement) +
                  placement_lists_.capacity() * sizeof(Span) + shape_ids_.bytes() +
                  placement_ids_.bytes() + string_ids_.size() * 32;
  for (const std::string& s : strings_) b += sizeof(std::string) + s.capacity();
  return b;
}

// ---------------------------------------------------------------- trace

int Trace::find_module(const std::string& fqn) const {
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].fqn == fqn) return int(i);
  }
  return -1;
}

bool Trace::is_within(int module, int ancestor) const {
  for (int m = module, steps = 0;
       m >= 0 && std::size_t(m) < modules.size() && steps <= int(modules.size());
       m = modules[std::size_t(m)].parent, ++steps) {
    if (m == ancestor) return true;
  }
  return false;
}

std::vector<Block> Trace::block_list() const {
  if (!blocks.empty()) return blocks;
  return {Block{0, std::uint32_t(records.size()), 0, 1}};
}

std::uint64_t Trace::event_count() const {
  std::uint64_t n = 0;
  for (const Block& b : block_list()) n += std::uint64_t(b.count) * b.repeat;
  return n;
}

bool same_event(const Trace& t, const Record& a, const Record& b) {
  if (a.kind != b.kind || a.phase != b.phase || a.dtype != b.dtype || a.sharded != b.sharded ||
      a.name != b.name || a.overload != b.overload || a.reason != b.reason ||
      a.module != b.module || a.mesh != b.mesh || a.n_inputs != b.n_inputs ||
      a.n_outputs != b.n_outputs) {
    return false;
  }
  if (a.kind == EventKind::Collective) {
    CollectiveInfo x = a.collective, y = b.collective;
    x.seq = y.seq = 0;
    x.seq_stride = y.seq_stride = 0;
    if (!(x == y)) return false;
  }
  const auto ai = t.inputs(a), bi = t.inputs(b), ao = t.outputs(a), bo = t.outputs(b);
  return std::equal(ai.begin(), ai.end(), bi.begin()) &&
         std::equal(ao.begin(), ao.end(), bo.begin());
}

}  // namespace commtrace
