// The CUDA backend against the CPU backend (which runs the reference templates) on the same
// rounded random inputs, in f32, f64 and bf16 with the tolerance per dtype of test_backend.cpp.
// Without a CUDA device (this machine and CI) the program prints why and exits 77, which ctest
// reports as skipped; nothing is faked.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#define CATCH_CONFIG_RUNNER  // Catch2 v2: main below
#include "kernels/backend.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using commtrace::testing::random;

namespace {

double tolerance(DType dt) { return dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 1e-5 : 1e-2; }

const Kernels& cpu() { return kernels_for(Device::CPU); }
const Kernels& gpu() { return kernels_for(Device::CUDA); }

// A buffer held twice: on the host for the CPU backend and on the device for the CUDA backend.
struct Arg {
  DType dt;
  i64 n;
  std::vector<unsigned char> host;
  void* dev = nullptr;
  Arg(DType dt_, i64 n_, const std::vector<double>& values) : dt(dt_), n(n_) {
    const std::size_t bytes = std::size_t(std::max<i64>(n, 1)) * dtype_size(dt);
    host.resize(bytes);
    if (!values.empty()) cpu().convert(values.data(), DType::F64, host.data(), dt, n);
    dev = gpu().allocate(bytes, 0);
    gpu().copy_from_host(dev, host.data(), bytes);
  }
  ~Arg() { gpu().deallocate(dev, host.size(), 0); }
  Arg(const Arg&) = delete;
  Arg& operator=(const Arg&) = delete;
  std::vector<double> values(const void* p) const {
    std::vector<double> v(static_cast<std::size_t>(n));
    cpu().convert(p, dt, v.data(), DType::F64, n);
    return v;
  }
};

// Runs f(kernels, pick) on the CPU backend with host buffers and on the CUDA backend with device
// buffers, then compares every output.
template <typename F>
void both(const std::string& what, const std::vector<Arg*>& outs, F f) {
  f(cpu(), [](Arg& a) { return static_cast<void*>(a.host.data()); });
  f(gpu(), [](Arg& a) { return a.dev; });
  gpu().synchronize();
  for (Arg* o : outs) {
    std::vector<unsigned char> back(o->host.size());
    gpu().copy_to_host(back.data(), o->dev, back.size());
    const std::vector<double> got = o->values(back.data()), want = o->values(o->host.data());
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(got[i] - want[i]);
      if (got[i] == want[i] || err <= tolerance(o->dt) * std::max(1.0, std::fabs(want[i])))
        continue;
      if (bad++ == 0) first = i;
    }
    INFO(what << " " << dtype_name(o->dt) << ": " << bad << " of " << got.size()
              << " differ; first [" << first << "] cuda " << (bad ? got[first] : 0.0) << " cpu "
              << (bad ? want[first] : 0.0));
    CHECK(bad == 0);
  }
}

const DType kFloating[] = {DType::F32, DType::F64, DType::BF16};

}  // namespace

TEST_CASE("cuda gemm matches the cpu backend", "[cuda]") {
  for (DType dt : kFloating) {
    for (int t = 0; t < 4; ++t) {
      const i64 m = 37, n = 29, k = 65;
      GemmArgs g;
      g.dt = dt, g.trans_a = t & 1, g.trans_b = t & 2, g.m = m, g.n = n, g.k = k;
      g.lda = g.trans_a ? m : k, g.ldb = g.trans_b ? k : n, g.ldc = n;
      Arg a(dt, m * k, random(m * k, 1)), b(dt, k * n, random(k * n, 2)), c(dt, m * n, {}),
          bias(dt, n, random(n, 3));
      both("gemm", {&c}, [&](const Kernels& kk, auto P) {
        GemmArgs h = g;
        h.a = P(a), h.b = P(b), h.c = P(c), h.bias = P(bias), h.bias_rows = 1;
        kk.gemm(h);
      });
    }
  }
}

