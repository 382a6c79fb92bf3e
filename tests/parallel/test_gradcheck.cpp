// Checks the backward of every differentiable op in parallel/ops.h against central finite
// differences in f64, and the autograd engine's behavior (accumulation, grad mode, errors).
// Not a test of forward values: those are covered by the kernel and tensor tests.
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor/autograd.h"
#include "parallel/tensor/ops.h"
#include "parallel/tensor/random.h"
#include "parallel/tensor/tensor.h"
#include "tests/catch_compat.h"

using namespace commtrace;
using i64 = std::int64_t;

namespace {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

constexpr double kEps = 1e-6;     // finite-difference step
constexpr double kAbsTol = 1e-6;  // |analytic - numeric| <= kAbsTol + kRelTol * |numeric|
constexpr double kRelTol = 1e-5;
constexpr int kMaxReported = 5;  // first mismatches printed per op

// L = sum(f(x) * W), evaluated without building a graph.
double loss_value(const OpFn& f, const std::vector<Tensor>& inputs, const Tensor& w) {
  NoGradGuard no_grad;
  return sum(mul(f(inputs), w)).item();
}

// Compares the analytic gradient of L = sum(f(x) * W) with central differences for every
// floating input and returns the number of mismatching elements (the first few are reported).
// W is a fixed random f64 tensor of f's output shape. i64 inputs are not perturbed.
// REQUIRES: floating inputs are f64 leaves.
int count_mismatches(const std::string& op, const OpFn& f, std::vector<Tensor> inputs,
                     std::uint64_t seed) {
  INFO("op " << op);
  for (Tensor& x : inputs) {
    REQUIRE(x.defined());
    if (x.dtype() == DType::I64) continue;
    REQUIRE(x.dtype() == DType::F64);
    x.set_grad(Tensor());
    x.set_requires_grad(true);
  }

  Shape out_shape;
  {
    NoGradGuard no_grad;
    out_shape = f(inputs).shape();
  }
  Generator gen(seed);
  const Tensor w = randn(out_shape, gen, DType::F64);

  Tensor loss = sum(mul(f(inputs), w));
  REQUIRE(loss.requires_grad());
  loss.backward();

  int reported = 0;
  int mismatches = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (x.dtype() == DType::I64) continue;
    const Tensor g = x.grad();
    REQUIRE(g.defined());
    REQUIRE(g.shape() == x.shape());
    REQUIRE(g.dtype() == DType::F64);
    const std::vector<double> analytic = g.to_vector();
    double* data = x.data<double>();
    for (i64 e = 0; e < x.numel(); ++e) {
      const double x0 = data[e];
      data[e] = x0 + kEps;
      const double lp = loss_value(f, inputs, w);
      data[e] = x0 - kEps;
      const double lm = loss_value(f, inputs, w);
      data[e] = x0;
      const double numeric = (lp - lm) / (2 * kEps);
      const double a = analytic[std::size_t(e)];
      if (std::abs(a - numeric) > kAbsTol + kRelTol * std::abs(numeric)) {
        ++mismatches;
        if (reported < kMaxReported) {
          ++reported;
          std::ostringstream msg;
          msg.precision(12);
          msg << op << ": input " << i << " element " << e << ": analytic " << a << ", numeric "
              << numeric;
          UNSCOPED_INFO(msg.str());
        }
      }
    }
  }
  return mismatches;
}

void gradcheck(const std::string& op, const OpFn& f, std::vector<Tensor> inputs,
               std::uint64_t seed = 1234) {
  const int mismatches = count_mismatches(op, f, std::move(inputs), seed);
  CAPTURE(op, mismatches);
  CHECK(mismatches == 0);
}

Tensor randn64(const Shape& shape, Generator& gen) { return randn(shape, gen, DType::F64); }

// Values in [lo, hi) with a random sign: magnitudes kept away from 0.
Tensor away_from_zero(const Shape& shape, double lo, double hi, Generator& gen) {
  Tensor mag = rand_uniform(shape, lo, hi, gen, DType::F64);
  std::vector<double> v = mag.to_vector();
  for (double& x : v) x = gen.uniform() < 0.5 ? -x : x;
  return Tensor::from_vector(v, shape, DType::F64);
}

}  // namespace

