// Tests of the reference kernels (kernels/reference.h) against formulas written here, and of
// every backward against central finite differences in double. The backends are tested against
// these references in test_backend.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/reference.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using commtrace::testing::contains;

namespace {

template <typename T>
std::vector<T> random_vec(i64 n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = T(dist(gen));
  return v;
}

// Small integers in [-3, 3]: products and sums of them are exact in f32.
template <typename T>
std::vector<T> int_vec(i64 n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = T(i64(gen() % 7) - 3);
  return v;
}

// Central differences of loss at x (eps 1e-6) compared with the analytic gradient.
void check_grad(const std::function<double(const std::vector<double>&)>& loss,
                std::vector<double> x, const std::vector<double>& grad) {
  REQUIRE(grad.size() == x.size());
  const double eps = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss(x);
    x[i] = x0 - eps;
    const double lm = loss(x);
    x[i] = x0;
    const double num = (lp - lm) / (2 * eps);
    INFO("element " << i);
    REQUIRE(grad[i] == Approx(num).epsilon(1e-6).margin(1e-8));
  }
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

// Runs f and returns the code of the commtrace::Error it throws, with its message in *msg.
ErrorCode error_of(const std::function<void()>& f, std::string* msg = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.code();
  }
  FAIL("no commtrace::Error thrown");
  return ErrorCode::Internal;
}

// Row-major multi-index of linear index i in shape.
std::vector<i64> unravel(i64 i, const Shape& shape) {
  std::vector<i64> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

// Linear index into `shape` (right-aligned, size-1 dims broadcast) of the multi-index of out.
i64 broadcast_offset(const std::vector<i64>& out_idx, const Shape& shape) {
  const std::size_t off = out_idx.size() - shape.size();
  i64 lin = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    lin = lin * shape[d] + (shape[d] == 1 ? 0 : out_idx[off + d]);
  }
  return lin;
}

template <typename T>
void ref_gemm(bool ta, bool tb, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda, const T* b,
              i64 ldb, T beta, T* c, i64 ldc) {
  for (i64 i = 0; i < m; ++i) {
    for (i64 j = 0; j < n; ++j) {
      T s = 0;
      for (i64 p = 0; p < k; ++p)
        s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + beta * c[i * ldc + j];
    }
  }
}

template <typename T>
void test_gemm_all_transposes() {
  const i64 m = 5, n = 7, k = 6, pad = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const i64 lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      auto a = int_vec<T>((ta ? k : m) * lda, 1);
      auto b = int_vec<T>((tb ? n : k) * ldb, 2);
      auto c = int_vec<T>(m * ldc, 3);
      auto want = c;
      ref::matmul<T>(ta, tb, m, n, k, T(2), a.data(), lda, b.data(), ldb, T(-1), c.data(), ldc);
      ref_gemm<T>(ta, tb, m, n, k, T(2), a.data(), lda, b.data(), ldb, T(-1), want.data(), ldc);
      INFO("trans_a " << ta << " trans_b " << tb);
      REQUIRE(c == want);  // exact: small integers; padding columns untouched too
    }
  }
}

template <typename T>
void test_binary_shapes(const Shape& as, const Shape& bs, const Shape& os) {
  auto a = int_vec<T>(numel(as), 11);
  auto b = int_vec<T>(numel(bs), 12);
  for (auto& x : b) x = x == T(0) ? T(5) : x;  // no division by zero
  for (auto op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
    std::vector<T> out(numel(os));
    ref::binary<T>(op, a.data(), as, b.data(), bs, out.data(), os);
    for (i64 i = 0; i < numel(os); ++i) {
      const auto idx = unravel(i, os);
      const T x = a[broadcast_offset(idx, as)], y = b[broadcast_offset(idx, bs)];
      const T want = op == BinaryOp::Add   ? x + y
                     : op == BinaryOp::Sub ? x - y
                     : op == BinaryOp::Mul ? x * y
                                           : x / y;
      INFO("a " << shape_str(as) << " b " << shape_str(bs) << " op " << int(op) << " i " << i);
      REQUIRE(out[i] == want);
    }
  }
}

void test_sum_to(const Shape& in_shape, const Shape& target) {
  auto in = int_vec<double>(numel(in_shape), 21);
  std::vector<double> out(numel(target), 99.0), want(numel(target), 0.0);
  for (i64 i = 0; i < numel(in_shape); ++i) {
    want[broadcast_offset(unravel(i, in_shape), target)] += in[i];
  }
  ref::sum_to<double>(in.data(), in_shape, out.data(), target);
  INFO("in " << shape_str(in_shape) << " target " << shape_str(target));
  REQUIRE(out == want);
}

// The mean cross-entropy loss of the reference: log_softmax, then nll_loss.
template <typename T>
T ce(const std::vector<T>& logits, const std::vector<i64>& targets, i64 n, i64 c) {
  std::vector<T> logp(logits.size());
  ref::log_softmax_forward<T>(logits.data(), logp.data(), n, c);
  T loss = T(-1);
  ref::nll_loss_forward<T>(logp.data(), targets.data(), n, c, &loss);
  return loss;
}

// Its gradient for grad_loss: nll_loss_backward, then log_softmax_backward.
std::vector<double> ce_grad(double grad_loss, const std::vector<double>& logits,
                            const std::vector<i64>& targets, i64 n, i64 c) {
  std::vector<double> logp(logits.size()), g(logits.size()), out(logits.size());
  ref::log_softmax_forward<double>(logits.data(), logp.data(), n, c);
  ref::nll_loss_backward<double>(&grad_loss, targets.data(), g.data(), n, c);
  ref::log_softmax_backward<double>(g.data(), logp.data(), out.data(), n, c);
  return out;
}

// Attention forward in double with the given inputs; returns out, fills probs.
std::vector<double> attn_fwd(const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, std::vector<double>& probs, i64 bh,
                             i64 t, i64 d, bool causal) {
  std::vector<double> out(bh * t * d);
  probs.assign(bh * t * t, -1.0);
  ref::attention_forward<double>(q.data(), k.data(), v.data(), out.data(), probs.data(), bh, t, d,
                                 1.0 / std::sqrt(double(d)), causal);
  return out;
}

}  // namespace

