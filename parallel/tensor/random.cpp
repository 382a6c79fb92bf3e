#include "parallel/tensor/random.h"

#include <cmath>
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
template <class F>
Tensor generate(const Shape& shape, DType dtype, Device device, F draw) {
  if (device == Device::Meta) return Tensor::empty(shape, dtype, device);
  std::vector<double> v(std::size_t(numel(shape)));
  for (double& x : v) x = draw();
  return Tensor::from_vector(v, shape, dtype, device);
}
}  // namespace

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  return generate(shape, dtype, device, [&] { return gen.normal(); });
}

Tensor rand_uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype,
                    Device device) {
  return generate(shape, dtype, device, [&] { return lo + (hi - lo) * gen.uniform(); });
}

Tensor randint(const Shape& shape, std::int64_t lo, std::int64_t hi, Generator& gen,
               Device device) {
  COMMTRACE_CHECK(hi > lo, ErrorCode::InvalidArgument, "randint: empty range [{}, {})", lo, hi);
  if (device == Device::Meta) return Tensor::empty(shape, DType::I64, device);
  std::vector<std::int64_t> v(std::size_t(numel(shape)));
  for (auto& x : v) x = lo + std::int64_t(gen.next_u64() % std::uint64_t(hi - lo));
  return Tensor::from_indices(v, shape, device);
}

}  // namespace commtrace
