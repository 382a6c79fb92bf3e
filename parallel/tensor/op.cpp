#include "parallel/tensor/op.h"

#include <vector>

#include "tracer/tracer.h"

namespace commtrace {

namespace {

DistHooks g_hooks{};

// The record's view of the defined plain inputs: their shapes, with the last two dims swapped
// where `transposed` says. Inline for the usual few inputs; a long cat spills to the heap.
class PlainArgs {
 public:
  PlainArgs(std::span<const Tensor> in, std::uint32_t transposed) {
    if (in.size() > inline_.size()) {
      heap_.resize(in.size());
      views_ = heap_;
    }
    std::size_t n = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const Tensor& t = in[k];
      if (!t.defined()) continue;
      if (k < 32 && ((transposed >> k) & 1u) && t.dim() >= 2) {
        Shape& s = swapped_[std::min<std::size_t>(k, swapped_.size() - 1)];
        s = t.shape();
        std::swap(s[s.size() - 2], s[s.size() - 1]);
        views_[n++] = ArgView{s, {}, {}};
      } else {
        views_[n++] = ArgView{t.shape(), {}, {}, &t.impl()->trace_shape};
      }
    }
    views_ = views_.first(n);
  }
  std::span<const ArgView> views() const { return views_; }

 private:
  std::array<ArgView, 8> inline_{};
  std::vector<ArgView> heap_;
  std::span<ArgView> views_{inline_};
  std::array<Shape, 3> swapped_;  // transposed operands are GEMM inputs: at most 3
};

}  // namespace

DimStrategy& Strategies::add() {
  COMMTRACE_CHECK(size < kMaxStrategies, ErrorCode::Internal, "a rule gave more than {} strategies",
                  kMaxStrategies);
  items[std::size_t(size)] = DimStrategy{};
  return items[std::size_t(size++)];
}

void install_dist_hooks(const DistHooks& hooks) { g_hooks = hooks; }

const DistHooks& dist_hooks() {
  COMMTRACE_CHECK(g_hooks.dispatch != nullptr, ErrorCode::Internal,
                  "a tensor carries a distribution but no DTensor layer is installed");
  return g_hooks;
}

int normalize_dim(int dim, int rank, const char* op) {
  const int r = std::max(rank, 1);
  COMMTRACE_CHECK(dim >= -r && dim < r, ErrorCode::InvalidArgument,
                  "{}: dim {} out of range for a {}-d tensor", op, dim, rank);
  return dim < 0 ? dim + r : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    COMMTRACE_CHECK(da == db || da == 1 || db == 1, ErrorCode::ShapeMismatch,
                    "{}: shapes {} and {} do not broadcast", op, shape_str(a), shape_str(b));
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

OpOutputs run_local(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a,
                    const OutSpec* specs, const ShardInfo* dist) {
  const Tensor* first = nullptr;
  for (const Tensor& t : in) {
    if (!t.defined()) continue;
    if (first) {
      COMMTRACE_CHECK(t.device() == first->device(), ErrorCode::InvalidArgument,
                      "{}: inputs on different devices: {} and {}", op.name, describe(*first),
                      describe(t));
    } else {
      first = &t;
    }
  }
  COMMTRACE_CHECK(first != nullptr, ErrorCode::Internal, "{}: no defined input", op.name);
  Tracer* tracer = Tracer::current();
  const std::uint64_t start = tracer ? tracer->now() : 0;

  OpOutputs out;
  switch (op.result) {
    case OpDef::Result::View: {
      out[0] = first->detach();
      COMMTRACE_CHECK(numel(specs[0].shape) == first->numel(), ErrorCode::ShapeMismatch,
                      "{}: {} cannot be viewed as {}", op.name, describe(*first),
                      shape_str(specs[0].shape));
      out[0].impl()->shape = specs[0].shape;
      break;
    }
    case OpDef::Result::InPlace:
      out[0] = *first;
      op.run(in, a, {out.data(), 1}, dist);
      break;
    case OpDef::Result::Fresh:
      for (int i = 0; i < op.n_outputs; ++i) {
        if (!specs[i].present) continue;
        out[std::size_t(i)] = Tensor::empty(specs[i].shape, specs[i].dtype, first->device());
      }
      op.run(in, a, {out.data(), std::size_t(op.n_outputs)}, dist);
      break;
  }

  // A local shard keeps its origin through ops that keep its shape (relu, gelu, dropout, ...).
  const TensorImpl& f = *first->impl();
  if (f.origin && out[0].shape() == f.shape && !out[0].impl()->origin) {
    out[0].impl()->origin = f.origin;
  }
  if (tracer) {
    const PlainArgs args(in, a.transposed);
    std::array<ArgView, kMaxOpOutputs> results{};
    std::size_t n_results = 0;
    for (int i = 0; i < op.n_outputs; ++i) {
      const Tensor& o = out[std::size_t(i)];
      if (o.defined()) results[n_results++] = ArgView{o.shape(), {}, {}, &o.impl()->trace_shape};
    }
    EventView e;
    e.kind = op.kind;
    e.name = op.name;
    e.overload = op.overload;
    e.dtype = first->dtype();
    e.inputs = args.views();
    e.outputs = {results.data(), n_results};
    tracer->record(e, start);
  }
  return out;
}

OpOutputs dispatch(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a) {
  for (const Tensor& t : in) {
    if (t.defined() && t.impl()->dist) return dist_hooks().dispatch(op, in, a);
  }
  std::array<OutSpec, kMaxOpOutputs> specs;
  op.shapes(in, a, specs.data());
  return run_local(op, in, a, specs.data(), nullptr);
}

}  // namespace commtrace