TEST_CASE("gemm matches a triple loop for every transpose combination", "[kernels][gemm]") {
  SECTION("f32") { test_gemm_all_transposes<float>(); }
  SECTION("f64") { test_gemm_all_transposes<double>(); }
  SECTION("random f64, no padding") {
    const i64 m = 17, n = 9, k = 33;
    auto a = random_vec<double>(m * k, 4), b = random_vec<double>(k * n, 5);
    std::vector<double> c(m * n), want(m * n);
    ref::matmul<double>(false, false, m, n, k, 0.5, a.data(), k, b.data(), n, 0.0, c.data(), n);
    ref_gemm<double>(false, false, m, n, k, 0.5, a.data(), k, b.data(), n, 0.0, want.data(), n);
    for (i64 i = 0; i < m * n; ++i) REQUIRE(c[i] == Approx(want[i]).epsilon(1e-12));
  }
}

TEST_CASE("matmul with zero dims", "[kernels][gemm]") {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  SECTION("k == 0 scales C by beta") {
    ref::matmul<float>(false, false, 2, 3, 0, 1.f, nullptr, 1, nullptr, 3, 2.f, c.data(), 3);
    REQUIRE(c == std::vector<float>{2, 4, 6, 8, 10, 12});
  }
  SECTION("k == 0 with beta == 0 does not read C") {
    c[0] = std::numeric_limits<float>::quiet_NaN();
    ref::matmul<float>(false, false, 2, 3, 0, 1.f, nullptr, 1, nullptr, 3, 0.f, c.data(), 3);
    REQUIRE(c == std::vector<float>(6, 0.f));
  }
  SECTION("m == 0 or n == 0 touches nothing") {
    ref::matmul<float>(false, false, 0, 3, 4, 1.f, nullptr, 4, nullptr, 3, 0.f, c.data(), 3);
    ref::matmul<float>(true, true, 2, 0, 4, 1.f, nullptr, 2, nullptr, 4, 0.f, c.data(), 3);
    REQUIRE(c == std::vector<float>{1, 2, 3, 4, 5, 6});
  }
}

TEST_CASE("gemm adds bias rows and runs batches", "[kernels][gemm]") {
  // Batch 2 of (2, 3) @ (3, 2) with padded leading dims; then a bias of 1 row and of m rows.
  const i64 m = 2, n = 2, k = 3;
  auto a = int_vec<double>(2 * 8, 5), b = int_vec<double>(2 * 9, 6);
  std::vector<double> c(2 * 6, -7.0);
  GemmArgs g;
  g.dt = DType::F64;
  g.batch = 2, g.m = m, g.n = n, g.k = k;
  g.a = a.data(), g.lda = 4, g.stride_a = 8;
  g.b = b.data(), g.ldb = 3, g.stride_b = 9;
  g.c = c.data(), g.ldc = 3, g.stride_c = 6;
  ref::gemm<double>(g);
  for (i64 bi = 0; bi < 2; ++bi) {
    for (i64 i = 0; i < m; ++i) {
      for (i64 j = 0; j < n; ++j) {
        double want = 0;
        for (i64 p = 0; p < k; ++p) want += a[bi * 8 + i * 4 + p] * b[bi * 9 + p * 3 + j];
        REQUIRE(c[bi * 6 + i * 3 + j] == want);
      }
      REQUIRE(c[bi * 6 + i * 3 + 2] == -7.0);  // padding untouched
    }
  }
  const std::vector<double> row = {10, 20}, full = {1, 2, 3, 4};
  for (const auto* bias : {&row, &full}) {
    std::vector<double> c1(6, -7.0), c0(6, -7.0);
    g.batch = 1;
    g.c = c0.data();
    ref::gemm<double>(g);
    g.bias = bias->data();
    g.bias_rows = bias->size() == 2 ? 1 : m;
    g.c = c1.data();
    ref::gemm<double>(g);
    for (i64 i = 0; i < m; ++i) {
      for (i64 j = 0; j < n; ++j) {
        REQUIRE(c1[i * 3 + j] == c0[i * 3 + j] + (*bias)[(g.bias_rows == 1 ? 0 : i * n) + j]);
      }
    }
    g.bias = nullptr;
  }
  SECTION("k == 0 gives the bias (or zeros)") {
    std::vector<double> c2(4, -7.0);
    GemmArgs z;
    z.dt = DType::F64, z.m = 2, z.n = 2, z.k = 0, z.ldc = 2, z.c = c2.data();
    ref::gemm<double>(z);
    REQUIRE(c2 == std::vector<double>(4, 0.0));
    z.bias = row.data(), z.bias_rows = 1;
    ref::gemm<double>(z);
    REQUIRE(c2 == std::vector<double>{10, 20, 10, 20});
  }
}

TEST_CASE("binary broadcasts like NumPy", "[kernels][elementwise]") {
  SECTION("same shape") { test_binary_shapes<float>({2, 3}, {2, 3}, {2, 3}); }
  SECTION("(2,3,4) op (3,1)") { test_binary_shapes<double>({2, 3, 4}, {3, 1}, {2, 3, 4}); }
  SECTION("(4) op (2,3,4)") { test_binary_shapes<float>({4}, {2, 3, 4}, {2, 3, 4}); }
  SECTION("(2,1,4) op (3,1)") { test_binary_shapes<double>({2, 1, 4}, {3, 1}, {2, 3, 4}); }
  SECTION("scalar op (2,3)") { test_binary_shapes<float>({}, {2, 3}, {2, 3}); }
  SECTION("(1) op (1)") { test_binary_shapes<double>({1}, {1}, {1}); }
  SECTION("(5,1) op (1,6)") { test_binary_shapes<double>({5, 1}, {1, 6}, {5, 6}); }
  SECTION("empty") { test_binary_shapes<float>({0, 3}, {3}, {0, 3}); }
}

TEST_CASE("sum_to reverses broadcasting", "[kernels][elementwise]") {
  test_sum_to({2, 3, 4}, {3, 1});
  test_sum_to({2, 3, 4}, {4});
  test_sum_to({2, 3, 4}, {1, 3, 1});
  test_sum_to({2, 3, 4}, {2, 1, 4});
  test_sum_to({2, 3, 4}, {});
  test_sum_to({2, 3, 4}, {2, 3, 4});
  SECTION("of a broadcast tensor counts the copies") {
    const std::vector<float> ones = {1.f, 2.f, 3.f}, zeros(24, 0.f);
    std::vector<float> expanded(24), back(3);
    ref::binary<float>(BinaryOp::Add, ones.data(), {3, 1}, zeros.data(), {2, 3, 4}, expanded.data(),
                       {2, 3, 4});
    ref::sum_to<float>(expanded.data(), {2, 3, 4}, back.data(), {3, 1});
    REQUIRE(back == std::vector<float>{8, 16, 24});
  }
}

