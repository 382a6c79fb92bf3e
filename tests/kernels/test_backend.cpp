// Every kernel of the CPU backend, reached through kernels_for(Device::CPU), against the reference
// (kernels/reference.h) in double on the same (rounded) random inputs, in f32, f64 and bf16 with a
// tolerance per dtype; failures print the first mismatches. Also: the meta backend touches
// nothing, cuda has no kernels in this build, and the error paths name their kernel. Layout
// kernels and collective reductions are exact (small integers).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/reference.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using commtrace::testing::contains;
using commtrace::testing::error_of;
using commtrace::testing::random;

namespace {

const Kernels& cpu() { return kernels_for(Device::CPU); }

const DType kFloating[] = {DType::F32, DType::F64, DType::BF16};
const DType kAll[] = {DType::F32, DType::F64, DType::BF16, DType::I64};

// |got - want| <= tol * max(1, |want|): relative, with an absolute floor for values near 0.
double tolerance(DType dt) {
  switch (dt) {
    case DType::F64:
      return 1e-12;
    case DType::F32:
      return 1e-5;
    default:
      return 1e-2;  // bf16: 8 mantissa bits, rounded once
  }
}

// A buffer of one dtype; never null (kernels may get zero-sized buffers).
struct Buf {
  DType dt;
  i64 n;
  std::vector<unsigned char> bytes;
  Buf(DType dt_, i64 n_)
      : dt(dt_), n(n_), bytes(static_cast<std::size_t>(std::max<i64>(n_, 1)) * 8) {}
  void* p() { return bytes.data(); }
  const void* p() const { return bytes.data(); }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<std::size_t>(n));
    ref::convert(p(), dt, v.data(), DType::F64, n);
    return v;
  }
};

// values rounded into a buffer of dt.
Buf make(DType dt, const std::vector<double>& values) {
  Buf b(dt, i64(values.size()));
  ref::convert(values.data(), DType::F64, b.p(), dt, b.n);
  return b;
}

// An input: its buffer in dt and the (rounded) values it holds, for the reference.
struct In {
  Buf buf;
  std::vector<double> v;
  In(DType dt, const std::vector<double>& raw) : buf(make(dt, raw)), v(buf.values()) {}
  const void* p() const { return buf.p(); }
  const double* d() const { return v.data(); }
};

// Small integers in [-3, 3]: sums and products of a few are exact in every dtype.
std::vector<double> small_ints(i64 n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = double(i64(gen() % 7) - 3);
  return v;
}

// Compares got with want within tol, printing the first mismatches as [index] got, want.
void check_close(const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  std::ostringstream first;
  first << std::setprecision(17);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const bool same_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (same_nan || got[i] == want[i] || err <= tol * std::max(1.0, std::fabs(want[i]))) continue;
    if (bad < 8) first << "\n  [" << i << "] got " << got[i] << ", want " << want[i];
    ++bad;
  }
  if (bad) {
    FAIL_CHECK(what << ": " << bad << " of " << got.size() << " elements differ by more than "
                    << tol << "; first:" << first.str());
  }
}

void check_close(const std::string& what, const Buf& got, const std::vector<double>& want) {
  check_close(what, got.values(), want, tolerance(got.dt));
}

Shape broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const i64 da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const i64 db = i < b.size() ? b[b.size() - 1 - i] : 1;
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

std::string name(DType dt) { return dtype_name(dt); }

}  // namespace

TEST_CASE("numel refuses shapes past kMaxNumel instead of overflowing", "[backend]") {
  REQUIRE(numel({}) == 1);
  REQUIRE(numel({3, 0, 5}) == 0);
  REQUIRE(numel({std::int64_t(1) << 29, std::int64_t(1) << 30}) == kMaxNumel);
  const Error e = error_of([] { numel({std::int64_t(1) << 31, std::int64_t(1) << 31, 16}); });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(std::string(e.what()) ==
          "shape [2147483648, 2147483648, 16] has more than 2^59 elements");
  // Past int64 itself, and an overflowed prefix of an empty tensor.
  REQUIRE_THROWS_AS(numel({std::int64_t(1) << 40, std::int64_t(1) << 40}), Error);
  REQUIRE(numel({std::int64_t(1) << 40, std::int64_t(1) << 40, 0}) == 0);
}

TEST_CASE("cpu gemm matches the reference", "[backend][gemm]") {
  struct Case {
    i64 batch, m, n, k;
  };
  const Case cases[] = {{1, 5, 7, 6}, {1, 1, 1, 1}, {3, 3, 4, 5},  {1, 0, 3, 4},
                        {1, 2, 0, 4}, {1, 2, 3, 0}, {2, 4, 5, 33}, {0, 2, 2, 2}};
  const i64 pad = 2, gap = 3;
  for (DType dt : kFloating) {
    for (const Case& cs : cases) {
      for (int t = 0; t < 4; ++t) {
        for (int bias_kind = 0; bias_kind < (cs.batch == 1 ? 3 : 1); ++bias_kind) {
          GemmArgs g;
          g.dt = dt;
          g.trans_a = t & 1;
          g.trans_b = t & 2;
          g.batch = cs.batch, g.m = cs.m, g.n = cs.n, g.k = cs.k;
          const i64 ra = g.trans_a ? g.k : g.m, ca = g.trans_a ? g.m : g.k;
          const i64 rb = g.trans_b ? g.n : g.k, cb = g.trans_b ? g.k : g.n;
          g.lda = ca + pad, g.stride_a = ra * g.lda + gap;
          g.ldb = cb + pad, g.stride_b = rb * g.ldb + gap;
          g.ldc = g.n + pad, g.stride_c = g.m * g.ldc + gap;
          const In a(dt, random(g.batch * g.stride_a, 1));
          const In b(dt, random(g.batch * g.stride_b, 2));
          const i64 bias_rows = bias_kind == 0 ? 0 : bias_kind == 1 ? 1 : g.m;
          const In bias(dt, random(bias_rows * g.n, 3));
          Buf c =
              make(dt, std::vector<double>(static_cast<std::size_t>(g.batch * g.stride_c), 7.0));
          std::vector<double> want = c.values();
          g.a = a.p(), g.b = b.p(), g.c = c.p();
          g.bias = bias_rows ? bias.p() : nullptr, g.bias_rows = bias_rows;
          INFO(name(dt) << " batch " << g.batch << " m " << g.m << " n " << g.n << " k " << g.k
                        << " trans " << g.trans_a << g.trans_b << " bias rows " << bias_rows);
          cpu().gemm(g);
          GemmArgs r = g;
          r.a = a.d(), r.b = b.d(), r.c = want.data(), r.bias = bias_rows ? bias.d() : nullptr;
          ref::gemm<double>(r);
          check_close("gemm", c, want);  // padding and gaps keep 7
        }
      }
    }
  }
}

