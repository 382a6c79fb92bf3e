#include "kernels/base.h"

#include <algorithm>
#include <vector>

namespace commtrace {

std::size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
    case DType::BF16:
      return 2;
    case DType::I64:
      return 8;
  }
  throw Error(ErrorCode::Internal, fmt::format("dtype_size: unknown dtype {}", int(dt)));
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::BF16:
      return "bf16";
    case DType::I64:
      return "i64";
  }
  return "?";
}

const char* device_name(Device d) {
  switch (d) {
    case Device::CPU:
      return "cpu";
    case Device::Meta:
      return "meta";
    case Device::CUDA:
      return "cuda";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp r) {
  switch (r) {
    case ReduceOp::None:
      return "";
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I64}) {
    if (s == dtype_name(dt)) return dt;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("unknown dtype '{}' (expected f32, f64, bf16 or i64)", s));
}

Device parse_device(const std::string& s) {
  for (Device d : {Device::CPU, Device::Meta, Device::CUDA}) {
    if (s == device_name(d)) return d;
  }
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("unknown device '{}' (expected cpu, meta or cuda)", s));
}

bool is_floating(DType dt) { return dt != DType::I64; }

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  bool over = false;
  for (auto d : s) {
    over = over || __builtin_mul_overflow(n, d, &n) || n > kMaxNumel;
  }
  // A zero dim makes an overflowed prefix harmless: the tensor is empty.
  if (over && std::find(s.begin(), s.end(), 0) == s.end()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("shape {} has more than 2^59 elements", shape_str(s)));
  }
  return over ? 0 : n;
}

std::string format_bytes(std::uint64_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (b < 1024) return fmt::format("{} B", b);
  double v = double(b);
  int u = 0;
  // Past 999.5 three digits would print in exponent form: go to the next unit.
  while (v >= 999.5 && u < 6) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.3g} {}", v, units[u]);
}

std::string shape_str(std::span<const std::int64_t> s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

const char* error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::InvalidArgument:
      return "InvalidArgument";
    case ErrorCode::ShapeMismatch:
      return "ShapeMismatch";
    case ErrorCode::Unsupported:
      return "Unsupported";
    case ErrorCode::Backend:
      return "Backend";
    case ErrorCode::Io:
      return "Io";
    case ErrorCode::Internal:
      return "Internal";
    case ErrorCode::Aborted:
      return "Aborted";
  }
  return "?";
}

std::string did_you_mean(std::string_view given, std::span<const std::string> known) {
  // Optimal string alignment distance: insertions, deletions, substitutions, adjacent swaps.
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  if (given.empty() || given.size() > 256) return "";
  const std::size_t limit = std::max<std::size_t>(1, given.size() / 3);
  std::size_t best = limit + 1;
  const std::string* match = nullptr;
  for (const std::string& k : known) {
    if (k.size() > 256) continue;
    const std::size_t dist = distance(given, k);
    if (dist < best) best = dist, match = &k;
  }
  return match ? fmt::format(" (did you mean '{}'?)", *match) : "";
}

}  // namespace commtrace
