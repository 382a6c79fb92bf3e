// Names as PyTorch's CommDebugMode prints them. Collective keys come from the one collective
// table (tracer/collectives.h); op names are "aten.<name>.<overload>".
#include "report/names.h"

#include "tracer/collectives.h"

namespace commtrace {

std::string torch_name(const OpRecord& r) {
  if (r.kind == EventKind::Collective) {
    if (const CollectiveSpec* c = find_collective(r.name)) return c->torch_name;
    return r.name;  // not in the table: shown as recorded
  }
  // A name that already carries a namespace ("_c10d_functional.all_reduce", read back from a
  // PyTorch dump) is not prefixed again.
  const std::string base = r.name.find('.') == std::string::npos ? "aten." + r.name : r.name;
  return r.overload.empty() ? base : base + "." + r.overload;
}

std::string torch_module_type(const std::string& type) {
  if (type.empty()) return "";
  // A type read back from a PyTorch dump is already in PyTorch's form.
  if (type.rfind("class '", 0) == 0) return type;
  return "class 'commtrace.nn." + type + "'";
}

std::string torch_size(const Shape& s) {
  std::string out = "torch.Size([";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "])";
}

}  // namespace commtrace