// The checker itself: an op whose backward is deliberately wrong must be caught.
TEST_CASE("gradcheck detects a wrong backward", "[gradcheck]") {
  Generator gen(0);
  const OpFn wrong = [](const std::vector<Tensor>& in) {
    Tensor out = mul(in[0].detach(), 3.0);  // forward 3x, backward claims 3g except element 2
    attach_grad(out, "WrongBackward", {in[0]}, [](const Tensor& g) {
      Tensor gx = clone(mul(g, 3.0));
      gx.data<double>()[2] += 0.01;
      return std::vector<Tensor>{gx};
    });
    return out;
  };
  CHECK(count_mismatches("wrong", wrong, {randn64({2, 3}, gen)}, 7) == 1);
  const OpFn right = [](const std::vector<Tensor>& in) { return mul(in[0], 3.0); };
  CHECK(count_mismatches("right", right, {randn64({2, 3}, gen)}, 7) == 0);
}

// ---------------------------------------------------------------- creation and copies

TEST_CASE("gradcheck clone", "[gradcheck]") {
  Generator gen(1);
  gradcheck("clone", [](const std::vector<Tensor>& in) { return clone(in[0]); },
            {randn64({3, 4}, gen)});
}

TEST_CASE("gradcheck to_dtype", "[gradcheck]") {
  Generator gen(2);
  gradcheck("to_dtype f64->f64",
            [](const std::vector<Tensor>& in) { return to_dtype(in[0], DType::F64); },
            {randn64({3, 4}, gen)});

  // f64 -> f32 -> f64 rounds in the forward, so finite differences with a 1e-6 step are
  // meaningless; the backward is the identity, checked exactly on the chain's gradient.
  Tensor x = randn64({2, 5}, gen);
  x.set_requires_grad(true);
  Tensor y = to_dtype(to_dtype(x, DType::F32), DType::F64);
  REQUIRE(y.dtype() == DType::F64);
  Tensor w = randn64({2, 5}, gen);
  sum(mul(y, w)).backward();
  REQUIRE(x.grad().dtype() == DType::F64);
  const std::vector<double> g = x.grad().to_vector(), wv = w.to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(g[i] == Approx(double(float(wv[i]))).epsilon(1e-7));  // W passed through f32
  }
}

// ---------------------------------------------------------------- views and layout

TEST_CASE("gradcheck view", "[gradcheck]") {
  Generator gen(3);
  gradcheck("view",
            [](const std::vector<Tensor>& in) {
              return view(in[0], {4, -1});
            },
            {randn64({2, 3, 4}, gen)});
}

TEST_CASE("gradcheck t", "[gradcheck]") {
  Generator gen(4);
  gradcheck("t", [](const std::vector<Tensor>& in) { return t(in[0]); }, {randn64({3, 5}, gen)});
}

TEST_CASE("gradcheck transpose", "[gradcheck]") {
  Generator gen(5);
  gradcheck("transpose(0, 2)", [](const std::vector<Tensor>& in) { return transpose(in[0], 0, 2); },
            {randn64({2, 3, 4}, gen)});
}

TEST_CASE("gradcheck narrow", "[gradcheck]") {
  Generator gen(6);
  gradcheck("narrow(1, 1, 2)", [](const std::vector<Tensor>& in) { return narrow(in[0], 1, 1, 2); },
            {randn64({2, 5, 3}, gen)});
}

TEST_CASE("gradcheck cat", "[gradcheck]") {
  Generator gen(7);
  SECTION("dim 1") {
    gradcheck("cat dim 1", [](const std::vector<Tensor>& in) { return cat(in, 1); },
              {randn64({2, 1, 3}, gen), randn64({2, 2, 3}, gen), randn64({2, 3, 3}, gen)});
  }
  SECTION("dim 0") {
    gradcheck("cat dim 0", [](const std::vector<Tensor>& in) { return cat(in, 0); },
              {randn64({1, 4}, gen), randn64({3, 4}, gen), randn64({2, 4}, gen)});
  }
}

