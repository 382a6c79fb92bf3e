// Communicator front end: argument checks (from each collective's buffer rule), sequence numbers
// and tracing for every collective, shared by all backends (DESIGN §1), plus the thread-local
// CollectiveScope stack. Moving data is the backends' job (comm_threads.cpp, comm_fake.cpp);
// nothing here waits or touches tensor data.
#include "parallel/comm/comm.h"

#include <algorithm>
#include <array>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <utility>

#include "kernels/backend.h"

namespace commtrace {

namespace {
thread_local const CollectiveContext* g_collective_ctx = nullptr;

std::uint64_t tensor_bytes(const Tensor& t) {
  return std::uint64_t(t.numel()) * dtype_size(t.dtype());
}

// True when a and b share storage and their bytes intersect (meta tensors never do).
bool overlaps(const Tensor& a, const Tensor& b) {
  const TensorImpl* x = a.impl();
  const TensorImpl* y = b.impl();
  if (x->storage == nullptr || x->storage != y->storage) return false;
  const std::int64_t xb = x->offset * std::int64_t(dtype_size(x->dtype));
  const std::int64_t yb = y->offset * std::int64_t(dtype_size(y->dtype));
  const std::int64_t xe = xb + std::int64_t(tensor_bytes(a));
  const std::int64_t ye = yb + std::int64_t(tensor_bytes(b));
  return xb < ye && yb < xe;
}

Shape with_dim0(Shape s, std::int64_t d0) {
  s[0] = d0;
  return s;
}
}  // namespace

std::string_view Reason::intern(std::string_view t) {
  if (t.empty()) return {};
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view v) const { return std::hash<std::string_view>{}(v); }
  };
  static std::mutex mu;
  static std::unordered_set<std::string, Hash, std::equal_to<>> pool;  // nodes never move
  const std::lock_guard<std::mutex> lock(mu);
  auto it = pool.find(t);
  if (it == pool.end()) it = pool.emplace(t).first;
  return *it;
}

Reason Reason::backward_of(const Reason& forward, const Reason& fallback) {
  if (forward.empty()) return fallback;
  Reason r = forward;
  r.prefix = "backward of ";
  return r;
}

std::string_view Reason::view() const {
  if (!op && *prefix == '\0') return text;
  // A direct-mapped cache per thread, keyed by the reason's parts (all of them interned or
  // static, so equal parts mean an equal text).
  struct Entry {
    const char* prefix = nullptr;
    const char* text = nullptr;
    std::size_t size = 0;
    const char* op = nullptr;
    int index = -1;
    std::string_view view;
  };
  static thread_local std::array<Entry, 64> cache;
  const std::size_t h = (reinterpret_cast<std::uintptr_t>(op ? op : text.data()) >> 3) * 31 +
                        reinterpret_cast<std::uintptr_t>(prefix) + std::size_t(index);
  Entry& e = cache[h % cache.size()];
  if (e.prefix != prefix || e.text != text.data() || e.size != text.size() || e.op != op ||
      e.index != index || e.view.data() == nullptr) {
    e = Entry{prefix, text.data(), text.size(), op, index, intern(str())};
  }
  return e.view;
}

std::string Reason::str() const {
  if (op) return fmt::format("{}{} input {}", prefix, op, index);
  return fmt::format("{}{}", prefix, text);
}

CollectiveScope::CollectiveScope(const CollectiveContext& ctx)
    : previous_(g_collective_ctx), ctx_(ctx) {
  g_collective_ctx = &ctx_;
}

CollectiveScope::~CollectiveScope() { g_collective_ctx = previous_; }

const CollectiveContext* CollectiveScope::current() { return g_collective_ctx; }

Communicator::Communicator(std::string group, std::vector<int> ranks, int global_rank)
    : group_(std::move(group)), ranks_(std::move(ranks)) {
  COMMTRACE_CHECK(!ranks_.empty(), ErrorCode::InvalidArgument,
                  "communicator '{}': a group needs at least one rank", group_);
  const auto it = std::find(ranks_.begin(), ranks_.end(), global_rank);
  COMMTRACE_CHECK(it != ranks_.end(), ErrorCode::InvalidArgument,
                  "communicator '{}': rank {} is not in the group's ranks {}", group_, global_rank,
                  shape_str(Shape(ranks_.begin(), ranks_.end())));
  rank_ = int(it - ranks_.begin());
  send_seq_.assign(ranks_.size(), 0);
  recv_seq_.assign(ranks_.size(), 0);
}

void Communicator::check_tensor(const char* op, const char* arg, const Tensor& t) const {
  COMMTRACE_CHECK(t.defined(), ErrorCode::InvalidArgument, "{}: {} is an undefined tensor", op,
                  arg);
  COMMTRACE_CHECK(supports_device(t.device()), ErrorCode::Unsupported,
                  "{}: the {} backend does not support {} tensors ({} is {})", op, backend_name(),
                  device_name(t.device()), arg, describe(t));
}

