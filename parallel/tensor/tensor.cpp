#include "parallel/tensor/tensor.h"

#include <algorithm>

#include "kernels/backend.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/memory.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {
std::atomic<std::uint64_t> g_allocations{0};
}

Storage::Storage(std::size_t bytes, Device device, int ordinal)
    : bytes_(bytes),
      device_(device),
      ordinal_(ordinal >= 0 ? ordinal : kernels_for(device).current_ordinal()) {
  data_ = kernels_for(device).allocate(bytes, ordinal_);
  g_allocations.fetch_add(1, std::memory_order_relaxed);
}

Storage::~Storage() { kernels_for(device_).deallocate(data_, bytes_, ordinal_); }

std::uint64_t Storage::allocations() { return g_allocations.load(std::memory_order_relaxed); }

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (auto d : shape) {
    COMMTRACE_CHECK(d >= 0, ErrorCode::InvalidArgument, "empty: negative dim in shape {}",
                    shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  const std::size_t bytes = std::size_t(commtrace::numel(shape)) * dtype_size(dtype);
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  impl->device = device;
  if (device != Device::Meta) impl->storage = std::make_shared<Storage>(bytes, device);
  if (MemoryLedger* m = MemoryLedger::current()) {
    const Tracer* tr = Tracer::current();
    impl->charge = m->charge(bytes, tr ? tr->current_module() : 0);
  }
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  kernels_for(device).fill(dtype, t.data_ptr(), value, t.numel());
  return t;
}

void Tensor::write_host(std::int64_t at, const void* host, DType host_dt, std::int64_t n) const {
  const TensorImpl& t = checked();
  COMMTRACE_CHECK(at >= 0 && n >= 0 && at + n <= numel(), ErrorCode::InvalidArgument,
                  "write_host: elements [{}, {}) of a tensor of {}", at, at + n, numel());
  if (t.device == Device::Meta) return;
  const std::size_t in = dtype_size(host_dt), out = dtype_size(t.dtype);
  std::vector<unsigned char> staged(std::size_t(std::min(n, kHostChunk)) * out);
  const Kernels& cpu = kernels_for(Device::CPU);
  const Kernels& dev = kernels_for(t.device);
  for (std::int64_t done = 0; done < n; done += kHostChunk) {
    const std::int64_t k = std::min(kHostChunk, n - done);
    cpu.convert(static_cast<const unsigned char*>(host) + std::size_t(done) * in, host_dt,
                staged.data(), t.dtype, k);
    dev.copy_from_host(static_cast<unsigned char*>(data_ptr()) + std::size_t(at + done) * out,
                       staged.data(), std::size_t(k) * out);
  }
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype,
                           Device device) {
  COMMTRACE_CHECK(std::int64_t(values.size()) == commtrace::numel(shape), ErrorCode::ShapeMismatch,
                  "from_vector: {} values for shape {} ({} elements)", values.size(),
                  shape_str(shape), commtrace::numel(shape));
  Tensor t = empty(shape, dtype, device);
  t.write_host(0, values.data(), DType::F64, t.numel());
  return t;
}

Tensor Tensor::from_indices(const std::vector<std::int64_t>& values, const Shape& shape,
                            Device device) {
  COMMTRACE_CHECK(std::int64_t(values.size()) == commtrace::numel(shape), ErrorCode::ShapeMismatch,
                  "from_indices: {} values for shape {}", values.size(), shape_str(shape));
  Tensor t = empty(shape, DType::I64, device);
  t.write_host(0, values.data(), DType::I64, t.numel());
  return t;
}

const TensorImpl& Tensor::checked() const {
  COMMTRACE_CHECK(impl_ != nullptr, ErrorCode::InvalidArgument, "use of an undefined tensor");
  return *impl_;
}

std::int64_t Tensor::size(int d) const {
  const int n = dim();
  COMMTRACE_CHECK(d >= -n && d < n, ErrorCode::InvalidArgument,
                  "size: dim {} out of range for a {}-d tensor", d, n);
  return shape()[std::size_t(d < 0 ? d + n : d)];
}

void* Tensor::raw_data(std::size_t elem_size) const {
  const TensorImpl& t = checked();
  COMMTRACE_CHECK(t.dist == nullptr, ErrorCode::InvalidArgument,
                  "data: a DTensor has no data of its own; use to_local() or full_tensor()");
  COMMTRACE_CHECK(t.device == Device::CPU, ErrorCode::Unsupported,
                  "data: a {} tensor has no host data", device_name(t.device));
  COMMTRACE_CHECK(elem_size == dtype_size(t.dtype), ErrorCode::InvalidArgument,
                  "data: element size {} does not match dtype {}", elem_size, dtype_name(t.dtype));
  return static_cast<char*>(t.storage->data()) + t.offset * std::int64_t(elem_size);
}

void* Tensor::data_ptr() const {
  const TensorImpl& t = checked();
  COMMTRACE_CHECK(t.dist == nullptr, ErrorCode::InvalidArgument,
                  "data: a DTensor has no data of its own; use to_local() or full_tensor()");
  if (!t.storage) return nullptr;
  return static_cast<char*>(t.storage->data()) + t.offset * std::int64_t(dtype_size(t.dtype));
}

std::vector<double> Tensor::to_vector() const {
  COMMTRACE_CHECK(!is_meta(), ErrorCode::Unsupported, "to_vector: a meta tensor has no data ({})",
                  describe(*this));
  const std::int64_t n = numel();
  std::vector<unsigned char> staged(std::size_t(n) * dtype_size(dtype()));
  kernels_for(device()).copy_to_host(staged.data(), data_ptr(), staged.size());
  std::vector<double> out(static_cast<std::size_t>(n));
  kernels_for(Device::CPU).convert(staged.data(), dtype(), out.data(), DType::F64, n);
  return out;
}

double Tensor::item() const {
  COMMTRACE_CHECK(numel() == 1, ErrorCode::InvalidArgument,
                  "item: tensor {} has {} elements, expected 1", describe(*this), numel());
  return to_vector()[0];
}

Tensor& Tensor::set_requires_grad(bool on) {
  COMMTRACE_CHECK(is_leaf(), ErrorCode::InvalidArgument,
                  "set_requires_grad: only leaf tensors can be flagged ({})", describe(*this));
  COMMTRACE_CHECK(!on || is_floating(dtype()), ErrorCode::InvalidArgument,
                  "set_requires_grad: {} tensors cannot require grad", dtype_name(dtype()));
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return Tensor(checked().grad); }

void Tensor::set_grad(const Tensor& g) {
  checked();
  if (g.defined()) {
    COMMTRACE_CHECK(g.shape() == shape(), ErrorCode::ShapeMismatch,
                    "set_grad: gradient {} does not match tensor {}", describe(g), describe(*this));
  }
  impl_->grad = g.impl_ptr();
}

Tensor Tensor::detach() const {
  const TensorImpl& t = checked();
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage;
  impl->charge = t.charge;
  impl->offset = t.offset;
  impl->shape = t.shape;
  impl->dtype = t.dtype;
  impl->device = t.device;
  impl->dist = t.dist;
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& grad) const { run_backward(*this, grad); }

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format(
      "{}{}{}", dtype_name(t.dtype()), shape_str(t.shape()),
      t.device() == Device::CPU ? "" : fmt::format(" on {}", device_name(t.device())));
}

}  // namespace commtrace
