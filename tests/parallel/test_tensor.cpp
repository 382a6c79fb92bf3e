// Tensor basics: storage and dtypes, views, meta tensors, and the argument checks of the op layer.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/op.h"
#include "parallel/tensor/ops.h"
#include "parallel/tensor/tensor.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"
#include "tracer/tracer.h"

using namespace commtrace;
using namespace commtrace::testing;

namespace {}  // namespace

TEST_CASE("tensors store f32, f64, bf16 and i64", "[tensor]") {
  const std::vector<double> v{1.0, -2.5, 3.0, 1.00390625};
  REQUIRE(Tensor::from_vector(v, {2, 2}, DType::F32).to_vector() == v);
  REQUIRE(Tensor::from_vector(v, {2, 2}, DType::F64).to_vector() == v);
  // bf16 keeps 8 mantissa bits: 1.00390625 (= 1 + 2^-8) rounds to even, i.e. to 1.
  REQUIRE(Tensor::from_vector(v, {4}, DType::BF16).to_vector() ==
          std::vector<double>{1.0, -2.5, 3.0, 1.0});
  const Tensor idx = Tensor::from_indices({3, 1, 4}, {3});
  REQUIRE(idx.dtype() == DType::I64);
  REQUIRE(idx.data<std::int64_t>()[2] == 4);
  REQUIRE(Tensor::from_vector(v, {2, 2}, DType::BF16).impl()->storage->bytes() == 8);
}

TEST_CASE("write_host fills a range past one staging chunk, into a view too", "[tensor]") {
  const std::int64_t n = Tensor::kHostChunk * 2 + 5;  // crosses two chunk boundaries
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = double(i % 251) - 100;
  const Tensor t = Tensor::zeros({n}, DType::BF16);
  t.write_host(0, v.data(), DType::F64, n);
  REQUIRE(t.to_vector() == v);  // |v| < 256: exact in bf16
  const Tensor m = Tensor::zeros({2, 3});
  const double row[3] = {7, 8, 9};
  m.write_host(3, row, DType::F64, 3);
  REQUIRE(m.to_vector() == std::vector<double>{0, 0, 0, 7, 8, 9});
  const Error e = error_of([&] { m.write_host(4, row, DType::F64, 3); });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(contains(e.what(), "[4, 7) of a tensor of 6"));
}

TEST_CASE("bf16 ops compute in f32 and store bf16", "[tensor]") {
  const Tensor a = Tensor::from_vector({1, 2, 3}, {3}, DType::BF16);
  const Tensor b = Tensor::from_vector({0.5, 0.25, -1}, {3}, DType::BF16);
  const Tensor c = add(a, b);
  REQUIRE(c.dtype() == DType::BF16);
  REQUIRE(c.to_vector() == std::vector<double>{1.5, 2.25, 2.0});
  REQUIRE(to_dtype(c, DType::F32).dtype() == DType::F32);
}

namespace {
std::vector<double> ramp(std::int64_t n, double scale) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(1.0 + 0.7 * double(i));
  return v;
}

// Runs f on bf16 leaves and on f32 leaves holding the same (bf16-rounded) values; the bf16
// outputs and gradients stay bf16 and agree with the f32 ones to bf16 precision.
void check_bf16_like_f32(const std::vector<Shape>& shapes,
                         const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  std::vector<Tensor> lo, hi;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto v = ramp(numel(shapes[i]), 1.0 + 0.5 * double(i));
    lo.push_back(Tensor::from_vector(v, shapes[i], DType::BF16).set_requires_grad(true));
    hi.push_back(Tensor::from_vector(lo.back().to_vector(), shapes[i]).set_requires_grad(true));
  }
  const Tensor ylo = f(lo), yhi = f(hi);
  REQUIRE(ylo.dtype() == DType::BF16);
  sum(ylo).backward();
  sum(yhi).backward();
  auto close = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      REQUIRE(got[i] == Approx(want[i]).epsilon(2e-2).margin(2e-2));
    }
  };
  close(ylo.to_vector(), yhi.to_vector());
  for (std::size_t i = 0; i < lo.size(); ++i) {
    INFO("gradient of input " << i);
    REQUIRE(lo[i].grad().dtype() == DType::BF16);
    close(lo[i].grad().to_vector(), hi[i].grad().to_vector());
  }
}
}  // namespace

