#include "kernels/base.h"

#include <algorithm>

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

}  // namespace commtrace
