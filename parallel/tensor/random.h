// Deterministic random numbers: a splitmix64 stream with Box-Muller normals, the same on every
// platform, and tensor factories on top. On meta tensors nothing is drawn.
#pragma once

#include <cstdint>

#include "parallel/tensor/tensor.h"

namespace commtrace {

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();   // N(0, 1)

 private:
  std::uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::F32,
             Device device = Device::CPU);
Tensor rand_uniform(const Shape& shape, double lo, double hi, Generator& gen,
                    DType dtype = DType::F32, Device device = Device::CPU);
// i64 values in [lo, hi).
Tensor randint(const Shape& shape, std::int64_t lo, std::int64_t hi, Generator& gen,
               Device device = Device::CPU);

}  // namespace commtrace