TEST_CASE("cuda elementwise, row-wise and reduction kernels match the cpu backend", "[cuda]") {
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    const i64 rows = 6, cols = 300, n = rows * cols;
    Arg x(dt, n, random(n, 4, -3, 3)), g(dt, n, random(n, 5)), out(dt, n, {}),
        w(dt, cols, random(cols, 6, 0.5, 1.5)), b(dt, cols, random(cols, 7)), mean(adt, rows, {}),
        rstd(adt, rows, {}), gw(dt, cols, {}), gb(dt, cols, {}), mask(adt, n, {}),
        small(dt, cols, random(cols, 8, 0.5, 1.5));
    both("binary broadcast", {&out}, [&](const Kernels& k, auto P) {
      k.binary(dt, BinaryOp::Div, P(x), {rows, cols}, P(small), {cols}, P(out), {rows, cols});
    });
    both("sum_to", {&gw}, [&](const Kernels& k, auto P) {
      k.sum_to(dt, P(x), {rows, cols}, P(gw), {cols});
    });
    both("gelu_backward", {&out},
         [&](const Kernels& k, auto P) { k.gelu_backward(dt, P(g), P(x), P(out), n); });
    both("dropout_forward", {&out, &mask}, [&](const Kernels& k, auto P) {
      k.dropout_forward(dt, P(x), P(out), P(mask), n, 0.3, 77);
    });
    both("softmax_forward", {&out},
         [&](const Kernels& k, auto P) { k.softmax_forward(dt, P(x), P(out), rows, cols); });
    both("log_softmax_forward", {&out},
         [&](const Kernels& k, auto P) { k.log_softmax_forward(dt, P(x), P(out), rows, cols); });
    both("layernorm_forward", {&out, &mean, &rstd}, [&](const Kernels& k, auto P) {
      k.layernorm_forward(dt, P(x), P(w), P(b), P(out), P(mean), P(rstd), rows, cols, 1e-5);
    });
    both("layernorm_backward", {&out, &gw, &gb}, [&](const Kernels& k, auto P) {
      k.layernorm_backward(dt, P(g), P(x), P(w), P(mean), P(rstd), P(out), P(gw), P(gb), rows,
                           cols);
    });
    both("rmsnorm_forward", {&out, &rstd}, [&](const Kernels& k, auto P) {
      k.rmsnorm_forward(dt, P(x), P(w), P(out), P(rstd), rows, cols, 1e-6);
    });
    both("sum_dim", {&gw},
         [&](const Kernels& k, auto P) { k.sum_dim(dt, P(x), P(gw), 1, rows, cols); });
  }
}

TEST_CASE("cuda embedding, attention and reduce match the cpu backend", "[cuda]") {
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    const i64 vocab = 50, dim = 16, tokens = 40, bh = 3, t = 9, d = 8;
    std::vector<double> ids(tokens);
    for (i64 i = 0; i < tokens; ++i) ids[std::size_t(i)] = double((i * 7) % vocab);
    Arg idx(DType::I64, tokens, ids), weight(dt, vocab * dim, random(vocab * dim, 9)),
        emb(dt, tokens * dim, {}), gemb(dt, tokens * dim, random(tokens * dim, 10)),
        gweight(dt, 20 * dim, {});
    both("embedding_forward (rows 10..30)", {&emb}, [&](const Kernels& k, auto P) {
      k.embedding_forward(dt, static_cast<const i64*>(P(idx)), tokens, P(weight), 10, 20, vocab,
                          dim, P(emb));
    });
    both("embedding_backward", {&gweight}, [&](const Kernels& k, auto P) {
      k.embedding_backward(dt, P(gemb), static_cast<const i64*>(P(idx)), tokens, P(gweight), 10, 20,
                           dim);
    });
    const i64 nq = bh * t * d;
    Arg q(dt, nq, random(nq, 11)), kk(dt, nq, random(nq, 12)), v(dt, nq, random(nq, 13)),
        o(dt, nq, {}), probs(adt, bh * t * t, {}), go(dt, nq, random(nq, 14)), gq(dt, nq, {}),
        gk(dt, nq, {}), gv(dt, nq, {});
    both("attention_forward", {&o, &probs}, [&](const Kernels& k, auto P) {
      k.attention_forward(dt, P(q), P(kk), P(v), P(o), P(probs), bh, t, d, 0.35, true);
    });
    both("attention_backward", {&gq, &gk, &gv}, [&](const Kernels& k, auto P) {
      k.attention_backward(dt, P(go), P(q), P(kk), P(v), P(probs), P(gq), P(gk), P(gv), bh, t, d,
                           0.35);
    });
    Arg r0(dt, 1000, random(1000, 15)), r1(dt, 1000, random(1000, 16)), r2(dt, 1000, {});
    both("reduce", {&r2}, [&](const Kernels& k, auto P) {
      const void* srcs[] = {P(r0), P(r1)};
      void* dsts[] = {P(r2)};
      k.reduce(dt, ReduceOp::Avg, srcs, 2, dsts, 1, 0, 1000);
    });
  }
}

