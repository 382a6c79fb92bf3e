// Tensor: a shared handle to contiguous row-major storage on one device (cpu, meta, cuda slot),
// with autograd state. Views share storage and differ in offset and shape. A meta tensor has a
// shape and dtype and no storage. The DTensor layer (later) rides on `dist`.
// Ops on tensors live in parallel/ops.h; this file holds construction and access only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base.h"
#include "tracer/tracer.h"

namespace commtrace {

// Bytes on one device (a type and an ordinal: which GPU), allocated and freed through
// kernels_for(device) with that ordinal. Owner of the allocation; counts every allocation for
// tests. The stream slot names the device stream whose queued work last wrote the bytes (null:
// the default stream; always null on cpu): a backend with streams waits on it before it reads
// the bytes on another stream.
class Storage {
 public:
  // ordinal < 0: the calling thread's current device of that type (a rank's GPU).
  Storage(std::size_t bytes, Device device, int ordinal = -1);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  int ordinal() const { return ordinal_; }
  void* stream() const { return stream_; }
  void set_stream(void* s) { stream_ = s; }

  static std::uint64_t allocations();  // data allocations since start, all threads

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  int ordinal_ = 0;
  void* stream_ = nullptr;
};

struct Node;
struct MemoryCharge;  // parallel/tensor/memory.h
struct DistSpec;      // parallel/dtensor.h
struct ShardOrigin;   // parallel/dtensor.h

// shape is fixed once the tensor is handed out (the trace caches its interned id).
struct TensorImpl {
  std::shared_ptr<Storage> storage;  // null on meta
  std::int64_t offset = 0;           // in elements
  Shape shape;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;         // null for leaves and for tensors outside autograd
  std::shared_ptr<const DistSpec> dist;  // set on a DTensor: this impl is the local shard
  // Set on a local tensor that to_local() took from a DTensor (and kept by same-shape ops on
  // it): lets from_local() recover an uneven global shape without a collective.
  std::shared_ptr<const ShardOrigin> origin;
  TraceSlot trace_slot;                  // its argument in the tracer that last recorded it
  std::shared_ptr<MemoryCharge> charge;  // with a MemoryLedger active: this allocation's bytes
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialized storage (zeros on meta: nothing).
  static Tensor empty(Shape shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device::CPU);
  // REQUIRES: values.size() == numel(shape). Stored as `dtype` (converted).
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor from_indices(const std::vector<std::int64_t>& values, const Shape& shape,
                             Device device = Device::CPU);
  // Elements staged on the host per transfer, so no host copy of a large tensor is made.
  static constexpr std::int64_t kHostChunk = 1 << 16;
  // Writes n host values of host_dt (f64 or i64, converted to the tensor's dtype) into elements
  // [at, at + n), staged kHostChunk at a time (any device; nothing on meta).
  void write_host(std::int64_t at, const void* host, DType host_dt, std::int64_t n) const;

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  const Shape& shape() const { return checked().shape; }
  int dim() const { return int(shape().size()); }
  std::int64_t size(int d) const;  // negative d counts from the end
  std::int64_t numel() const { return commtrace::numel(shape()); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().device; }
  bool is_meta() const { return device() == Device::Meta; }

  // Typed access to the elements; REQUIRES: cpu and sizeof(T) == dtype size.
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data(sizeof(T)));
  }
  void* raw_data(std::size_t elem_size) const;
  // The elements on their device, for kernels_for(device()); null on meta. Not for host access.
  void* data_ptr() const;

  std::vector<double> to_vector() const;  // any dtype (tests and printing)
  double item() const;                    // REQUIRES: one element

  bool requires_grad() const { return checked().requires_grad; }
  Tensor& set_requires_grad(bool on);  // REQUIRES: a leaf, floating dtype
  bool is_leaf() const { return checked().grad_fn == nullptr; }
  Tensor grad() const;
  void set_grad(const Tensor& g);
  Node* grad_fn() const { return checked().grad_fn.get(); }

  // A new handle on the same storage (and DTensor spec), outside autograd.
  Tensor detach() const;
  // Reverse-mode autograd from this tensor; with no gradient it must hold one element.
  void backward(const Tensor& grad = Tensor()) const;

 private:
  const TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

// A name for error messages: "f32[8, 10]".
std::string describe(const Tensor& t);

}  // namespace commtrace