// The checks of every collective, driven by its spec's buffer rule. Messages name the op, the
// argument, the value and what was expected.
void Communicator::check(const CollectiveCall& c) const {
  const CollectiveSpec& spec = collective_spec(c.op);
  const char* op = spec.name;
  const int n = size();
  const bool in_place = spec.buffers == BufferRule::InPlace;
  const bool single = in_place || spec.p2p;  // one buffer, named t
  if (c.in) check_tensor(op, single ? "t" : "in", *c.in);
  if (c.out && c.out != c.in) check_tensor(op, single ? "t" : "out", *c.out);
  if (spec.reduces) {
    COMMTRACE_CHECK(c.reduce != ReduceOp::None, ErrorCode::InvalidArgument,
                    "{}: a reduce op is required (sum, avg or max)", op);
  }
  if (c.in && c.out && !in_place) {
    COMMTRACE_CHECK(c.in->dtype() == c.out->dtype(), ErrorCode::InvalidArgument,
                    "{}: in is {} but out is {}; dtypes must match", op, describe(*c.in),
                    describe(*c.out));
  }
  if (c.reduce == ReduceOp::Avg) {
    COMMTRACE_CHECK(is_floating(c.in->dtype()), ErrorCode::InvalidArgument,
                    "{}: reduce op avg needs a floating dtype, got {}", op, describe(*c.in));
  }
  if (spec.rooted) {
    COMMTRACE_CHECK(c.root >= 0 && c.root < n, ErrorCode::InvalidArgument,
                    "{}: root {} out of range [0, {}) for group '{}'", op, c.root, n, group_);
  }
  if (spec.p2p) {
    COMMTRACE_CHECK(c.peer >= 0 && c.peer < n, ErrorCode::InvalidArgument,
                    "{}: peer {} out of range [0, {}) for group '{}'", op, c.peer, n, group_);
    COMMTRACE_CHECK(c.peer != rank_, ErrorCode::InvalidArgument,
                    "{}: peer {} is this rank (group '{}' rank {}); {} another rank", op, c.peer,
                    group_, rank_, c.op == Collective::Send ? "send to" : "receive from");
  }
  const BufferRule rule = spec.buffers;
  if (rule != BufferRule::Gather && rule != BufferRule::Scatter && rule != BufferRule::Exchange) {
    return;
  }
  const Tensor& in = *c.in;
  const Tensor& out = *c.out;
  const char* verb = rule == BufferRule::Gather    ? "gathered"
                     : rule == BufferRule::Scatter ? "scattered"
                                                   : "split";
  COMMTRACE_CHECK(in.dim() >= 1, ErrorCode::InvalidArgument,
                  "{}: in is {}; it needs at least one dim ({} along dim 0)", op, describe(in),
                  verb);
  if (rule == BufferRule::Gather) {
    COMMTRACE_CHECK(out.numel() == n * in.numel(), ErrorCode::ShapeMismatch,
                    "{}: out has {} elements, expected {} ranks × {} = {} (in is {})", op,
                    out.numel(), n, in.numel(), n * in.numel(), describe(in));
    const Shape want = with_dim0(in.shape(), in.size(0) * n);
    COMMTRACE_CHECK(out.shape() == want, ErrorCode::ShapeMismatch,
                    "{}: out is {}, expected shape {} ({} ranks × in {} along dim 0)", op,
                    describe(out), shape_str(want), n, shape_str(in.shape()));
  } else {
    COMMTRACE_CHECK(in.size(0) % n == 0, ErrorCode::ShapeMismatch,
                    "{}: in {} has {} rows in dim 0, not divisible by {} ranks", op, describe(in),
                    in.size(0), n);
    if (rule == BufferRule::Scatter) {
      const Shape want = with_dim0(in.shape(), in.size(0) / n);
      COMMTRACE_CHECK(out.shape() == want, ErrorCode::ShapeMismatch,
                      "{}: out is {}, expected shape {} (in {} split over {} ranks along dim 0)",
                      op, describe(out), shape_str(want), shape_str(in.shape()), n);
    } else {
      COMMTRACE_CHECK(out.shape() == in.shape(), ErrorCode::ShapeMismatch,
                      "{}: out is {}, expected the shape of in {}", op, describe(out),
                      shape_str(in.shape()));
    }
  }
  COMMTRACE_CHECK(!overlaps(in, out), ErrorCode::InvalidArgument,
                  "{}: in and out overlap in memory; use separate buffers", op);
}