// In place: both backends start from the same parameter and moments (f32 moments for bf16).
TEST_CASE("cuda optimizer steps match the cpu backend", "[cuda]") {
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    const i64 n = 1000;
    Arg p(dt, n, random(n, 20)), g(dt, n, random(n, 21)), m(adt, n, random(n, 22, -0.1, 0.1)),
        v(adt, n, random(n, 23, 0, 0.1));
    both("sgd_step", {&p, &m}, [&](const Kernels& k, auto P) {
      k.sgd_step(dt, P(p), P(g), P(m), n, SgdArgs{0.1, 0.9, 0.01, false});
    });
    both("adamw_step", {&p, &m, &v}, [&](const Kernels& k, auto P) {
      k.adamw_step(dt, P(p), P(g), P(m), P(v), n, AdamWArgs{1e-2, 0.9, 0.999, 1e-8, 0.1, 3});
    });
  }
}

// The stream's event timer measures the queued work itself: more than nothing, no more than the
// host saw from before queueing until the work was done; tokens are reused.
TEST_CASE("cuda timer measures work on the stream", "[cuda]") {
  DeviceTimer* timer = gpu().timer();
  REQUIRE(timer != nullptr);
  REQUIRE(cpu().timer() == nullptr);
  const i64 n = 1024;
  Arg a(DType::F32, n * n, random(n * n, 30)), c(DType::F32, n * n, {});
  GemmArgs g;
  g.m = g.n = g.k = n, g.lda = g.ldb = g.ldc = n, g.a = a.dev, g.b = a.dev, g.c = c.dev;
  gpu().synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint32_t token = timer->start();
  for (int i = 0; i < 10; ++i) gpu().gemm(g);
  timer->stop(token);
  const double device_s = timer->elapsed_s(token);
  const double host_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("device " << device_s << " s, host " << host_s << " s");
  CHECK(device_s > 0);
  CHECK(device_s <= host_s * 1.01);
  CHECK(timer->start() == token);  // the freed pair is taken again
  timer->stop(token);
  (void)timer->elapsed_s(token);
}

TEST_CASE("cuda embedding names an index out of range", "[cuda]") {
  Arg idx(DType::I64, 3, {1, 99, 2}), w(DType::F32, 40, random(40, 1)), out(DType::F32, 12, {});
  REQUIRE_THROWS_WITH(gpu().embedding_forward(DType::F32, static_cast<const i64*>(idx.dev), 3,
                                              w.dev, 0, 10, 10, 4, out.dev),
                      "embedding_forward: index 99 at position 1 is out of range [0, 10)");
}

// Its own main: without a device there is nothing to run, and the exit code says so (77).
int main(int argc, char** argv) {
  if (!has_kernels(Device::CUDA)) {
    std::printf("SKIP test_cuda: %s\n", kernels_unavailable_reason(Device::CUDA).c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