TEST_CASE("bf16 ops and their gradients stay bf16 and match f32", "[tensor][bf16]") {
  SECTION("layer_norm") {
    check_bf16_like_f32({{3, 8}, {8}, {8}}, [](const std::vector<Tensor>& in) {
      return mul(layer_norm(in[0], in[1], in[2]), in[0]);
    });
  }
  SECTION("softmax and gelu") {
    check_bf16_like_f32(
        {{4, 6}}, [](const std::vector<Tensor>& in) { return mul(softmax(gelu(in[0])), in[0]); });
  }
  SECTION("attention") {
    check_bf16_like_f32(
        {{1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}}, [](const std::vector<Tensor>& in) {
          return mul(scaled_dot_product_attention(in[0], in[1], in[2], true), in[0]);
        });
  }
  SECTION("linear, dropout and cross-entropy") {
    check_bf16_like_f32({{4, 5}, {3, 5}, {3}}, [](const std::vector<Tensor>& in) {
      const Tensor h = dropout(linear(in[0], in[1], in[2]), 0.25, 7);
      return cross_entropy(h, Tensor::from_indices({0, 2, 1, 2}, {4}));
    });
  }
}

TEST_CASE("dropout's mask is acc-typed and its backward one kernel", "[tensor][dropout]") {
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    INFO(dtype_name(dt));
    const Tensor x = Tensor::from_vector(ramp(64, 2.0), {8, 8}, dt).set_requires_grad(true);
    Tracer tr;
    {
      TracerActivation on(tr);
      sum(mul(dropout(x, 0.5, 3), 1.0)).backward();
    }
    std::vector<std::string> names;
    const Trace t = tr.take();
    for (const Record& r : t.records) names.emplace_back(t.name(r));
    REQUIRE(names == std::vector<std::string>{"native_dropout", "mul", "sum", "ones_like", "expand",
                                              "mul", "native_dropout_backward"});
    // grad = mask: 0 or 1 / (1 - p) = 2 exactly, half of them or so.
    const auto g = x.grad().to_vector();
    REQUIRE(x.grad().dtype() == dt);
    int kept = 0;
    for (double v : g) {
      REQUIRE((v == 0.0 || v == 2.0));
      kept += v == 2.0;
    }
    REQUIRE(kept > 16);
    REQUIRE(kept < 48);
  }
}

TEST_CASE("a process that runs on the cpu maps neither cuBLAS nor NCCL", "[tensor]") {
  // Both are loaded on first GPU use: linked, they would cost every process ~220 MB at start.
  const Tensor x = Tensor::full({4}, 2.0);
  REQUIRE(relu(x).to_vector() == std::vector<double>{2, 2, 2, 2});
  std::ifstream maps("/proc/self/maps");
  REQUIRE(maps.good());
  std::string line;
  while (std::getline(maps, line)) {
    INFO(line);
    REQUIRE(line.find("libcublas") == std::string::npos);
    REQUIRE(line.find("libnccl") == std::string::npos);
  }
}

TEST_CASE("views share storage", "[tensor]") {
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = view(x, {3, -1});
  REQUIRE(v.shape() == Shape{3, 2});
  v.data<float>()[5] = 60;
  REQUIRE(x.to_vector()[5] == 60);
  REQUIRE(x.detach().impl()->storage == x.impl()->storage);
  REQUIRE_THROWS_AS(view(x, {4, -1}), Error);
}

TEST_CASE("storage keeps its device ordinal and stream slot, and a bad ordinal is refused",
          "[tensor]") {
  Storage s(64, Device::CPU);
  REQUIRE(s.ordinal() == 0);
  REQUIRE(s.stream() == nullptr);  // the default stream
  int marker = 0;
  s.set_stream(&marker);
  REQUIRE(s.stream() == &marker);
  const Error e = error_of([] { Storage bad(64, Device::CPU, 1); });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(contains(e.what(), "ordinal 1"));
}

TEST_CASE("meta tensors carry shape and dtype and allocate nothing", "[tensor][meta]") {
  const auto before = Storage::allocations();
  const Tensor a = Tensor::empty({1024, 1024}, DType::F32, Device::Meta);
  const Tensor w = Tensor::zeros({512, 1024}, DType::F32, Device::Meta);
  const Tensor y = relu(linear(a, w, Tensor()));
  REQUIRE(y.shape() == Shape{1024, 512});
  REQUIRE(y.is_meta());
  REQUIRE(sum(y).shape() == Shape{});
  REQUIRE(Storage::allocations() == before);
  REQUIRE(error_of([&] { (void)a.data<float>(); }).code() == ErrorCode::Unsupported);
}

TEST_CASE("cuda tensors are refused until the CUDA backend exists", "[tensor]") {
  REQUIRE(error_of([] { Tensor::empty({2}, DType::F32, Device::CUDA); }).code() ==
          ErrorCode::Unsupported);
}

