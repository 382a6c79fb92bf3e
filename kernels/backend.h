// The device seam: every kernel the runtime runs, on raw contiguous row-major buffers of one
// device, behind one table per device type. The op layer calls kernels_for(device) and nothing
// else of kernels/ (no backend's functions directly); every backend is tested against the naive
// reference in kernels/reference.h. Not a tensor library: no shapes are checked here beyond what
// only a kernel can see (an index or target out of range); callers validate arguments.
//
// Dtypes. `dt` is the storage dtype of the floating buffers of a call: f32, f64 or bf16 (bf16 is
// computed in f32 inside each backend and rounded once when stored). Buffers documented as "acc"
// (saved statistics, attention probabilities, dropout masks, optimizer state) hold
// acc_dtype(dt): f64 for f64, f32 otherwise. Index buffers are i64.
//
// Devices. cpu: OpenBLAS GEMM, the reference loops elsewhere. meta: every kernel is a no-op and
// allocate() returns null (shapes only, no data). cuda: cuBLAS GEMM and the kernels of
// kernels/cuda/, queued on the calling thread's stream (kernels/cuda_backend.cpp);
// kernels_for(Device::CUDA) throws Unsupported in a build without CUDA or with no device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "kernels/base.h"

namespace commtrace {

using i64 = std::int64_t;

DType acc_dtype(DType dt);  // f64 for f64, f32 otherwise

enum class BinaryOp : int { Add = 0, Sub = 1, Mul = 2, Div = 3 };

// C (batch, m, n) = [bias +] op(A) @ op(B), row-major; op(A) is (m, k), op(B) is (k, n).
// A, B, C of batch b start at b * stride_{a,b,c} elements. lda/ldb are the leading dims of the
// STORED (untransposed) matrices, ldc of C. bias (optional, 2-d only: batch == 1) holds bias_rows
// rows of n elements: 1 (broadcast over rows) or m. k == 0 gives C = bias (or 0).
struct GemmArgs {
  DType dt = DType::F32;
  bool trans_a = false, trans_b = false;
  i64 batch = 1, m = 0, n = 0, k = 0;
  const void* a = nullptr;
  i64 lda = 0, stride_a = 0;
  const void* b = nullptr;
  i64 ldb = 0, stride_b = 0;
  void* c = nullptr;
  i64 ldc = 0, stride_c = 0;
  const void* bias = nullptr;
  i64 bias_rows = 0;
  bool allow_tf32 = false;  // CUDA only: TF32 tensor cores for f32 when asked
};

// Adam/AdamW hyper-parameters of one step; step counts from 1. AdamW decays decoupled:
// p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps).
struct AdamWArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  i64 step = 1;
};

// SGD: g' = g + wd * p; with momentum > 0: m = momentum * m + g' (first step: m = g'),
// p -= lr * m; else p -= lr * g'.
struct SgdArgs {
  double lr = 1e-3, momentum = 0.0, weight_decay = 0.0;
  bool first_step = true;
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Device device() const = 0;
  // Returns when the work this thread queued has finished (a no-op where kernels run inline):
  // before another thread reads or writes the buffers.
  virtual void synchronize() const = 0;
  // The calling thread's timer of its stream; null where kernels run inline (cpu, meta), whose
  // work the host clock times.
  virtual DeviceTimer* timer() const { return nullptr; }

  // ---- devices of this type and the calling thread's ----
  virtual int device_count() const { return 1; }
  // The ordinal the calling thread's buffers and kernels use (cuda: 0 until set).
  virtual int current_ordinal() const { return 0; }
  // REQUIRES: 0 <= ordinal < device_count(), before the thread's first buffer or kernel on this
  // device type (one device per thread); Error(InvalidArgument) otherwise.
  virtual void set_current_ordinal(int ordinal) const;
  // The calling thread's stream as the device API's handle (cuda: a cudaStream_t), for a
  // communicator that queues work beside the kernels (NCCL); null where kernels run inline.
  virtual void* native_stream() const { return nullptr; }

