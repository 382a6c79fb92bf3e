// Internal to kernels/: the dtype dispatch every backend shares. f32 and f64 kernels work on the
// buffers themselves (Direct); bf16 is widened into f32 scratch before a kernel, and what it
// writes is rounded into the bf16 buffers once after it (Widened). Accumulator buffers (acc_dtype:
// statistics, optimizer moments) are already io's type, f32 for bf16, and are cast by the caller.
// A backend supplies its device side as the policy Dev:
//   static void convert(const void* src, DType from, void* dst, DType to, i64 n);
//   class Buffer { explicit Buffer(i64 n); float* data(); };  // n floats of scratch, not moved
//   static void launched(const char* kernel);                 // after a kernel was issued
//   static constexpr const char* kName;                       // "cpu", "cuda": for errors
#pragma once

#include <deque>
#include <vector>

#include "kernels/base.h"

namespace commtrace::dispatch {

// Error(Unsupported): "<kernel>: the <backend> backend does not support dtype <dt> (expected
// <expected>)".
[[noreturn]] inline void unsupported(const char* backend, const char* kernel, DType dt,
                                     const char* expected) {
  throw Error(ErrorCode::Unsupported,
              fmt::format("{}: the {} backend does not support dtype {} (expected {})", kernel,
                          backend, dtype_name(dt), expected));
}

template <typename T>
struct Direct {
  using type = T;
  const T* in(const void* p, i64) { return static_cast<const T*>(p); }
  T* out(void* p, i64) { return static_cast<T*>(p); }
  T* inout(void* p, i64) { return static_cast<T*>(p); }  // read and written in place
  void narrow() {}
};

// Null stays null.
template <class Dev>
class Widened {
 public:
  using type = float;
  const float* in(const void* p, i64 n) { return p ? widen(p, n) : nullptr; }
  float* out(void* p, i64 n) {
    if (!p) return nullptr;
    float* w = bufs_.emplace_back(n).data();
    outs_.push_back({w, p, n});
    return w;
  }
  float* inout(void* p, i64 n) {
    if (!p) return nullptr;
    float* w = widen(p, n);
    outs_.push_back({w, p, n});
    return w;
  }
  void narrow() {
    if (outs_.empty()) return;
    for (const Out& o : outs_) Dev::convert(o.wide, DType::F32, o.bf16, DType::BF16, o.n);
    Dev::launched("convert");
  }

 private:
  float* widen(const void* p, i64 n) {
    float* w = bufs_.emplace_back(n).data();
    Dev::convert(p, DType::BF16, w, DType::F32, n);
    Dev::launched("convert");
    return w;
  }
  struct Out {
    const float* wide;
    void* bf16;
    i64 n;
  };
  std::deque<typename Dev::Buffer> bufs_;  // a deque never moves its elements
  std::vector<Out> outs_;
};

// Runs f(io) with io the Direct or Widened view of dt's buffers: f32, f64 or bf16.
template <class Dev, typename F>
void floating(const char* kernel, DType dt, F&& f) {
  switch (dt) {
    case DType::F32: {
      Direct<float> io;
      f(io);
      return Dev::launched(kernel);
    }
    case DType::F64: {
      Direct<double> io;
      f(io);
      return Dev::launched(kernel);
    }
    case DType::BF16: {
      Widened<Dev> io;
      f(io);
      Dev::launched(kernel);
      return io.narrow();
    }
    case DType::I64:
      break;
  }
  unsupported(Dev::kName, kernel, dt, "f32, f64 or bf16");
}

template <typename T>
T* acc(void* p) {
  return static_cast<T*>(p);
}
template <typename T>
const T* acc(const void* p) {
  return static_cast<const T*>(p);
}

}  // namespace commtrace::dispatch