TEST_CASE("shape errors name the op and both shapes", "[tensor][errors]") {
  const Tensor a = Tensor::zeros({2, 3});
  const Tensor b = Tensor::zeros({4, 5});
  const Error e = error_of([&] { mm(a, b); });
  REQUIRE(e.code() == ErrorCode::ShapeMismatch);
  const std::string msg = e.what();
  REQUIRE(msg.find("mm") != std::string::npos);
  REQUIRE(msg.find("[2, 3]") != std::string::npos);
  REQUIRE(msg.find("[4, 5]") != std::string::npos);

  const std::string bc = error_of([&] { add(a, b); }).what();
  REQUIRE(bc.find("add") != std::string::npos);
  REQUIRE(bc.find("[2, 3]") != std::string::npos);

  const std::string lin = error_of([&] { linear(a, b, Tensor()); }).what();
  REQUIRE(lin.find("linear") != std::string::npos);

  REQUIRE(error_of([&] {
            add(a, Tensor::zeros({2, 3}, DType::F64));
          }).code() == ErrorCode::InvalidArgument);
  REQUIRE(error_of([&] {
            embedding(Tensor::from_indices({9}, {1}), Tensor::zeros({8, 2}));
          }).code() == ErrorCode::InvalidArgument);
  REQUIRE(error_of([&] { a.size(2); }).code() == ErrorCode::InvalidArgument);
  REQUIRE(error_of([&] { dropout(a, 1.0, 0); }).code() == ErrorCode::InvalidArgument);
}

TEST_CASE("mixing devices in one op is an error", "[tensor][errors]") {
  const Tensor a = Tensor::zeros({2, 2});
  const Tensor m = Tensor::zeros({2, 2}, DType::F32, Device::Meta);
  const std::string msg = error_of([&] { add(a, m); }).what();
  REQUIRE(msg.find("different devices") != std::string::npos);
}

TEST_CASE("GradReadyRecorder lists leaves as their gradients become final", "[autograd]") {
  // l = sum(w1 * (w2 * (w1 * x))): w1 has two uses; it is final after the inner one, so w2
  // comes first. A leaf without a gradient is not listed.
  Tensor x = Tensor::from_vector({1, 2}, {2});
  Tensor w1 = Tensor::from_vector({3, 4}, {2}), w2 = Tensor::from_vector({5, 6}, {2});
  Tensor unused = Tensor::from_vector({7, 8}, {2});
  for (Tensor* t : {&w1, &w2, &unused}) t->set_requires_grad(true);
  const Tensor l = sum(mul(w1, mul(w2, mul(w1, x))));
  std::vector<const TensorImpl*> order;
  {
    const GradReadyRecorder rec(order);
    l.backward();
  }
  REQUIRE(order == std::vector<const TensorImpl*>{w2.impl(), w1.impl()});
  // Outside the scope nothing is recorded.
  sum(mul(w2, x)).backward();
  REQUIRE(order.size() == 2);
}

TEST_CASE("recorded inputs are the defined ones in order, a transposed one swapped", "[tensor]") {
  auto plain = [](const Tensor& t) { return ArgView::plain(t.shape(), nullptr); };
  for (const std::size_t n : {std::size_t(3), std::size_t(11)}) {
    std::vector<Tensor> in;
    for (std::size_t k = 0; k < n; ++k) {
      // Every third input undefined; the others of shape (k + 1, 2).
      in.push_back(k % 3 == 1 ? Tensor() : Tensor::zeros({std::int64_t(k) + 1, 2}));
    }
    Tracer tr;
    for (int it = 0; it < 2; ++it) {  // written, then matched by the transposed compare
      tr.record(                      // input 0 shown as its transpose
          EventHead{}, [&](auto& sink) { describe_inputs(sink, in, /*transposed=*/1u, plain); },
          tr.start_time());
      tr.next_iteration();
    }
    const Trace t = tr.take();
    REQUIRE(t.records.size() == 1);
    REQUIRE(t.blocks[0].repeat == 2);
    std::vector<std::vector<std::int64_t>> shapes;
    for (const TensorArg& a : t.inputs(t.records[0])) {
      const auto s = t.shape(a.shape);
      shapes.emplace_back(s.begin(), s.end());
    }
    std::vector<std::vector<std::int64_t>> want{{2, 1}};
    for (std::size_t k = 1; k < n; ++k) {
      if (k % 3 != 1) want.push_back({std::int64_t(k) + 1, 2});
    }
    INFO("inputs: " << n);
    REQUIRE(shapes == want);
  }
}
