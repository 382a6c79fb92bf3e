// The one JSON front end of commtrace's files (traces, baselines, plans, models, PyTorch dumps):
// reading a file, parsing with a nesting limit, typed access whose errors name the file and the
// JSON path, and the one version policy of README's "File formats": "schema" must be the
// reader's, the major version must be the reader's, and keys the reader does not know are
// refused unless the file's minor version is later than the reader's (a later minor may add
// keys). Every error is Error(InvalidArgument) "<file>: <path>: <what is wrong>" (Io for files).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/base.h"

namespace commtrace {

using Json = nlohmann::ordered_json;

// Deeper nesting is refused before parsing (a recursive parser would overflow the stack).
inline constexpr int kMaxJsonDepth = 64;

// A position in a document, rendered only for an error: "ranks[0].records[5].name". A path
// points to its parent, so parts live on the stack of the reading code: name every level
// (extending a temporary would leave a dangling parent, and does not compile). Keys must
// outlive the path too.
class JsonPath {
 public:
  JsonPath() = default;
  JsonPath key(const char* k) const& { return JsonPath(this, k, 0); }
  JsonPath index(std::size_t i) const& { return JsonPath(this, nullptr, i); }
  JsonPath key(const char* k) && = delete;
  JsonPath index(std::size_t i) && = delete;
  std::string str() const;  // "(top level)" for the root

 private:
  JsonPath(const JsonPath* parent, const char* key, std::size_t index)
      : parent_(parent), key_(key), index_(index) {}
  const JsonPath* parent_ = nullptr;
  const char* key_ = nullptr;  // null: an array index (or the root when parent_ is null)
  std::size_t index_ = 0;
};

class JsonReader {
 public:
  explicit JsonReader(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  // Parses text. REQUIRES a JSON object at the top ("<source>: expected <expected>, got <type>")
  // and no control character in any string or key (terminal escapes), nested at most
  // kMaxJsonDepth levels.
  Json parse(std::string_view text, std::string_view expected) const;
  // The same with nlohmann's parser callback: `filter` sees every value as it is parsed and may
  // take it or drop it (return false), so a large file's uninteresting parts never sit in memory.
  // Only what is kept is checked for control characters: check what the filter takes with
  // check_printable.
  Json parse(std::string_view text, std::string_view expected,
             const Json::parser_callback_t& filter) const;
  // The header by the one policy: "schema" equal to `schema`, "version" "<major>.<minor>" with a
  // major among `supported` ({major, minor} this build writes for each major it reads).
  // Afterwards check_keys refuses unknown keys only for minors <= that major's. Returns the
  // file's major version.
  int check_header(const Json& root, std::string_view schema,
                   std::initializer_list<std::pair<int, int>> supported, std::string_view what);

  [[noreturn]] void fail(const JsonPath& path, std::string_view msg) const;

  // REQUIRES j is an object. Unknown keys are refused unless a later minor allows them; keys
  // starting with '_' are comments.
  void check_keys(const Json& j, const JsonPath& path,
                  std::initializer_list<const char*> known) const;
  bool strict() const { return strict_; }
  // Refuses a control character in any string or key of j ("<file>: <path>: control character").
  void check_printable(const Json& j, const JsonPath& path) const;

  const Json& object(const Json& j, const JsonPath& path) const;
  const Json& array(const Json& j, const JsonPath& path) const;
  const Json& at(const Json& obj, const char* key, const JsonPath& path) const;  // required
  const Json* find(const Json& obj, const char* key) const;                      // optional
  std::string str(const Json& j, const JsonPath& path) const;
  std::vector<std::string> strings(const Json& j, const JsonPath& path) const;  // an array
  bool boolean(const Json& j, const JsonPath& path) const;
  double number(const Json& j, const JsonPath& path) const;  // finite
  std::int64_t integer(const Json& j, const JsonPath& path,
                       std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const;
  std::uint64_t unsigned_integer(const Json& j, const JsonPath& path) const;
  int int32(const Json& j, const JsonPath& path, int lo = std::numeric_limits<int>::min(),
            int hi = std::numeric_limits<int>::max()) const {
    return int(integer(j, path, lo, hi));
  }
  // Runs a parser that throws Error (an enum name, a placement) and prefixes file and path.
  template <typename F>
  auto parse_with(const Json& j, const JsonPath& path, F parser) const {
    const std::string s = str(j, path);
    try {
      return parser(s);
    } catch (const Error& e) {
      fail(path, e.what());
    }
  }

 private:
  Json parse_impl(std::string_view text, std::string_view expected,
                  const Json::parser_callback_t* filter) const;

  std::string source_;
  bool strict_ = true;
  std::string version_;
};

// The whole file. Error(Io) "<path>: cannot open <what>: <reason>" when it cannot be read.
std::string read_text_file(const std::string& path, std::string_view what = "file");

// Whether a --model / --plan style argument names a file rather than a built-in: it holds
// ".json" or a '/'.
bool names_a_file(std::string_view arg);

// A file written through a temporary file in the same folder and renamed over the target by
// commit(), once every byte is written and flushed: a failed or abandoned write leaves the old
// file intact (the destructor removes the temporary file).
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // Io when the temporary file cannot be created
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::string_view bytes);  // Io on failure (a full disk, a file-size limit)
  void commit();                       // Io on failure; then the target holds the new file
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

// Writes the whole file through an AtomicFile.
void write_text_file(const std::string& path, std::string_view text);

// A streaming JSON writer: values are appended to a buffer that is handed to `sink` whenever it
// grows past 64 KiB (and by flush()), so a large document never sits in memory whole. Strings
// are escaped (control characters as \u00XX, invalid UTF-8 replaced by U+FFFD). Compact, or
// indented by 2 when `pretty`.
class JsonWriter {
 public:
  using Sink = std::function<void(std::string_view)>;
  JsonWriter(Sink sink, bool pretty);

  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view k);
  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(std::int64_t v);
  JsonWriter& value(std::uint64_t v);
  JsonWriter& value(int v) { return value(std::int64_t(v)); }
  JsonWriter& value(std::uint32_t v) { return value(std::uint64_t(v)); }
  JsonWriter& value(double v);  // shortest round-trip form; non-finite as null
  JsonWriter& value(bool v);
  JsonWriter& null();
  void flush();  // REQUIRES: the document is complete

 private:
  void before_value();
  void newline();
  void spill();

  Sink sink_;
  bool pretty_;
  std::string buf_;
  std::vector<bool> has_items_;  // per open container
  bool after_key_ = false;
};

// Appends s to out as a JSON string literal (with the quotes).
void json_escape(std::string_view s, std::string& out);

}  // namespace commtrace
