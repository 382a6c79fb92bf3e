// The CPU backend of the device seam: host memory (malloc), OpenBLAS cblas for the matrix
// products, the reference templates (kernels/reference.h) for everything else. f32 computes in
// float and f64 in double; bf16 is widened to f32 scratch inside each kernel and its outputs are
// rounded once. Internal: callers reach it through kernels_for(Device::CPU).
#include <cblas.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype_dispatch.h"
#include "kernels/reference.h"

namespace commtrace {
namespace {

// ---- host memory budget ----

// Bytes of cpu storage live in the process (all ranks' threads), and the most it may hold.
std::atomic<std::uint64_t> g_host_held{0};
std::atomic<std::uint64_t> g_host_limit{0};  // 0: default_limit()

constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

std::uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page) : kUnlimited;
}

// The first unsigned number in `path` after `key` (whole file when key is empty); kUnlimited
// when the file or the number is missing ("max" in a cgroup file).
std::uint64_t read_number(const char* path, std::string_view key, std::uint64_t scale) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t at = key.empty() ? 0 : text.find(key);
  if (at == std::string::npos) return kUnlimited;
  const char* p = text.c_str() + at + key.size();
  while (*p == ' ' || *p == '\t') ++p;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(p, text.c_str() + text.size(), v);
  return ec == std::errc() && end != p ? v * scale : kUnlimited;
}

// How many processes of this job share the machine, from what MPI launchers set; 1 without.
std::uint64_t local_processes() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(var);
    std::uint64_t n = 0;
    if (v && std::from_chars(v, v + std::strlen(v), n).ec == std::errc() && n > 1) return n;
  }
  return 1;
}

