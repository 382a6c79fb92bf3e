// Communicator front end: argument checks, sequence numbers and tracing for every collective,
// shared by all backends (DESIGN §1), plus the thread-local CollectiveScope stack and the
// nccl-tests bus-bandwidth table. Moving data is the backends' job (comm_threads.cpp,
// comm_fake.cpp); nothing here waits or touches tensor data.
#include "parallel/comm.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "tracer/tracer.h"

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

CollectiveScope::CollectiveScope(CollectiveContext ctx)
    : previous_(g_collective_ctx), ctx_(std::move(ctx)) {
  g_collective_ctx = &ctx_;
}

CollectiveScope::~CollectiveScope() { g_collective_ctx = previous_; }

const CollectiveContext* CollectiveScope::current() { return g_collective_ctx; }

// One table for the per-collective math (DESIGN §3, §5.4). PyTorch-compatible names map to the
// same factors so readers of a PyTorch-style JSON can use it too.
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

template <class F>
void Communicator::traced(const char* op, std::uint64_t seq, const std::vector<const Tensor*>& ins,
                          const std::vector<const Tensor*>& outs, std::uint64_t bytes, ReduceOp rop,
                          F&& hook) {
  Tracer* tracer = Tracer::current();
  if (tracer == nullptr) {
    hook();
    return;
  }
  const CollectiveContext* ctx = CollectiveScope::current();
  auto meta = [&](const Tensor& t, bool input) {
    TensorMeta m;
    m.shape = t.shape();
    m.global_shape = ctx != nullptr && !ctx->global_shape.empty() ? ctx->global_shape : t.shape();
    if (ctx != nullptr) m.placements = input ? ctx->placements_before : ctx->placements_after;
    return m;
  };
  OpRecord r;
  r.inputs.reserve(ins.size());
  r.kind = EventKind::Collective;
  r.name = op;
  if (!ins.empty()) r.dtype = ins.front()->dtype();
  if (!outs.empty()) r.dtype = outs.front()->dtype();
  for (const Tensor* t : ins) r.inputs.push_back(meta(*t, true));
  for (const Tensor* t : outs) r.outputs.push_back(meta(*t, false));
  if (ctx != nullptr) {
    r.mesh = ctx->mesh;
    r.reason = ctx->reason;
    r.collective.placements_before = ctx->placements_before;
    r.collective.placements_after = ctx->placements_after;
  }
  r.collective.seq = seq;
  r.collective.group = group_;
  r.collective.group_size = size();
  r.collective.group_rank = rank_;
  r.collective.bytes = bytes;
  r.collective.reduce_op = rop;
  // Recorded before the hook so that a call that fails (mismatch, timeout) still shows in the
  // trace; the time is filled in when the hook returns.
  tracer->record(std::move(r));
  const std::size_t index = tracer->trace().records.size() - 1;
  const auto start = std::chrono::steady_clock::now();
  hook();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (Tracer::current() == tracer && index < tracer->trace().records.size()) {
    tracer->trace().records[index].time_s = took.count();
  }
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", "t", t);
  COMMTRACE_CHECK(op != ReduceOp::None, ErrorCode::InvalidArgument,
                  "all_reduce: a reduce op is required (sum, avg or max)");
  COMMTRACE_CHECK(op != ReduceOp::Avg || is_floating(t.dtype()), ErrorCode::InvalidArgument,
                  "all_reduce: reduce op avg needs a floating dtype, got {}", describe(t));
  const std::uint64_t seq = seq_++;
  traced("all_reduce", seq, {&t}, {&t}, tensor_bytes(t), op, [&] { do_all_reduce(t, op, seq); });
}

