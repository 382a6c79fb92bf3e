// Basics shared by every layer: dtypes, devices, bf16 storage, and the one exception type.
// This header is the only part of kernels/ that tracer/ may include. It has no CUDA in it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace commtrace {

// Serialized values are explicit (DESIGN §5.9).
enum class DType : int { F32 = 0, F64 = 1, BF16 = 2, I64 = 3 };
enum class Device : int { CPU = 0, Meta = 1, CUDA = 2 };
// How values combine across ranks (collectives) and in Partial placements; None: not a reduction.
enum class ReduceOp : int { None = 0, Sum = 1, Avg = 2, Max = 3 };

std::size_t dtype_size(DType dt);
const char* dtype_name(DType dt);        // "f32", "f64", "bf16", "i64"
const char* device_name(Device d);       // "cpu", "meta", "cuda"
const char* reduce_op_name(ReduceOp r);  // "", "sum", "avg", "max"
DType parse_dtype(const std::string& s);
Device parse_device(const std::string& s);
bool is_floating(DType dt);

using Shape = std::vector<std::int64_t>;
// A tensor holds at most 2^59 elements, so that its size in bytes (up to 8 per element) and the
// element offsets kernels compute stay far from int64 overflow.
inline constexpr std::int64_t kMaxNumel = std::int64_t(1) << 59;
// The product of the dims. REQUIRES dims >= 0; Error(InvalidArgument) naming the shape when the
// product exceeds kMaxNumel.
std::int64_t numel(const Shape& s);
std::string shape_str(std::span<const std::int64_t> s);  // "[8, 10]"
// Bytes for people: "400 B", "3.12 KiB", "1.5 MiB" (three significant digits).
std::string format_bytes(std::uint64_t bytes);

// Times work queued on a device's stream (CUDA events): start() and stop() queue a marker
// before and after the work and return or take its token; elapsed_s() waits until the stop
// marker has passed, returns the seconds between the markers and frees the token. A timer belongs
// to the thread (the stream) that made it. The tracer holds tokens between an event and the end
// of its iteration, so a record of device work carries the device's time, not the host's
// enqueue time.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  virtual std::uint32_t start() = 0;
  virtual void stop(std::uint32_t token) = 0;
  virtual double elapsed_s(std::uint32_t token) = 0;
};

enum class ErrorCode : int {
  InvalidArgument = 1,
  ShapeMismatch = 2,
  Unsupported = 3,
  Backend = 4,
  Io = 5,
  Internal = 6,
  Aborted = 7,
};
const char* error_code_name(ErrorCode c);

// The one exception type of commtrace. Messages name the op, the value and the valid range.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// " (did you mean 'transformer'?)" for the known name closest to `given` (Damerau-Levenshtein,
// within a third of its length, at least 1), "" when none is close. For error messages.
std::string did_you_mean(std::string_view given, std::span<const std::string> known);

// Throws Error(code, fmt::format(...)) when cond is false.
#define COMMTRACE_CHECK(cond, code, ...)                                     \
  do {                                                                       \
    if (!(cond)) throw ::commtrace::Error((code), fmt::format(__VA_ARGS__)); \
  } while (0)

// bfloat16 storage: the upper 16 bits of an IEEE float; conversion rounds to nearest even.
struct BF16 {
  std::uint16_t bits = 0;
};

inline float bf16_to_float(BF16 v) {
  std::uint32_t u = std::uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline BF16 float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return BF16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};  // quiet NaN stays NaN
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return BF16{static_cast<std::uint16_t>(u >> 16)};
}

}  // namespace commtrace