TEST_CASE("scale, add_scalar, fill, relu", "[kernels][elementwise]") {
  const std::vector<double> x = {-2, -0.5, 0, 1.5, 3};
  std::vector<double> out(5);
  ref::scale<double>(x.data(), 2.0, out.data(), 5);
  REQUIRE(out == std::vector<double>{-4, -1, 0, 3, 6});
  ref::add_scalar<double>(x.data(), 1.0, out.data(), 5);
  REQUIRE(out == std::vector<double>{-1, 0.5, 1, 2.5, 4});
  ref::fill(DType::F64, out.data(), 7.0, 5);
  REQUIRE(out == std::vector<double>(5, 7.0));
  ref::relu_forward<double>(x.data(), out.data(), 5);
  REQUIRE(out == std::vector<double>{0, 0, 0, 1.5, 3});
  const std::vector<double> g = {1, 2, 3, 4, 5};
  ref::relu_backward<double>(g.data(), x.data(), out.data(), 5);
  REQUIRE(out == std::vector<double>{0, 0, 0, 4, 5});
  std::vector<float> xf = {-1.f, 2.f}, of(2);
  ref::relu_forward<float>(xf.data(), of.data(), 2);
  REQUIRE(of == std::vector<float>{0.f, 2.f});
}

TEST_CASE("gelu is exact-erf and its backward matches finite differences", "[kernels][gelu]") {
  const std::vector<double> x = {-3, -1, -0.25, 0, 0.5, 1, 2.5};
  std::vector<double> y(x.size());
  ref::gelu_forward<double>(x.data(), y.data(), i64(x.size()));
  REQUIRE(y[3] == 0.0);
  REQUIRE(y[5] == Approx(0.8413447460685429).epsilon(1e-14));
  REQUIRE(y[1] == Approx(-0.15865525393145707).epsilon(1e-14));
  std::vector<float> xf = {1.f}, yf(1);
  ref::gelu_forward<float>(xf.data(), yf.data(), 1);
  REQUIRE(yf[0] == Approx(0.8413447f).epsilon(1e-6));

  const auto r = random_vec<double>(i64(x.size()), 31);
  std::vector<double> grad(x.size());
  ref::gelu_backward<double>(r.data(), x.data(), grad.data(), i64(x.size()));
  check_grad(
      [&](const std::vector<double>& xx) {
        std::vector<double> yy(xx.size());
        ref::gelu_forward<double>(xx.data(), yy.data(), i64(xx.size()));
        return dot(yy, r);
      },
      x, grad);
}

TEST_CASE("silu is x sigmoid(x) and its backward matches finite differences", "[kernels][silu]") {
  const std::vector<double> x = {-3, -1, -0.25, 0, 0.5, 1, 2.5};
  std::vector<double> y(x.size());
  ref::silu_forward<double>(x.data(), y.data(), i64(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(y[i] == Approx(x[i] / (1 + std::exp(-x[i]))).epsilon(1e-14).margin(1e-15));
  }
  const auto r = random_vec<double>(i64(x.size()), 33);
  std::vector<double> grad(x.size());
  ref::silu_backward<double>(r.data(), x.data(), grad.data(), i64(x.size()));
  check_grad(
      [&](const std::vector<double>& xx) {
        std::vector<double> yy(xx.size());
        ref::silu_forward<double>(xx.data(), yy.data(), i64(xx.size()));
        return dot(yy, r);
      },
      x, grad);
}

TEST_CASE("rmsnorm", "[kernels][rmsnorm]") {
  const i64 rows = 3, cols = 8;
  const double eps = 1e-6;
  auto x = random_vec<double>(rows * cols, 61, -2, 2);
  auto w = random_vec<double>(cols, 62, 0.5, 1.5);
  std::vector<double> y(rows * cols), rstd(rows);

  SECTION("matches the formula: x / sqrt(mean(x^2) + eps) * w") {
    ref::rmsnorm_forward<double>(x.data(), w.data(), y.data(), rstd.data(), rows, cols, eps);
    for (i64 r = 0; r < rows; ++r) {
      double ms = 0;
      for (i64 j = 0; j < cols; ++j) ms += x[r * cols + j] * x[r * cols + j];
      const double rs = 1 / std::sqrt(ms / cols + eps);
      REQUIRE(rstd[r] == Approx(rs).epsilon(1e-12));
      for (i64 j = 0; j < cols; ++j) {
        REQUIRE(y[r * cols + j] == Approx(x[r * cols + j] * rs * w[j]).epsilon(1e-12));
      }
    }
  }
  SECTION("backward matches finite differences for x and w, with and without w") {
    const auto r = random_vec<double>(rows * cols, 63);
    for (bool affine : {true, false}) {
      const double* wp = affine ? w.data() : nullptr;
      auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
        std::vector<double> yy(rows * cols), rr(rows);
        ref::rmsnorm_forward<double>(xx.data(), affine ? ww.data() : nullptr, yy.data(), rr.data(),
                                     rows, cols, eps);
        return dot(yy, r);
      };
      ref::rmsnorm_forward<double>(x.data(), wp, y.data(), rstd.data(), rows, cols, eps);
      std::vector<double> gx(rows * cols, 123.0), gw(cols, 123.0);
      ref::rmsnorm_backward<double>(r.data(), x.data(), wp, rstd.data(), gx.data(),
                                    affine ? gw.data() : nullptr, rows, cols);
      check_grad([&](const std::vector<double>& v) { return loss(v, w); }, x, gx);
      if (affine) check_grad([&](const std::vector<double>& v) { return loss(x, v); }, w, gw);
    }
  }
}

TEST_CASE("softmax", "[kernels][softmax]") {
  const i64 rows = 4, cols = 6;
  auto x = random_vec<double>(rows * cols, 41, -3, 3);
  std::vector<double> y(rows * cols);
  ref::softmax_forward<double>(x.data(), y.data(), rows, cols);
  for (i64 r = 0; r < rows; ++r) {
    double s = 0, z = 0;
    for (i64 j = 0; j < cols; ++j) z += std::exp(x[r * cols + j]);
    for (i64 j = 0; j < cols; ++j) {
      s += y[r * cols + j];
      REQUIRE(y[r * cols + j] == Approx(std::exp(x[r * cols + j]) / z).epsilon(1e-12));
    }
    REQUIRE(s == Approx(1.0).epsilon(1e-12));
  }
  SECTION("stable for large inputs (f32)") {
    std::vector<float> big = {1000.f, 1001.f, 1002.f}, out(3);
    ref::softmax_forward<float>(big.data(), out.data(), 1, 3);
    REQUIRE(out[0] + out[1] + out[2] == Approx(1.f));
    REQUIRE(out[2] == Approx(0.66524096f).epsilon(1e-5));
  }
  SECTION("backward matches finite differences") {
    const auto r = random_vec<double>(rows * cols, 42);
    std::vector<double> grad(rows * cols);
    ref::softmax_backward<double>(r.data(), y.data(), grad.data(), rows, cols);
    check_grad(
        [&](const std::vector<double>& xx) {
          std::vector<double> yy(xx.size());
          ref::softmax_forward<double>(xx.data(), yy.data(), rows, cols);
          return dot(yy, r);
        },
        x, grad);
  }
}