TEST_CASE("cpu gemm with zero sizes never reads A or B", "[backend][gemm]") {
  std::vector<float> c(6, std::numeric_limits<float>::quiet_NaN());
  GemmArgs g;
  g.m = 2, g.n = 3, g.k = 0, g.ldc = 3, g.c = c.data();
  cpu().gemm(g);
  REQUIRE(c == std::vector<float>(6, 0.f));  // beta 0 does not read C
  const std::vector<float> bias = {1, 2, 3};
  g.bias = bias.data(), g.bias_rows = 1;
  cpu().gemm(g);
  REQUIRE(c == std::vector<float>{1, 2, 3, 1, 2, 3});
  g.m = 0;
  cpu().gemm(g);  // touches nothing
  REQUIRE(c == std::vector<float>{1, 2, 3, 1, 2, 3});
}

TEST_CASE("cpu binary and sum_to match the reference", "[backend][elementwise]") {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3}, {2, 3}}, {{2, 3, 4}, {3, 1}}, {{4}, {2, 3, 4}}, {{2, 1, 4}, {3, 1}},
      {{}, {2, 3}},     {{1}, {1}},          {{5, 1}, {1, 6}}, {{0, 3}, {3}},
      {{3, 0}, {1, 0}}, {{1, 1, 7}, {6, 1}}};
  for (DType dt : kFloating) {
    for (const auto& [as, bs] : shapes) {
      const Shape os = broadcast(as, bs);
      const In a(dt, random(numel(as), 11));
      std::vector<double> braw = random(numel(bs), 12, 0.5, 1.5);
      for (std::size_t i = 0; i < braw.size(); i += 2) braw[i] = -braw[i];  // no zeros
      const In b(dt, braw);
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
        INFO(name(dt) << " " << shape_str(as) << " op " << int(op) << " " << shape_str(bs));
        Buf out(dt, numel(os));
        std::vector<double> want(static_cast<std::size_t>(numel(os)));
        cpu().binary(dt, op, a.p(), as, b.p(), bs, out.p(), os);
        ref::binary<double>(op, a.d(), as, b.d(), bs, want.data(), os);
        check_close("binary", out, want);
      }
      for (const Shape& target : {as, bs}) {  // each operand's shape is a legal sum_to target
        const In x(dt, random(numel(os), 13));
        INFO(name(dt) << " sum_to " << shape_str(os) << " -> " << shape_str(target));
        Buf out = make(dt, std::vector<double>(static_cast<std::size_t>(numel(target)), 99.0));
        std::vector<double> want(static_cast<std::size_t>(numel(target)));
        cpu().sum_to(dt, x.p(), os, out.p(), target);
        ref::sum_to<double>(x.d(), os, want.data(), target);
        check_close("sum_to", out, want);
      }
    }
  }
}

TEST_CASE("cpu pointwise kernels match the reference", "[backend][elementwise]") {
  for (DType dt : kFloating) {
    for (i64 n : {i64(0), i64(1), i64(17), i64(300)}) {
      INFO(name(dt) << " n " << n);
      const In x(dt, random(n, 21, -3, 3)), g(dt, random(n, 22));
      std::vector<double> want(static_cast<std::size_t>(n));
      Buf out(dt, n);
      cpu().scale(dt, x.p(), -1.7, out.p(), n);
      ref::scale<double>(x.d(), -1.7, want.data(), n);
      check_close("scale", out, want);
      cpu().add_scalar(dt, x.p(), 0.3, out.p(), n);
      ref::add_scalar<double>(x.d(), 0.3, want.data(), n);
      check_close("add_scalar", out, want);
      cpu().relu_forward(dt, x.p(), out.p(), n);
      ref::relu_forward<double>(x.d(), want.data(), n);
      check_close("relu_forward", out, want);
      cpu().relu_backward(dt, g.p(), x.p(), out.p(), n);
      ref::relu_backward<double>(g.d(), x.d(), want.data(), n);
      check_close("relu_backward", out, want);
      cpu().gelu_forward(dt, x.p(), out.p(), n);
      ref::gelu_forward<double>(x.d(), want.data(), n);
      check_close("gelu_forward", out, want);
      cpu().gelu_backward(dt, g.p(), x.p(), out.p(), n);
      ref::gelu_backward<double>(g.d(), x.d(), want.data(), n);
      check_close("gelu_backward", out, want);
      cpu().silu_forward(dt, x.p(), out.p(), n);
      ref::silu_forward<double>(x.d(), want.data(), n);
      check_close("silu_forward", out, want);
      cpu().silu_backward(dt, g.p(), x.p(), out.p(), n);
      ref::silu_backward<double>(g.d(), x.d(), want.data(), n);
      check_close("silu_backward", out, want);
    }
  }
}

TEST_CASE("cpu dropout matches the reference", "[backend][dropout]") {
  for (DType dt : kFloating) {
    for (i64 n : {i64(0), i64(1), i64(257)}) {
      for (double p : {0.0, 0.3}) {
        INFO(name(dt) << " n " << n << " p " << p);
        const In x(dt, random(n, 31));
        Buf out(dt, n), mask(acc_dtype(dt), n);
        std::vector<double> want(static_cast<std::size_t>(n)),
            want_mask(static_cast<std::size_t>(n));
        cpu().dropout_forward(dt, x.p(), out.p(), mask.p(), n, p, 77);
        ref::dropout_forward<double>(x.d(), want.data(), want_mask.data(), n, p, 77);
        check_close("dropout_forward", out, want);
        check_close("dropout_forward mask", mask, want_mask);

        const In g(dt, random(n, 32)), m(acc_dtype(dt), want_mask);
        cpu().dropout_backward(dt, g.p(), m.p(), out.p(), n);
        ref::dropout_backward<double>(g.d(), m.d(), want.data(), n);
        check_close("dropout_backward", out, want);
      }
    }
  }
}

TEST_CASE("cpu softmax matches the reference", "[backend][softmax]") {
  for (DType dt : kFloating) {
    for (auto [rows, cols] : std::vector<std::pair<i64, i64>>{{0, 5}, {1, 1}, {3, 7}, {4, 33}}) {
      INFO(name(dt) << " rows " << rows << " cols " << cols);
      const i64 n = rows * cols;
      const In x(dt, random(n, 41, -3, 3)), g(dt, random(n, 42)), y(dt, random(n, 43, 0, 1));
      Buf out(dt, n);
      std::vector<double> want(static_cast<std::size_t>(n));
      cpu().softmax_forward(dt, x.p(), out.p(), rows, cols);
      ref::softmax_forward<double>(x.d(), want.data(), rows, cols);
      check_close("softmax_forward", out, want);
      cpu().softmax_backward(dt, g.p(), y.p(), out.p(), rows, cols);
      ref::softmax_backward<double>(g.d(), y.d(), want.data(), rows, cols);
      check_close("softmax_backward", out, want);
    }
  }
}

