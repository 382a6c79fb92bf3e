#include "report/json_text.h"

#include <fmt/format.h>

#include "tracer/trace.h"  // Error, COMMTRACE_CHECK

namespace commtrace {

nlohmann::ordered_json parse_report_json(const std::string& text, const std::string& source,
                                         const char* expected) {
  nlohmann::ordered_json root;
  try {
    root = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  COMMTRACE_CHECK(root.is_object(), ErrorCode::InvalidArgument, "{}: expected {}, got {}", source,
                  expected, root.type_name());
  return root;
}

}  // namespace commtrace
