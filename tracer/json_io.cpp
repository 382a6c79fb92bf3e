#include "tracer/json_io.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace commtrace {

namespace {

// The deepest nesting of arrays and objects in text (strings skipped); stops past `limit`.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

const char* type_name(const Json& j) { return j.type_name(); }

}  // namespace

std::string JsonPath::str() const {
  std::vector<const JsonPath*> parts;
  for (const JsonPath* p = this; p && p->parent_; p = p->parent_) parts.push_back(p);
  if (parts.empty()) return "(top level)";
  std::string out;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    const JsonPath* p = *it;
    if (p->key_) {
      if (!out.empty()) out += '.';
      out += p->key_;
    } else {
      out += fmt::format("[{}]", p->index_);
    }
  }
  return out;
}

Json JsonReader::parse(std::string_view text, std::string_view expected) const {
  return parse_impl(text, expected, nullptr);
}

Json JsonReader::parse(std::string_view text, std::string_view expected,
                       const Json::parser_callback_t& filter) const {
  return parse_impl(text, expected, &filter);
}

Json JsonReader::parse_impl(std::string_view text, std::string_view expected,
                            const Json::parser_callback_t* filter) const {
  COMMTRACE_CHECK(nesting_depth(text, kMaxJsonDepth) <= kMaxJsonDepth, ErrorCode::InvalidArgument,
                  "{}: JSON nested deeper than {} levels", source_, kMaxJsonDepth);
  Json root;
  try {
    root = filter ? Json::parse(text, *filter) : Json::parse(text);
  } catch (const Json::exception& e) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: not valid JSON: {}", source_, e.what()));
  }
  COMMTRACE_CHECK(root.is_object(), ErrorCode::InvalidArgument, "{}: expected {}, got {}", source_,
                  expected, type_name(root));
  check_printable(root, JsonPath());
  return root;
}

namespace {
// The first control character of s (C0, DEL, or C1 encoded as UTF-8), or -1 when none.
int control_char(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return c;
    if (c == 0xc2 && i + 1 < s.size()) {
      const auto n = static_cast<unsigned char>(s[i + 1]);
      if (n >= 0x80 && n <= 0x9f) return n;
    }
  }
  return -1;
}
}  // namespace

// Names and texts of a file reach terminals (show, diff, errors): a control character (an ANSI
// or OSC escape sequence) is refused rather than printed. Recursion is bounded by the nesting
// limit checked before parsing.
void JsonReader::check_printable(const Json& j, const JsonPath& path) const {
  if (j.is_string()) {
    const int c = control_char(j.get_ref<const std::string&>());
    if (c >= 0) fail(path, fmt::format("control character U+{:04X} in a string", c));
  } else if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      const int c = control_char(key);
      if (c >= 0) fail(path, fmt::format("control character U+{:04X} in a key", c));
      check_printable(value, path.key(key.c_str()));
    }
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) check_printable(j[i], path.index(i));
  }
}

int JsonReader::check_header(const Json& root, std::string_view schema,
                             std::initializer_list<std::pair<int, int>> supported,
                             std::string_view what) {
  const JsonPath top;
  const std::string s = str(at(root, "schema", top), top.key("schema"));
  COMMTRACE_CHECK(s == schema, ErrorCode::InvalidArgument, "{}: schema is '{}', expected '{}'",
                  source_, s, schema);
  const std::string v = str(at(root, "version", top), top.key("version"));
  int file_major = 0, file_minor = 0;
  const char* b = v.data();
  const char* e = v.data() + v.size();
  auto [p1, ec1] = std::from_chars(b, e, file_major);
  bool ok = ec1 == std::errc() && p1 < e && *p1 == '.' && p1 > b;
  if (ok) {
    auto [p2, ec2] = std::from_chars(p1 + 1, e, file_minor);
    ok = ec2 == std::errc() && p2 == e && p1 + 1 < e;
  }
  COMMTRACE_CHECK(ok && file_major >= 0 && file_minor >= 0, ErrorCode::InvalidArgument,
                  "{}: version '{}' is not of the form <major>.<minor>", source_, v);
  std::vector<std::string> readable;
  for (const auto& [major, minor] : supported) {
    if (file_major == major) {
      strict_ = file_minor <= minor;
      version_ = v;
      return major;
    }
    readable.push_back(fmt::format("{}.x", major));
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{}: {} version {} is not supported (this build reads {})", source_, what,
                          v, fmt::join(readable, ", ")));
}