  // ---- memory (device buffers; ordinal selects the device of that type) ----
  // REQUIRES: bytes > 0 for a non-null result. Throws Backend when out of memory.
  virtual void* allocate(std::size_t bytes, int ordinal) const = 0;
  virtual void deallocate(void* p, std::size_t bytes, int ordinal) const = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) const = 0;  // on the device
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) const = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) const = 0;
  // Element conversion between any two storage dtypes (f32, f64, bf16, i64); n elements.
  virtual void convert(const void* in, DType in_dt, void* out, DType out_dt, i64 n) const = 0;
  virtual void fill(DType dt, void* out, double value, i64 n) const = 0;  // any dtype

  // ---- GEMM ----
  virtual void gemm(const GemmArgs& g) const = 0;

  // ---- elementwise (dt floating) ----
  // out = a (op) b with NumPy broadcasting: a_shape and b_shape are right-aligned against
  // out_shape (its rank >= both); a size-1 dim broadcasts.
  virtual void binary(DType dt, BinaryOp op, const void* a, const Shape& a_shape, const void* b,
                      const Shape& b_shape, void* out, const Shape& out_shape) const = 0;
  // out (target_shape) = in (in_shape) summed over the dims broadcasting expanded: the reverse
  // of broadcasting target_shape to in_shape.
  virtual void sum_to(DType dt, const void* in, const Shape& in_shape, void* out,
                      const Shape& target_shape) const = 0;
  virtual void scale(DType dt, const void* x, double s, void* out, i64 n) const = 0;       // s*x
  virtual void add_scalar(DType dt, const void* x, double s, void* out, i64 n) const = 0;  // x+s
  virtual void relu_forward(DType dt, const void* x, void* out, i64 n) const = 0;
  virtual void relu_backward(DType dt, const void* grad_out, const void* x, void* grad_in,
                             i64 n) const = 0;  // grad where x > 0
  // Exact GELU, x * Phi(x) (PyTorch's default).
  virtual void gelu_forward(DType dt, const void* x, void* out, i64 n) const = 0;
  virtual void gelu_backward(DType dt, const void* grad_out, const void* x, void* grad_in,
                             i64 n) const = 0;
  // SiLU, x * sigmoid(x) (the gate of a SwiGLU feed-forward).
  virtual void silu_forward(DType dt, const void* x, void* out, i64 n) const = 0;
  virtual void silu_backward(DType dt, const void* grad_out, const void* x, void* grad_in,
                             i64 n) const = 0;
  // Counter-based dropout: element i of stream `seed` is kept with probability 1 - p and scaled
  // by 1/(1-p); the same (seed, i) always decides the same. mask (acc) holds the applied scale.
  virtual void dropout_forward(DType dt, const void* x, void* out, void* mask, i64 n, double p,
                               std::uint64_t seed) const = 0;
  // grad_in = grad_out * mask (mask in acc).
  virtual void dropout_backward(DType dt, const void* grad_out, const void* mask, void* grad_in,
                                i64 n) const = 0;

  // ---- row-wise over the last dim: x is (rows, cols) ----
  virtual void softmax_forward(DType dt, const void* x, void* out, i64 rows, i64 cols) const = 0;
  // grad_in = out * (grad_out - sum(grad_out * out)) per row.
  virtual void softmax_backward(DType dt, const void* grad_out, const void* out, void* grad_in,
                                i64 rows, i64 cols) const = 0;
  // out = (x - mean) * rstd * w + b; mean and rstd (rows, acc) are saved. w, b (cols) or null.
  virtual void layernorm_forward(DType dt, const void* x, const void* w, const void* b, void* out,
                                 void* mean, void* rstd, i64 rows, i64 cols, double eps) const = 0;
  // Overwrites grad_x, and grad_w / grad_b (cols, dtype dt) when not null.
  virtual void layernorm_backward(DType dt, const void* grad_out, const void* x, const void* w,
                                  const void* mean, const void* rstd, void* grad_x, void* grad_w,
                                  void* grad_b, i64 rows, i64 cols) const = 0;

  // RMSNorm: out = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps) per row (rows, acc)
  // saved; w (cols) or null.
  virtual void rmsnorm_forward(DType dt, const void* x, const void* w, void* out, void* rstd,
                               i64 rows, i64 cols, double eps) const = 0;
  // Overwrites grad_x, and grad_w (cols, dtype dt) when not null.
  virtual void rmsnorm_backward(DType dt, const void* grad_out, const void* x, const void* w,
                                const void* rstd, void* grad_x, void* grad_w, i64 rows,
                                i64 cols) const = 0;

  // ---- reductions: x viewed as (outer, dim, inner) ----
  virtual void sum_dim(DType dt, const void* x, void* out, i64 outer, i64 dim,
                       i64 inner) const = 0;                                  // out (outer, inner)
  virtual void sum_all(DType dt, const void* x, void* out, i64 n) const = 0;  // out: 1 element

  // ---- embedding ----
  // out (n, dim) = rows of weight for idx. weight holds rows [row_begin, row_begin + rows) of the
  // full table of `vocab` rows; an index outside that range gives a zero row (the masked lookup
  // of a row-sharded table); an index < 0 or >= vocab throws InvalidArgument.
  virtual void embedding_forward(DType dt, const i64* idx, i64 n, const void* weight, i64 row_begin,
                                 i64 rows, i64 vocab, i64 dim, void* out) const = 0;
  // grad_weight (rows, dim) = the grad_out rows scattered and summed by index, masked the same
  // way (overwritten).
  virtual void embedding_backward(DType dt, const void* grad_out, const i64* idx, i64 n,
                                  void* grad_weight, i64 row_begin, i64 rows, i64 dim) const = 0;

  // ---- scaled-dot-product attention: q, k, v, out (bh, t, d); probs (bh, t, t) acc ----
  virtual void attention_forward(DType dt, const void* q, const void* k, const void* v, void* out,
                                 void* probs, i64 bh, i64 t, i64 d, double scale,
                                 bool causal) const = 0;
  // Overwrites grad_q, grad_k, grad_v.
  virtual void attention_backward(DType dt, const void* grad_out, const void* q, const void* k,
                                  const void* v, const void* probs, void* grad_q, void* grad_k,
                                  void* grad_v, i64 bh, i64 t, i64 d, double scale) const = 0;

  // ---- blockwise (ring) attention, as kernels/reference.h states: q, out (bh, tq, d); k, v
  // (bh, tk, d); lse (bh, tq) acc; positions q_pos, k_pos for the causal mask ----
  virtual void attention_block_forward(DType dt, const void* q, const void* k, const void* v,
                                       void* out, void* lse, i64 bh, i64 tq, i64 tk, i64 d,
                                       double scale, bool causal, i64 q_pos, i64 k_pos) const = 0;
  // In place on out (rows, d) and lse (rows, acc).
  virtual void attention_merge(DType dt, void* out, void* lse, const void* out_b, const void* lse_b,
                               i64 rows, i64 d) const = 0;
  // Overwrites grad_q, grad_k, grad_v.
  virtual void attention_block_backward(DType dt, const void* grad_out, const void* q,
                                        const void* k, const void* v, const void* out,
                                        const void* lse, void* grad_q, void* grad_k, void* grad_v,
                                        i64 bh, i64 tq, i64 tk, i64 d, double scale, bool causal,
                                        i64 q_pos, i64 k_pos) const = 0;

  // ---- cross-entropy as PyTorch decomposes it: log_softmax, then the mean negative
  // log-likelihood. x, out (rows, cols); logp (n, c), targets (n) in [0, c) else throws ----
  // out = x - max - log(sum(exp(x - max))) per row.
  virtual void log_softmax_forward(DType dt, const void* x, void* out, i64 rows,
                                   i64 cols) const = 0;
  // grad_in = grad_out - exp(out) * sum(grad_out) per row.
  virtual void log_softmax_backward(DType dt, const void* grad_out, const void* out, void* grad_in,
                                    i64 rows, i64 cols) const = 0;
  // loss (1 element, dt) = -mean over rows of logp[r, targets[r]].
  virtual void nll_loss_forward(DType dt, const void* logp, const i64* targets, i64 n, i64 c,
                                void* loss) const = 0;
  // grad_logp = -grad_loss / n at each row's target, 0 elsewhere; grad_loss: 1 element, dt.
  virtual void nll_loss_backward(DType dt, const void* grad_loss, const i64* targets,
                                 void* grad_logp, i64 n, i64 c) const = 0;

  // ---- cross-entropy over a class shard (PyTorch's loss_parallel): logits (n, c) hold classes
  // [col_begin, col_begin + c) of rows of `vocab` classes; max, sumexp, picked (n) in acc. The
  // caller reduces each statistic over the shards between the calls (max: Max; sumexp, picked:
  // Sum). ----
  // max[r] = max_j logits[r, j] (-infinity when c == 0).
  virtual void ce_shard_max(DType dt, const void* logits, i64 n, i64 c, void* max) const = 0;
  // With the global max: sumexp[r] = sum_j exp(logits[r, j] - max[r]); picked[r] = the logit of
  // target t = targets[r] when t falls in the shard, else 0. A target outside [0, vocab) throws.
  virtual void ce_shard_stats(DType dt, const void* logits, const i64* targets, const void* max,
                              i64 n, i64 c, i64 col_begin, i64 vocab, void* sumexp,
                              void* picked) const = 0;
  // loss (1 element, dt) = mean over the n rows of max + log(sumexp) - picked.
  virtual void ce_shard_loss(DType dt, const void* max, const void* sumexp, const void* picked,
                             i64 n, void* loss) const = 0;
  // grad_logits = grad_loss / n * (exp(logits - max) / sumexp - [column is the target]);
  // grad_loss: 1 element, dt.
  virtual void ce_shard_backward(DType dt, const void* grad_loss, const void* logits,
                                 const i64* targets, const void* max, const void* sumexp, i64 n,
                                 i64 c, i64 col_begin, void* grad_logits) const = 0;

  // ---- layout: data movement of any storage dtype (i64 included) ----
  // out = in permuted: out dim i is in dim perm[i]; shapes are the input's.
  virtual void permute(DType dt, const void* in, const Shape& in_shape, const int* perm,
                       void* out) const = 0;
  // out = in[..., start:start+len, ...] along dim.
  virtual void narrow(DType dt, const void* in, const Shape& in_shape, int dim, i64 start, i64 len,
                      void* out) const = 0;
  // dst[..., start:start+src_len, ...] = src along dim (the rest of dst untouched).
  virtual void narrow_scatter(DType dt, const void* src, const Shape& src_shape, int dim, i64 start,
                              void* dst, const Shape& dst_shape) const = 0;

  // ---- optimizers: one fused in-place update per parameter; p, g in dt (f32 or f64) ----
  virtual void sgd_step(DType dt, void* p, const void* g, void* momentum_buf, i64 n,
                        const SgdArgs& a) const = 0;
  virtual void adamw_step(DType dt, void* p, const void* g, void* m, void* v, i64 n,
                          const AdamWArgs& a) const = 0;

  // ---- collectives' arithmetic (the threads backend over this device's buffers) ----
  // dsts[j][i] = reduce over s = 0..n_srcs-1, in that order, of srcs[s][i], for i in
  // [begin, end), in every dtype (bf16 reduced in f32, i64 exactly; Avg divides by n_srcs). A dst
  // may alias a src: each block of every source is read before it is written. op is Sum, Avg
  // or Max.
  virtual void reduce(DType dt, ReduceOp op, const void* const* srcs, int n_srcs, void* const* dsts,
                      int n_dsts, i64 begin, i64 end) const = 0;
};