TEST_CASE("cpu rmsnorm matches the reference", "[backend][rmsnorm]") {
  const double eps = 1e-6;
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    for (auto [rows, cols] : std::vector<std::pair<i64, i64>>{{0, 8}, {1, 1}, {3, 8}, {5, 33}}) {
      for (bool affine : {false, true}) {
        INFO(name(dt) << " rows " << rows << " cols " << cols << " affine " << affine);
        const i64 n = rows * cols;
        const In x(dt, random(n, 56, -2, 2)), w(dt, random(cols, 57, 0.5, 1.5));
        Buf out(dt, n), rstd(adt, rows);
        std::vector<double> want(static_cast<std::size_t>(n)),
            want_rstd(static_cast<std::size_t>(rows));
        cpu().rmsnorm_forward(dt, x.p(), affine ? w.p() : nullptr, out.p(), rstd.p(), rows, cols,
                              eps);
        ref::rmsnorm_forward<double>(x.d(), affine ? w.d() : nullptr, want.data(), want_rstd.data(),
                                     rows, cols, eps);
        check_close("rmsnorm_forward", out, want);
        check_close("rmsnorm_forward rstd", rstd, want_rstd);

        const In g(dt, random(n, 58)), r(adt, want_rstd);
        Buf gx(dt, n), gw = make(dt, std::vector<double>(static_cast<std::size_t>(cols), 123.0));
        std::vector<double> want_gx(static_cast<std::size_t>(n)),
            want_gw(static_cast<std::size_t>(cols));
        cpu().rmsnorm_backward(dt, g.p(), x.p(), affine ? w.p() : nullptr, r.p(), gx.p(),
                               affine ? gw.p() : nullptr, rows, cols);
        ref::rmsnorm_backward<double>(g.d(), x.d(), affine ? w.d() : nullptr, r.d(), want_gx.data(),
                                      affine ? want_gw.data() : nullptr, rows, cols);
        check_close("rmsnorm_backward grad_x", gx, want_gx);
        if (affine) check_close("rmsnorm_backward grad_w", gw, want_gw);
      }
    }
  }
}

TEST_CASE("cpu layernorm matches the reference", "[backend][layernorm]") {
  const double eps = 1e-5;
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    for (auto [rows, cols] : std::vector<std::pair<i64, i64>>{{0, 8}, {1, 1}, {3, 8}, {5, 33}}) {
      for (int affine = 0; affine < 3; ++affine) {  // none, weight only, weight and bias
        INFO(name(dt) << " rows " << rows << " cols " << cols << " affine " << affine);
        const i64 n = rows * cols;
        const In x(dt, random(n, 51, -2, 2)), w(dt, random(cols, 52, 0.5, 1.5)),
            b(dt, random(cols, 53));
        const void* wp = affine >= 1 ? w.p() : nullptr;
        const void* bp = affine == 2 ? b.p() : nullptr;
        const double* wd = affine >= 1 ? w.d() : nullptr;
        const double* bd = affine == 2 ? b.d() : nullptr;
        Buf out(dt, n), mean(adt, rows), rstd(adt, rows);
        std::vector<double> want(static_cast<std::size_t>(n)),
            want_mean(static_cast<std::size_t>(rows)), want_rstd(static_cast<std::size_t>(rows));
        cpu().layernorm_forward(dt, x.p(), wp, bp, out.p(), mean.p(), rstd.p(), rows, cols, eps);
        ref::layernorm_forward<double>(x.d(), wd, bd, want.data(), want_mean.data(),
                                       want_rstd.data(), rows, cols, eps);
        check_close("layernorm_forward", out, want);
        check_close("layernorm_forward mean", mean, want_mean);
        check_close("layernorm_forward rstd", rstd, want_rstd);

        const In g(dt, random(n, 54)), m(adt, want_mean), r(adt, want_rstd);
        Buf gx(dt, n), gw = make(dt, std::vector<double>(static_cast<std::size_t>(cols), 123.0)),
                       gb = make(dt, std::vector<double>(static_cast<std::size_t>(cols), 123.0));
        std::vector<double> want_gx(static_cast<std::size_t>(n)),
            want_gw(static_cast<std::size_t>(cols)), want_gb(static_cast<std::size_t>(cols));
        cpu().layernorm_backward(dt, g.p(), x.p(), wp, m.p(), r.p(), gx.p(),
                                 affine >= 1 ? gw.p() : nullptr, affine == 2 ? gb.p() : nullptr,
                                 rows, cols);
        ref::layernorm_backward<double>(g.d(), x.d(), wd, m.d(), r.d(), want_gx.data(),
                                        affine >= 1 ? want_gw.data() : nullptr,
                                        affine == 2 ? want_gb.data() : nullptr, rows, cols);
        check_close("layernorm_backward grad_x", gx, want_gx);
        if (affine >= 1) check_close("layernorm_backward grad_w", gw, want_gw);
        if (affine == 2) check_close("layernorm_backward grad_b", gb, want_gb);
      }
    }
  }
}

TEST_CASE("cpu sum_dim and sum_all match the reference", "[backend][reduce]") {
  struct Split {
    i64 outer, dim, inner;
  };
  for (DType dt : kFloating) {
    for (Split s : {Split{2, 3, 4}, Split{1, 1, 1}, Split{3, 0, 2}, Split{0, 3, 2}, Split{1, 50, 1},
                    Split{4, 7, 5}}) {
      INFO(name(dt) << " outer " << s.outer << " dim " << s.dim << " inner " << s.inner);
      const In x(dt, random(s.outer * s.dim * s.inner, 61));
      Buf out = make(dt, std::vector<double>(static_cast<std::size_t>(s.outer * s.inner), 99.0));
      std::vector<double> want(static_cast<std::size_t>(s.outer * s.inner));
      cpu().sum_dim(dt, x.p(), out.p(), s.outer, s.dim, s.inner);
      ref::sum_dim<double>(x.d(), want.data(), s.outer, s.dim, s.inner);
      check_close("sum_dim", out, want);
    }
    for (i64 n : {i64(0), i64(1), i64(100), i64(1000)}) {
      INFO(name(dt) << " sum_all n " << n);
      const In x(dt, random(n, 62));
      Buf out = make(dt, {99.0});
      std::vector<double> want(1);
      cpu().sum_all(dt, x.p(), out.p(), n);
      ref::sum_all<double>(x.d(), want.data(), n);
      check_close("sum_all", out, want);
    }
  }
}