TEST_CASE("layernorm", "[kernels][layernorm]") {
  const i64 rows = 3, cols = 8;
  const double eps = 1e-5;
  auto x = random_vec<double>(rows * cols, 51, -2, 2);
  auto w = random_vec<double>(cols, 52, 0.5, 1.5);
  auto b = random_vec<double>(cols, 53);
  std::vector<double> y(rows * cols), mean(rows), rstd(rows);

  SECTION("without affine: mean 0, biased variance 1") {
    ref::layernorm_forward<double>(x.data(), nullptr, nullptr, y.data(), mean.data(), rstd.data(),
                                   rows, cols, 0.0);
    for (i64 r = 0; r < rows; ++r) {
      double m = 0, v = 0, xm = 0;
      for (i64 j = 0; j < cols; ++j) m += y[r * cols + j], xm += x[r * cols + j];
      m /= cols;
      for (i64 j = 0; j < cols; ++j) v += (y[r * cols + j] - m) * (y[r * cols + j] - m);
      REQUIRE(m == Approx(0.0).margin(1e-12));
      REQUIRE(v / cols == Approx(1.0).epsilon(1e-12));
      REQUIRE(mean[r] == Approx(xm / cols).epsilon(1e-12));
    }
  }
  SECTION("affine matches the formula (f32)") {
    std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), bf(b.begin(), b.end());
    std::vector<float> yf(rows * cols), mf(rows), rf(rows);
    ref::layernorm_forward<float>(xf.data(), wf.data(), bf.data(), yf.data(), mf.data(), rf.data(),
                                  rows, cols, eps);
    for (i64 r = 0; r < rows; ++r) {
      double m = 0, v = 0;
      for (i64 j = 0; j < cols; ++j) m += xf[r * cols + j];
      m /= cols;
      for (i64 j = 0; j < cols; ++j) v += (xf[r * cols + j] - m) * (xf[r * cols + j] - m);
      const double rs = 1 / std::sqrt(v / cols + eps);
      REQUIRE(rf[r] == Approx(rs).epsilon(1e-5));
      for (i64 j = 0; j < cols; ++j) {
        REQUIRE(yf[r * cols + j] ==
                Approx((xf[r * cols + j] - m) * rs * wf[j] + bf[j]).epsilon(1e-5).margin(1e-5));
      }
    }
  }
  SECTION("backward matches finite differences for x, w and b") {
    const auto r = random_vec<double>(rows * cols, 54);
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                    const std::vector<double>& bb) {
      std::vector<double> yy(rows * cols), mm(rows), rr(rows);
      ref::layernorm_forward<double>(xx.data(), ww.data(), bb.data(), yy.data(), mm.data(),
                                     rr.data(), rows, cols, eps);
      return dot(yy, r);
    };
    ref::layernorm_forward<double>(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(),
                                   rows, cols, eps);
    std::vector<double> gx(rows * cols, 123.0), gw(cols, 123.0), gb(cols, 123.0);
    ref::layernorm_backward<double>(r.data(), x.data(), w.data(), mean.data(), rstd.data(),
                                    gx.data(), gw.data(), gb.data(), rows, cols);
    check_grad([&](const std::vector<double>& v) { return loss(v, w, b); }, x, gx);
    check_grad([&](const std::vector<double>& v) { return loss(x, v, b); }, w, gw);
    check_grad([&](const std::vector<double>& v) { return loss(x, w, v); }, b, gb);

    // A second call overwrites grad_x, grad_w and grad_b.
    auto gx2 = gx, gw2 = gw, gb2 = gb;
    ref::layernorm_backward<double>(r.data(), x.data(), w.data(), mean.data(), rstd.data(),
                                    gx2.data(), gw2.data(), gb2.data(), rows, cols);
    REQUIRE(gx2 == gx);
    REQUIRE(gw2 == gw);
    REQUIRE(gb2 == gb);
  }
  SECTION("backward without affine and null grad_w / grad_b") {
    const auto r = random_vec<double>(rows * cols, 55);
    ref::layernorm_forward<double>(x.data(), nullptr, nullptr, y.data(), mean.data(), rstd.data(),
                                   rows, cols, eps);
    std::vector<double> gx(rows * cols);
    ref::layernorm_backward<double>(r.data(), x.data(), nullptr, mean.data(), rstd.data(),
                                    gx.data(), nullptr, nullptr, rows, cols);
    check_grad(
        [&](const std::vector<double>& xx) {
          std::vector<double> yy(rows * cols), mm(rows), rr(rows);
          ref::layernorm_forward<double>(xx.data(), nullptr, nullptr, yy.data(), mm.data(),
                                         rr.data(), rows, cols, eps);
          return dot(yy, r);
        },
        x, gx);
  }
}

TEST_CASE("sum_dim, sum_all", "[kernels][reduce]") {
  const i64 outer = 2, dim = 3, inner = 4;
  auto x = int_vec<float>(outer * dim * inner, 61);
  std::vector<float> s(outer * inner, 99.f);
  ref::sum_dim<float>(x.data(), s.data(), outer, dim, inner);
  for (i64 o = 0; o < outer; ++o) {
    for (i64 i = 0; i < inner; ++i) {
      float want = 0;
      for (i64 j = 0; j < dim; ++j) want += x[(o * dim + j) * inner + i];
      REQUIRE(s[o * inner + i] == want);
    }
  }
  float total = -1.f;
  ref::sum_all<float>(x.data(), &total, i64(x.size()));
  REQUIRE(total == std::accumulate(x.begin(), x.end(), 0.f));
  double empty = -1.0;
  ref::sum_all<double>(nullptr, &empty, 0);
  REQUIRE(empty == 0.0);
  SECTION("f32 accumulates in double") {
    const std::vector<float> v = {1e8f, 1.f, 1.f, 1.f, 1.f, -1e8f};
    ref::sum_all<float>(v.data(), &total, 6);
    REQUIRE(total == 4.f);
  }
}

