// The CUDA backend of the device seam: device memory from a caching allocator, one stream and one
// cuBLAS handle per calling thread (one stream per rank under the threads launcher), cuBLAS for
// the matrix products (row-major handled in gemm_rm alone), the kernels of kernels/cuda/ for the
// rest. bf16 is widened to f32 device scratch around every kernel but the GEMM, as the CPU backend
// does (cuBLAS multiplies bf16 with f32 accumulation itself). Internal: callers reach it through
// kernels_for(Device::CUDA).
//
// Ordering: every call is queued on the calling thread's stream; copies to and from the host
// return when the bytes have arrived. A thread that hands a buffer to another thread calls
// synchronize() first (the threads communicator does, around each collective).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/launch.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/math.h"

namespace commtrace {
namespace {

namespace cu = commtrace::cuda;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(ErrorCode::Backend,
                fmt::format("cuda: {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
  }
}

// cuBLAS, loaded on first use (a thread's first CUDA call): linked, its libraries would map
// ~220 MB and spend ~0.3 s in their initializers in every commtrace process, GPU or not. The
// library this build found is tried first, then the loader's search path.
struct CublasApi {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  // The C entry point (the header adds C++ overloads, so no decltype).
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void*, cudaDataType, int,
                                         long long, const void*, cudaDataType, int, long long,
                                         const void*, void*, cudaDataType, int, long long, int,
                                         cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

const CublasApi& cublas() {
  static const CublasApi api = [] {
    const LoadedLibrary lib({COMMTRACE_CUBLAS_LIBRARY, COMMTRACE_CUBLAS_SONAME}, "cuda", "cuBLAS",
                            "put " COMMTRACE_CUBLAS_SONAME " on LD_LIBRARY_PATH");
    CublasApi a;
    auto load = [&](auto& fn, const char* name) {
      fn = lib.symbol<std::remove_reference_t<decltype(fn)>>(name);
    };
    load(a.create, "cublasCreate_v2");
    load(a.destroy, "cublasDestroy_v2");
    load(a.set_stream, "cublasSetStream_v2");
    load(a.status_string, "cublasGetStatusString");
    load(a.gemm_strided_batched, "cublasGemmStridedBatchedEx");
    return a;
  }();
  return api;
}

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::Backend,
                fmt::format("cublas: {}: {} ({})", what, cublas().status_string(st), int(st)));
  }
}

// After a launch: a bad configuration or an earlier asynchronous fault surfaces here.
void launched(const char* kernel) { check(cudaGetLastError(), kernel); }

// ---- caching allocator ----
// Freed blocks are kept per (device, stream) and reused by later allocations on that stream, so
// cudaMalloc leaves the hot path; stream order makes the reuse safe. A block freed by a thread
// whose stream is not the block's waits for that thread's queued work first. When a stream goes
// (its thread ends, after synchronizing), its blocks serve every stream. On out-of-memory the
// cache is returned to the driver and the allocation retried once.
class CachingAllocator {
 public:
  static CachingAllocator& get() {
    static CachingAllocator* a = new CachingAllocator;  // never destroyed: frees may come late
    return *a;
  }