TEST_CASE("cpu embedding matches the reference", "[backend][embedding]") {
  const i64 vocab = 7, dim = 3;
  const std::vector<i64> idx = {5, 0, 2, 2, 4, 6, 3, 2, 0};
  const i64 n = i64(idx.size());
  for (DType dt : kFloating) {
    for (auto [row_begin, rows] :
         std::vector<std::pair<i64, i64>>{{0, 7}, {2, 3}, {6, 1}, {3, 0}}) {
      for (i64 count : {n, i64(0)}) {
        INFO(name(dt) << " rows [" << row_begin << ", " << row_begin + rows << ") n " << count);
        const In w(dt, random(rows * dim, 71));
        Buf out = make(dt, std::vector<double>(static_cast<std::size_t>(count * dim), 99.0));
        std::vector<double> want(static_cast<std::size_t>(count * dim));
        cpu().embedding_forward(dt, idx.data(), count, w.p(), row_begin, rows, vocab, dim, out.p());
        ref::embedding_forward<double>(idx.data(), count, w.d(), row_begin, rows, vocab, dim,
                                       want.data());
        check_close("embedding_forward", out, want);

        const In g(dt, random(count * dim, 72));
        Buf gw = make(dt, std::vector<double>(static_cast<std::size_t>(rows * dim), 99.0));
        std::vector<double> want_gw(static_cast<std::size_t>(rows * dim));
        cpu().embedding_backward(dt, g.p(), idx.data(), count, gw.p(), row_begin, rows, dim);
        ref::embedding_backward<double>(g.d(), idx.data(), count, want_gw.data(), row_begin, rows,
                                        dim);
        check_close("embedding_backward", gw, want_gw);
      }
    }
  }
}

TEST_CASE("cpu attention matches the reference", "[backend][attention]") {
  struct Dims {
    i64 bh, t, d;
  };
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    for (Dims s : {Dims{1, 1, 1}, Dims{2, 5, 4}, Dims{3, 7, 3}, Dims{0, 4, 2}, Dims{2, 0, 3}}) {
      for (bool causal : {true, false}) {
        INFO(name(dt) << " bh " << s.bh << " t " << s.t << " d " << s.d << " causal " << causal);
        const i64 n = s.bh * s.t * s.d, np = s.bh * s.t * s.t;
        const double scale = 1.0 / std::sqrt(double(s.d));
        const In q(dt, random(n, 81)), k(dt, random(n, 82)), v(dt, random(n, 83));
        Buf out(dt, n), probs(adt, np);
        std::vector<double> want(static_cast<std::size_t>(n)),
            want_probs(static_cast<std::size_t>(np));
        cpu().attention_forward(dt, q.p(), k.p(), v.p(), out.p(), probs.p(), s.bh, s.t, s.d, scale,
                                causal);
        ref::attention_forward<double>(q.d(), k.d(), v.d(), want.data(), want_probs.data(), s.bh,
                                       s.t, s.d, scale, causal);
        check_close("attention_forward", out, want);
        check_close("attention_forward probs", probs, want_probs);

        const In g(dt, random(n, 84)), p(adt, want_probs);
        Buf gq(dt, n), gk(dt, n), gv(dt, n);
        std::vector<double> wq(static_cast<std::size_t>(n)), wk(static_cast<std::size_t>(n)),
            wv(static_cast<std::size_t>(n));
        cpu().attention_backward(dt, g.p(), q.p(), k.p(), v.p(), p.p(), gq.p(), gk.p(), gv.p(),
                                 s.bh, s.t, s.d, scale);
        ref::attention_backward<double>(g.d(), q.d(), k.d(), v.d(), p.d(), wq.data(), wk.data(),
                                        wv.data(), s.bh, s.t, s.d, scale);
        check_close("attention_backward grad_q", gq, wq);
        check_close("attention_backward grad_k", gk, wk);
        check_close("attention_backward grad_v", gv, wv);
      }
    }
  }
}

TEST_CASE("cpu blockwise attention matches the reference", "[backend][attention]") {
  struct Dims {
    i64 bh, tq, tk, d, q_pos, k_pos;
  };
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    // Blocks on, before and after the diagonal, a block that sees nothing, empty ones.
    for (Dims s : {Dims{2, 3, 3, 4, 3, 3}, Dims{1, 4, 2, 3, 4, 0}, Dims{2, 2, 3, 2, 0, 2},
                   Dims{0, 3, 3, 2, 0, 0}, Dims{2, 3, 0, 2, 0, 0}}) {
      for (bool causal : {true, false}) {
        INFO(name(dt) << " bh " << s.bh << " tq " << s.tq << " tk " << s.tk << " q_pos " << s.q_pos
                      << " k_pos " << s.k_pos << " causal " << causal);
        const i64 nq = s.bh * s.tq * s.d, nk = s.bh * s.tk * s.d, nl = s.bh * s.tq;
        const double scale = 1.0 / std::sqrt(double(s.d));
        const In q(dt, random(nq, 101)), k(dt, random(nk, 102)), v(dt, random(nk, 103));
        Buf out(dt, nq), lse(adt, nl);
        std::vector<double> want(static_cast<std::size_t>(nq)),
            want_lse(static_cast<std::size_t>(nl));
        cpu().attention_block_forward(dt, q.p(), k.p(), v.p(), out.p(), lse.p(), s.bh, s.tq, s.tk,
                                      s.d, scale, causal, s.q_pos, s.k_pos);
        ref::attention_block_forward<double>(q.d(), k.d(), v.d(), want.data(), want_lse.data(),
                                             s.bh, s.tq, s.tk, s.d, scale, causal, s.q_pos,
                                             s.k_pos);
        check_close("attention_block_forward", out, want);
        check_close("attention_block_forward lse", lse, want_lse);

        // Merged into a running block that saw something (its lse finite).
        const In out0(dt, random(nq, 104)), lse0(adt, random(nl, 105));
        Buf merged = make(dt, out0.v), merged_lse = make(adt, lse0.v);
        std::vector<double> want_m = out0.v, want_ml = lse0.v;
        const In ob(dt, want), lb(adt, want_lse);
        cpu().attention_merge(dt, merged.p(), merged_lse.p(), ob.p(), lb.p(), nl, s.d);
        ref::attention_merge<double>(want_m.data(), want_ml.data(), ob.d(), lb.d(), nl, s.d);
        check_close("attention_merge", merged, want_m);
        check_close("attention_merge lse", merged_lse, want_ml);

        const In g(dt, random(nq, 106)), o(dt, want_m), l(adt, want_ml);
        Buf gq(dt, nq), gk(dt, nk), gv(dt, nk);
        std::vector<double> wq(static_cast<std::size_t>(nq)), wk(static_cast<std::size_t>(nk)),
            wv(static_cast<std::size_t>(nk));
        cpu().attention_block_backward(dt, g.p(), q.p(), k.p(), v.p(), o.p(), l.p(), gq.p(), gk.p(),
                                       gv.p(), s.bh, s.tq, s.tk, s.d, scale, causal, s.q_pos,
                                       s.k_pos);
        ref::attention_block_backward<double>(g.d(), q.d(), k.d(), v.d(), o.d(), l.d(), wq.data(),
                                              wk.data(), wv.data(), s.bh, s.tq, s.tk, s.d, scale,
                                              causal, s.q_pos, s.k_pos);
        check_close("attention_block_backward grad_q", gq, wq);
        check_close("attention_block_backward grad_k", gk, wk);
        check_close("attention_block_backward grad_v", gv, wv);
      }
    }
  }
}