TEST_CASE("gradcheck expand", "[gradcheck]") {
  Generator gen(8);
  gradcheck("expand (3,1)->(2,3,4)",
            [](const std::vector<Tensor>& in) {
              return expand(in[0], {2, 3, 4});
            },
            {randn64({3, 1}, gen)});
}

TEST_CASE("gradcheck sum_to", "[gradcheck]") {
  Generator gen(9);
  gradcheck("sum_to (2,3,4)->(3,1)",
            [](const std::vector<Tensor>& in) {
              return sum_to(in[0], {3, 1});
            },
            {randn64({2, 3, 4}, gen)});
  gradcheck("sum_to (2,3,4)->(4)", [](const std::vector<Tensor>& in) { return sum_to(in[0], {4}); },
            {randn64({2, 3, 4}, gen)});
}

// ---------------------------------------------------------------- GEMM

TEST_CASE("gradcheck mm", "[gradcheck]") {
  Generator gen(10);
  gradcheck("mm", [](const std::vector<Tensor>& in) { return mm(in[0], in[1]); },
            {randn64({3, 4}, gen), randn64({4, 5}, gen)});
}

TEST_CASE("gradcheck addmm", "[gradcheck]") {
  Generator gen(11);
  const OpFn f = [](const std::vector<Tensor>& in) { return addmm(in[0], in[1], in[2]); };
  SECTION("bias (n)") {
    gradcheck("addmm bias (n)", f, {randn64({5}, gen), randn64({3, 4}, gen), randn64({4, 5}, gen)});
  }
  SECTION("bias (m, n)") {
    gradcheck("addmm bias (m,n)", f,
              {randn64({3, 5}, gen), randn64({3, 4}, gen), randn64({4, 5}, gen)});
  }
}

TEST_CASE("gradcheck bmm", "[gradcheck]") {
  Generator gen(12);
  gradcheck("bmm", [](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); },
            {randn64({2, 3, 4}, gen), randn64({2, 4, 5}, gen)});
}