TEST_CASE("embedding", "[kernels][embedding]") {
  const i64 vocab = 6, dim = 3;
  std::vector<double> table(vocab * dim);
  std::iota(table.begin(), table.end(), 0.0);  // row r holds 3r, 3r+1, 3r+2
  const std::vector<i64> idx = {5, 0, 2, 2, 4};
  const i64 n = i64(idx.size());

  SECTION("whole table") {
    std::vector<double> out(n * dim);
    ref::embedding_forward<double>(idx.data(), n, table.data(), 0, vocab, vocab, dim, out.data());
    for (i64 i = 0; i < n; ++i) {
      for (i64 j = 0; j < dim; ++j) REQUIRE(out[i * dim + j] == double(idx[i] * dim + j));
    }
    std::vector<double> go(n * dim, 1.0), gw(vocab * dim, 10.0);  // overwritten
    ref::embedding_backward<double>(go.data(), idx.data(), n, gw.data(), 0, vocab, dim);
    const std::vector<double> hits = {1, 0, 2, 0, 1, 1};
    for (i64 r = 0; r < vocab; ++r) {
      for (i64 j = 0; j < dim; ++j) REQUIRE(gw[r * dim + j] == hits[r]);
    }
  }
  SECTION("masked row range [2, 5)") {
    const i64 row_begin = 2, rows = 3;
    const double* shard = table.data() + row_begin * dim;
    std::vector<float> shard_f(shard, shard + rows * dim), out(n * dim, -1.f);
    ref::embedding_forward<float>(idx.data(), n, shard_f.data(), row_begin, rows, vocab, dim,
                                  out.data());
    for (i64 i = 0; i < n; ++i) {
      const bool in = idx[i] >= row_begin && idx[i] < row_begin + rows;
      for (i64 j = 0; j < dim; ++j) {
        REQUIRE(out[i * dim + j] == (in ? float(idx[i] * dim + j) : 0.f));
      }
    }
    std::vector<float> go(n * dim), gw(rows * dim, -5.f);
    for (i64 i = 0; i < n * dim; ++i) go[i] = float(i);
    ref::embedding_backward<float>(go.data(), idx.data(), n, gw.data(), row_begin, rows, dim);
    // idx 2 at positions 2 and 3, idx 4 at position 4; idx 3 never.
    for (i64 j = 0; j < dim; ++j) {
      REQUIRE(gw[0 * dim + j] == go[2 * dim + j] + go[3 * dim + j]);
      REQUIRE(gw[1 * dim + j] == 0.f);
      REQUIRE(gw[2 * dim + j] == go[4 * dim + j]);
    }
  }
  SECTION("index out of the vocabulary throws InvalidArgument naming it") {
    std::vector<double> out(2 * dim);
    for (i64 bad : {i64(-1), vocab}) {
      const std::vector<i64> bad_idx = {1, bad};
      std::string msg;
      REQUIRE(error_of(
                  [&] {
                    ref::embedding_forward<double>(bad_idx.data(), 2, table.data(), 0, vocab, vocab,
                                                   dim, out.data());
                  },
                  &msg) == ErrorCode::InvalidArgument);
      REQUIRE(contains(msg, "embedding"));
      REQUIRE(contains(msg, std::to_string(bad)));
      REQUIRE(contains(msg, "position 1"));
      REQUIRE(contains(msg, "[0, 6)"));
    }
    const std::vector<i64> neg = {-3};
    std::vector<double> gw(vocab * dim), go(dim);
    REQUIRE_THROWS_AS(
        ref::embedding_backward<double>(go.data(), neg.data(), 1, gw.data(), 0, vocab, dim), Error);
  }
}

TEST_CASE("causal attention forward", "[kernels][attention]") {
  const i64 bh = 2, t = 5, d = 4;
  auto q = random_vec<double>(bh * t * d, 71), k = random_vec<double>(bh * t * d, 72),
       v = random_vec<double>(bh * t * d, 73);
  std::vector<double> probs;
  const auto out = attn_fwd(q, k, v, probs, bh, t, d, true);
  for (i64 h = 0; h < bh; ++h) {
    for (i64 j = 0; j < d; ++j) {  // the first query attends only to key 0
      REQUIRE(out[h * t * d + j] == Approx(v[h * t * d + j]).epsilon(1e-12));
    }
    for (i64 i = 0; i < t; ++i) {
      double s = 0;
      for (i64 j = 0; j < t; ++j) {
        const double p = probs[(h * t + i) * t + j];
        if (j > i) REQUIRE(p == 0.0);
        s += p;
      }
      REQUIRE(s == Approx(1.0).epsilon(1e-12));
    }
  }
  SECTION("matches a naive reference, causal and not") {
    for (bool causal : {true, false}) {
      const auto o = attn_fwd(q, k, v, probs, bh, t, d, causal);
      for (i64 h = 0; h < bh; ++h) {
        for (i64 i = 0; i < t; ++i) {
          const i64 valid = causal ? i + 1 : t;
          std::vector<double> s(valid);
          double z = 0;
          for (i64 j = 0; j < valid; ++j) {
            for (i64 c = 0; c < d; ++c) s[j] += q[(h * t + i) * d + c] * k[(h * t + j) * d + c];
            s[j] = std::exp(s[j] / std::sqrt(double(d)));
            z += s[j];
          }
          for (i64 c = 0; c < d; ++c) {
            double want = 0;
            for (i64 j = 0; j < valid; ++j) want += s[j] / z * v[(h * t + j) * d + c];
            REQUIRE(o[(h * t + i) * d + c] == Approx(want).epsilon(1e-12));
          }
        }
      }
    }
  }
  SECTION("f32 agrees with f64") {
    std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end());
    std::vector<float> of(bh * t * d), pf(bh * t * t);
    ref::attention_forward<float>(qf.data(), kf.data(), vf.data(), of.data(), pf.data(), bh, t, d,
                                  0.5f, true);
    for (i64 i = 0; i < bh * t * d; ++i) REQUIRE(of[i] == Approx(out[i]).margin(1e-5));
  }
}

