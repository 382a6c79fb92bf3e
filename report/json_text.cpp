#include "report/json_text.h"

#include <fmt/format.h>

#include <charconv>

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

std::pair<int, int> parse_json_version(const std::string& source, const std::string& v) {
  int major = 0, minor = 0;
  const char* b = v.data();
  const char* e = v.data() + v.size();
  auto [p1, ec1] = std::from_chars(b, e, major);
  bool ok = ec1 == std::errc() && p1 < e && *p1 == '.';
  if (ok) {
    auto [p2, ec2] = std::from_chars(p1 + 1, e, minor);
    ok = ec2 == std::errc() && p2 == e && p1 + 1 < e;
  }
  COMMTRACE_CHECK(ok && major >= 0 && minor >= 0, ErrorCode::InvalidArgument,
                  "{}: version '{}' is not of the form <major>.<minor>", source, v);
  return {major, minor};
}

}  // namespace commtrace
