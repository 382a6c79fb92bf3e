// Communicators: the ONE entry point of every collective (DESIGN §1). The public methods are
// non-virtual: they validate the arguments, stamp a per-communicator sequence number, record the
// op into the current tracer, then call the backend's protected do_* hook. Backends cannot skip
// tracing. Buffers are contiguous tensors; chunked ops split along dim 0 (callers move other
// dims to the front). Backends live in comm_threads.cpp / comm_fake.cpp; launch() in launch.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/tensor.h"
#include "tracer/collectives.h"
#include "tracer/trace.h"

namespace commtrace {

// Why the collectives issued inside this scope happen, filled in by redistribute and the
// parallel styles; the communicator copies it into each record. Thread-local, nests.
struct CollectiveContext {
  std::string reason;             // "out_proj output: Partial(sum) → Replicate (RowwiseParallel)"
  std::string placements_before;  // "(Partial(sum),)"
  std::string placements_after;   // "(Replicate(),)"
  std::string mesh;               // "DeviceMesh((4,), 'cpu', stride=(1,))"
  Shape global_shape;             // of the DTensor being redistributed
};

class CollectiveScope {
 public:
  explicit CollectiveScope(CollectiveContext ctx);
  ~CollectiveScope();
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;
  static const CollectiveContext* current();  // innermost, or null

 private:
  const CollectiveContext* previous_;
  CollectiveContext ctx_;
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
  // Point to point: peer is a group rank; shapes and dtypes must match the peer's call. send
  // may return before the peer receives (threads copies eagerly), so a ring of send-then-recv
  // does not deadlock.
  void send(const Tensor& t, int peer);
  void recv(Tensor& t, int peer);
  void barrier();

 protected:
  // Hooks get validated arguments; seq is this call's sequence number (equal on every rank).
  virtual void do_all_reduce(Tensor& t, ReduceOp op, std::uint64_t seq) = 0;
  virtual void do_all_gather(const Tensor& in, Tensor& out, std::uint64_t seq) = 0;
  virtual void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, std::uint64_t seq) = 0;
  virtual void do_all_to_all(const Tensor& in, Tensor& out, std::uint64_t seq) = 0;
  virtual void do_broadcast(Tensor& t, int root, std::uint64_t seq) = 0;
  virtual void do_send(const Tensor& t, int peer, std::uint64_t seq) = 0;
  virtual void do_recv(Tensor& t, int peer, std::uint64_t seq) = 0;
  virtual void do_barrier(std::uint64_t seq) = 0;
  // Devices whose tensors this backend can move; checked with the arguments, before recording.
  virtual bool supports_device(Device d) const { return true; }

 private:
  // Checks that t is defined and on a device this backend supports.
  void check_tensor(const char* op, const char* arg, const Tensor& t) const;
  // Records (when a tracer is current) and times the hook. seq is the call's sequence number.
  template <class F>
  void traced(const char* op, std::uint64_t seq, const std::vector<const Tensor*>& ins,
              const std::vector<const Tensor*>& outs, std::uint64_t bytes, ReduceOp rop, F&& hook);

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