void Communicator::all_gather(const Tensor& in, Tensor& out) {
  check_tensor("all_gather", "in", in);
  check_tensor("all_gather", "out", out);
  const int n = size();
  COMMTRACE_CHECK(in.dtype() == out.dtype(), ErrorCode::InvalidArgument,
                  "all_gather: in is {} but out is {}; dtypes must match", describe(in),
                  describe(out));
  COMMTRACE_CHECK(in.dim() >= 1, ErrorCode::InvalidArgument,
                  "all_gather: in is {}; it needs at least one dim (gathered along dim 0)",
                  describe(in));
  COMMTRACE_CHECK(out.numel() == n * in.numel(), ErrorCode::ShapeMismatch,
                  "all_gather: out has {} elements, expected {} ranks × {} = {} (in is {})",
                  out.numel(), n, in.numel(), n * in.numel(), describe(in));
  const Shape want = with_dim0(in.shape(), in.size(0) * n);
  COMMTRACE_CHECK(out.shape() == want, ErrorCode::ShapeMismatch,
                  "all_gather: out is {}, expected shape {} ({} ranks × in {} along dim 0)",
                  describe(out), shape_str(want), n, shape_str(in.shape()));
  COMMTRACE_CHECK(!overlaps(in, out), ErrorCode::InvalidArgument,
                  "all_gather: in and out overlap in memory; use separate buffers");
  const std::uint64_t seq = seq_++;
  traced("all_gather", seq, {&in}, {&out}, tensor_bytes(out), ReduceOp::None,
         [&] { do_all_gather(in, out, seq); });
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_tensor("reduce_scatter", "in", in);
  check_tensor("reduce_scatter", "out", out);
  const int n = size();
  COMMTRACE_CHECK(op != ReduceOp::None, ErrorCode::InvalidArgument,
                  "reduce_scatter: a reduce op is required (sum, avg or max)");
  COMMTRACE_CHECK(in.dtype() == out.dtype(), ErrorCode::InvalidArgument,
                  "reduce_scatter: in is {} but out is {}; dtypes must match", describe(in),
                  describe(out));
  COMMTRACE_CHECK(op != ReduceOp::Avg || is_floating(in.dtype()), ErrorCode::InvalidArgument,
                  "reduce_scatter: reduce op avg needs a floating dtype, got {}", describe(in));
  COMMTRACE_CHECK(in.dim() >= 1, ErrorCode::InvalidArgument,
                  "reduce_scatter: in is {}; it needs at least one dim (scattered along dim 0)",
                  describe(in));
  COMMTRACE_CHECK(in.size(0) % n == 0, ErrorCode::ShapeMismatch,
                  "reduce_scatter: in {} has {} rows in dim 0, not divisible by {} ranks",
                  describe(in), in.size(0), n);
  const Shape want = with_dim0(in.shape(), in.size(0) / n);
  COMMTRACE_CHECK(out.shape() == want, ErrorCode::ShapeMismatch,
                  "reduce_scatter: out is {}, expected shape {} (in {} split over {} ranks along "
                  "dim 0)",
                  describe(out), shape_str(want), shape_str(in.shape()), n);
  COMMTRACE_CHECK(!overlaps(in, out), ErrorCode::InvalidArgument,
                  "reduce_scatter: in and out overlap in memory; use separate buffers");
  const std::uint64_t seq = seq_++;
  traced("reduce_scatter", seq, {&in}, {&out}, tensor_bytes(in), op,
         [&] { do_reduce_scatter(in, out, op, seq); });
}

void Communicator::all_to_all(const Tensor& in, Tensor& out) {
  check_tensor("all_to_all", "in", in);
  check_tensor("all_to_all", "out", out);
  const int n = size();
  COMMTRACE_CHECK(in.dtype() == out.dtype(), ErrorCode::InvalidArgument,
                  "all_to_all: in is {} but out is {}; dtypes must match", describe(in),
                  describe(out));
  COMMTRACE_CHECK(in.dim() >= 1, ErrorCode::InvalidArgument,
                  "all_to_all: in is {}; it needs at least one dim (split along dim 0)",
                  describe(in));
  COMMTRACE_CHECK(in.size(0) % n == 0, ErrorCode::ShapeMismatch,
                  "all_to_all: in {} has {} rows in dim 0, not divisible by {} ranks", describe(in),
                  in.size(0), n);
  COMMTRACE_CHECK(out.shape() == in.shape(), ErrorCode::ShapeMismatch,
                  "all_to_all: out is {}, expected the shape of in {}", describe(out),
                  shape_str(in.shape()));
  COMMTRACE_CHECK(!overlaps(in, out), ErrorCode::InvalidArgument,
                  "all_to_all: in and out overlap in memory; use separate buffers");
  const std::uint64_t seq = seq_++;
  traced("all_to_all", seq, {&in}, {&out}, tensor_bytes(in), ReduceOp::None,
         [&] { do_all_to_all(in, out, seq); });
}

void Communicator::broadcast(Tensor& t, int root) {
  check_tensor("broadcast", "t", t);
  COMMTRACE_CHECK(root >= 0 && root < size(), ErrorCode::InvalidArgument,
                  "broadcast: root {} out of range [0, {}) for group '{}'", root, size(), group_);
  const std::uint64_t seq = seq_++;
  traced("broadcast", seq, {&t}, {&t}, tensor_bytes(t), ReduceOp::None,
         [&] { do_broadcast(t, root, seq); });
}

void Communicator::send(const Tensor& t, int peer) {
  check_tensor("send", "t", t);
  COMMTRACE_CHECK(peer >= 0 && peer < size(), ErrorCode::InvalidArgument,
                  "send: peer {} out of range [0, {}) for group '{}'", peer, size(), group_);
  COMMTRACE_CHECK(peer != rank_, ErrorCode::InvalidArgument,
                  "send: peer {} is this rank (group '{}' rank {}); send to another rank", peer,
                  group_, rank_);
  const std::uint64_t seq = send_seq_[std::size_t(peer)]++;
  traced("send", seq, {&t}, {}, tensor_bytes(t), ReduceOp::None, [&] { do_send(t, peer, seq); });
}

void Communicator::recv(Tensor& t, int peer) {
  check_tensor("recv", "t", t);
  COMMTRACE_CHECK(peer >= 0 && peer < size(), ErrorCode::InvalidArgument,
                  "recv: peer {} out of range [0, {}) for group '{}'", peer, size(), group_);
  COMMTRACE_CHECK(peer != rank_, ErrorCode::InvalidArgument,
                  "recv: peer {} is this rank (group '{}' rank {}); receive from another rank",
                  peer, group_, rank_);
  const std::uint64_t seq = recv_seq_[std::size_t(peer)]++;
  traced("recv", seq, {}, {&t}, tensor_bytes(t), ReduceOp::None, [&] { do_recv(t, peer, seq); });
}

void Communicator::barrier() {
  const std::uint64_t seq = seq_++;
  traced("barrier", seq, {}, {}, 0, ReduceOp::None, [&] { do_barrier(seq); });
}

}  // namespace commtrace