// Host memory: the cpu backend's storage live in this process (every rank's thread) may not
// exceed the limit; an allocation past it throws Backend (instead of the kernel killing an
// overcommitted process). By default the limit is what the machine could give when the process
// started (MemAvailable, within the cgroup's limit), shared by the MPI job's processes on the
// machine, less 1/16 for the memory beside tensor storage; 0 restores the default.
std::uint64_t host_memory_limit();
void set_host_memory_limit(std::uint64_t bytes);
std::uint64_t host_memory_held();
// Throws that Backend error when `bytes` more would pass the limit; `need` names what asks for
// them (the message goes on "would hold X GiB of host memory, more than ...").
void check_host_room(std::uint64_t bytes, std::string_view need);

// The kernels of a device type. Throws Unsupported for a device this build has no kernels for.
const Kernels& kernels_for(Device d);
// True when this build has kernels for the device type and (cuda) a device is visible.
bool has_kernels(Device d);
// Why has_kernels(d) is false ("" when it is true), for messages and skipped tests.
std::string kernels_unavailable_reason(Device d);

// A library a backend loads on first use instead of linking it (cuBLAS, NCCL: linked, their size
// and initializers would land in every process). Opens the first of `paths` that loads
// (RTLD_NOW | RTLD_LOCAL; never closed). Errors are Unsupported and start with `who`:
// "{who}: cannot load {name} ({each path's error}); {hint}", "{who}: the {name} library has no
// {symbol}".
class LoadedLibrary {
 public:
  LoadedLibrary(std::initializer_list<const char*> paths, std::string who, std::string name,
                std::string_view hint);
  template <class F>
  F symbol(const char* s) const {
    return reinterpret_cast<F>(raw_symbol(s));
  }

 private:
  void* raw_symbol(const char* s) const;
  void* handle_ = nullptr;
  std::string who_, name_;
};

}  // namespace commtrace