TEST_CASE("cpu log_softmax and nll_loss match the reference", "[backend][cross_entropy]") {
  for (DType dt : kFloating) {
    for (auto [n, c] : std::vector<std::pair<i64, i64>>{{1, 1}, {4, 5}, {7, 13}, {3, 40}}) {
      INFO(name(dt) << " n " << n << " c " << c);
      std::mt19937_64 gen(91);
      std::vector<i64> targets(static_cast<std::size_t>(n));
      for (auto& t : targets) t = i64(gen() % std::uint64_t(c));
      const In logits(dt, random(n * c, 92, -3, 3)), grad_loss(dt, {1.5});
      Buf loss(dt, 1), grad(dt, n * c);
      std::vector<double> want(1), want_grad(static_cast<std::size_t>(n * c));
      // logits stand in for log-probabilities too: the kernels do not care.
      cpu().log_softmax_forward(dt, logits.p(), grad.p(), n, c);
      ref::log_softmax_forward<double>(logits.d(), want_grad.data(), n, c);
      check_close("log_softmax_forward", grad, want_grad);
      const In g(dt, random(n * c, 93));
      cpu().log_softmax_backward(dt, g.p(), logits.p(), grad.p(), n, c);
      ref::log_softmax_backward<double>(g.d(), logits.d(), want_grad.data(), n, c);
      check_close("log_softmax_backward", grad, want_grad);
      cpu().nll_loss_forward(dt, logits.p(), targets.data(), n, c, loss.p());
      ref::nll_loss_forward<double>(logits.d(), targets.data(), n, c, want.data());
      check_close("nll_loss_forward", loss, want);
      cpu().nll_loss_backward(dt, grad_loss.p(), targets.data(), grad.p(), n, c);
      ref::nll_loss_backward<double>(grad_loss.d(), targets.data(), want_grad.data(), n, c);
      check_close("nll_loss_backward", grad, want_grad);
    }
  }
}

TEST_CASE("cpu class-shard cross-entropy matches the reference", "[backend][cross_entropy]") {
  for (DType dt : kFloating) {
    const DType adt = acc_dtype(dt);
    for (auto [n, c, begin] :
         std::vector<std::tuple<i64, i64, i64>>{{1, 1, 0}, {4, 5, 3}, {7, 13, 0}, {3, 0, 8}}) {
      INFO(name(dt) << " n " << n << " c " << c << " begin " << begin);
      const i64 vocab = 16;
      std::mt19937_64 gen(93);
      std::vector<i64> targets(static_cast<std::size_t>(n));
      for (auto& t : targets) t = i64(gen() % std::uint64_t(vocab));
      const In logits(dt, random(n * c, 94, -3, 3)), grad_loss(dt, {1.5}),
          max(adt, random(n, 95, 2, 3)), sumexp(adt, random(n, 96, 1, 4)),
          picked(adt, random(n, 97, -1, 1));
      Buf m(adt, n), se(adt, n), pk(adt, n), loss(dt, 1), grad(dt, n * c);
      std::vector<double> want_m(static_cast<std::size_t>(n)), want_se(static_cast<std::size_t>(n)),
          want_pk(static_cast<std::size_t>(n)), want_loss(1),
          want_grad(static_cast<std::size_t>(n * c));
      cpu().ce_shard_max(dt, logits.p(), n, c, m.p());
      ref::ce_shard_max<double>(logits.d(), n, c, want_m.data());
      check_close("ce_shard_max", m, want_m);
      cpu().ce_shard_stats(dt, logits.p(), targets.data(), max.p(), n, c, begin, vocab, se.p(),
                           pk.p());
      ref::ce_shard_stats<double>(logits.d(), targets.data(), max.d(), n, c, begin, vocab,
                                  want_se.data(), want_pk.data());
      check_close("ce_shard_stats sumexp", se, want_se);
      check_close("ce_shard_stats picked", pk, want_pk);
      cpu().ce_shard_loss(dt, max.p(), sumexp.p(), picked.p(), n, loss.p());
      ref::ce_shard_loss<double>(max.d(), sumexp.d(), picked.d(), n, want_loss.data());
      check_close("ce_shard_loss", loss, want_loss);
      cpu().ce_shard_backward(dt, grad_loss.p(), logits.p(), targets.data(), max.p(), sumexp.p(), n,
                              c, begin, grad.p());
      ref::ce_shard_backward<double>(grad_loss.d(), logits.d(), targets.data(), max.d(), sumexp.d(),
                                     n, c, begin, want_grad.data());
      check_close("ce_shard_backward", grad, want_grad);
    }
  }
}