TEST_CASE("gradcheck linear", "[gradcheck]") {
  Generator gen(13);
  SECTION("2-d input with bias") {
    gradcheck("linear 2-d bias",
              [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
              {randn64({3, 4}, gen), randn64({5, 4}, gen), randn64({5}, gen)});
  }
  SECTION("2-d input without bias") {
    gradcheck("linear 2-d no bias",
              [](const std::vector<Tensor>& in) { return linear(in[0], in[1], Tensor()); },
              {randn64({3, 4}, gen), randn64({5, 4}, gen)});
  }
  SECTION("3-d input (2,3,4) with bias") {
    gradcheck("linear 3-d bias",
              [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
              {randn64({2, 3, 4}, gen), randn64({5, 4}, gen), randn64({5}, gen)});
  }
  SECTION("3-d input (2,3,4) without bias") {
    gradcheck("linear 3-d no bias",
              [](const std::vector<Tensor>& in) { return linear(in[0], in[1], Tensor()); },
              {randn64({2, 3, 4}, gen), randn64({5, 4}, gen)});
  }
}

// ---------------------------------------------------------------- elementwise

namespace {
using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);

// (2,3,4) op (3,1), (4) op (2,3,4), and equal shapes. `denominator` keeps b away from 0.
void check_binary(const std::string& name, BinaryFn op, bool denominator, std::uint64_t seed) {
  Generator gen(seed);
  const auto rhs = [&](const Shape& s) {
    return denominator ? away_from_zero(s, 0.5, 2.0, gen) : randn64(s, gen);
  };
  const OpFn f = [op](const std::vector<Tensor>& in) { return op(in[0], in[1]); };
  gradcheck(name + " (2,3,4) op (3,1)", f, {randn64({2, 3, 4}, gen), rhs({3, 1})});
  gradcheck(name + " (4) op (2,3,4)", f, {randn64({4}, gen), rhs({2, 3, 4})});
  gradcheck(name + " (2,3) op (2,3)", f, {randn64({2, 3}, gen), rhs({2, 3})});
}
}  // namespace

TEST_CASE("gradcheck add", "[gradcheck]") {
  check_binary(
      "add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, false, 20);
}

TEST_CASE("gradcheck sub", "[gradcheck]") {
  check_binary(
      "sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, false, 21);
}

TEST_CASE("gradcheck mul", "[gradcheck]") {
  check_binary(
      "mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, false, 22);
}

TEST_CASE("gradcheck div", "[gradcheck]") {
  check_binary(
      "div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, true, 23);
}

TEST_CASE("gradcheck mul and add by scalar", "[gradcheck]") {
  Generator gen(24);
  gradcheck("mul scalar", [](const std::vector<Tensor>& in) { return mul(in[0], -2.5); },
            {randn64({3, 4}, gen)});
  gradcheck("add scalar", [](const std::vector<Tensor>& in) { return add(in[0], 1.75); },
            {randn64({3, 4}, gen)});
}

TEST_CASE("gradcheck relu", "[gradcheck]") {
  Generator gen(25);
  gradcheck("relu", [](const std::vector<Tensor>& in) { return relu(in[0]); },
            {away_from_zero({4, 5}, 0.1, 2.0, gen)});
}

TEST_CASE("gradcheck gelu", "[gradcheck]") {
  Generator gen(26);
  gradcheck("gelu", [](const std::vector<Tensor>& in) { return gelu(in[0]); },
            {mul(randn64({4, 5}, gen), 2.0)});
}

TEST_CASE("gradcheck silu", "[gradcheck]") {
  Generator gen(28);
  gradcheck("silu", [](const std::vector<Tensor>& in) { return silu(in[0]); },
            {mul(randn64({4, 5}, gen), 2.0)});
}

TEST_CASE("gradcheck dropout", "[gradcheck]") {
  Generator gen(27);
  // The mask is a function of (seed, element index), so with a fixed seed dropout is linear.
  gradcheck("dropout p=0.3", [](const std::vector<Tensor>& in) { return dropout(in[0], 0.3, 99); },
            {randn64({6, 7}, gen)});

  Tensor x = randn64({3, 4}, gen);
  x.set_requires_grad(true);
  Tensor y = dropout(x, 0.0, 99);
  CHECK(y.impl() == x.impl());

  // p = 0.3 really drops something and scales the rest by 1 / 0.7.
  Tensor ones = Tensor::full({1000}, 1.0, DType::F64);
  const std::vector<double> d = dropout(ones, 0.3, 5).to_vector();
  int dropped = 0;
  for (double v : d) {
    if (v == 0.0) {
      ++dropped;
    } else {
      CHECK(v == Approx(1.0 / 0.7));
    }
  }
  CHECK(dropped > 200);
  CHECK(dropped < 400);
}

// ---------------------------------------------------------------- normalization, attention

TEST_CASE("gradcheck softmax", "[gradcheck]") {
  Generator gen(30);
  gradcheck("softmax", [](const std::vector<Tensor>& in) { return softmax(in[0]); },
            {randn64({2, 3, 5}, gen)});
}

TEST_CASE("gradcheck layer_norm", "[gradcheck]") {
  Generator gen(31);
  SECTION("weight and bias") {
    gradcheck("layer_norm affine",
              [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); },
              {randn64({2, 3, 6}, gen), add(randn64({6}, gen), 1.0), randn64({6}, gen)});
  }
  SECTION("weight only") {
    gradcheck("layer_norm weight only",
              [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], Tensor()); },
              {randn64({4, 6}, gen), add(randn64({6}, gen), 1.0)});
  }
  SECTION("no affine") {
    gradcheck("layer_norm plain",
              [](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); },
              {randn64({2, 3, 6}, gen)});
  }
}

TEST_CASE("gradcheck rms_norm", "[gradcheck]") {
  Generator gen(34);
  gradcheck("rms_norm weight", [](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); },
            {randn64({2, 3, 6}, gen), add(randn64({6}, gen), 1.0)});
  gradcheck("rms_norm plain",
            [](const std::vector<Tensor>& in) { return rms_norm(in[0], Tensor()); },
            {randn64({4, 6}, gen)});
}