void JsonReader::fail(const JsonPath& path, std::string_view msg) const {
  throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}: {}", source_, path.str(), msg));
}

void JsonReader::check_keys(const Json& j, const JsonPath& path,
                            std::initializer_list<const char*> known) const {
  if (!strict_) return;
  for (const auto& [key, value] : j.items()) {
    if (!key.empty() && key[0] == '_') continue;
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) {
      fail(path, version_.empty()
                     ? fmt::format("unknown key '{}'", key)
                     : fmt::format("unknown key '{}' (not in version {})", key, version_));
    }
  }
}

const Json& JsonReader::object(const Json& j, const JsonPath& path) const {
  if (!j.is_object()) fail(path, fmt::format("expected an object, got {}", type_name(j)));
  return j;
}

const Json& JsonReader::array(const Json& j, const JsonPath& path) const {
  if (!j.is_array()) fail(path, fmt::format("expected an array, got {}", type_name(j)));
  return j;
}

const Json& JsonReader::at(const Json& obj, const char* key, const JsonPath& path) const {
  object(obj, path);
  const auto it = obj.find(key);
  if (it == obj.end()) fail(path, fmt::format("missing key '{}'", key));
  return *it;
}

const Json* JsonReader::find(const Json& obj, const char* key) const {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::string JsonReader::str(const Json& j, const JsonPath& path) const {
  if (!j.is_string()) fail(path, fmt::format("expected a string, got {}", type_name(j)));
  return j.get<std::string>();
}

std::vector<std::string> JsonReader::strings(const Json& j, const JsonPath& path) const {
  array(j, path);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < j.size(); ++i) out.push_back(str(j[i], path.index(i)));
  return out;
}

bool JsonReader::boolean(const Json& j, const JsonPath& path) const {
  if (!j.is_boolean()) fail(path, fmt::format("expected true or false, got {}", type_name(j)));
  return j.get<bool>();
}

double JsonReader::number(const Json& j, const JsonPath& path) const {
  if (!j.is_number()) fail(path, fmt::format("expected a number, got {}", type_name(j)));
  const double v = j.get<double>();
  if (!std::isfinite(v)) fail(path, fmt::format("{} is not a finite number", j.dump()));
  return v;
}

std::int64_t JsonReader::integer(const Json& j, const JsonPath& path, std::int64_t lo,
                                 std::int64_t hi) const {
  if (j.is_number_unsigned()) {
    const std::uint64_t v = j.get<std::uint64_t>();
    if (hi < 0 || v > std::uint64_t(hi) || (lo > 0 && v < std::uint64_t(lo))) {
      fail(path, fmt::format("{} is out of range [{}, {}]", v, lo, hi));
    }
    return std::int64_t(v);
  }
  if (!j.is_number_integer()) {
    fail(path, fmt::format("expected an integer, got {}", j.is_number() ? j.dump() : type_name(j)));
  }
  const std::int64_t v = j.get<std::int64_t>();
  if (v < lo || v > hi) fail(path, fmt::format("{} is out of range [{}, {}]", v, lo, hi));
  return v;
}

std::uint64_t JsonReader::unsigned_integer(const Json& j, const JsonPath& path) const {
  if (j.is_number_unsigned()) return j.get<std::uint64_t>();
  if (j.is_number_integer()) fail(path, fmt::format("{} must not be negative", j.dump()));
  fail(path, fmt::format("expected a non-negative integer, got {}",
                         j.is_number() ? j.dump() : type_name(j)));
}

bool names_a_file(std::string_view arg) {
  return arg.find(".json") != std::string_view::npos || arg.find('/') != std::string_view::npos;
}