TEST_CASE("cpu layout kernels move every dtype exactly", "[backend][layout]") {
  const std::vector<std::pair<Shape, std::vector<int>>> perms = {
      {{2, 3, 4}, {0, 2, 1}}, {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{2, 3, 4}, {2, 0, 1}}, {{7}, {0}},
      {{3, 0, 2}, {2, 0, 1}}, {{}, {}}};
  for (DType dt : kAll) {
    for (const auto& [shape, perm] : perms) {
      INFO(name(dt) << " permute " << shape_str(shape));
      const In x(dt, small_ints(numel(shape), 101));
      Buf out(dt, numel(shape));
      std::vector<double> want(static_cast<std::size_t>(numel(shape)));
      cpu().permute(dt, x.p(), shape, perm.data(), out.p());
      ref::permute<double>(x.d(), shape, perm.data(), want.data());
      check_close("permute", out.values(), want, 0.0);
    }
    const Shape shape = {2, 3, 4};
    const In x(dt, small_ints(numel(shape), 102));
    for (int dim = 0; dim < 3; ++dim) {
      for (auto [start, len] : std::vector<std::pair<i64, i64>>{{1, shape[dim] - 1}, {0, 0}}) {
        INFO(name(dt) << " narrow dim " << dim << " start " << start << " len " << len);
        Shape part_shape = shape;
        part_shape[dim] = len;
        Buf part(dt, numel(part_shape));
        std::vector<double> want(static_cast<std::size_t>(numel(part_shape)));
        cpu().narrow(dt, x.p(), shape, dim, start, len, part.p());
        ref::narrow<double>(x.d(), shape, dim, start, len, want.data());
        check_close("narrow", part.values(), want, 0.0);

        Buf back = make(dt, std::vector<double>(static_cast<std::size_t>(numel(shape)), 9.0));
        std::vector<double> want_back(static_cast<std::size_t>(numel(shape)), 9.0);
        const std::vector<double> part_values = part.values();
        cpu().narrow_scatter(dt, part.p(), part_shape, dim, start, back.p(), shape);
        ref::narrow_scatter<double>(part_values.data(), part_shape, dim, start, want_back.data(),
                                    shape);
        check_close("narrow_scatter", back.values(), want_back, 0.0);
      }
    }
  }
}

TEST_CASE("cpu convert and fill cover every dtype", "[backend][layout]") {
  const std::vector<double> vals = {0, 1, -2, 3, -100, 1024};  // exact in every dtype
  for (DType a : kAll) {
    for (DType b : kAll) {
      INFO(name(a) << " -> " << name(b));
      const In x(a, vals);
      Buf y(b, i64(vals.size()));
      cpu().convert(x.p(), a, y.p(), b, i64(vals.size()));
      check_close("convert", y.values(), vals, 0.0);
    }
    INFO(name(a));
    Buf f(a, 5);
    cpu().fill(a, f.p(), -3.0, 5);
    check_close("fill", f.values(), std::vector<double>(5, -3.0), 0.0);
    cpu().fill(a, f.p(), 2.75, 5);
    check_close("fill", f.values(), std::vector<double>(5, a == DType::I64 ? 2.0 : 2.75), 0.0);
  }
}

// bf16 parameters and gradients with moments in f32 (acc_dtype): the step runs in f32 on the
// widened values and the parameter is rounded once.
TEST_CASE("cpu optimizer steps match the reference", "[backend][optim]") {
  for (DType dt : kFloating) {
    const DType at = acc_dtype(dt);
    for (i64 n : {i64(0), i64(1), i64(37)}) {
      for (double momentum : {0.0, 0.9}) {
        for (bool first : {true, false}) {
          INFO(name(dt) << " sgd n " << n << " momentum " << momentum << " first " << first);
          const SgdArgs a{0.1, momentum, 0.01, first};
          const In g(dt, random(n, 111));
          In p(dt, random(n, 112)), m(at, random(n, 113));
          std::vector<double> wp = p.v, wm = m.v;
          cpu().sgd_step(dt, p.buf.p(), g.p(), m.buf.p(), n, a);
          ref::sgd_step<double>(wp.data(), g.d(), wm.data(), n, a);
          check_close("sgd_step p", p.buf, wp);
          check_close("sgd_step momentum", m.buf, wm);
        }
      }
      for (i64 step : {i64(1), i64(3)}) {
        for (double wd : {0.0, 0.1}) {
          INFO(name(dt) << " adamw n " << n << " step " << step << " wd " << wd);
          const AdamWArgs a{1e-2, 0.9, 0.999, 1e-8, wd, step};
          const In g(dt, random(n, 121));
          In p(dt, random(n, 122)), m(at, random(n, 123, -0.1, 0.1)), v(at, random(n, 124, 0, 0.1));
          std::vector<double> wp = p.v, wm = m.v, wv = v.v;
          cpu().adamw_step(dt, p.buf.p(), g.p(), m.buf.p(), v.buf.p(), n, a);
          ref::adamw_step<double>(wp.data(), g.d(), wm.data(), wv.data(), n, a);
          check_close("adamw_step p", p.buf, wp);
          check_close("adamw_step m", m.buf, wm);
          check_close("adamw_step v", v.buf, wv);
        }
      }
    }
  }
}

TEST_CASE("cpu reduce is exact, in source order, and may run in place", "[backend][reduce]") {
  const int n_srcs = 4;
  const i64 n = 300, begin = 37, end = 290;
  for (DType dt : kAll) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      if (op == ReduceOp::Avg && dt == DType::I64) continue;  // integer division
      INFO(name(dt) << " " << reduce_op_name(op));
      std::vector<In> srcs;
      for (int s = 0; s < n_srcs; ++s) srcs.emplace_back(dt, small_ints(n, 130 + s));
      std::vector<double> want(static_cast<std::size_t>(n));
      for (i64 i = 0; i < n; ++i) {
        double acc = srcs[0].v[i];
        for (int s = 1; s < n_srcs; ++s) {
          acc = op == ReduceOp::Max ? std::max(acc, srcs[s].v[i]) : acc + srcs[s].v[i];
        }
        want[i] = op == ReduceOp::Avg ? acc / n_srcs : acc;
      }
      // Into two fresh outputs: [begin, end) written, the rest untouched.
      Buf d0 = make(dt, std::vector<double>(n, 9.0)), d1 = make(dt, std::vector<double>(n, 9.0));
      std::vector<const void*> sp;
      for (const In& s : srcs) sp.push_back(s.p());
      void* dp[] = {d0.p(), d1.p()};
      cpu().reduce(dt, op, sp.data(), n_srcs, dp, 2, begin, end);
      std::vector<double> want_range(static_cast<std::size_t>(n), 9.0);
      std::copy(want.begin() + begin, want.begin() + end, want_range.begin() + begin);
      check_close("reduce dst 0", d0.values(), want_range, 0.0);
      check_close("reduce dst 1", d1.values(), want_range, 0.0);
      // In place: every source is also a destination (the threads all_reduce).
      std::vector<void*> all;
      for (In& s : srcs) all.push_back(s.buf.p());
      cpu().reduce(dt, op, sp.data(), n_srcs, all.data(), n_srcs, 0, n);
      for (In& s : srcs) check_close("reduce in place", s.buf.values(), want, 0.0);
    }
  }
}

