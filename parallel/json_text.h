// JSON input of parallel/ (plan and model files): parse and read with errors naming the source.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace commtrace {

// REQUIRES: text holds a JSON object. Error(InvalidArgument) "<source>: not valid JSON: ..." or
// "<source>: expected a JSON object".
nlohmann::ordered_json parse_config_json(const std::string& text, const std::string& source);
// The whole file; Error(Io) "cannot read <what> file '<path>'" when it cannot be read.
std::string read_config_file(const std::string& path, const char* what);

}  // namespace commtrace
