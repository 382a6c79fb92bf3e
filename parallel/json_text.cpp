#include "parallel/json_text.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "kernels/base.h"

namespace commtrace {

nlohmann::ordered_json parse_config_json(const std::string& text, const std::string& source) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  COMMTRACE_CHECK(j.is_object(), ErrorCode::InvalidArgument, "{}: expected a JSON object", source);
  return j;
}

std::string read_config_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  COMMTRACE_CHECK(in.good(), ErrorCode::Io, "cannot read {} file '{}'", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace commtrace