// The default limit, taken once (at the first allocation, when this process holds next to
// nothing): the memory the kernel can give without swapping (MemAvailable, and the cgroup's
// room when it has a limit, capped by physical memory), shared evenly by the job's processes on
// this machine, less 1/16 for what the process allocates beside tensor storage.
std::uint64_t default_limit() {
  static const std::uint64_t bytes = [] {
    std::uint64_t room =
        std::min(physical_memory(), read_number("/proc/meminfo", "MemAvailable:", 1024));
    // cgroup v2, then v1 (whose "no limit" is a number past any machine's memory).
    for (const auto& [max, used] :
         {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
          std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                    "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
      const std::uint64_t cg_max = read_number(max, "", 1), cg_used = read_number(used, "", 1);
      if (cg_max != kUnlimited && cg_used != kUnlimited) {
        room = std::min(room, cg_max > cg_used ? cg_max - cg_used : 0);
      }
    }
    if (room == kUnlimited) return room;
    room /= local_processes();
    return room - room / 16;
  }();
  return bytes;
}

// `need` (what asks for the bytes) would bring the host storage to `held`, past `limit`.
[[noreturn]] void throw_over_limit(std::string_view need, std::uint64_t held, std::uint64_t limit) {
  throw Error(
      ErrorCode::Backend,
      fmt::format(
          "{} would hold {} of host memory, more than the {} {}; "
          "--device meta traces the shapes without data",
          need, format_bytes(held), format_bytes(limit),
          g_host_limit.load(std::memory_order_relaxed) ? "allowed" : "available to this process"));
}

// ---- OpenBLAS ----

blasint to_blas(i64 v, const char* what) {
  COMMTRACE_CHECK(v >= 0 && v <= std::numeric_limits<blasint>::max(), ErrorCode::Unsupported,
                  "gemm: {} = {} is out of range [0, {}] of the BLAS integer", what, v,
                  std::numeric_limits<blasint>::max());
  return static_cast<blasint>(v);
}

void cblas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
                float alpha, const float* a, blasint lda, const float* b, blasint ldb, float beta,
                float* c, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
                double alpha, const double* a, blasint lda, const double* b, blasint ldb,
                double beta, double* c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// ref::Matmul through cblas. Zero-sized products never reach cblas: k == 0 leaves C = beta * C
// (beta == 0 does not read C), m or n == 0 does nothing.
template <typename T>
void blas_matmul(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda,
                 const T* b, i64 ldb, T beta, T* c, i64 ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (i64 i = 0; i < m; ++i) {
      for (i64 j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  cblas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
             to_blas(m, "m"), to_blas(n, "n"), to_blas(k, "k"), alpha, a, to_blas(lda, "lda"), b,
             to_blas(ldb, "ldb"), beta, c, to_blas(ldc, "ldc"));
}

// ---- dtype dispatch ----

// The host side of the shared dtype dispatch (kernels/dtype_dispatch.h).
struct Host {
  static void convert(const void* src, DType from, void* dst, DType to, i64 n) {
    ref::convert(src, from, dst, to, n);
  }
  class Buffer {
   public:
    explicit Buffer(i64 n) : v_(std::size_t(n)) {}
    float* data() { return v_.data(); }

   private:
    std::vector<float> v_;
  };
  static void launched(const char*) {}
  static constexpr const char* kName = "cpu";
};

[[noreturn]] void unsupported(const char* kernel, DType dt, const char* expected) {
  dispatch::unsupported(Host::kName, kernel, dt, expected);
}

template <typename F>
void floating(const char* kernel, DType dt, F&& f) {
  dispatch::floating<Host>(kernel, dt, std::forward<F>(f));
}
using dispatch::acc;

// Data movement: f(U{}) with U the unsigned integer of dt's element size.
template <typename F>
void by_size(DType dt, F&& f) {
  switch (dtype_size(dt)) {
    case 2:
      return f(std::uint16_t{});
    case 4:
      return f(std::uint32_t{});
    case 8:
      return f(std::uint64_t{});
  }
  throw Error(ErrorCode::Internal, fmt::format("cpu: unexpected dtype {}", dtype_name(dt)));
}

// Elements of a strided batch of `rows` x `cols` matrices with leading dim ld.
i64 extent(i64 batch, i64 stride, i64 rows, i64 cols, i64 ld) {
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

// bf16 GEMM: A, B and bias widened, the product in f32 into a dense scratch, rounded into C's
// (batch, m, n) blocks only (C's padding stays untouched).
void gemm_bf16(const GemmArgs& g) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  dispatch::Widened<Host> io;
  GemmArgs w = g;
  w.dt = DType::F32;
  w.a =
      io.in(g.a, extent(g.batch, g.stride_a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
  w.b =
      io.in(g.b, extent(g.batch, g.stride_b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
  w.bias = io.in(g.bias, g.bias_rows * g.n);
  std::vector<float> c(std::size_t(g.batch * g.m * g.n));
  w.c = c.data();
  w.ldc = g.n;
  w.stride_c = g.m * g.n;
  ref::gemm<float>(w, blas_matmul<float>);
  for (i64 bi = 0; bi < g.batch; ++bi) {
    for (i64 i = 0; i < g.m; ++i) {
      ref::convert(c.data() + (bi * g.m + i) * g.n, DType::F32,
                   static_cast<BF16*>(g.c) + bi * g.stride_c + i * g.ldc, DType::BF16, g.n);
    }
  }
}

class CpuKernels final : public Kernels {
 public:
  Device device() const override { return Device::CPU; }
  void synchronize() const override {}

  // ---- memory ----
  void* allocate(std::size_t bytes, int ordinal) const override {
    COMMTRACE_CHECK(ordinal == 0, ErrorCode::InvalidArgument,
                    "allocate: cpu device ordinal {} is out of range [0, 1)", ordinal);
    // Checked before malloc: Linux overcommits, so a model too large for the machine would
    // otherwise be killed by the kernel when its pages are touched, with no message.
    const std::uint64_t held = g_host_held.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const std::uint64_t limit = host_memory_limit();
    if (held > limit) {
      g_host_held.fetch_sub(bytes, std::memory_order_relaxed);
      throw_over_limit(fmt::format("allocate: cpu: {} more", format_bytes(bytes)), held, limit);
    }
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) g_host_held.fetch_sub(bytes, std::memory_order_relaxed);
    COMMTRACE_CHECK(p != nullptr, ErrorCode::Backend, "allocate: cpu out of memory ({} bytes)",
                    bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, int) const override {
    std::free(p);
    g_host_held.fetch_sub(bytes, std::memory_order_relaxed);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) const override {
    copy(dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) const override {
    copy(host_dst, src, bytes);
  }
  void convert(const void* in, DType in_dt, void* out, DType out_dt, i64 n) const override {
    ref::convert(in, in_dt, out, out_dt, n);
  }
  void fill(DType dt, void* out, double value, i64 n) const override {
    ref::fill(dt, out, value, n);
  }

  // ---- GEMM ----
  void gemm(const GemmArgs& g) const override {
    switch (g.dt) {
      case DType::F32:
        return ref::gemm<float>(g, blas_matmul<float>);
      case DType::F64:
        return ref::gemm<double>(g, blas_matmul<double>);
      case DType::BF16:
        return gemm_bf16(g);
      case DType::I64:
        break;
    }
    unsupported("gemm", g.dt, "f32, f64 or bf16");
  }

  // ---- elementwise ----
  void binary(DType dt, BinaryOp op, const void* a, const Shape& a_shape, const void* b,
              const Shape& b_shape, void* out, const Shape& out_shape) const override {
    floating("binary", dt, [&](auto& io) {
      ref::binary(op, io.in(a, numel(a_shape)), a_shape, io.in(b, numel(b_shape)), b_shape,
                  io.out(out, numel(out_shape)), out_shape);
    });
  }
  void sum_to(DType dt, const void* in, const Shape& in_shape, void* out,
              const Shape& target_shape) const override {
    floating("sum_to", dt, [&](auto& io) {
      ref::sum_to(io.in(in, numel(in_shape)), in_shape, io.out(out, numel(target_shape)),
                  target_shape);
    });
  }
  void scale(DType dt, const void* x, double s, void* out, i64 n) const override {
    floating("scale", dt, [&](auto& io) { ref::scale(io.in(x, n), s, io.out(out, n), n); });
  }
  void add_scalar(DType dt, const void* x, double s, void* out, i64 n) const override {
    floating("add_scalar", dt,
             [&](auto& io) { ref::add_scalar(io.in(x, n), s, io.out(out, n), n); });
  }
  void relu_forward(DType dt, const void* x, void* out, i64 n) const override {
    floating("relu_forward", dt,
             [&](auto& io) { ref::relu_forward(io.in(x, n), io.out(out, n), n); });
  }
  void relu_backward(DType dt, const void* grad_out, const void* x, void* grad_in,
                     i64 n) const override {
    floating("relu_backward", dt, [&](auto& io) {
      ref::relu_backward(io.in(grad_out, n), io.in(x, n), io.out(grad_in, n), n);
    });
  }
  void gelu_forward(DType dt, const void* x, void* out, i64 n) const override {
    floating("gelu_forward", dt,
             [&](auto& io) { ref::gelu_forward(io.in(x, n), io.out(out, n), n); });
  }
  void gelu_backward(DType dt, const void* grad_out, const void* x, void* grad_in,
                     i64 n) const override {
    floating("gelu_backward", dt, [&](auto& io) {
      ref::gelu_backward(io.in(grad_out, n), io.in(x, n), io.out(grad_in, n), n);
    });
  }
  void silu_forward(DType dt, const void* x, void* out, i64 n) const override {
    floating("silu_forward", dt,
             [&](auto& io) { ref::silu_forward(io.in(x, n), io.out(out, n), n); });
  }
  void silu_backward(DType dt, const void* grad_out, const void* x, void* grad_in,
                     i64 n) const override {
    floating("silu_backward", dt, [&](auto& io) {
      ref::silu_backward(io.in(grad_out, n), io.in(x, n), io.out(grad_in, n), n);
    });
  }
  void dropout_forward(DType dt, const void* x, void* out, void* mask, i64 n, double p,
                       std::uint64_t seed) const override {
    floating("dropout_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::dropout_forward(io.in(x, n), io.out(out, n), acc<T>(mask), n, p, seed);
    });
  }
  void dropout_backward(DType dt, const void* grad_out, const void* mask, void* grad_in,
                        i64 n) const override {
    floating("dropout_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::dropout_backward(io.in(grad_out, n), acc<T>(mask), io.out(grad_in, n), n);
    });
  }

  // ---- row-wise, reductions ----
  void softmax_forward(DType dt, const void* x, void* out, i64 rows, i64 cols) const override {
    floating("softmax_forward", dt, [&](auto& io) {
      ref::softmax_forward(io.in(x, rows * cols), io.out(out, rows * cols), rows, cols);
    });
  }
  void softmax_backward(DType dt, const void* grad_out, const void* out, void* grad_in, i64 rows,
                        i64 cols) const override {
    floating("softmax_backward", dt, [&](auto& io) {
      const i64 n = rows * cols;
      ref::softmax_backward(io.in(grad_out, n), io.in(out, n), io.out(grad_in, n), rows, cols);
    });
  }
  void layernorm_forward(DType dt, const void* x, const void* w, const void* b, void* out,
                         void* mean, void* rstd, i64 rows, i64 cols, double eps) const override {
    floating("layernorm_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      ref::layernorm_forward(io.in(x, n), io.in(w, cols), io.in(b, cols), io.out(out, n),
                             acc<T>(mean), acc<T>(rstd), rows, cols, eps);
    });
  }
  void layernorm_backward(DType dt, const void* grad_out, const void* x, const void* w,
                          const void* mean, const void* rstd, void* grad_x, void* grad_w,
                          void* grad_b, i64 rows, i64 cols) const override {
    floating("layernorm_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      ref::layernorm_backward(io.in(grad_out, n), io.in(x, n), io.in(w, cols), acc<T>(mean),
                              acc<T>(rstd), io.out(grad_x, n), io.out(grad_w, cols),
                              io.out(grad_b, cols), rows, cols);
    });
  }
  void rmsnorm_forward(DType dt, const void* x, const void* w, void* out, void* rstd, i64 rows,
                       i64 cols, double eps) const override {
    floating("rmsnorm_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      ref::rmsnorm_forward(io.in(x, n), io.in(w, cols), io.out(out, n), acc<T>(rstd), rows, cols,
                           eps);
    });
  }
  void rmsnorm_backward(DType dt, const void* grad_out, const void* x, const void* w,
                        const void* rstd, void* grad_x, void* grad_w, i64 rows,
                        i64 cols) const override {
    floating("rmsnorm_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = rows * cols;
      ref::rmsnorm_backward(io.in(grad_out, n), io.in(x, n), io.in(w, cols), acc<T>(rstd),
                            io.out(grad_x, n), io.out(grad_w, cols), rows, cols);
    });
  }
  void sum_dim(DType dt, const void* x, void* out, i64 outer, i64 dim, i64 inner) const override {
    floating("sum_dim", dt, [&](auto& io) {
      ref::sum_dim(io.in(x, outer * dim * inner), io.out(out, outer * inner), outer, dim, inner);
    });
  }
  void sum_all(DType dt, const void* x, void* out, i64 n) const override {
    floating("sum_all", dt, [&](auto& io) { ref::sum_all(io.in(x, n), io.out(out, 1), n); });
  }

  // ---- embedding ----
  void embedding_forward(DType dt, const i64* idx, i64 n, const void* weight, i64 row_begin,
                         i64 rows, i64 vocab, i64 dim, void* out) const override {
    floating("embedding_forward", dt, [&](auto& io) {
      ref::embedding_forward(idx, n, io.in(weight, rows * dim), row_begin, rows, vocab, dim,
                             io.out(out, n * dim));
    });
  }
  void embedding_backward(DType dt, const void* grad_out, const i64* idx, i64 n, void* grad_weight,
                          i64 row_begin, i64 rows, i64 dim) const override {
    floating("embedding_backward", dt, [&](auto& io) {
      ref::embedding_backward(io.in(grad_out, n * dim), idx, n, io.out(grad_weight, rows * dim),
                              row_begin, rows, dim);
    });
  }

  // ---- attention ----
  void attention_forward(DType dt, const void* q, const void* k, const void* v, void* out,
                         void* probs, i64 bh, i64 t, i64 d, double scale,
                         bool causal) const override {
    floating("attention_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = bh * t * d;
      ref::attention_forward(io.in(q, n), io.in(k, n), io.in(v, n), io.out(out, n), acc<T>(probs),
                             bh, t, d, scale, causal, blas_matmul<T>);
    });
  }
  void attention_backward(DType dt, const void* grad_out, const void* q, const void* k,
                          const void* v, const void* probs, void* grad_q, void* grad_k,
                          void* grad_v, i64 bh, i64 t, i64 d, double scale) const override {
    floating("attention_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 n = bh * t * d;
      ref::attention_backward(io.in(grad_out, n), io.in(q, n), io.in(k, n), io.in(v, n),
                              acc<T>(probs), io.out(grad_q, n), io.out(grad_k, n),
                              io.out(grad_v, n), bh, t, d, scale, blas_matmul<T>);
    });
  }

  void attention_block_forward(DType dt, const void* q, const void* k, const void* v, void* out,
                               void* lse, i64 bh, i64 tq, i64 tk, i64 d, double scale, bool causal,
                               i64 q_pos, i64 k_pos) const override {
    floating("attention_block_forward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::attention_block_forward(io.in(q, bh * tq * d), io.in(k, bh * tk * d),
                                   io.in(v, bh * tk * d), io.out(out, bh * tq * d), acc<T>(lse), bh,
                                   tq, tk, d, scale, causal, q_pos, k_pos, blas_matmul<T>);
    });
  }
  void attention_merge(DType dt, void* out, void* lse, const void* out_b, const void* lse_b,
                       i64 rows, i64 d) const override {
    floating("attention_merge", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const T* prev = io.in(out, rows * d);  // read and written: widened in, narrowed back
      T* o = io.out(out, rows * d);
      if (o != prev) std::copy(prev, prev + rows * d, o);
      ref::attention_merge(o, acc<T>(lse), io.in(out_b, rows * d), acc<T>(lse_b), rows, d);
    });
  }
  void attention_block_backward(DType dt, const void* grad_out, const void* q, const void* k,
                                const void* v, const void* out, const void* lse, void* grad_q,
                                void* grad_k, void* grad_v, i64 bh, i64 tq, i64 tk, i64 d,
                                double scale, bool causal, i64 q_pos, i64 k_pos) const override {
    floating("attention_block_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      const i64 nq = bh * tq * d, nk = bh * tk * d;
      ref::attention_block_backward(io.in(grad_out, nq), io.in(q, nq), io.in(k, nk), io.in(v, nk),
                                    io.in(out, nq), acc<T>(lse), io.out(grad_q, nq),
                                    io.out(grad_k, nk), io.out(grad_v, nk), bh, tq, tk, d, scale,
                                    causal, q_pos, k_pos, blas_matmul<T>);
    });
  }

  // ---- cross-entropy ----
  void log_softmax_forward(DType dt, const void* x, void* out, i64 rows, i64 cols) const override {
    floating("log_softmax_forward", dt, [&](auto& io) {
      ref::log_softmax_forward(io.in(x, rows * cols), io.out(out, rows * cols), rows, cols);
    });
  }
  void log_softmax_backward(DType dt, const void* grad_out, const void* out, void* grad_in,
                            i64 rows, i64 cols) const override {
    floating("log_softmax_backward", dt, [&](auto& io) {
      const i64 n = rows * cols;
      ref::log_softmax_backward(io.in(grad_out, n), io.in(out, n), io.out(grad_in, n), rows, cols);
    });
  }
  void nll_loss_forward(DType dt, const void* logp, const i64* targets, i64 n, i64 c,
                        void* loss) const override {
    floating("nll_loss_forward", dt, [&](auto& io) {
      ref::nll_loss_forward(io.in(logp, n * c), targets, n, c, io.out(loss, 1));
    });
  }
  void nll_loss_backward(DType dt, const void* grad_loss, const i64* targets, void* grad_logp,
                         i64 n, i64 c) const override {
    floating("nll_loss_backward", dt, [&](auto& io) {
      ref::nll_loss_backward(io.in(grad_loss, 1), targets, io.out(grad_logp, n * c), n, c);
    });
  }
  void ce_shard_max(DType dt, const void* logits, i64 n, i64 c, void* max) const override {
    floating("ce_shard_max", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::ce_shard_max(io.in(logits, n * c), n, c, acc<T>(max));
    });
  }
  void ce_shard_stats(DType dt, const void* logits, const i64* targets, const void* max, i64 n,
                      i64 c, i64 col_begin, i64 vocab, void* sumexp, void* picked) const override {
    floating("ce_shard_stats", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::ce_shard_stats(io.in(logits, n * c), targets, acc<T>(max), n, c, col_begin, vocab,
                          acc<T>(sumexp), acc<T>(picked));
    });
  }
  void ce_shard_loss(DType dt, const void* max, const void* sumexp, const void* picked, i64 n,
                     void* loss) const override {
    floating("ce_shard_loss", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::ce_shard_loss(acc<T>(max), acc<T>(sumexp), acc<T>(picked), n, io.out(loss, 1));
    });
  }
  void ce_shard_backward(DType dt, const void* grad_loss, const void* logits, const i64* targets,
                         const void* max, const void* sumexp, i64 n, i64 c, i64 col_begin,
                         void* grad_logits) const override {
    floating("ce_shard_backward", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::ce_shard_backward(io.in(grad_loss, 1), io.in(logits, n * c), targets, acc<T>(max),
                             acc<T>(sumexp), n, c, col_begin, io.out(grad_logits, n * c));
    });
  }

  // ---- layout ----
  void permute(DType dt, const void* in, const Shape& in_shape, const int* perm,
               void* out) const override {
    by_size(dt, [&](auto tag) {
      using U = decltype(tag);
      ref::permute(static_cast<const U*>(in), in_shape, perm, static_cast<U*>(out));
    });
  }
  void narrow(DType dt, const void* in, const Shape& in_shape, int dim, i64 start, i64 len,
              void* out) const override {
    by_size(dt, [&](auto tag) {
      using U = decltype(tag);
      ref::narrow(static_cast<const U*>(in), in_shape, dim, start, len, static_cast<U*>(out));
    });
  }
  void narrow_scatter(DType dt, const void* src, const Shape& src_shape, int dim, i64 start,
                      void* dst, const Shape& dst_shape) const override {
    by_size(dt, [&](auto tag) {
      using U = decltype(tag);
      ref::narrow_scatter(static_cast<const U*>(src), src_shape, dim, start, static_cast<U*>(dst),
                          dst_shape);
    });
  }

  // ---- optimizers ----
  void sgd_step(DType dt, void* p, const void* g, void* momentum_buf, i64 n,
                const SgdArgs& a) const override {
    floating("sgd_step", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::sgd_step(io.inout(p, n), io.in(g, n), acc<T>(momentum_buf), n, a);
    });
  }
  void adamw_step(DType dt, void* p, const void* g, void* m, void* v, i64 n,
                  const AdamWArgs& a) const override {
    floating("adamw_step", dt, [&](auto& io) {
      using T = typename std::decay_t<decltype(io)>::type;
      ref::adamw_step(io.inout(p, n), io.in(g, n), acc<T>(m), acc<T>(v), n, a);
    });
  }

  // ---- collectives' arithmetic ----
  void reduce(DType dt, ReduceOp op, const void* const* srcs, int n_srcs, void* const* dsts,
              int n_dsts, i64 begin, i64 end) const override {
    switch (dt) {
      case DType::F32:
        return reduce_typed<float>(op, srcs, n_srcs, dsts, n_dsts, begin, end);
      case DType::F64:
        return reduce_typed<double>(op, srcs, n_srcs, dsts, n_dsts, begin, end);
      case DType::I64:
        return reduce_typed<i64>(op, srcs, n_srcs, dsts, n_dsts, begin, end);
      case DType::BF16:
        return reduce_typed<BF16, float>(op, srcs, n_srcs, dsts, n_dsts, begin, end);
    }
    unsupported("reduce", dt, "f32, f64, bf16 or i64");
  }

 private:
  // Blocks of kBlock elements: each block of every source is read into an accumulator (in
  // source order: the reference's bits) before any destination is written, so a dst may alias a
  // src; the inner loops are contiguous and vectorize. bf16 accumulates in float.
  template <typename T, typename A = T>
  static void reduce_typed(ReduceOp op, const void* const* srcs, int n_srcs, void* const* dsts,
                           int n_dsts, i64 begin, i64 end) {
    COMMTRACE_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Max,
                    ErrorCode::InvalidArgument,
                    "reduce: op {} is not a reduction (expected sum, avg or max)", int(op));
    COMMTRACE_CHECK(n_srcs >= 1, ErrorCode::InvalidArgument, "reduce: {} sources, expected >= 1",
                    n_srcs);
    constexpr i64 kBlock = 1024;
    A acc[kBlock];
    auto load = [](T v) -> A {
      if constexpr (std::is_same_v<T, BF16>) {
        return bf16_to_float(v);
      } else {
        return v;
      }
    };
    auto store = [](A v) -> T {
      if constexpr (std::is_same_v<T, BF16>) {
        return float_to_bf16(v);
      } else {
        return v;
      }
    };
    for (i64 b = begin; b < end; b += kBlock) {
      const i64 len = std::min(kBlock, end - b);
      const T* s0 = static_cast<const T*>(srcs[0]) + b;
      for (i64 k = 0; k < len; ++k) acc[k] = load(s0[k]);
      for (int j = 1; j < n_srcs; ++j) {
        const T* sj = static_cast<const T*>(srcs[j]) + b;
        if (op == ReduceOp::Max) {
          for (i64 k = 0; k < len; ++k) {
            const A v = load(sj[k]);
            acc[k] = v > acc[k] ? v : acc[k];
          }
        } else {
          for (i64 k = 0; k < len; ++k) acc[k] += load(sj[k]);
        }
      }
      if (op == ReduceOp::Avg) {
        for (i64 k = 0; k < len; ++k) acc[k] /= A(n_srcs);
      }
      for (int j = 0; j < n_dsts; ++j) {
        T* dj = static_cast<T*>(dsts[j]) + b;
        for (i64 k = 0; k < len; ++k) dj[k] = store(acc[k]);
      }
    }
  }
};

}  // namespace

