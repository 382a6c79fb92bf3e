// Communicators: the ONE entry point of every collective (DESIGN §1). The public methods are
// non-virtual: they validate the arguments, stamp a per-communicator sequence number, record the
// op into the current tracer, then call the backend's protected run() hook. What each collective
// is (buffers, bytes, reduce op, root, peer) comes from its row in tracer/collectives.h. Backends
// cannot skip tracing. Buffers are contiguous tensors; chunked ops split along dim 0 (callers move
// other dims to the front). Backends live in comm_threads.cpp / comm_fake.cpp; launch() in
// launch.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/tensor/tensor.h"
#include "tracer/collectives.h"
#include "tracer/trace.h"
#include "tracer/tracer.h"

namespace commtrace {

// Why a collective happens: `prefix` + `text`, or an op's input, "<prefix><op> input <index>".
// Made into text only when a tracer records a collective, so untraced runs format nothing.
// Trivially copyable, so autograd closures capture it without allocating: a text is interned
// once into a process-wide pool (build a Reason once, outside hot loops, and keep it).
struct Reason {
  Reason() = default;
  Reason(std::string_view t) : text(intern(t)) {}    // NOLINT: a text converts implicitly
  Reason(const std::string& t) : text(intern(t)) {}  // NOLINT
  Reason(const char* t) : text(intern(t)) {}         // NOLINT
  static Reason op_input(const char* op, int index) {
    Reason r;
    r.op = op;
    r.index = index;
    return r;
  }
  // `forward` with "backward of " in front, or `fallback` when `forward` is empty.
  static Reason backward_of(const Reason& forward, const Reason& fallback);
  std::string str() const;
  // str(), interned: valid for the whole process. Formatted once per distinct reason (and
  // thread), so a collective repeated every iteration formats nothing.
  std::string_view view() const;
  bool empty() const { return text.empty() && op == nullptr; }

  const char* prefix = "";
  std::string_view text;     // interned: valid for the whole process
  const char* op = nullptr;  // static: an OpDef's name
  int index = -1;

 private:
  static std::string_view intern(std::string_view t);
};

// Why the collectives issued inside this scope happen, filled in by redistribute, the parallel
// styles and DDP; the communicator records it with each collective. The views must outlive the
// scope (the scope's owner keeps the data). Thread-local, nests; costs nothing untraced.
struct CollectiveContext {
  Reason reason;  // "ToyModel.out_proj output (RowwiseParallel output_layouts)"
  std::span<const Placement> before, after;  // the redistribution step it serves
  const MeshInfo* mesh = nullptr;
  std::uint64_t mesh_key = 0;                  // DeviceMesh::uid(); 0: none
  std::span<const std::int64_t> global_shape;  // of the DTensor being redistributed
};

class CollectiveScope {
 public:
  explicit CollectiveScope(const CollectiveContext& ctx);
  ~CollectiveScope();
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;
  static const CollectiveContext* current();  // innermost, or null

 private:
  const CollectiveContext* previous_;
  CollectiveContext ctx_;
};

// One collective call as the backends see it: validated arguments and its sequence number.
// in and out are the same tensor for in-place collectives; null where the spec has no buffer.
struct CollectiveCall {
  Collective op = Collective::Barrier;
  const Tensor* in = nullptr;
  const Tensor* out = nullptr;
  ReduceOp reduce = ReduceOp::None;
  int root = -1;  // group rank, broadcast
  int peer = -1;  // group rank, send and recv
  std::uint64_t seq = 0;
};

// One point-to-point op of a batch (PyTorch's P2POp): a send reads `tensor`, a recv writes it.
struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  Tensor tensor;
  int peer = 0;  // group rank
};

class Communicator {
 public:
  // group: the mesh dim name ("tp"); ranks: the global ranks of the group in group order.
  Communicator(std::string group, std::vector<int> ranks, int global_rank);
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const std::string& group() const { return group_; }
  int size() const { return int(ranks_.size()); }
  int rank() const { return rank_; }  // rank within the group
  const std::vector<int>& ranks() const { return ranks_; }
  // The sequence number the next collective will get. send/recv do not advance it: they count
  // per peer and direction (send_seq_, recv_seq_), so point-to-point traffic between two ranks
  // never desynchronizes the group counter.
  std::uint64_t next_seq() const { return seq_; }
  virtual const char* backend_name() const = 0;

  // t (any shape) is reduced in place over the group.
  void all_reduce(Tensor& t, ReduceOp op);
  // out (size * n, ...) = the groups' `in` (n, ...) concatenated along dim 0, in group order.
  void all_gather(const Tensor& in, Tensor& out);
  // in (size * n, ...); out (n, ...) = reduction over the group of chunk rank() of in.
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op);
  // in, out (size * n, ...): chunk j of in goes to group rank j; chunk i of out is from rank i.
  void all_to_all(const Tensor& in, Tensor& out);
  // t of group rank `root` is copied to every rank's t.
  void broadcast(Tensor& t, int root);
  // Point to point, peers are group ranks; shapes and dtypes must match the peer's call. The
  // sends and receives of a batch are issued together (NCCL's group, PyTorch's
  // batch_isend_irecv) and the call returns when all are done. A send is not eager: it
  // completes when its receiver has the data, so a ring step batches its send and its recv.
  // Each op is checked, numbered and recorded as a send or recv.
  void batch_p2p(std::span<const P2POp> ops);
  void send(const Tensor& t, int peer);  // a batch of one: returns once the peer received
  void recv(Tensor& t, int peer);
  void barrier();

 protected:
  // The backend's hooks: they get validated arguments (tracer/collectives.h's buffer rules
  // hold). run_p2p gets a batch of send and recv calls to complete together.
  virtual void run(const CollectiveCall& call) = 0;
  virtual void run_p2p(std::span<const CollectiveCall> calls) = 0;
  // Devices whose tensors this backend can move; checked with the arguments, before recording.
  virtual bool supports_device(Device /*d*/) const { return true; }

 private:
  // The one entry: checks the call against its spec, numbers it, records it (when a tracer is
  // current), then runs the backend's hook. prepare() is its first half: the record's index, or
  // kNotRecorded.
  void issue(CollectiveCall& call);
  static constexpr std::uint32_t kNotRecorded = 0xffffffffu;
  std::uint32_t prepare(CollectiveCall& call, Tracer* tracer);
  void check(const CollectiveCall& call) const;
  void check_tensor(const char* op, const char* arg, const Tensor& t) const;

  std::string group_;
  std::vector<int> ranks_;
  int rank_ = 0;
  std::uint64_t seq_ = 0;
  // p2p sequence numbers, indexed by peer group rank: the k-th send to a peer matches the peer's
  // k-th recv from this rank, and both carry seq k.
  std::vector<std::uint64_t> send_seq_;
  std::vector<std::uint64_t> recv_seq_;
};

}  // namespace commtrace