TEST_CASE("cpu memory: allocate, copy and the ordinal", "[backend][memory]") {
  void* z = cpu().allocate(0, 0);
  REQUIRE(z != nullptr);
  cpu().deallocate(z, 0, 0);
  const std::vector<double> host = {1.5, -2, 3};
  void* a = cpu().allocate(24, 0);
  void* b = cpu().allocate(24, 0);
  cpu().copy_from_host(a, host.data(), 24);
  cpu().copy(b, a, 24);
  std::vector<double> back(3);
  cpu().copy_to_host(back.data(), b, 24);
  REQUIRE(back == host);
  cpu().deallocate(a, 24, 0);
  cpu().deallocate(b, 24, 0);
  const Error e = error_of([] { cpu().allocate(8, 1); });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(contains(e.what(), "ordinal 1"));
  REQUIRE(cpu().device() == Device::CPU);
  REQUIRE(acc_dtype(DType::F64) == DType::F64);
  REQUIRE(acc_dtype(DType::F32) == DType::F32);
  REQUIRE(acc_dtype(DType::BF16) == DType::F32);
}

TEST_CASE("cpu memory: live storage is counted and held under a limit", "[backend][memory]") {
  REQUIRE(host_memory_limit() > 0);
  const std::uint64_t before = host_memory_held();
  void* a = cpu().allocate(4096, 0);
  REQUIRE(host_memory_held() == before + 4096);
  set_host_memory_limit(before + 4096 + 1024);
  const Error e = error_of([] { cpu().allocate(2048, 0); });
  REQUIRE(e.code() == ErrorCode::Backend);
  REQUIRE(contains(e.what(), "of host memory, more than the"));
  REQUIRE(contains(e.what(), "--device meta"));
  REQUIRE(host_memory_held() == before + 4096);  // the refused allocation is not counted
  void* b = cpu().allocate(1024, 0);             // up to the limit still fits
  cpu().deallocate(b, 1024, 0);
  // check_host_room asks the same question without allocating.
  const Error room = error_of([] { check_host_room(2048, "a preflight: 2 KiB"); });
  REQUIRE(room.code() == ErrorCode::Backend);
  REQUIRE(contains(room.what(), "a preflight: 2 KiB would hold " +
                                    format_bytes(before + 4096 + 2048) +
                                    " of host memory, more than the " +
                                    format_bytes(before + 4096 + 1024) + " allowed"));
  check_host_room(1024, "fits");
  REQUIRE(host_memory_held() == before + 4096);
  set_host_memory_limit(0);
  cpu().deallocate(a, 4096, 0);
  REQUIRE(host_memory_held() == before);
}

TEST_CASE("cpu memory: the default limit is what the machine can give, not more",
          "[backend][memory]") {
  set_host_memory_limit(0);
  const std::uint64_t limit = host_memory_limit();
  REQUIRE(limit > 0);
  REQUIRE(limit <= std::uint64_t(sysconf(_SC_PHYS_PAGES)) * std::uint64_t(sysconf(_SC_PAGE_SIZE)));
  const Error e = error_of([&] { check_host_room(limit + 1, "more than the limit"); });
  REQUIRE(e.code() == ErrorCode::Backend);
  REQUIRE(contains(e.what(), "available to this process; --device meta"));
  REQUIRE(format_bytes(640) == "640 B");
  REQUIRE(format_bytes(3ull << 29) == "1.5 GiB");
  const Error huge = error_of([] { check_host_room(~std::uint64_t(0), "no overflow"); });
  REQUIRE(huge.code() == ErrorCode::Backend);
}

TEST_CASE("the meta backend touches nothing and allocates nothing", "[backend][meta]") {
  const Kernels& k = kernels_for(Device::Meta);
  REQUIRE(k.device() == Device::Meta);
  REQUIRE(k.allocate(1024, 0) == nullptr);
  k.deallocate(nullptr, 1024, 0);
  std::vector<double> a(64, 3.0), b(64, 4.0), c(64, 5.0), d(64, 6.0);
  const std::vector<i64> idx(8, 1);
  const auto before = std::vector<std::vector<double>>{a, b, c, d};
  const Shape s = {8, 8};
  const int perm[] = {1, 0};
  GemmArgs g;
  g.m = g.n = g.k = 8, g.lda = g.ldb = g.ldc = 8, g.a = a.data(), g.b = b.data(), g.c = c.data();
  k.copy(c.data(), a.data(), 64);
  k.copy_from_host(c.data(), a.data(), 64);
  k.copy_to_host(c.data(), a.data(), 64);
  k.convert(a.data(), DType::F64, c.data(), DType::F32, 8);
  k.fill(DType::F64, c.data(), 1.0, 64);
  k.gemm(g);
  k.binary(DType::F64, BinaryOp::Add, a.data(), s, b.data(), s, c.data(), s);
  k.sum_to(DType::F64, a.data(), s, c.data(), {8});
  k.scale(DType::F64, a.data(), 2.0, c.data(), 64);
  k.add_scalar(DType::F64, a.data(), 2.0, c.data(), 64);
  k.relu_forward(DType::F64, a.data(), c.data(), 64);
  k.relu_backward(DType::F64, a.data(), b.data(), c.data(), 64);
  k.gelu_forward(DType::F64, a.data(), c.data(), 64);
  k.gelu_backward(DType::F64, a.data(), b.data(), c.data(), 64);
  k.dropout_forward(DType::F64, a.data(), c.data(), d.data(), 64, 0.5, 1);
  k.dropout_backward(DType::F64, a.data(), b.data(), c.data(), 64);
  k.softmax_forward(DType::F64, a.data(), c.data(), 8, 8);
  k.softmax_backward(DType::F64, a.data(), b.data(), c.data(), 8, 8);
  k.layernorm_forward(DType::F64, a.data(), b.data(), b.data(), c.data(), d.data(), d.data(), 8, 8,
                      1e-5);
  k.layernorm_backward(DType::F64, a.data(), b.data(), b.data(), b.data(), b.data(), c.data(),
                       d.data(), d.data(), 8, 8);
  k.sum_dim(DType::F64, a.data(), c.data(), 8, 8, 1);
  k.sum_all(DType::F64, a.data(), c.data(), 64);
  k.embedding_forward(DType::F64, idx.data(), 8, a.data(), 0, 8, 8, 8, c.data());
  k.embedding_backward(DType::F64, a.data(), idx.data(), 8, c.data(), 0, 8, 8);
  k.attention_forward(DType::F64, a.data(), a.data(), a.data(), c.data(), d.data(), 1, 8, 8, 0.5,
                      true);
  k.attention_backward(DType::F64, a.data(), a.data(), a.data(), a.data(), b.data(), c.data(),
                       c.data(), d.data(), 1, 8, 8, 0.5);
  k.log_softmax_forward(DType::F64, a.data(), c.data(), 8, 8);
  k.log_softmax_backward(DType::F64, a.data(), b.data(), c.data(), 8, 8);
  k.nll_loss_forward(DType::F64, a.data(), idx.data(), 8, 8, c.data());
  k.nll_loss_backward(DType::F64, a.data(), idx.data(), c.data(), 8, 8);
  k.permute(DType::F64, a.data(), s, perm, c.data());
  k.narrow(DType::F64, a.data(), s, 0, 1, 2, c.data());
  k.narrow_scatter(DType::F64, a.data(), {2, 8}, 0, 1, c.data(), s);
  k.sgd_step(DType::F64, c.data(), a.data(), d.data(), 64, SgdArgs{});
  k.adamw_step(DType::F64, c.data(), a.data(), d.data(), d.data(), 64, AdamWArgs{});
  const void* srcs[] = {a.data(), b.data()};
  void* dsts[] = {c.data(), d.data()};
  k.reduce(DType::F64, ReduceOp::Sum, srcs, 2, dsts, 2, 0, 64);
  REQUIRE(std::vector<std::vector<double>>{a, b, c, d} == before);
}