TEST_CASE("gradcheck embedding", "[gradcheck]") {
  Generator gen(32);
  // Index 1 appears three times and 3 twice: their gradient rows accumulate. Row 4 is unused.
  const Tensor idx = Tensor::from_indices({1, 3, 1, 0, 2, 1, 3, 5}, {2, 4});
  gradcheck("embedding", [](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); },
            {idx, randn64({6, 3}, gen)});
}

TEST_CASE("gradcheck scaled_dot_product_attention", "[gradcheck]") {
  Generator gen(33);
  const bool causal = GENERATE(false, true);
  CAPTURE(causal);
  gradcheck(causal ? "sdpa causal" : "sdpa",
            [causal](const std::vector<Tensor>& in) {
              return scaled_dot_product_attention(in[0], in[1], in[2], causal);
            },
            {randn64({2, 2, 4, 3}, gen), randn64({2, 2, 4, 3}, gen), randn64({2, 2, 4, 3}, gen)});
}

TEST_CASE("gradcheck cross_entropy", "[gradcheck]") {
  Generator gen(34);
  SECTION("logits (6, 5)") {
    gradcheck("cross_entropy (6,5)",
              [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); },
              {randn64({6, 5}, gen), Tensor::from_indices({0, 4, 2, 2, 1, 3}, {6})});
  }
  SECTION("logits (2, 3, 5)") {
    gradcheck("cross_entropy (2,3,5)",
              [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); },
              {randn64({2, 3, 5}, gen), randint({6}, 0, 5, gen)});
  }
}

// ---------------------------------------------------------------- reductions

TEST_CASE("gradcheck sum", "[gradcheck]") {
  Generator gen(40);
  gradcheck("sum all", [](const std::vector<Tensor>& in) { return sum(in[0]); },
            {randn64({2, 3, 4}, gen)});
  for (const int dim : {0, 1, 2, -1, -3}) {
    for (const bool keepdim : {false, true}) {
      CAPTURE(dim, keepdim);
      gradcheck("sum(dim)",
                [dim, keepdim](const std::vector<Tensor>& in) { return sum(in[0], dim, keepdim); },
                {randn64({2, 3, 4}, gen)});
    }
  }
}

TEST_CASE("gradcheck mean", "[gradcheck]") {
  Generator gen(41);
  gradcheck("mean all", [](const std::vector<Tensor>& in) { return mean(in[0]); },
            {randn64({2, 3, 4}, gen)});
  for (const int dim : {0, 1, -1}) {
    for (const bool keepdim : {false, true}) {
      CAPTURE(dim, keepdim);
      gradcheck("mean(dim)",
                [dim, keepdim](const std::vector<Tensor>& in) { return mean(in[0], dim, keepdim); },
                {randn64({2, 3, 4}, gen)});
    }
  }
}

// A composite: a small MLP block exercises the engine's ordering over many nodes.
TEST_CASE("gradcheck composite block", "[gradcheck]") {
  Generator gen(42);
  gradcheck(
      "ln -> linear -> gelu -> linear + residual -> cross_entropy",
      [](const std::vector<Tensor>& in) {
        Tensor h = layer_norm(in[0], in[1], in[2]);
        Tensor y = linear(gelu(linear(h, in[3], in[4])), in[5], Tensor());
        return cross_entropy(add(y, in[0]), in[6]);
      },
      {randn64({2, 3, 4}, gen), add(randn64({4}, gen), 1.0), randn64({4}, gen),
       randn64({6, 4}, gen), randn64({6}, gen), randn64({4, 6}, gen), randint({6}, 0, 4, gen)});
}

// ---------------------------------------------------------------- autograd behavior

namespace {
std::vector<double> vec_of(const Tensor& t) { return t.to_vector(); }

void check_close(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i, a[i], b[i]);
    CHECK(a[i] == Approx(b[i]).epsilon(1e-12).margin(1e-12));
  }
}
}  // namespace