// The one instance behind kernels_for(Device::CPU) (kernels/backend.cpp).
// OpenBLAS runs single-threaded: the runtime's ranks are threads already, and BLAS worker
// threads that spin (sched_yield) between the small products of a step take the ranks' cores.
// Its pthread build starts its workers when loaded; they are joined here when the library has
// the (internal) entry for it, looked up at run time so other builds link unchanged.
static void single_threaded_blas() {
  openblas_set_num_threads(1);
  using Shutdown = int (*)();
  if (auto shutdown = reinterpret_cast<Shutdown>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"))) {
    shutdown();
  }
}

std::uint64_t host_memory_limit() {
  const std::uint64_t l = g_host_limit.load(std::memory_order_relaxed);
  return l ? l : default_limit();
}
void set_host_memory_limit(std::uint64_t bytes) {
  g_host_limit.store(bytes, std::memory_order_relaxed);
}
std::uint64_t host_memory_held() { return g_host_held.load(std::memory_order_relaxed); }
void check_host_room(std::uint64_t bytes, std::string_view need) {
  const std::uint64_t held = host_memory_held(), limit = host_memory_limit();
  if (bytes > limit || held > limit - bytes) {
    throw_over_limit(need, held > kUnlimited - bytes ? kUnlimited : held + bytes, limit);
  }
}

const Kernels& cpu_backend() {
  static const CpuKernels k = [] {
    single_threaded_blas();
    return CpuKernels{};
  }();
  return k;
}

}  // namespace commtrace
