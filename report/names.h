// Names as PyTorch's CommDebugMode prints them: collective keys, aten op names, module types.
#pragma once

#include <string>

#include "tracer/trace.h"

namespace commtrace {

// "c10d_functional.all_reduce" for a collective record, "aten.addmm.default" for an op. A name
// that already has a namespace (read back from a PyTorch dump: "_c10d_functional.all_reduce")
// is not prefixed with "aten.".
std::string torch_name(const OpRecord& r);
// "class 'commtrace.nn.Linear'" for a module type "Linear"; "" for Global. A type already in
// PyTorch's form ("class 'torch.nn.modules.linear.Linear'", from a dump) is returned as is.
std::string torch_module_type(const std::string& type);
// PyTorch's repr of a shape: "torch.Size([8, 10])".
std::string torch_size(const Shape& s);

}  // namespace commtrace