TEST_CASE("a tensor used twice accumulates its gradient", "[autograd]") {
  SECTION("y = x * x + x") {
    Tensor x = Tensor::from_vector({1.0, -2.0, 0.5, 3.0}, {4}, DType::F64);
    x.set_requires_grad(true);
    sum(add(mul(x, x), x)).backward();
    check_close(vec_of(x.grad()), {3.0, -3.0, 2.0, 7.0});  // 2x + 1
  }
  SECTION("a tied weight used by two linear calls") {
    Generator gen(50);
    Tensor w = randn64({3, 3}, gen);
    Tensor x = randn64({2, 3}, gen);
    w.set_requires_grad(true);
    x.set_requires_grad(true);
    // L = sum(linear(linear(x, w), w)) = sum(x wᵀ wᵀ)
    sum(linear(linear(x, w, Tensor()), w, Tensor())).backward();
    const std::vector<double> gw = vec_of(w.grad());

    // Same function with two distinct copies of w: the tied gradient is their sum.
    Tensor w1 = clone(w.detach()), w2 = clone(w.detach());
    w1.set_requires_grad(true);
    w2.set_requires_grad(true);
    sum(linear(linear(x.detach(), w1, Tensor()), w2, Tensor())).backward();
    const std::vector<double> g1 = vec_of(w1.grad()), g2 = vec_of(w2.grad());
    std::vector<double> expected(g1.size());
    for (std::size_t i = 0; i < g1.size(); ++i) expected[i] = g1[i] + g2[i];
    check_close(gw, expected);
    gradcheck("tied linear",
              [](const std::vector<Tensor>& in) {
                return linear(linear(in[0], in[1], Tensor()), in[1], Tensor());
              },
              {x.detach(), w.detach()});
  }
}

TEST_CASE("leaf gradients accumulate across backward calls", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0, 3.0}, {3}, DType::F64);
  x.set_requires_grad(true);
  sum(mul(x, 2.0)).backward();
  check_close(vec_of(x.grad()), {2.0, 2.0, 2.0});
  sum(mul(x, x)).backward();  // a fresh graph: 2x is added
  check_close(vec_of(x.grad()), {4.0, 6.0, 8.0});
  x.set_grad(Tensor());
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("NoGradGuard builds no graph", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}, DType::F64);
  x.set_requires_grad(true);
  CHECK(grad_enabled());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(grad_enabled());
    Tensor y = mul(x, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    {
      NoGradGuard nested;
      CHECK_FALSE(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());  // the nested guard restores the outer state
  }
  CHECK(grad_enabled());
  Tensor z = mul(x, x);
  CHECK(z.requires_grad());
  CHECK(z.grad_fn() != nullptr);
}

TEST_CASE("backward on a non-scalar without a gradient throws", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0, 3.0}, {3}, DType::F64);
  x.set_requires_grad(true);
  Tensor y = mul(x, 2.0);
  REQUIRE_THROWS_AS(y.backward(), Error);
  // With an explicit gradient it works.
  y.backward(Tensor::from_vector({1.0, 0.0, -1.0}, {3}, DType::F64));
  check_close(vec_of(x.grad()), {2.0, 0.0, -2.0});
}

TEST_CASE("backward twice through the same graph throws", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0, 3.0}, {3}, DType::F64);
  x.set_requires_grad(true);
  Tensor loss = sum(mul(x, x));
  loss.backward();
  REQUIRE_THROWS_AS(loss.backward(), Error);
}

TEST_CASE("an input that does not require grad gets no gradient", "[autograd]") {
  Generator gen(51);
  Tensor a = randn64({2, 3}, gen);
  Tensor b = randn64({3, 4}, gen);
  Tensor c = randn64({2, 3}, gen);
  a.set_requires_grad(true);
  sum(mul(mm(a, b), 2.0)).backward();
  CHECK(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  CHECK_FALSE(b.requires_grad());

  sum(mul(a, c)).backward();
  CHECK_FALSE(c.grad().defined());

  // No input requires grad: the result is outside autograd.
  Tensor d = add(b, 1.0);
  CHECK_FALSE(d.requires_grad());
  CHECK(d.grad_fn() == nullptr);
}