TEST_CASE("attention backward matches finite differences", "[kernels][attention]") {
  const i64 bh = 2, t = 4, d = 3;
  auto q = random_vec<double>(bh * t * d, 81), k = random_vec<double>(bh * t * d, 82),
       v = random_vec<double>(bh * t * d, 83);
  const auto r = random_vec<double>(bh * t * d, 84);
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    std::vector<double> probs;
    attn_fwd(q, k, v, probs, bh, t, d, causal);
    std::vector<double> gq(bh * t * d, 7.0), gk(bh * t * d, 7.0), gv(bh * t * d, 7.0);
    ref::attention_backward<double>(r.data(), q.data(), k.data(), v.data(), probs.data(), gq.data(),
                                    gk.data(), gv.data(), bh, t, d, 1.0 / std::sqrt(double(d)));
    std::vector<double> p;
    check_grad(
        [&](const std::vector<double>& x) {
          return dot(attn_fwd(x, k, v, p, bh, t, d, causal), r);
        },
        q, gq);
    check_grad(
        [&](const std::vector<double>& x) {
          return dot(attn_fwd(q, x, v, p, bh, t, d, causal), r);
        },
        k, gk);
    check_grad(
        [&](const std::vector<double>& x) {
          return dot(attn_fwd(q, k, x, p, bh, t, d, causal), r);
        },
        v, gv);
  }
}

TEST_CASE("cross-entropy: log_softmax and nll_loss", "[kernels][cross_entropy]") {
  const i64 n = 4, c = 5;
  auto logits = random_vec<double>(n * c, 91, -3, 3);
  const std::vector<i64> targets = {0, 4, 2, 2};
  double want = 0;
  for (i64 r = 0; r < n; ++r) {
    double z = 0;
    for (i64 j = 0; j < c; ++j) z += std::exp(logits[r * c + j]);
    want += std::log(z) - logits[r * c + targets[r]];
  }
  REQUIRE(ce<double>(logits, targets, n, c) == Approx(want / n).epsilon(1e-12));

  SECTION("stable for large logits (f32)") {
    const std::vector<float> big = {1000.f, 1000.f, 0.f, 1000.f};
    const std::vector<i64> tg = {0, 0};  // losses log 2 and 1000
    REQUIRE(ce<float>(big, tg, 2, 2) == Approx((std::log(2.0) + 1000.0) / 2).epsilon(1e-6));
  }
  SECTION("backward matches finite differences") {
    const std::vector<double> grad = ce_grad(1.5, logits, targets, n, c);
    check_grad([&](const std::vector<double>& x) { return 1.5 * ce<double>(x, targets, n, c); },
               logits, grad);
  }
  SECTION("target out of range throws InvalidArgument naming it") {
    for (i64 bad : {i64(-1), c}) {
      const std::vector<i64> tg = {1, 2, bad, 0};
      std::string msg;
      REQUIRE(error_of([&] { ce<double>(logits, tg, n, c); }, &msg) == ErrorCode::InvalidArgument);
      REQUIRE(contains(msg, "nll_loss_forward"));
      REQUIRE(contains(msg, "target " + std::to_string(bad)));
      REQUIRE(contains(msg, "[0, 5)"));
      REQUIRE(error_of([&] { ce_grad(1.0, logits, tg, n, c); }) == ErrorCode::InvalidArgument);
    }
  }
}

TEST_CASE("cross-entropy over class shards equals cross-entropy over whole rows",
          "[kernels][cross_entropy]") {
  const i64 n = 5, vocab = 7;
  const auto logits = random_vec<double>(n * vocab, 71, -3, 3);
  const std::vector<i64> targets = {0, 6, 3, 2, 4};
  const i64 begins[] = {0, 3, 7};  // shards [0, 3) and [3, 7)
  auto shard = [&](int s) {
    const i64 c = begins[s + 1] - begins[s];
    std::vector<double> out(std::size_t(n * c));
    for (i64 r = 0; r < n; ++r) {
      for (i64 j = 0; j < c; ++j) out[std::size_t(r * c + j)] = logits[r * vocab + begins[s] + j];
    }
    return out;
  };
  const std::vector<double> parts[] = {shard(0), shard(1)};
  std::vector<double> max(n, -1e300), sumexp(n, 0.0), picked(n, 0.0);
  for (int s = 0; s < 2; ++s) {  // all_reduce(Max)
    std::vector<double> m(n);
    ref::ce_shard_max<double>(parts[s].data(), n, begins[s + 1] - begins[s], m.data());
    for (i64 r = 0; r < n; ++r) max[r] = std::max(max[r], m[r]);
  }
  for (int s = 0; s < 2; ++s) {  // all_reduce(Sum) of both statistics
    std::vector<double> se(n), pk(n);
    ref::ce_shard_stats<double>(parts[s].data(), targets.data(), max.data(), n,
                                begins[s + 1] - begins[s], begins[s], vocab, se.data(), pk.data());
    for (i64 r = 0; r < n; ++r) sumexp[r] += se[r], picked[r] += pk[r];
  }
  double loss = 0;
  ref::ce_shard_loss<double>(max.data(), sumexp.data(), picked.data(), n, &loss);
  REQUIRE(loss == Approx(ce<double>(logits, targets, n, vocab)).epsilon(1e-13));

  const double g = 0.7;
  const std::vector<double> want_grad = ce_grad(g, logits, targets, n, vocab);
  for (int s = 0; s < 2; ++s) {
    const i64 c = begins[s + 1] - begins[s];
    std::vector<double> grad(std::size_t(n * c));
    ref::ce_shard_backward<double>(&g, parts[s].data(), targets.data(), max.data(), sumexp.data(),
                                   n, c, begins[s], grad.data());
    for (i64 r = 0; r < n; ++r) {
      for (i64 j = 0; j < c; ++j) {
        REQUIRE(grad[std::size_t(r * c + j)] ==
                Approx(want_grad[std::size_t(r * vocab + begins[s] + j)]).margin(1e-14));
      }
    }
  }
  const std::vector<i64> bad = {0, 7, 0, 0, 0};
  std::vector<double> se(n), pk(n);
  std::string msg;
  REQUIRE(error_of(
              [&] {
                ref::ce_shard_stats<double>(parts[0].data(), bad.data(), max.data(), n, 3, 0, vocab,
                                            se.data(), pk.data());
              },
              &msg) == ErrorCode::InvalidArgument);
  REQUIRE(contains(msg, "ce_shard_stats"));
}