  void* allocate(std::size_t bytes, int device, cudaStream_t s) {
    const std::size_t size = round_up(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (cudaStream_t key : {s, cudaStream_t(nullptr)}) {
        auto it = free_.lower_bound({device, key, size});
        if (it != free_.end() && std::get<0>(it->first) == device &&
            std::get<1>(it->first) == key && std::get<2>(it->first) <= 2 * size) {
          void* p = it->second;
          live_[p] = Block{std::get<2>(it->first), device, s};
          free_.erase(it);
          return p;
        }
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached();
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw Error(ErrorCode::Backend,
                  fmt::format("allocate: cuda:{} out of memory ({} bytes)", device, bytes));
    }
    check(e, "cudaMalloc");
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = Block{size, device, s};
    return p;
  }

  // `current` is the freeing thread's stream (null when that thread queued nothing).
  void deallocate(void* p, cudaStream_t current) {
    if (!p) return;
    std::unique_lock<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    Block b = it->second;
    live_.erase(it);
    if (current && current != b.stream) {
      lock.unlock();
      (void)cudaStreamSynchronize(current);  // its work may still read the block
      lock.lock();
    }
    const cudaStream_t key = streams_.count(b.stream) ? b.stream : nullptr;
    free_.insert({{b.device, key, b.size}, p});
  }

  void stream_created(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.insert(s);
  }

  // REQUIRES: s synchronized. Its cached blocks serve every stream from now on.
  void stream_gone(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.erase(s);
    for (auto it = free_.begin(); it != free_.end();) {
      if (std::get<1>(it->first) == s) {
        free_.insert({{std::get<0>(it->first), nullptr, std::get<2>(it->first)}, it->second});
        it = free_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  struct Block {
    std::size_t size;
    int device;
    cudaStream_t stream;
  };
  using Key = std::tuple<int, cudaStream_t, std::size_t>;

  static std::size_t round_up(std::size_t bytes) {
    constexpr std::size_t kAlign = 512;
    return (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  }

  void release_cached() {
    (void)cudaDeviceSynchronize();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, p] : free_) (void)cudaFree(p);
    free_.clear();
  }

  std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::multimap<Key, void*> free_;
  std::set<cudaStream_t> streams_;
};

// ---- CUDA-event timing of work on one stream ----
// A pool of event pairs: a token is a pair's index, taken by start() and returned by elapsed_s(),
// so the steady state creates no events.
class EventTimer final : public DeviceTimer {
 public:
  explicit EventTimer(cudaStream_t s) : stream_(s) {}
  ~EventTimer() override {  // at thread exit: errors ignored
    for (const Pair& p : pairs_) {
      (void)cudaEventDestroy(p.start);
      (void)cudaEventDestroy(p.stop);
    }
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  std::uint32_t start() override {
    if (free_.empty()) {
      Pair p;
      check(cudaEventCreate(&p.start), "cudaEventCreate");
      check(cudaEventCreate(&p.stop), "cudaEventCreate");
      free_.push_back(std::uint32_t(pairs_.size()));
      pairs_.push_back(p);
    }
    const std::uint32_t t = free_.back();
    free_.pop_back();
    check(cudaEventRecord(pairs_[t].start, stream_), "cudaEventRecord");
    return t;
  }
  void stop(std::uint32_t t) override {
    check(cudaEventRecord(pair(t).stop, stream_), "cudaEventRecord");
  }
  double elapsed_s(std::uint32_t t) override {
    const Pair& p = pair(t);
    free_.push_back(t);
    check(cudaEventSynchronize(p.stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, p.start, p.stop), "cudaEventElapsedTime");
    return double(ms) * 1e-3;
  }

 private:
  struct Pair {
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  const Pair& pair(std::uint32_t t) const {
    COMMTRACE_CHECK(t < pairs_.size(), ErrorCode::Internal, "device timer: unknown token {}", t);
    return pairs_[t];
  }
  cudaStream_t stream_;
  std::vector<Pair> pairs_;
  std::vector<std::uint32_t> free_;
};

// ---- per-thread context: the thread's stream, cuBLAS handle, bad-index word and timer ----
struct ThreadContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  unsigned long long* bad = nullptr;  // device word for index checks
  std::unique_ptr<EventTimer> timer;

  ThreadContext() {
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CachingAllocator::get().stream_created(stream);
    check(cublas().create(&blas), "cublasCreate");
    check(cublas().set_stream(blas, stream), "cublasSetStream");
    check(cudaMalloc(&bad, sizeof *bad), "cudaMalloc");
    timer = std::make_unique<EventTimer>(stream);
  }
  ~ThreadContext() {  // errors ignored: this runs at thread exit, maybe after the runtime's
    (void)cudaStreamSynchronize(stream);
    timer.reset();
    CachingAllocator::get().stream_gone(stream);
    if (blas) (void)cublas().destroy(blas);
    if (bad) (void)cudaFree(bad);
    (void)cudaStreamDestroy(stream);
  }
  ThreadContext(const ThreadContext&) = delete;
  ThreadContext& operator=(const ThreadContext&) = delete;
};

thread_local std::unique_ptr<ThreadContext> t_context;
thread_local int t_ordinal = -1;  // set_current_ordinal's choice; -1: the runtime's current device

ThreadContext& ctx() {
  if (!t_context) {
    if (t_ordinal >= 0) check(cudaSetDevice(t_ordinal), "cudaSetDevice");
    t_context = std::make_unique<ThreadContext>();
  }
  return *t_context;
}

int visible_devices() {
  int n = 0;
  check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  return n;
}
cudaStream_t stream() { return ctx().stream; }

void sync(const char* what) { check(cudaStreamSynchronize(stream()), what); }

// Device scratch from the caching allocator, for one kernel call.
class Scratch {
 public:
  explicit Scratch(std::size_t bytes)
      : p_(CachingAllocator::get().allocate(bytes, ctx().device, stream())) {}
  ~Scratch() { CachingAllocator::get().deallocate(p_, nullptr); }  // same stream: ordered
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_;
};

// ---- index checks: the first bad position a kernel flagged, or -1 ----
unsigned long long* reset_bad() {
  check(cudaMemsetAsync(ctx().bad, 0xff, sizeof(unsigned long long), stream()), "cudaMemsetAsync");
  return ctx().bad;
}

i64 first_bad(const char* kernel) {
  launched(kernel);
  unsigned long long pos = 0;
  check(cudaMemcpyAsync(&pos, ctx().bad, sizeof pos, cudaMemcpyDeviceToHost, stream()),
        "cudaMemcpyAsync");
  sync(kernel);
  return pos == cu::kNoBadIndex ? -1 : i64(pos);
}

i64 index_at(const i64* idx, i64 pos) {
  i64 v = 0;
  check(cudaMemcpyAsync(&v, idx + pos, sizeof v, cudaMemcpyDeviceToHost, stream()),
        "cudaMemcpyAsync");
  sync("index_at");
  return v;
}

// ---- dtype dispatch ----
// The device side of the shared dtype dispatch (kernels/dtype_dispatch.h): conversions and
// scratch on the thread's stream.
struct Gpu {
  static void convert(const void* src, DType from, void* dst, DType to, i64 n) {
    cu::convert(stream(), src, int(from), dst, int(to), n);
  }
  class Buffer {
   public:
    explicit Buffer(i64 n) : s_(std::size_t(std::max<i64>(n, 1)) * sizeof(float)) {}
    float* data() { return s_.as<float>(); }

   private:
    Scratch s_;
  };
  static void launched(const char* kernel) { commtrace::launched(kernel); }
  static constexpr const char* kName = "cuda";
};

[[noreturn]] void unsupported(const char* kernel, DType dt, const char* expected) {
  dispatch::unsupported(Gpu::kName, kernel, dt, expected);
}

template <typename F>
void floating(const char* kernel, DType dt, F&& f) {
  dispatch::floating<Gpu>(kernel, dt, std::forward<F>(f));
}
using dispatch::acc;

// ---- shapes to kernel dims ----
cu::Dims dims_of(const Shape& shape, const char* kernel) {
  COMMTRACE_CHECK(shape.size() <= std::size_t(cu::kMaxRank), ErrorCode::Unsupported,
                  "{}: the cuda backend takes at most {} dims, got {}", kernel, cu::kMaxRank,
                  shape_str(shape));
  cu::Dims d;
  d.rank = int(shape.size());
  i64 st = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    const int k = cu::kMaxRank - int(shape.size()) + int(i);
    d.size[k] = shape[i];
    d.stride[k] = st;
    st *= shape[i];
  }
  return d;
}

// `shape` right-aligned against `full`: full's sizes, shape's strides, 0 where shape broadcasts.
cu::Dims broadcast_dims(const Shape& shape, const Shape& full, const char* kernel) {
  cu::Dims d = dims_of(full, kernel);
  const cu::Dims own = dims_of(shape, kernel);
  for (int k = 0; k < cu::kMaxRank; ++k) {
    d.stride[k] = k < cu::kMaxRank - own.rank || own.size[k] == 1 ? 0 : own.stride[k];
  }
  return d;
}

// ---- GEMM: C (row-major) = alpha op(A) op(B) + beta C, as column-major C^T = op(B)^T op(A)^T ----
int blas_int(i64 v, const char* what) {
  COMMTRACE_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), ErrorCode::Unsupported,
                  "gemm: {} = {} is out of range [0, {}] of cuBLAS", what, v,
                  std::numeric_limits<int>::max());
  return int(v);
}

void gemm_rm(DType dt, bool ta, bool tb, i64 batch, i64 m, i64 n, i64 k, double alpha,
             const void* a, i64 lda, i64 sa, const void* b, i64 ldb, i64 sb, double beta, void* c,
             i64 ldc, i64 sc, bool allow_tf32 = false) {
  if (batch == 0 || m == 0 || n == 0 || k == 0) return;  // callers fill C for k == 0
  cudaDataType type = CUDA_R_32F;
  cublasComputeType_t compute = allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (dt == DType::F64) {
    type = CUDA_R_64F;
    compute = CUBLAS_COMPUTE_64F;
  } else if (dt == DType::BF16) {
    type = CUDA_R_16BF;
    compute = CUBLAS_COMPUTE_32F;
  }
  const float alpha_f = float(alpha), beta_f = float(beta);
  const void* pa = dt == DType::F64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* pb = dt == DType::F64 ? static_cast<const void*>(&beta) : &beta_f;
  check(cublas().gemm_strided_batched(
            ctx().blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
            blas_int(n, "n"), blas_int(m, "m"), blas_int(k, "k"), pa, b, type, blas_int(ldb, "ldb"),
            sb, a, type, blas_int(lda, "lda"), sa, pb, c, type, blas_int(ldc, "ldc"), sc,
            blas_int(batch, "batch"), compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

// The acc-typed GEMM of attention's steps (T float or double).
template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::F64 : DType::F32;
}

template <typename T>
void attention_forward_t(const T* q, const T* k, const T* v, T* out, T* probs, i64 bh, i64 t, i64 d,
                         double scale, bool causal) {
  const DType dt = dtype_of<T>();
  gemm_rm(dt, false, true, bh, t, t, d, double(T(scale)), q, d, t * d, k, d, t * d, 0, probs, t,
          t * t);
  cu::softmax_forward(stream(), probs, probs, bh * t, t, causal, t);
  launched("attention_forward");
  gemm_rm(dt, false, false, bh, t, d, t, 1, probs, t, t * t, v, d, t * d, 0, out, d, t * d);
}

template <typename T>
void attention_backward_t(const T* go, const T* q, const T* k, const T* v, const T* p, T* gq, T* gk,
                          T* gv, i64 bh, i64 t, i64 d, double scale) {
  const DType dt = dtype_of<T>();
  const double s = double(T(scale));
  const i64 td = t * d, tt = t * t;
  Scratch ds_buf(std::size_t(std::max<i64>(bh * tt, 1)) * sizeof(T));
  T* ds = ds_buf.as<T>();
  gemm_rm(dt, false, true, bh, t, t, d, 1, go, d, td, v, d, td, 0, ds, t, tt);
  gemm_rm(dt, true, false, bh, t, d, t, 1, p, t, tt, go, d, td, 0, gv, d, td);
  cu::softmax_backward(stream(), ds, p, ds, bh * t, t);
  launched("attention_backward");
  gemm_rm(dt, false, false, bh, t, d, t, s, ds, t, tt, k, d, td, 0, gq, d, td);
  gemm_rm(dt, true, false, bh, t, d, t, s, ds, t, tt, q, d, td, 0, gk, d, td);
}

template <typename T>
void block_forward_t(const T* q, const T* k, const T* v, T* out, T* lse, i64 bh, i64 tq, i64 tk,
                     i64 d, double scale, bool causal, i64 q_pos, i64 k_pos) {
  const DType dt = dtype_of<T>();
  Scratch p_buf(std::size_t(std::max<i64>(bh * tq * tk, 1)) * sizeof(T));
  T* p = p_buf.as<T>();
  gemm_rm(dt, false, true, bh, tq, tk, d, double(T(scale)), q, d, tq * d, k, d, tk * d, 0, p, tk,
          tq * tk);
  if (d == 0) cu::fill_bits(stream(), p, sizeof(T), 0, bh * tq * tk);  // no product: scores 0
  cu::block_softmax(stream(), p, lse, bh, tq, tk, causal, q_pos, k_pos);
  launched("attention_block_forward");
  if (tk == 0) {
    cu::fill_bits(stream(), out, sizeof(T), 0, bh * tq * d);
    return launched("attention_block_forward");
  }
  gemm_rm(dt, false, false, bh, tq, d, tk, 1, p, tk, tq * tk, v, d, tk * d, 0, out, d, tq * d);
}

template <typename T>
void block_backward_t(const T* go, const T* q, const T* k, const T* v, const T* out, const T* lse,
                      T* gq, T* gk, T* gv, i64 bh, i64 tq, i64 tk, i64 d, double scale, bool causal,
                      i64 q_pos, i64 k_pos) {
  const DType dt = dtype_of<T>();
  const double s = double(T(scale));
  const std::size_t scores = std::size_t(std::max<i64>(bh * tq * tk, 1)) * sizeof(T);
  Scratch p_buf(scores), ds_buf(scores);
  T *p = p_buf.as<T>(), *ds = ds_buf.as<T>();
  const i64 qd = tq * d, kd = tk * d, qk = tq * tk;
  if (tq == 0 || tk == 0 || d == 0) {  // a product over nothing: the gradients are 0
    cu::fill_bits(stream(), gq, sizeof(T), 0, bh * qd);
    cu::fill_bits(stream(), gk, sizeof(T), 0, bh * kd);
    cu::fill_bits(stream(), gv, sizeof(T), 0, bh * kd);
    return launched("attention_block_backward");
  }
  gemm_rm(dt, false, true, bh, tq, tk, d, s, q, d, qd, k, d, kd, 0, p, tk, qk);
  cu::block_probs(stream(), p, lse, bh, tq, tk, causal, q_pos, k_pos);
  launched("attention_block_backward");
  gemm_rm(dt, true, false, bh, tk, d, tq, 1, p, tk, qk, go, d, qd, 0, gv, d, kd);
  gemm_rm(dt, false, true, bh, tq, tk, d, 1, go, d, qd, v, d, kd, 0, ds, tk, qk);
  cu::block_grad_scores(stream(), go, out, p, ds, bh * tq, tk, d);
  launched("attention_block_backward");
  gemm_rm(dt, false, false, bh, tq, d, tk, s, ds, tk, qk, k, d, kd, 0, gq, d, qd);
  gemm_rm(dt, true, false, bh, tk, d, tq, s, ds, tk, qk, q, d, qd, 0, gk, d, kd);
}

void check_target(const char* kernel, i64 pos, const i64* targets, i64 c) {
  if (pos < 0) return;
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{}: target {} at position {} is out of range [0, {})", kernel,
                          index_at(targets, pos), pos, c));
}

class CudaKernels final : public Kernels {
 public:
  Device device() const override { return Device::CUDA; }
  void synchronize() const override { sync("synchronize"); }
  DeviceTimer* timer() const override { return ctx().timer.get(); }
  int device_count() const override { return visible_devices(); }
  int current_ordinal() const override {
    return t_context ? t_context->device : std::max(t_ordinal, 0);
  }
  void set_current_ordinal(int ordinal) const override {
    const int n = visible_devices();
    COMMTRACE_CHECK(ordinal >= 0 && ordinal < n, ErrorCode::InvalidArgument,
                    "cuda:{}: this machine has {} visible CUDA device{} (cuda:0 to cuda:{})",
                    ordinal, n, n == 1 ? "" : "s", n - 1);
    COMMTRACE_CHECK(!t_context || t_context->device == ordinal, ErrorCode::InvalidArgument,
                    "cuda:{}: this thread already runs on cuda:{} (one device per thread)", ordinal,
                    t_context ? t_context->device : 0);
    t_ordinal = ordinal;
  }
  void* native_stream() const override { return ctx().stream; }

