#include "parallel/tensor/random.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace commtrace {

std::uint64_t Generator::next_u64() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Generator::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

double Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2.0 * M_PI * u2);
  has_spare_ = true;
  return r * std::cos(2.0 * M_PI * u2);
}

namespace {
// The tensor first (its allocation is what may fail), then its values drawn in order a chunk
// at a time: host memory stays bounded however large the tensor.
template <class T, class F>
Tensor generate(const Shape& shape, DType dtype, Device device, F draw) {
  Tensor t = Tensor::empty(shape, dtype, device);
  if (device == Device::Meta) return t;
  const std::int64_t n = t.numel();
  std::vector<T> v(std::size_t(std::min(n, Tensor::kHostChunk)));
  for (std::int64_t done = 0; done < n; done += Tensor::kHostChunk) {
    const std::int64_t k = std::min(Tensor::kHostChunk, n - done);
    for (std::int64_t i = 0; i < k; ++i) v[std::size_t(i)] = draw();
    t.write_host(done, v.data(), std::is_same_v<T, double> ? DType::F64 : DType::I64, k);
  }
  return t;
}
}  // namespace

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  return generate<double>(shape, dtype, device, [&] { return gen.normal(); });
}

Tensor rand_uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype,
                    Device device) {
  return generate<double>(shape, dtype, device, [&] { return lo + (hi - lo) * gen.uniform(); });
}

Tensor randint(const Shape& shape, std::int64_t lo, std::int64_t hi, Generator& gen,
               Device device) {
  COMMTRACE_CHECK(hi > lo, ErrorCode::InvalidArgument, "randint: empty range [{}, {})", lo, hi);
  return generate<std::int64_t>(shape, DType::I64, device, [&] {
    return lo + std::int64_t(gen.next_u64() % std::uint64_t(hi - lo));
  });
}

}  // namespace commtrace