TEST_CASE("dropout", "[kernels][dropout]") {
  const i64 n = 100000;
  const std::vector<double> x = random_vec<double>(n, 101, 0.5, 1.5);
  std::vector<double> out1(n), mask1(n), out2(n), mask2(n);

  SECTION("same seed, same mask; another seed, another mask") {
    ref::dropout_forward<double>(x.data(), out1.data(), mask1.data(), n, 0.3, 42);
    ref::dropout_forward<double>(x.data(), out2.data(), mask2.data(), n, 0.3, 42);
    REQUIRE(mask1 == mask2);
    REQUIRE(out1 == out2);
    ref::dropout_forward<double>(x.data(), out2.data(), mask2.data(), n, 0.3, 43);
    REQUIRE(mask1 != mask2);
  }
  SECTION("kept fraction is about 1 - p, kept values scaled by 1/(1-p)") {
    for (double p : {0.1, 0.3, 0.5, 0.9}) {
      ref::dropout_forward<double>(x.data(), out1.data(), mask1.data(), n, p, 7);
      i64 kept = 0;
      for (i64 i = 0; i < n; ++i) {
        if (mask1[i] != 0.0) {
          ++kept;
          REQUIRE(mask1[i] == 1.0 / (1.0 - p));
        }
        REQUIRE(out1[i] == x[i] * mask1[i]);
      }
      INFO("p " << p);
      REQUIRE(double(kept) / n == Approx(1.0 - p).margin(0.01));
    }
  }
  SECTION("p == 0 copies x with mask exactly 1") {
    ref::dropout_forward<double>(x.data(), out1.data(), mask1.data(), n, 0.0, 9);
    REQUIRE(out1 == x);
    REQUIRE(mask1 == std::vector<double>(n, 1.0));
    std::vector<float> xf = {1.5f, -2.f}, of(2), mf(2);
    ref::dropout_forward<float>(xf.data(), of.data(), mf.data(), 2, 0.0, 9);
    REQUIRE(of == xf);
    REQUIRE(mf == std::vector<float>{1.f, 1.f});
  }
  SECTION("the decision for element i does not depend on n") {
    std::vector<float> xf(1000, 1.f), o_small(10), m_small(10), o_big(1000), m_big(1000);
    ref::dropout_forward<float>(xf.data(), o_small.data(), m_small.data(), 10, 0.5, 5);
    ref::dropout_forward<float>(xf.data(), o_big.data(), m_big.data(), 1000, 0.5, 5);
    REQUIRE(std::equal(m_small.begin(), m_small.end(), m_big.begin()));
  }
  SECTION("p outside [0, 1) throws InvalidArgument") {
    for (double p : {1.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
      REQUIRE(error_of([&] {
                ref::dropout_forward<double>(x.data(), out1.data(), mask1.data(), n, p, 1);
              }) == ErrorCode::InvalidArgument);
    }
    REQUIRE_THROWS_AS(ref::dropout_forward<float>(nullptr, nullptr, nullptr, 0, 1.0, 1), Error);
  }
}

TEST_CASE("permute", "[kernels][layout]") {
  const Shape shape = {2, 3, 4};
  std::vector<double> in(24);
  std::iota(in.begin(), in.end(), 0.0);
  std::vector<int> perm = {0, 1, 2};
  do {
    std::vector<double> out(24, -1);
    ref::permute<double>(in.data(), shape, perm.data(), out.data());
    const Shape out_shape = {shape[perm[0]], shape[perm[1]], shape[perm[2]]};
    for (i64 o = 0; o < 24; ++o) {
      const auto oi = unravel(o, out_shape);
      std::vector<i64> ii(3);
      for (int d = 0; d < 3; ++d) ii[perm[d]] = oi[d];
      INFO("perm " << perm[0] << perm[1] << perm[2] << " o " << o);
      REQUIRE(out[o] == in[(ii[0] * 3 + ii[1]) * 4 + ii[2]]);
    }
  } while (std::next_permutation(perm.begin(), perm.end()));

  SECTION("4-d transpose of the middle dims, f32") {
    std::vector<float> a(2 * 3 * 4 * 5), b(a.size());
    std::iota(a.begin(), a.end(), 0.f);
    const int perm4[] = {0, 2, 1, 3};
    ref::permute<float>(a.data(), {2, 3, 4, 5}, perm4, b.data());
    for (i64 i = 0; i < 2; ++i)
      for (i64 j = 0; j < 4; ++j)
        for (i64 k = 0; k < 3; ++k)
          for (i64 l = 0; l < 5; ++l)
            REQUIRE(b[((i * 4 + j) * 3 + k) * 5 + l] == a[((i * 3 + k) * 4 + j) * 5 + l]);
  }
}

TEST_CASE("narrow and narrow_scatter", "[kernels][layout]") {
  const Shape shape = {2, 3, 4};
  std::vector<double> in(24);
  std::iota(in.begin(), in.end(), 0.0);
  for (int dim = 0; dim < 3; ++dim) {
    const i64 start = 1, len = shape[dim] - 1;
    Shape ns = shape;
    ns[dim] = len;
    std::vector<double> part(numel(ns));
    ref::narrow<double>(in.data(), shape, dim, start, len, part.data());
    for (i64 o = 0; o < numel(ns); ++o) {
      auto idx = unravel(o, ns);
      idx[dim] += start;
      REQUIRE(part[o] == in[(idx[0] * 3 + idx[1]) * 4 + idx[2]]);
    }
    std::vector<double> back(24, -1.0);
    ref::narrow_scatter<double>(part.data(), ns, dim, start, back.data(), shape);
    for (i64 i = 0; i < 24; ++i) {
      const auto idx = unravel(i, shape);
      REQUIRE(back[i] == (idx[dim] >= start ? in[i] : -1.0));
    }
  }
  SECTION("f32, a single slice in the middle") {
    std::vector<float> a(12), s(4), d(12, 0.f);
    std::iota(a.begin(), a.end(), 0.f);
    ref::narrow<float>(a.data(), {3, 4}, 0, 1, 1, s.data());
    REQUIRE(s == std::vector<float>{4, 5, 6, 7});
    ref::narrow_scatter<float>(s.data(), {1, 4}, 0, 2, d.data(), {3, 4});
    REQUIRE(d == std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 4, 5, 6, 7});
  }
}

