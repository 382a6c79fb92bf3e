// The meta backend: tensors of shapes and dtypes only. Every kernel is a no-op and allocate()
// returns null, so a whole model runs on meta with no data and no allocation. Internal: callers
// reach it through kernels_for(Device::Meta).
#include "kernels/backend.h"

namespace commtrace {
namespace {

class MetaKernels final : public Kernels {
 public:
  Device device() const override { return Device::Meta; }
  void synchronize() const override {}

  void* allocate(std::size_t, int) const override { return nullptr; }
  void deallocate(void*, std::size_t, int) const override {}
  void copy(void*, const void*, std::size_t) const override {}
  void copy_from_host(void*, const void*, std::size_t) const override {}
  void copy_to_host(void*, const void*, std::size_t) const override {}
  void convert(const void*, DType, void*, DType, i64) const override {}
  void fill(DType, void*, double, i64) const override {}

  void gemm(const GemmArgs&) const override {}

  void binary(DType, BinaryOp, const void*, const Shape&, const void*, const Shape&, void*,
              const Shape&) const override {}
  void sum_to(DType, const void*, const Shape&, void*, const Shape&) const override {}
  void scale(DType, const void*, double, void*, i64) const override {}
  void add_scalar(DType, const void*, double, void*, i64) const override {}
  void relu_forward(DType, const void*, void*, i64) const override {}
  void relu_backward(DType, const void*, const void*, void*, i64) const override {}
  void gelu_forward(DType, const void*, void*, i64) const override {}
  void gelu_backward(DType, const void*, const void*, void*, i64) const override {}
  void silu_forward(DType, const void*, void*, i64) const override {}
  void silu_backward(DType, const void*, const void*, void*, i64) const override {}
  void dropout_forward(DType, const void*, void*, void*, i64, double,
                       std::uint64_t) const override {}
  void dropout_backward(DType, const void*, const void*, void*, i64) const override {}

  void softmax_forward(DType, const void*, void*, i64, i64) const override {}
  void softmax_backward(DType, const void*, const void*, void*, i64, i64) const override {}
  void layernorm_forward(DType, const void*, const void*, const void*, void*, void*, void*, i64,
                         i64, double) const override {}
  void layernorm_backward(DType, const void*, const void*, const void*, const void*, const void*,
                          void*, void*, void*, i64, i64) const override {}
  void rmsnorm_forward(DType, const void*, const void*, void*, void*, i64, i64,
                       double) const override {}
  void rmsnorm_backward(DType, const void*, const void*, const void*, const void*, void*, void*,
                        i64, i64) const override {}
  void sum_dim(DType, const void*, void*, i64, i64, i64) const override {}
  void sum_all(DType, const void*, void*, i64) const override {}

  void embedding_forward(DType, const i64*, i64, const void*, i64, i64, i64, i64,
                         void*) const override {}
  void embedding_backward(DType, const void*, const i64*, i64, void*, i64, i64,
                          i64) const override {}
  void attention_forward(DType, const void*, const void*, const void*, void*, void*, i64, i64, i64,
                         double, bool) const override {}
  void attention_backward(DType, const void*, const void*, const void*, const void*, const void*,
                          void*, void*, void*, i64, i64, i64, double) const override {}
  void attention_block_forward(DType, const void*, const void*, const void*, void*, void*, i64, i64,
                               i64, i64, double, bool, i64, i64) const override {}
  void attention_merge(DType, void*, void*, const void*, const void*, i64, i64) const override {}
  void attention_block_backward(DType, const void*, const void*, const void*, const void*,
                                const void*, const void*, void*, void*, void*, i64, i64, i64, i64,
                                double, bool, i64, i64) const override {}
  void log_softmax_forward(DType, const void*, void*, i64, i64) const override {}
  void log_softmax_backward(DType, const void*, const void*, void*, i64, i64) const override {}
  void nll_loss_forward(DType, const void*, const i64*, i64, i64, void*) const override {}
  void nll_loss_backward(DType, const void*, const i64*, void*, i64, i64) const override {}
  void ce_shard_max(DType, const void*, i64, i64, void*) const override {}
  void ce_shard_stats(DType, const void*, const i64*, const void*, i64, i64, i64, i64, void*,
                      void*) const override {}
  void ce_shard_loss(DType, const void*, const void*, const void*, i64, void*) const override {}
  void ce_shard_backward(DType, const void*, const void*, const i64*, const void*, const void*, i64,
                         i64, i64, void*) const override {}

  void permute(DType, const void*, const Shape&, const int*, void*) const override {}
  void narrow(DType, const void*, const Shape&, int, i64, i64, void*) const override {}
  void narrow_scatter(DType, const void*, const Shape&, int, i64, void*,
                      const Shape&) const override {}

  void sgd_step(DType, void*, const void*, void*, i64, const SgdArgs&) const override {}
  void adamw_step(DType, void*, const void*, void*, void*, i64, const AdamWArgs&) const override {}

  void reduce(DType, ReduceOp, const void* const*, int, void* const*, int, i64,
              i64) const override {}
};

}  // namespace

// The one instance behind kernels_for(Device::Meta) (kernels/backend.cpp).
const Kernels& meta_backend() {
  static const MetaKernels k;
  return k;
}

}  // namespace commtrace
