#include "parallel/tensor/op.h"

#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "tracer/tracer.h"

namespace commtrace {

namespace {

DistHooks g_hooks{};

}  // namespace

DimStrategy& Strategies::add() {
  COMMTRACE_CHECK(size_ < kMaxStrategies, ErrorCode::Internal,
                  "a rule gave more than {} strategies", kMaxStrategies);
  return *::new (&items_[size_++]) DimStrategy{};
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

OpOutputs run_local(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a, OutSpec* specs,
                    const ShardInfo* dist) {
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
  Tracer* implied = nullptr;  // the event is implied: counted, not described
  if (tracer && tracer->next_implied()) std::swap(tracer, implied);
  const std::uint64_t start = tracer ? tracer->start_time() : 0;
  // A timed GEMM on a device is timed there (CUDA events), not by its enqueue time.
  DeviceTiming timing(tracer && op.kind == EventKind::Gemm && tracer->timing()
                          ? kernels_for(first->device()).timer()
                          : nullptr);

  OpOutputs out;
  switch (op.result) {
    case OpDef::Result::View: {
      out[0] = first->detach();
      COMMTRACE_CHECK(numel(specs[0].shape) == first->numel(), ErrorCode::ShapeMismatch,
                      "{}: {} cannot be viewed as {}", op.name, describe(*first),
                      shape_str(specs[0].shape));
      out[0].impl()->shape = std::move(specs[0].shape);
      break;
    }
    case OpDef::Result::InPlace:
      out[0] = *first;
      op.run(in, a, {out.data(), 1}, dist);
      break;
    case OpDef::Result::Fresh:
      for (int i = 0; i < op.n_outputs; ++i) {
        if (!specs[i].present) continue;
        out[std::size_t(i)] =
            Tensor::empty(std::move(specs[i].shape), specs[i].dtype, first->device());
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
    EventHead h;
    h.kind = op.kind;
    h.name = op.name;
    h.overload = op.overload;
    h.dtype = f.dtype;
    const std::uint32_t index = tracer->record(
        h,
        [&](auto& sink) {
          describe_inputs(sink, in, a.transposed, [](const Tensor& t) {
            const TensorImpl& i = *t.impl();
            return ArgView::plain(i.shape, &i.trace_slot);
          });
          for (int i = 0; i < op.n_outputs; ++i) {
            const TensorImpl* o = out[std::size_t(i)].impl();
            if (o) sink.output(ArgView::plain(o->shape, &o->trace_slot));
          }
        },
        start);
    timing.end(*tracer, index);
  }
  if (implied) implied->record_implied();
  return out;
}

namespace {
thread_local DispatchObserver* g_observer = nullptr;

OpOutputs dispatch_unobserved(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a) {
  for (const Tensor& t : in) {
    if (t.defined() && t.impl()->dist) return dist_hooks().dispatch(op, in, a);
  }
  std::array<OutSpec, kMaxOpOutputs> specs;
  op.shapes(in, a, specs.data());
  return run_local(op, in, a, specs.data(), nullptr);
}
}  // namespace

DispatchObserverScope::DispatchObserverScope(DispatchObserver& o)
    : previous_(std::exchange(g_observer, &o)) {}
DispatchObserverScope::~DispatchObserverScope() { g_observer = previous_; }

OpOutputs dispatch(const OpDef& op, std::span<const Tensor> in, const OpAttrs& a) {
  DispatchObserver* o = g_observer;
  if (!o) return dispatch_unobserved(op, in, a);
  g_observer = nullptr;  // one observation per call: the DTensor path's inner ops are its own
  struct Restore {
    DispatchObserver* o;
    ~Restore() { g_observer = o; }
  } restore{o};
  o->before(op);
  OpOutputs out = dispatch_unobserved(op, in, a);
  o->after(out);
  return out;
}

}  // namespace commtrace