std::string read_text_file(const std::string& path, std::string_view what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    throw Error(ErrorCode::Io,
                fmt::format("{}: cannot open {}: {}", path, what, std::strerror(errno)));
  }
  std::string text;
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int read_errno = errno;
  std::fclose(f);
  if (failed) {
    throw Error(ErrorCode::Io,
                fmt::format("{}: cannot read {}: {}", path, what, std::strerror(read_errno)));
  }
  return text;
}

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp{}", path_, ::getpid())) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) {
    throw Error(ErrorCode::Io,
                fmt::format("{}: cannot open for writing: {}", path_, std::strerror(errno)));
  }
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(std::string_view bytes) {
  COMMTRACE_CHECK(f_ != nullptr, ErrorCode::Internal, "{}: write after commit", path_);
  if (std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) {
    throw Error(ErrorCode::Io, fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
  }
}

void AtomicFile::commit() {
  COMMTRACE_CHECK(f_ != nullptr, ErrorCode::Internal, "{}: committed twice", path_);
  int err = std::fflush(f_) == 0 ? 0 : errno;
  if (std::fclose(f_) != 0 && err == 0) err = errno;
  f_ = nullptr;
  if (err == 0 && std::rename(tmp_.c_str(), path_.c_str()) != 0) err = errno;
  if (err != 0) {
    throw Error(ErrorCode::Io, fmt::format("{}: cannot write: {}", path_, std::strerror(err)));
  }
  committed_ = true;
}

void write_text_file(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

void json_escape(std::string_view s, std::string& out) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\r':
          out += "\\r";
          break;
        default:
          if (c < 0x20 || c == 0x7f) {
            out += fmt::format("\\u{:04x}", c);
          } else {
            out += char(c);
          }
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence is copied; anything else becomes U+FFFD.
    const int len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    bool ok = len > 0 && i + std::size_t(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + std::size_t(k)]) & 0xc0) == 0x80;
    }
    if (ok) {
      out.append(s.substr(i, std::size_t(len)));
      i += std::size_t(len);
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  out += '"';
}

JsonWriter::JsonWriter(Sink sink, bool pretty) : sink_(std::move(sink)), pretty_(pretty) {
  buf_.reserve(1 << 17);
}

void JsonWriter::newline() {
  if (!pretty_) return;
  buf_ += '\n';
  buf_.append(2 * has_items_.size(), ' ');
}

void JsonWriter::spill() {
  if (buf_.size() >= (1 << 16)) {
    sink_(buf_);
    buf_.clear();
  }
}

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_items_.empty()) {
    if (has_items_.back()) buf_ += ',';
    has_items_.back() = true;
    newline();
  }
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  buf_ += '{';
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  const bool items = has_items_.back();
  has_items_.pop_back();
  if (items) newline();
  buf_ += '}';
  spill();
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  buf_ += '[';
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  const bool items = has_items_.back();
  has_items_.pop_back();
  if (items) newline();
  buf_ += ']';
  spill();
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view k) {
  before_value();
  json_escape(k, buf_);
  buf_ += pretty_ ? ": " : ":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  before_value();
  json_escape(s, buf_);
  return *this;
}

JsonWriter& JsonWriter::value(std::int64_t v) {
  before_value();
  fmt::format_to(std::back_inserter(buf_), "{}", v);
  return *this;
}

JsonWriter& JsonWriter::value(std::uint64_t v) {
  before_value();
  fmt::format_to(std::back_inserter(buf_), "{}", v);
  return *this;
}

JsonWriter& JsonWriter::value(double v) {
  if (!std::isfinite(v)) return null();
  before_value();
  fmt::format_to(std::back_inserter(buf_), "{}", v);
  return *this;
}

JsonWriter& JsonWriter::value(bool v) {
  before_value();
  buf_ += v ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  buf_ += "null";
  return *this;
}

void JsonWriter::flush() {
  COMMTRACE_CHECK(has_items_.empty(), ErrorCode::Internal, "JsonWriter: {} containers open",
                  has_items_.size());
  if (pretty_) buf_ += '\n';
  sink_(buf_);
  buf_.clear();
}

}  // namespace commtrace
