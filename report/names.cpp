// Names as PyTorch's CommDebugMode prints them. Collective keys come from the one collective
// table (tracer/collectives.h); op names are "aten.<name>.<overload>".
#include "report/names.h"

#include <charconv>

#include <fmt/ranges.h>

#include "report/counts.h"
#include "tracer/collectives.h"

namespace commtrace {

std::string torch_name(const Trace& t, const Record& r) {
  if (r.kind == EventKind::Collective) return collective_spec(r.collective.op).torch_name;
  const std::string_view name = t.str(r.name), overload = t.str(r.overload);
  std::string base =
      name.find('.') == std::string_view::npos ? fmt::format("aten.{}", name) : std::string(name);
  return overload.empty() ? base : fmt::format("{}.{}", base, overload);
}

std::string torch_module_type(const std::string& type) {
  if (type.empty()) return "";
  if (type.rfind("class '", 0) == 0) return type;
  return "class 'commtrace.nn." + type + "'";
}

std::string torch_size(std::span<const std::int64_t> s) {
  return fmt::format("torch.Size([{}])", fmt::join(s, ", "));
}

Shape parse_torch_size(std::string_view s) {
  constexpr std::string_view kHead = "torch.Size([", kTail = "])";
  auto bad = [&] {
    return Error(ErrorCode::InvalidArgument,
                 fmt::format("expected \"torch.Size([...])\", got \"{}\"", s));
  };
  if (s.size() < kHead.size() + kTail.size() || s.substr(0, kHead.size()) != kHead ||
      s.substr(s.size() - kTail.size()) != kTail) {
    throw bad();
  }
  std::string_view body = s.substr(kHead.size(), s.size() - kHead.size() - kTail.size());
  Shape shape;
  while (!body.empty()) {
    while (!body.empty() && body.front() == ' ') body.remove_prefix(1);
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), v);
    if (ec != std::errc() || end == body.data() || v < 0) throw bad();
    shape.push_back(v);
    body.remove_prefix(std::size_t(end - body.data()));
    if (body.empty()) break;
    if (body.front() != ',' || body.size() == 1) throw bad();
    body.remove_prefix(1);
  }
  return shape;
}

std::string tensor_arg_str(const Trace& t, const TensorArg& a, bool sharded) {
  if (!sharded || a.placements == 0) return shape_str(t.shape(a.shape));
  return fmt::format("{} {}", shape_str(t.shape(a.global_shape)),
                     placements_str(t.placements(a.placements)));
}

std::string reason_str(const Trace& t, const Record& r) {
  std::string why = r.reason == 0 ? "(no reason recorded)" : std::string(t.str(r.reason));
  if (r.collective.before != 0 || r.collective.after != 0) {
    why += fmt::format(": {} → {}", placements_str(t.placements(r.collective.before)),
                       placements_str(t.placements(r.collective.after)));
  }
  return why;
}

std::string trace_description(const Trace& t) {
  std::vector<std::string> head, details;
  const std::string model = metadata_of(t, "model"), plan = metadata_of(t, "plan");
  // Built-in plans are named after their model ("toy tp"): do not repeat the model.
  if (!model.empty() && plan.rfind(model + " ", 0) != 0) head.push_back(model);
  if (!plan.empty()) head.push_back(plan);
  if (is_torch_dump(t)) head.push_back("PyTorch CommDebugMode dump");
  if (!metadata_of(t, "world_size").empty()) {
    details.push_back("world " + metadata_of(t, "world_size"));
  }
  if (metadata_of(t, "input_requires_grad") == "true") details.push_back("input requires grad");
  if (!metadata_of(t, "source").empty()) details.push_back(metadata_of(t, "source"));
  const int iters = trace_iterations(t);
  if (iters > 1) details.push_back(fmt::format("{} iterations", iters));
  std::string s = fmt::format("{}", fmt::join(head, " "));
  if (s.empty()) s = "trace";
  if (!details.empty()) s += fmt::format(" ({})", fmt::join(details, ", "));
  return s;
}

}  // namespace commtrace
