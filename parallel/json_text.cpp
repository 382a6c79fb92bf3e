#include "parallel/json_text.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "kernels/base.h"

namespace commtrace {

nlohmann::ordered_json parse_config_json(const std::string& text, const std::string& source,
                                         const std::string& what) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  COMMTRACE_CHECK(j.is_object(), ErrorCode::InvalidArgument, "{}: expected a JSON object", source);
  const std::string schema = "commtrace." + what;
  COMMTRACE_CHECK(j.value("schema", "") == schema, ErrorCode::InvalidArgument,
                  "{}: \"schema\" must be \"{}\"", source, schema);
  const std::string version = j.value("version", "");
  COMMTRACE_CHECK(version.rfind("1.", 0) == 0, ErrorCode::InvalidArgument,
                  "{}: unsupported {} version \"{}\" (this build reads 1.x)", source, what,
                  version);
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