TEST_CASE("cuda has no kernels in this build", "[backend][cuda]") {
  const Error e = error_of([] { kernels_for(Device::CUDA); });
  REQUIRE(e.code() == ErrorCode::Unsupported);
  REQUIRE(contains(e.what(), "cuda"));
  REQUIRE_FALSE(has_kernels(Device::CUDA));
  REQUIRE(has_kernels(Device::CPU));
  REQUIRE(has_kernels(Device::Meta));
}

TEST_CASE("kernel errors name the kernel", "[backend][errors]") {
  const i64 vocab = 6, dim = 2;
  std::vector<double> big(64, 0.5);
  SECTION("embedding index out of range, in every floating dtype") {
    for (DType dt : kFloating) {
      INFO(name(dt));
      const In w(dt, random(vocab * dim, 141));
      Buf out(dt, 2 * dim);
      for (i64 bad : {i64(-1), vocab}) {
        const std::vector<i64> idx = {1, bad};
        const Error e = error_of([&] {
          cpu().embedding_forward(dt, idx.data(), 2, w.p(), 0, vocab, vocab, dim, out.p());
        });
        REQUIRE(e.code() == ErrorCode::InvalidArgument);
        REQUIRE(contains(e.what(), "embedding_forward"));
        REQUIRE(contains(e.what(), "index " + std::to_string(bad) + " at position 1"));
        REQUIRE(contains(e.what(), "[0, 6)"));
      }
      const std::vector<i64> neg = {-3};
      const In g(dt, random(dim, 142));
      Buf gw(dt, vocab * dim);
      const Error e = error_of(
          [&] { cpu().embedding_backward(dt, g.p(), neg.data(), 1, gw.p(), 0, vocab, dim); });
      REQUIRE(e.code() == ErrorCode::InvalidArgument);
      REQUIRE(contains(e.what(), "embedding_backward"));
    }
  }
  SECTION("cross-entropy target out of range") {
    for (DType dt : kFloating) {
      INFO(name(dt));
      const In logits(dt, random(2 * 3, 143)), one(dt, {1.0});
      Buf loss(dt, 1), grad(dt, 6);
      const std::vector<i64> targets = {0, 3};
      Error e =
          error_of([&] { cpu().nll_loss_forward(dt, logits.p(), targets.data(), 2, 3, loss.p()); });
      REQUIRE(e.code() == ErrorCode::InvalidArgument);
      REQUIRE(contains(e.what(), "nll_loss_forward: target 3 at position 1"));
      e = error_of([&] { cpu().nll_loss_backward(dt, one.p(), targets.data(), grad.p(), 2, 3); });
      REQUIRE(e.code() == ErrorCode::InvalidArgument);
      REQUIRE(contains(e.what(), "nll_loss_backward"));
    }
  }
  SECTION("unsupported dtypes") {
    Error e = error_of([&] { cpu().relu_forward(DType::I64, big.data(), big.data(), 8); });
    REQUIRE(e.code() == ErrorCode::Unsupported);
    REQUIRE(contains(e.what(), "relu_forward"));
    REQUIRE(contains(e.what(), "i64"));
    GemmArgs g;
    g.dt = DType::I64;
    e = error_of([&] { cpu().gemm(g); });
    REQUIRE(e.code() == ErrorCode::Unsupported);
    REQUIRE(contains(e.what(), "gemm"));
    e = error_of(
        [&] { cpu().sgd_step(DType::I64, big.data(), big.data(), big.data(), 8, SgdArgs{}); });
    REQUIRE(e.code() == ErrorCode::Unsupported);
    REQUIRE(contains(e.what(), "sgd_step"));
    REQUIRE(contains(e.what(), "i64"));
    e = error_of([&] {
      cpu().adamw_step(DType::I64, big.data(), big.data(), big.data(), big.data(), 8, AdamWArgs{});
    });
    REQUIRE(e.code() == ErrorCode::Unsupported);
    REQUIRE(contains(e.what(), "adamw_step"));
  }
  SECTION("bad arguments") {
    const void* srcs[] = {big.data()};
    void* dsts[] = {big.data()};
    Error e = error_of([&] { cpu().reduce(DType::F64, ReduceOp::None, srcs, 1, dsts, 1, 0, 8); });
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE(contains(e.what(), "reduce"));
    e = error_of(
        [&] { cpu().dropout_forward(DType::F32, big.data(), big.data(), big.data(), 4, 1.0, 1); });
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE(contains(e.what(), "dropout_forward"));
  }
}

TEST_CASE("a library loaded on first use: the first path that loads, clear errors otherwise",
          "[backend][library]") {
  const LoadedLibrary libm({"/nonexistent/libm.so.6", "libm.so.6"}, "test", "libm", "no hint");
  const auto cosine = libm.symbol<double (*)(double)>("cos");
  REQUIRE(cosine(0.0) == 1.0);
  const Error missing = error_of([&] { (void)libm.symbol<void (*)()>("no_such_symbol_here"); });
  REQUIRE(missing.code() == ErrorCode::Unsupported);
  REQUIRE(std::string(missing.what()) == "test: the libm library has no no_such_symbol_here");
  const Error none = error_of([] {
    const LoadedLibrary l({"/nonexistent/a.so", "/nonexistent/b.so"}, "cuda", "cuBLAS",
                          "put it on LD_LIBRARY_PATH");
  });
  REQUIRE(none.code() == ErrorCode::Unsupported);
  const std::string what = none.what();
  REQUIRE(what.rfind("cuda: cannot load cuBLAS (", 0) == 0);
  REQUIRE(contains(what, "/nonexistent/a.so"));
  REQUIRE(contains(what, "; /nonexistent/b.so"));
  REQUIRE(contains(what, "); put it on LD_LIBRARY_PATH"));
}
