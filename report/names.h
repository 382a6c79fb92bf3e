// Names as PyTorch's CommDebugMode prints them (collective keys, aten op names, module types,
// torch.Size) and the one byte formatter of every report.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tracer/trace.h"

namespace commtrace {

// "c10d_functional.all_reduce" for a collective record, "aten.addmm.default" for an op. A name
// that already has a namespace (read back from a PyTorch dump) is not prefixed with "aten.".
std::string torch_name(const Trace& t, const Record& r);
// "class 'commtrace.nn.Linear'" for a module type "Linear"; "" for Global. A type already in
// PyTorch's form ("class 'torch.nn.modules.linear.Linear'", from a dump) is returned as is.
std::string torch_module_type(const std::string& type);
// PyTorch's repr of a shape: "torch.Size([8, 10])", and its parser (InvalidArgument).
std::string torch_size(std::span<const std::int64_t> s);
Shape parse_torch_size(std::string_view s);

// A record's tensor argument: "[8, 10]", or for a sharded op "[8, 10] (Shard(dim=0),)" (the
// global shape and the placements).
std::string tensor_arg_str(const Trace& t, const TensorArg& a, bool sharded);
// "toy tp (world 4, 2 iterations)": the trace's model and plan and the metadata that is present.
std::string trace_description(const Trace& t);
// Why a record happened: its reason, and for a redistribution "before → after" placements.
std::string reason_str(const Trace& t, const Record& r);

}  // namespace commtrace