std::uint32_t Communicator::prepare(CollectiveCall& c, Tracer* tracer) {
  check(c);
  const CollectiveSpec& spec = collective_spec(c.op);
  if (c.op == Collective::Send) {
    c.seq = send_seq_[std::size_t(c.peer)]++;
  } else if (c.op == Collective::Recv) {
    c.seq = recv_seq_[std::size_t(c.peer)]++;
  } else {
    c.seq = seq_++;
  }
  if (tracer == nullptr) return kNotRecorded;
  if (tracer->next_implied()) return tracer->begin_implied(c.seq);
  const CollectiveContext* ctx = CollectiveScope::current();
  const std::span<const std::int64_t> global =
      ctx ? ctx->global_shape : std::span<const std::int64_t>();
  // The buffer's slot describes it as a plain tensor: only a view without a context is that.
  auto arg = [&](const Tensor& t, bool input) {
    const TensorImpl& i = *t.impl();
    if (!ctx) return ArgView::plain(i.shape, &i.trace_slot);
    return ArgView{i.shape, global, input ? ctx->before : ctx->after, nullptr, &i.trace_slot};
  };
  const bool in_place = spec.buffers == BufferRule::InPlace;
  EventHead h;
  h.kind = EventKind::Collective;
  h.name = spec.name;
  if (c.in) h.dtype = c.in->impl()->dtype;  // defined: check(c) ran
  if (c.out) h.dtype = c.out->impl()->dtype;
  if (ctx) {
    h.mesh = ctx->mesh;
    h.mesh_key = ctx->mesh_key;
    h.reason = ctx->reason.view();
  }
  CollectiveView cv;
  cv.op = c.op;
  cv.reduce_op = c.reduce;
  cv.seq = c.seq;
  cv.group = group_;
  cv.group_size = size();
  cv.group_rank = rank_;
  cv.peer = c.peer;
  cv.root = c.root;
  cv.bytes = spec.bytes == ByteSource::Input    ? tensor_bytes(*c.in)
             : spec.bytes == ByteSource::Output ? tensor_bytes(in_place ? *c.in : *c.out)
                                                : 0;
  if (ctx) {
    cv.before = ctx->before;
    cv.after = ctx->after;
  }
  // Recorded before the hook so that a call that fails (mismatch, timeout) still shows in the
  // trace; its duration is set when the hook returns.
  return tracer->begin(
      h,
      [&](auto& sink) {
        if (c.in) sink.input(arg(*c.in, true));
        if (c.out) sink.output(arg(*c.out, false));
      },
      &cv);
}

namespace {

// The timer of the device a timed call's buffers are on; null on cpu and meta (host time).
DeviceTimer* timer_of(const CollectiveCall& c, bool timed) {
  const Tensor* t = c.in ? c.in : c.out;
  return timed && t ? kernels_for(t->device()).timer() : nullptr;
}

}  // namespace

void Communicator::issue(CollectiveCall& c) {
  Tracer* tracer = Tracer::current();
  const std::uint32_t record = prepare(c, tracer);
  DeviceTiming timing(timer_of(c, record != kNotRecorded && tracer->timing()));
  run(c);
  if (record != kNotRecorded && Tracer::current() == tracer) {
    tracer->finish(record);
    timing.end(*tracer, record);
  }
}

void Communicator::batch_p2p(std::span<const P2POp> ops) {
  Tracer* tracer = Tracer::current();
  std::vector<CollectiveCall> calls(ops.size());
  std::vector<std::uint32_t> records(ops.size(), kNotRecorded);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    CollectiveCall& c = calls[i];
    const bool send = op.kind == P2POp::Kind::Send;
    c.op = send ? Collective::Send : Collective::Recv;
    (send ? c.in : c.out) = &op.tensor;
    c.peer = op.peer;
    check(c);  // the whole batch first: a bad op numbers none
  }
  for (std::size_t i = 0; i < ops.size(); ++i) records[i] = prepare(calls[i], tracer);
  // On a device every op of the batch spans the batch's work (its ops run together).
  std::vector<std::optional<DeviceTiming>> timings(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    timings[i].emplace(timer_of(calls[i], records[i] != kNotRecorded && tracer->timing()));
  }
  run_p2p(calls);
  if (Tracer::current() != tracer) return;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (records[i] == kNotRecorded) continue;
    tracer->finish(records[i]);
    timings[i]->end(*tracer, records[i]);
  }
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  CollectiveCall c{Collective::AllReduce, &t, &t, op};
  issue(c);
}

void Communicator::all_gather(const Tensor& in, Tensor& out) {
  CollectiveCall c{Collective::AllGather, &in, &out};
  issue(c);
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  CollectiveCall c{Collective::ReduceScatter, &in, &out, op};
  issue(c);
}

void Communicator::all_to_all(const Tensor& in, Tensor& out) {
  CollectiveCall c{Collective::AllToAll, &in, &out};
  issue(c);
}

void Communicator::broadcast(Tensor& t, int root) {
  CollectiveCall c{Collective::Broadcast, &t, &t, ReduceOp::None, root};
  issue(c);
}

void Communicator::send(const Tensor& t, int peer) {
  const P2POp op{P2POp::Kind::Send, t, peer};
  batch_p2p({&op, 1});
}

void Communicator::recv(Tensor& t, int peer) {
  const P2POp op{P2POp::Kind::Recv, t, peer};
  batch_p2p({&op, 1});
}

void Communicator::barrier() {
  CollectiveCall c{Collective::Barrier};
  issue(c);
}

}  // namespace commtrace
