// JSON input of report/: parses a document with errors that name its source.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace commtrace {

// REQUIRES: text holds a JSON object. Error(InvalidArgument) "<source>: not valid JSON: ..." on
// a syntax error, "<source>: expected a JSON object ..., got <type>" on another value.
nlohmann::ordered_json parse_report_json(const std::string& text, const std::string& source,
                                         const char* expected);

// "1.0" -> {1, 0}; anything else is Error(InvalidArgument) naming the source and the value.
std::pair<int, int> parse_json_version(const std::string& source, const std::string& version);

}  // namespace commtrace
