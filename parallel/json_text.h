// JSON input of parallel/ (plan and model files): parse and read with errors naming the source.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace commtrace {

// REQUIRES: text holds a JSON object with "schema": "commtrace.<what>" and a "version" "1.x".
// Error(InvalidArgument) naming the source otherwise: not valid JSON, not an object, another
// schema, or an unsupported version.
nlohmann::ordered_json parse_config_json(const std::string& text, const std::string& source,
                                         const std::string& what);
// The whole file; Error(Io) "cannot read <what> file '<path>'" when it cannot be read.
std::string read_config_file(const std::string& path, const char* what);

}  // namespace commtrace