TEST_CASE("convert between storage dtypes", "[kernels][layout]") {
  SECTION("bf16 rounds to nearest even") {
    const std::vector<float> f = {1.00390625f, 1.01171875f, 1.0f, -2.5f, 3.0078125f};
    std::vector<BF16> b(f.size());
    std::vector<float> back(f.size());
    ref::convert(f.data(), DType::F32, b.data(), DType::BF16, i64(f.size()));
    ref::convert(b.data(), DType::BF16, back.data(), DType::F32, i64(f.size()));
    REQUIRE(back == std::vector<float>{1.0f, 1.015625f, 1.0f, -2.5f, 3.0f});
    REQUIRE(b[0].bits == 0x3f80);
  }
  SECTION("round trips through every pair") {
    const std::vector<double> vals = {0, 1, -2, 3.5, -100.5, 1024};  // exact in bf16 and f32
    const DType all[] = {DType::F32, DType::F64, DType::BF16, DType::I64};
    for (DType a : all) {
      for (DType b : all) {
        std::vector<double> src(vals);
        if (a == DType::I64 || b == DType::I64) {
          for (auto& v : src) v = std::trunc(v);
        }
        std::vector<unsigned char> ba(src.size() * 8), bb(src.size() * 8);
        std::vector<double> back(src.size());
        const i64 n = i64(src.size());
        ref::convert(src.data(), DType::F64, ba.data(), a, n);
        ref::convert(ba.data(), a, bb.data(), b, n);
        ref::convert(bb.data(), b, ba.data(), a, n);
        ref::convert(ba.data(), a, back.data(), DType::F64, n);
        INFO(dtype_name(a) << " <-> " << dtype_name(b));
        REQUIRE(back == src);
      }
    }
  }
  SECTION("float to i64 truncates toward zero") {
    const std::vector<float> f = {2.7f, -2.7f, 0.5f, -0.5f};
    std::vector<i64> out(4);
    ref::convert(f.data(), DType::F32, out.data(), DType::I64, 4);
    REQUIRE(out == std::vector<i64>{2, -2, 0, 0});
    const std::vector<double> d = {1e300, -1e300, std::nan("")};
    std::vector<i64> sat(3);
    ref::convert(d.data(), DType::F64, sat.data(), DType::I64, 3);
    REQUIRE(sat ==
            std::vector<i64>{std::numeric_limits<i64>::max(), std::numeric_limits<i64>::min(), 0});
  }
  SECTION("i64 to f64 and same dtype are exact") {
    const std::vector<i64> big = {i64(1) << 53, -(i64(1) << 40), std::numeric_limits<i64>::max()};
    std::vector<double> d(3);
    std::vector<i64> same(3);
    ref::convert(big.data(), DType::I64, d.data(), DType::F64, 2);
    REQUIRE(d[0] == 9007199254740992.0);
    REQUIRE(d[1] == -1099511627776.0);
    ref::convert(big.data(), DType::I64, same.data(), DType::I64, 3);
    REQUIRE(same == big);
  }
}

// Ring attention's kernels: every query block against every key block, merged by log-sum-exp,
// is causal attention over the whole sequence; the blocks' backward shares sum to its gradient.
TEST_CASE("blockwise attention merged over blocks equals attention", "[kernels][attention]") {
  const i64 bh = 2, t = 6, d = 3, blk = 2, nb = t / blk;
  const double scale = 1.0 / std::sqrt(double(d));
  const auto q = random_vec<double>(bh * t * d, 91), k = random_vec<double>(bh * t * d, 92),
             v = random_vec<double>(bh * t * d, 93), g = random_vec<double>(bh * t * d, 94);
  std::vector<double> probs;
  const std::vector<double> want = attn_fwd(q, k, v, probs, bh, t, d, true);
  std::vector<double> wq(bh * t * d), wk(bh * t * d), wv(bh * t * d);
  ref::attention_backward<double>(g.data(), q.data(), k.data(), v.data(), probs.data(), wq.data(),
                                  wk.data(), wv.data(), bh, t, d, scale);
  // Rows [b * blk, (b + 1) * blk) of every head, as a contiguous (bh, blk, d) block.
  auto block = [&](const std::vector<double>& x, i64 b) {
    std::vector<double> out(bh * blk * d);
    for (i64 h = 0; h < bh; ++h) {
      std::copy_n(x.begin() + (h * t + b * blk) * d, blk * d, out.begin() + h * blk * d);
    }
    return out;
  };
  std::vector<double> gq(bh * t * d, 0.0), gk(bh * t * d, 0.0), gv(bh * t * d, 0.0);
  for (i64 qb = 0; qb < nb; ++qb) {
    const auto qq = block(q, qb), gg = block(g, qb);
    std::vector<double> out(bh * blk * d, 0.0), lse(bh * blk, -INFINITY);
    for (i64 kb = 0; kb < nb; ++kb) {  // every block, masked ones included: they see nothing
      std::vector<double> o(bh * blk * d), l(bh * blk);
      ref::attention_block_forward<double>(qq.data(), block(k, kb).data(), block(v, kb).data(),
                                           o.data(), l.data(), bh, blk, blk, d, scale, true,
                                           qb * blk, kb * blk);
      if (kb > qb) {
        for (double x : l) REQUIRE(x == -INFINITY);
        for (double x : o) REQUIRE(x == 0.0);
      }
      ref::attention_merge<double>(out.data(), lse.data(), o.data(), l.data(), bh * blk, d);
    }
    for (i64 h = 0; h < bh; ++h) {
      for (i64 i = 0; i < blk * d; ++i) {
        REQUIRE(out[h * blk * d + i] == Approx(want[(h * t + qb * blk) * d + i]).margin(1e-12));
      }
    }
    for (i64 kb = 0; kb < nb; ++kb) {
      std::vector<double> dq(bh * blk * d), dk(bh * blk * d), dv(bh * blk * d);
      ref::attention_block_backward<double>(
          gg.data(), qq.data(), block(k, kb).data(), block(v, kb).data(), out.data(), lse.data(),
          dq.data(), dk.data(), dv.data(), bh, blk, blk, d, scale, true, qb * blk, kb * blk);
      for (i64 h = 0; h < bh; ++h) {
        for (i64 i = 0; i < blk * d; ++i) {
          gq[(h * t + qb * blk) * d + i] += dq[h * blk * d + i];
          gk[(h * t + kb * blk) * d + i] += dk[h * blk * d + i];
          gv[(h * t + kb * blk) * d + i] += dv[h * blk * d + i];
        }
      }
    }
  }
  for (i64 i = 0; i < bh * t * d; ++i) {
    REQUIRE(gq[i] == Approx(wq[i]).margin(1e-12));
    REQUIRE(gk[i] == Approx(wk[i]).margin(1e-12));
    REQUIRE(gv[i] == Approx(wv[i]).margin(1e-12));
  }
}