  // ---- memory ----
  void* allocate(std::size_t bytes, int ordinal) const override {
    ThreadContext& c = ctx();
    COMMTRACE_CHECK(ordinal == c.device, ErrorCode::Unsupported,
                    "allocate: this thread runs on cuda:{}, not cuda:{} (one device per thread)",
                    c.device, ordinal);
    return CachingAllocator::get().allocate(bytes, ordinal, c.stream);
  }
  void deallocate(void* p, std::size_t, int) const override {
    CachingAllocator::get().deallocate(p, t_context ? t_context->stream : nullptr);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const override {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()), "copy");
  }
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) const override {
    if (!bytes) return;
    check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()),
          "copy_from_host");
    sync("copy_from_host");  // the host buffer may go once this returns
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) const override {
    if (!bytes) return;
    check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "copy_to_host");
    sync("copy_to_host");
  }
  void convert(const void* in, DType in_dt, void* out, DType out_dt, i64 n) const override {
    if (in_dt == out_dt) return copy(out, in, std::size_t(n) * dtype_size(in_dt));
    cu::convert(stream(), in, int(in_dt), out, int(out_dt), n);
    launched("convert");
  }
  void fill(DType dt, void* out, double value, i64 n) const override {
    std::uint64_t bits = 0;  // the CPU backend's conversion of value, as bits of dt
    kernels_for(Device::CPU).convert(&value, DType::F64, &bits, dt, 1);
    cu::fill_bits(stream(), out, int(dtype_size(dt)), bits, n);
    launched("fill");
  }

  // ---- GEMM ----
  void gemm(const GemmArgs& g) const override {
    COMMTRACE_CHECK(
        g.dt != DType::I64, ErrorCode::Unsupported,
        "gemm: the cuda backend does not support dtype i64 (expected f32, f64 or bf16)");
    if (g.batch == 0 || g.m == 0 || g.n == 0) return;
    if (g.bias || g.k == 0) {  // C starts as the bias rows (or 0 when nothing is multiplied)
      switch (g.dt) {
        case DType::F32:
          cu::fill_gemm_c(stream(), static_cast<float*>(g.c), g.batch, g.m, g.n, g.ldc, g.stride_c,
                          static_cast<const float*>(g.bias), g.bias_rows);
          break;
        case DType::F64:
          cu::fill_gemm_c(stream(), static_cast<double*>(g.c), g.batch, g.m, g.n, g.ldc, g.stride_c,
                          static_cast<const double*>(g.bias), g.bias_rows);
          break;
        default:
          cu::fill_gemm_c(stream(), static_cast<std::uint16_t*>(g.c), g.batch, g.m, g.n, g.ldc,
                          g.stride_c, static_cast<const std::uint16_t*>(g.bias), g.bias_rows);
      }
      launched("gemm");
    }
    gemm_rm(g.dt, g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, 1.0, g.a, g.lda, g.stride_a, g.b,
            g.ldb, g.stride_b, g.bias ? 1.0 : 0.0, g.c, g.ldc, g.stride_c,
            g.allow_tf32 && g.dt == DType::F32);
  }

  // ---- elementwise ----
  void binary(DType dt, BinaryOp op, const void* a, const Shape& a_shape, const void* b,
              const Shape& b_shape, void* out, const Shape& out_shape) const override {
    const cu::Dims ad = broadcast_dims(a_shape, out_shape, "binary");
    const cu::Dims bd = broadcast_dims(b_shape, out_shape, "binary");
    const cu::Dims od = dims_of(out_shape, "binary");
    floating("binary", dt, [&](auto& io) {
      cu::binary(stream(), int(op), io.in(a, numel(a_shape)), ad, io.in(b, numel(b_shape)), bd,
                 io.out(out, numel(out_shape)), od, numel(out_shape));
    });
  }
  void sum_to(DType dt, const void* in, const Shape& in_shape, void* out,
              const Shape& target_shape) const override {
    const cu::Dims d = dims_of(in_shape, "sum_to");
    const cu::Dims t = broadcast_dims(target_shape, in_shape, "sum_to");
    cu::Dims summed;  // size 1 marks a dim the target sums over
    summed.rank = d.rank;
    for (int k = 0; k < cu::kMaxRank; ++k) {
      summed.size[k] = k >= cu::kMaxRank - d.rank && t.stride[k] == 0 && d.size[k] > 1;
    }
    floating("sum_to", dt, [&](auto& io) {
      cu::sum_to(stream(), io.in(in, numel(in_shape)), d, summed, io.out(out, numel(target_shape)),
                 numel(target_shape));
    });
  }
  void scale(DType dt, const void* x, double s, void* out, i64 n) const override {
    unary("scale", cu::Unary::Scale, dt, x, s, out, n);
  }
  void add_scalar(DType dt, const void* x, double s, void* out, i64 n) const override {
    unary("add_scalar", cu::Unary::AddScalar, dt, x, s, out, n);
  }
  void relu_forward(DType dt, const void* x, void* out, i64 n) const override {
    unary("relu_forward", cu::Unary::Relu, dt, x, 0, out, n);
  }
  void relu_backward(DType dt, const void* g, const void* x, void* gi, i64 n) const override {
    unary_grad("relu_backward", cu::UnaryGrad::Relu, dt, g, x, gi, n);
  }
  void gelu_forward(DType dt, const void* x, void* out, i64 n) const override {
    unary("gelu_forward", cu::Unary::Gelu, dt, x, 0, out, n);
  }
  void gelu_backward(DType dt, const void* g, const void* x, void* gi, i64 n) const override {
    unary_grad("gelu_backward", cu::UnaryGrad::Gelu, dt, g, x, gi, n);
  }
  void silu_forward(DType dt, const void* x, void* out, i64 n) const override {
    unary("silu_forward", cu::Unary::Silu, dt, x, 0, out, n);
  }
  void silu_backward(DType dt, const void* g, const void* x, void* gi, i64 n) const override {
    unary_grad("silu_backward", cu::UnaryGrad::Silu, dt, g, x, gi, n);
  }
  void dropout_forward(DType dt, const void* x, void* out, void* mask, i64 n, double p,
                       std::uint64_t seed) const override {
    floating("dropout_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const T pt = T(p);
      COMMTRACE_CHECK(pt >= T(0) && pt < T(1), ErrorCode::InvalidArgument,
                      "dropout_forward: p = {} is out of range [0, 1)", p);
      cu::dropout_forward(stream(), io.in(x, n), io.out(out, n), acc<T>(mask), n, pt, seed);
    });
  }
  void dropout_backward(DType dt, const void* g, const void* mask, void* gi, i64 n) const override {
    floating("dropout_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      cu::mul(stream(), io.in(g, n), acc<T>(mask), io.out(gi, n), n);
    });
  }

  // ---- row-wise, reductions ----
  void softmax_forward(DType dt, const void* x, void* out, i64 rows, i64 cols) const override {
    floating("softmax_forward", dt, [&](auto& io) {
      cu::softmax_forward(stream(), io.in(x, rows * cols), io.out(out, rows * cols), rows, cols,
                          false, cols);
    });
  }
  void softmax_backward(DType dt, const void* g, const void* y, void* gi, i64 rows,
                        i64 cols) const override {
    floating("softmax_backward", dt, [&](auto& io) {
      const i64 n = rows * cols;
      cu::softmax_backward(stream(), io.in(g, n), io.in(y, n), io.out(gi, n), rows, cols);
    });
  }
  void layernorm_forward(DType dt, const void* x, const void* w, const void* b, void* out,
                         void* mean, void* rstd, i64 rows, i64 cols, double eps) const override {
    floating("layernorm_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      cu::layernorm_forward(stream(), io.in(x, n), io.in(w, cols), io.in(b, cols), io.out(out, n),
                            acc<T>(mean), acc<T>(rstd), rows, cols, eps);
    });
  }
  void layernorm_backward(DType dt, const void* go, const void* x, const void* w, const void* mean,
                          const void* rstd, void* gx, void* gw, void* gb, i64 rows,
                          i64 cols) const override {
    floating("layernorm_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      cu::layernorm_backward(stream(), io.in(go, n), io.in(x, n), io.in(w, cols), acc<T>(mean),
                             acc<T>(rstd), io.out(gx, n), io.out(gw, cols), io.out(gb, cols), rows,
                             cols);
    });
  }
  void rmsnorm_forward(DType dt, const void* x, const void* w, void* out, void* rstd, i64 rows,
                       i64 cols, double eps) const override {
    floating("rmsnorm_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      cu::rmsnorm_forward(stream(), io.in(x, n), io.in(w, cols), io.out(out, n), acc<T>(rstd), rows,
                          cols, eps);
    });
  }
  void rmsnorm_backward(DType dt, const void* go, const void* x, const void* w, const void* rstd,
                        void* gx, void* gw, i64 rows, i64 cols) const override {
    floating("rmsnorm_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      cu::rmsnorm_backward(stream(), io.in(go, n), io.in(x, n), io.in(w, cols), acc<T>(rstd),
                           io.out(gx, n), io.out(gw, cols), rows, cols);
    });
  }
  void sum_dim(DType dt, const void* x, void* out, i64 outer, i64 dim, i64 inner) const override {
    floating("sum_dim", dt, [&](auto& io) {
      cu::sum_dim(stream(), io.in(x, outer * dim * inner), io.out(out, outer * inner), outer, dim,
                  inner);
    });
  }
  void sum_all(DType dt, const void* x, void* out, i64 n) const override {
    floating("sum_all", dt,
             [&](auto& io) { cu::sum_all(stream(), io.in(x, n), io.out(out, 1), n); });
  }

  // ---- embedding ----
  void embedding_forward(DType dt, const i64* idx, i64 n, const void* weight, i64 row_begin,
                         i64 rows, i64 vocab, i64 dim, void* out) const override {
    unsigned long long* bad = reset_bad();
    floating("embedding_forward", dt, [&](auto& io) {
      cu::embedding_forward(stream(), idx, n, io.in(weight, rows * dim), row_begin, rows, vocab,
                            dim, io.out(out, n * dim), bad);
    });
    if (const i64 pos = first_bad("embedding_forward"); pos >= 0) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("embedding_forward: index {} at position {} is out of range [0, {})",
                              index_at(idx, pos), pos, vocab));
    }
  }
  void embedding_backward(DType dt, const void* go, const i64* idx, i64 n, void* gw, i64 row_begin,
                          i64 rows, i64 dim) const override {
    unsigned long long* bad = reset_bad();
    floating("embedding_backward", dt, [&](auto& io) {
      cu::embedding_backward(stream(), io.in(go, n * dim), idx, n, io.out(gw, rows * dim),
                             row_begin, rows, dim, bad);
    });
    if (const i64 pos = first_bad("embedding_backward"); pos >= 0) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("embedding_backward: index {} at position {} is negative",
                              index_at(idx, pos), pos));
    }
  }

  // ---- attention ----
  void attention_forward(DType dt, const void* q, const void* k, const void* v, void* out,
                         void* probs, i64 bh, i64 t, i64 d, double scale,
                         bool causal) const override {
    floating("attention_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = bh * t * d;
      attention_forward_t<T>(io.in(q, n), io.in(k, n), io.in(v, n), io.out(out, n), acc<T>(probs),
                             bh, t, d, scale, causal);
    });
  }
  void attention_backward(DType dt, const void* go, const void* q, const void* k, const void* v,
                          const void* probs, void* gq, void* gk, void* gv, i64 bh, i64 t, i64 d,
                          double scale) const override {
    floating("attention_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = bh * t * d;
      attention_backward_t<T>(io.in(go, n), io.in(q, n), io.in(k, n), io.in(v, n), acc<T>(probs),
                              io.out(gq, n), io.out(gk, n), io.out(gv, n), bh, t, d, scale);
    });
  }
  void attention_block_forward(DType dt, const void* q, const void* k, const void* v, void* out,
                               void* lse, i64 bh, i64 tq, i64 tk, i64 d, double scale, bool causal,
                               i64 q_pos, i64 k_pos) const override {
    floating("attention_block_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      block_forward_t<T>(io.in(q, bh * tq * d), io.in(k, bh * tk * d), io.in(v, bh * tk * d),
                         io.out(out, bh * tq * d), acc<T>(lse), bh, tq, tk, d, scale, causal, q_pos,
                         k_pos);
    });
  }
  void attention_merge(DType dt, void* out, void* lse, const void* out_b, const void* lse_b,
                       i64 rows, i64 d) const override {
    floating("attention_merge", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const T* prev = io.in(out, rows * d);  // read and written: widened in, narrowed back
      T* o = io.out(out, rows * d);
      if (o != prev) copy(o, prev, std::size_t(rows * d) * sizeof(T));
      cu::attention_merge(stream(), o, acc<T>(lse), io.in(out_b, rows * d), acc<T>(lse_b), rows, d);
    });
  }
  void attention_block_backward(DType dt, const void* go, const void* q, const void* k,
                                const void* v, const void* out, const void* lse, void* gq, void* gk,
                                void* gv, i64 bh, i64 tq, i64 tk, i64 d, double scale, bool causal,
                                i64 q_pos, i64 k_pos) const override {
    floating("attention_block_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 nq = bh * tq * d, nk = bh * tk * d;
      block_backward_t<T>(io.in(go, nq), io.in(q, nq), io.in(k, nk), io.in(v, nk), io.in(out, nq),
                          acc<T>(lse), io.out(gq, nq), io.out(gk, nk), io.out(gv, nk), bh, tq, tk,
                          d, scale, causal, q_pos, k_pos);
    });
  }

  // ---- losses ----
  void log_softmax_forward(DType dt, const void* x, void* out, i64 rows, i64 cols) const override {
    floating("log_softmax_forward", dt, [&](auto& io) {
      cu::log_softmax_forward(stream(), io.in(x, rows * cols), io.out(out, rows * cols), rows,
                              cols);
    });
  }
  void log_softmax_backward(DType dt, const void* g, const void* y, void* gi, i64 rows,
                            i64 cols) const override {
    floating("log_softmax_backward", dt, [&](auto& io) {
      const i64 n = rows * cols;
      cu::log_softmax_backward(stream(), io.in(g, n), io.in(y, n), io.out(gi, n), rows, cols);
    });
  }
  void nll_loss_forward(DType dt, const void* logp, const i64* targets, i64 n, i64 c,
                        void* loss) const override {
    unsigned long long* bad = reset_bad();
    floating("nll_loss_forward", dt, [&](auto& io) {
      cu::nll_loss_forward(stream(), io.in(logp, n * c), targets, n, c, io.out(loss, 1), bad);
    });
    check_target("nll_loss_forward", first_bad("nll_loss_forward"), targets, c);
  }
  void nll_loss_backward(DType dt, const void* grad_loss, const i64* targets, void* grad_logp,
                         i64 n, i64 c) const override {
    unsigned long long* bad = reset_bad();
    floating("nll_loss_backward", dt, [&](auto& io) {
      cu::nll_loss_backward(stream(), io.in(grad_loss, 1), targets, io.out(grad_logp, n * c), n, c,
                            bad);
    });
    check_target("nll_loss_backward", first_bad("nll_loss_backward"), targets, c);
  }
  void ce_shard_max(DType dt, const void* logits, i64 n, i64 c, void* max) const override {
    floating("ce_shard_max", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      cu::ce_shard_max(stream(), io.in(logits, n * c), n, c, acc<T>(max));
    });
  }
  void ce_shard_stats(DType dt, const void* logits, const i64* targets, const void* max, i64 n,
                      i64 c, i64 col_begin, i64 vocab, void* sumexp, void* picked) const override {
    unsigned long long* bad = reset_bad();
    floating("ce_shard_stats", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      cu::ce_shard_stats(stream(), io.in(logits, n * c), targets, acc<T>(max), n, c, col_begin,
                         vocab, acc<T>(sumexp), acc<T>(picked), bad);
    });
    check_target("ce_shard_stats", first_bad("ce_shard_stats"), targets, vocab);
  }
  void ce_shard_loss(DType dt, const void* max, const void* sumexp, const void* picked, i64 n,
                     void* loss) const override {
    floating("ce_shard_loss", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      cu::ce_shard_loss(stream(), acc<T>(max), acc<T>(sumexp), acc<T>(picked), n, io.out(loss, 1));
    });
  }
  void ce_shard_backward(DType dt, const void* grad_loss, const void* logits, const i64* targets,
                         const void* max, const void* sumexp, i64 n, i64 c, i64 col_begin,
                         void* grad_logits) const override {
    floating("ce_shard_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      cu::ce_shard_backward(stream(), io.in(grad_loss, 1), io.in(logits, n * c), targets,
                            acc<T>(max), acc<T>(sumexp), n, c, col_begin,
                            io.out(grad_logits, n * c));
    });
  }

  // ---- layout ----
  void permute(DType dt, const void* in, const Shape& in_shape, const int* perm,
               void* out) const override {
    const cu::Dims src = dims_of(in_shape, "permute");
    cu::Dims space;  // out's sizes, in's strides
    space.rank = src.rank;
    const int base = cu::kMaxRank - src.rank;
    for (int i = 0; i < src.rank; ++i) {
      space.size[base + i] = src.size[base + perm[i]];
      space.stride[base + i] = src.stride[base + perm[i]];
    }
    cu::gather_strided(stream(), int(dtype_size(dt)), in, space, out, numel(in_shape));
    launched("permute");
  }
  void narrow(DType dt, const void* in, const Shape& in_shape, int dim, i64 start, i64 len,
              void* out) const override {
    const i64 inner = span(in_shape, dim + 1), outer = span(in_shape, 0, dim);
    const std::size_t es = dtype_size(dt);
    cu::copy_blocks(stream(), int(es), static_cast<const char*>(in) + start * inner * i64(es),
                    in_shape[std::size_t(dim)] * inner, out, len * inner, outer, len * inner);
    launched("narrow");
  }
  void narrow_scatter(DType dt, const void* src, const Shape& src_shape, int dim, i64 start,
                      void* dst, const Shape& dst_shape) const override {
    const i64 inner = span(src_shape, dim + 1), outer = span(src_shape, 0, dim);
    const i64 len = src_shape[std::size_t(dim)];
    const std::size_t es = dtype_size(dt);
    cu::copy_blocks(stream(), int(es), src, len * inner,
                    static_cast<char*>(dst) + start * inner * i64(es),
                    dst_shape[std::size_t(dim)] * inner, outer, len * inner);
    launched("narrow_scatter");
  }

  // ---- optimizers ----
  void sgd_step(DType dt, void* p, const void* g, void* m, i64 n, const SgdArgs& a) const override {
    floating("sgd_step", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      cu::sgd_step(stream(), io.inout(p, n), io.in(g, n), acc<T>(m), n, T(a.lr), T(a.momentum),
                   T(a.weight_decay), a.first_step);
    });
  }
  void adamw_step(DType dt, void* p, const void* g, void* m, void* v, i64 n,
                  const AdamWArgs& a) const override {
    floating("adamw_step", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const T b1 = T(a.beta1), b2 = T(a.beta2);
      cu::adamw_step(stream(), io.inout(p, n), io.in(g, n), acc<T>(m), acc<T>(v), n, T(a.lr), b1,
                     b2, T(a.eps), T(a.weight_decay), math::adam_bias_correction(b1, a.step),
                     math::adam_bias_correction(b2, a.step));
    });
  }

  // ---- collectives' arithmetic ----
  void reduce(DType dt, ReduceOp op, const void* const* srcs, int n_srcs, void* const* dsts,
              int n_dsts, i64 begin, i64 end) const override {
    COMMTRACE_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Max,
                    ErrorCode::InvalidArgument,
                    "reduce: op {} is not a reduction (expected sum, avg or max)", int(op));
    COMMTRACE_CHECK(
        n_srcs >= 1 && n_srcs <= cu::kMaxPeers && n_dsts >= 0 && n_dsts <= cu::kMaxPeers,
        ErrorCode::Unsupported,
        "reduce: {} sources and {} destinations; the cuda backend takes 1 to {}", n_srcs, n_dsts,
        cu::kMaxPeers);
    cu::Peers p{};
    std::copy(srcs, srcs + n_srcs, p.src);
    std::copy(dsts, dsts + n_dsts, p.dst);
    cu::reduce(stream(), int(dt), int(op), p, n_srcs, n_dsts, begin, end);
    launched("reduce");
  }

 private:
  static i64 span(const Shape& s, int begin, int end = -1) {
    i64 n = 1;
    for (int i = begin; i < (end < 0 ? int(s.size()) : end); ++i) n *= s[std::size_t(i)];
    return n;
  }
  static void unary(const char* kernel, cu::Unary op, DType dt, const void* x, double s, void* out,
                    i64 n) {
    floating(kernel, dt,
             [&](auto& io) { cu::unary(stream(), op, io.in(x, n), s, io.out(out, n), n); });
  }
  static void unary_grad(const char* kernel, cu::UnaryGrad op, DType dt, const void* g,
                         const void* x, void* gi, i64 n) {
    floating(kernel, dt, [&](auto& io) {
      cu::unary_backward(stream(), op, io.in(g, n), io.in(x, n), io.out(gi, n), n);
    });
  }
};

}  // namespace

// Why this process cannot use CUDA ("" when it can): no device, or no driver.
std::string cuda_unavailable_reason() {
  static const std::string reason = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return fmt::format("no usable CUDA device (cudaGetDeviceCount: {})", cudaGetErrorString(e));
    }
    return n == 0 ? std::string("no CUDA device is visible") : std::string();
  }();
  return reason;
}

const Kernels& cuda_backend() {
  const std::string& why = cuda_unavailable_reason();
  COMMTRACE_CHECK(why.empty(), ErrorCode::Unsupported, "cuda: {}", why);
  static const CudaKernels k;
  return k;
}

}  // namespace commtrace
