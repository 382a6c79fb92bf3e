// The "threads" backend: every rank is a thread of one process and collectives move data through
// shared memory. Per group there is one rendezvous (mutex, condvar, one slot per group rank);
// send/recv go through per-(src, dst) mailboxes of the same group. It never hangs: every wait
// looks at the Job's abort flag, the finished ranks and a timeout. It is not a performance model
// of a real interconnect; it exists to run TP/SP programs with real numbers on one machine.
//
// Point to point is a rendezvous, not eager: a batch posts its sends (pointers to the sender's
// buffers) in the mailboxes, then takes its receives (each receiver copies straight from the
// sender's buffer), then waits until its sends were taken. Posting every send of a batch before
// waiting on anything is what lets a ring step (send right, receive left) complete.
//
// A collective, on each rank:
//   1. arrive: post {call, seq, buffers} in the rank's slot and wait until every rank of the group
//      posted the same call at the same seq (a different call at that seq is a mismatch error);
//   2. data step, outside the lock: read the peers' buffers directly and write (see below);
//   3. depart: mark the step done and wait until every rank is done, so that nobody returns (and
//      frees or reuses a buffer) while a peer still reads or writes it.
// all_reduce splits the elements into one chunk per rank; rank r reduces chunk r over the inputs
// of ranks 0..n-1 in that order and writes the result into chunk r of EVERY rank's tensor (the
// shared-memory form of reduce_scatter + all_gather). Each element is read n times and written n
// times in all, the work is spread over the ranks, no scratch buffer is needed (chunk r of every
// tensor is touched by rank r only, so in-place is safe), and one rank computes each element, so
// every rank gets the same bits. reduce_scatter is the same with one output. The arithmetic is
// the CPU kernels' reduce (kernels/backend.h), which combines the sources in the order given.
#include <algorithm>
#include <cstring>
#include <functional>

#include "kernels/backend.h"
#include "parallel/comm/backend.h"
#include "parallel/comm/threads_state.h"

namespace commtrace {

namespace {

using namespace threads;  // NOLINT(google-build-using-namespace): its one user

// ---- data steps ----

const char* byte_ptr(const void* p, std::int64_t offset) {
  return static_cast<const char*>(p) + offset;
}
char* byte_ptr(void* p, std::int64_t offset) { return static_cast<char*>(p) + offset; }

// ---- the world and the communicator ----

class ThreadsBackend final : public CommBackend,
                             public std::enable_shared_from_this<ThreadsBackend> {
 public:
  ThreadsBackend(std::shared_ptr<Job> job, double timeout_s)
      : CommBackend(std::move(job), "threads"),
        timeout_s_(timeout_s),
        waits_(CommBackend::job().world_size()) {}
  double timeout_s() const { return timeout_s_; }
  WaitGraph& waits() { return waits_; }

  // Wakes every wait so it sees the abort flag or a finished rank now.
  void wake_all() {
    std::vector<std::shared_ptr<GroupState>> groups;
    {
      std::lock_guard<std::mutex> lock(groups_mu_);
      for (auto& [key, g] : groups_) groups.push_back(g);
    }
    for (auto& g : groups) {
      std::lock_guard<std::mutex> lock(g->mu);
      g->cv.notify_all();
    }
  }

 protected:
  std::shared_ptr<Communicator> make_communicator(const std::string& group,
                                                  const std::vector<int>& ranks,
                                                  int global_rank) override;

 private:
  double timeout_s_;
  WaitGraph waits_;
  std::mutex groups_mu_;
  std::map<std::string, std::shared_ptr<GroupState>> groups_;  // by name + ranks
};

class ThreadsCommunicator final : public Communicator, public CallCheck {
 public:
  ThreadsCommunicator(const std::string& group, const std::vector<int>& ranks, int global_rank,
                      std::shared_ptr<ThreadsBackend> backend, std::shared_ptr<GroupState> state)
      : Communicator(group, ranks, global_rank),
        backend_(std::move(backend)),
        state_(std::move(state)),
        global_rank_(global_rank) {}

  const char* backend_name() const override { return "threads"; }

  // The rendezvous of a collective and of a batch without their data steps.
  void same_call(const CallDesc& d, std::uint64_t seq) override {
    collective(kernels_for(Device::CPU), d, nullptr, nullptr, seq,
               [](const std::vector<const void*>&, const std::vector<void*>&) {});
  }
  void same_p2p(std::span<const CollectiveCall> calls) override { p2p(calls, false); }

 protected:
  // Device buffers of one process are moved by that device's kernels (cuda: ranks share a GPU).
  bool supports_device(Device d) const override { return d == Device::CPU || d == Device::CUDA; }

  void run(const CollectiveCall& c) override {
    if (c.op == Collective::Barrier) return do_barrier(c.seq);  // no buffers
    Tensor& out = const_cast<Tensor&>(*(c.out ? c.out : c.in));
    switch (c.op) {
      case Collective::AllReduce:
        return do_all_reduce(out, c.reduce, c.seq);
      case Collective::AllGather:
        return do_all_gather(*c.in, out, c.seq);
      case Collective::ReduceScatter:
        return do_reduce_scatter(*c.in, out, c.reduce, c.seq);
      case Collective::AllToAll:
        return do_all_to_all(*c.in, out, c.seq);
      case Collective::Broadcast:
        return do_broadcast(out, c.root, c.seq);
      case Collective::Send:
      case Collective::Recv:
        return run_p2p({&c, 1});
      case Collective::Barrier:
        return;  // handled above
    }
  }

 private:
  void do_all_reduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
    const DType dt = t.dtype();
    const std::int64_t n_elems = t.numel();
    void* buf = data_of(t);
    const Kernels& k = kernels_for(t.device());
    collective(k, {Collective::AllReduce, dt, t.shape(), op, -1}, buf, buf, seq,
               [&](const std::vector<const void*>& ins, const std::vector<void*>& outs) {
                 // Chunk bounds are multiples of 64 elements so ranks write different lines.
                 const int n = size();
                 auto bound = [&](int r) -> std::int64_t {
                   if (r >= n) return n_elems;
                   return std::min(n_elems, (n_elems * r / n) / 64 * 64);
                 };
                 k.reduce(dt, op, ins.data(), n, outs.data(), n, bound(rank()), bound(rank() + 1));
               });
  }

  void do_all_gather(const Tensor& in, Tensor& out, std::uint64_t seq) {
    const std::int64_t bytes = in.numel() * std::int64_t(dtype_size(in.dtype()));
    void* dst = data_of(out);
    const Kernels& k = kernels_for(in.device());
    collective(k, {Collective::AllGather, in.dtype(), in.shape(), ReduceOp::None, -1}, data_of(in),
               dst, seq, [&](const std::vector<const void*>& ins, const std::vector<void*>&) {
                 for (int j = 0; j < size(); ++j) {
                   k.copy(byte_ptr(dst, j * bytes), ins[std::size_t(j)], std::size_t(bytes));
                 }
               });
  }

  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, std::uint64_t seq) {
    const DType dt = in.dtype();
    const std::int64_t chunk = out.numel();
    const std::int64_t offset = rank() * chunk * std::int64_t(dtype_size(dt));
    void* dst = data_of(out);
    const Kernels& k = kernels_for(in.device());
    collective(k, {Collective::ReduceScatter, dt, in.shape(), op, -1}, data_of(in), dst, seq,
               [&](const std::vector<const void*>& ins, const std::vector<void*>&) {
                 std::vector<const void*> srcs;
                 for (const void* p : ins) srcs.push_back(byte_ptr(p, offset));
                 k.reduce(dt, op, srcs.data(), int(srcs.size()), &dst, 1, 0, chunk);
               });
  }

  void do_all_to_all(const Tensor& in, Tensor& out, std::uint64_t seq) {
    const std::int64_t chunk_bytes = in.numel() / size() * std::int64_t(dtype_size(in.dtype()));
    void* dst = data_of(out);
    const Kernels& k = kernels_for(in.device());
    collective(k, {Collective::AllToAll, in.dtype(), in.shape(), ReduceOp::None, -1}, data_of(in),
               dst, seq, [&](const std::vector<const void*>& ins, const std::vector<void*>&) {
                 for (int j = 0; j < size(); ++j) {
                   k.copy(byte_ptr(dst, j * chunk_bytes),
                          byte_ptr(ins[std::size_t(j)], rank() * chunk_bytes),
                          std::size_t(chunk_bytes));
                 }
               });
  }

  void do_broadcast(Tensor& t, int root, std::uint64_t seq) {
    const std::size_t bytes = std::size_t(t.numel()) * dtype_size(t.dtype());
    void* buf = data_of(t);
    const Kernels& k = kernels_for(t.device());
    collective(k, {Collective::Broadcast, t.dtype(), t.shape(), ReduceOp::None, root}, buf, buf,
               seq, [&](const std::vector<const void*>& ins, const std::vector<void*>&) {
                 if (rank() != root) k.copy(buf, ins[std::size_t(root)], bytes);
               });
  }

  void do_barrier(std::uint64_t seq) { same_call(CallDesc{}, seq); }  // a rendezvous, no data

  void run_p2p(std::span<const CollectiveCall> calls) override { p2p(calls, true); }

  // with_data false: the sends post their descriptions only, so the receives compare them and
  // copy nothing.
  void p2p(std::span<const CollectiveCall> calls, bool with_data) {
    GroupState& g = *state_;
    std::vector<Posted> posted;  // reserved up front: the mailboxes point into it
    posted.reserve(calls.size());
    std::vector<int> posted_peer;
    for (const CollectiveCall& c : calls) {  // sent buffers are ready before a peer reads them
      if (with_data && c.op == Collective::Send) kernels_for(c.in->device()).synchronize();
    }
    {
      std::lock_guard<std::mutex> lock(g.mu);
      for (const CollectiveCall& c : calls) {
        if (c.op != Collective::Send) continue;
        Posted& p = posted.emplace_back();
        p.seq = c.seq;
        p.dtype = c.in->dtype();
        p.shape = c.in->shape();
        p.bytes = with_data ? std::size_t(c.in->numel()) * dtype_size(p.dtype) : 0;
        p.data = p.bytes ? data_of(*c.in) : nullptr;
        posted_peer.push_back(c.peer);
        g.mail[{rank(), c.peer}].push_back(&p);
        backend_->waits().unblock(ranks()[std::size_t(c.peer)]);  // a receiver's wait ends
      }
      g.cv.notify_all();
    }
    try {
      for (const CollectiveCall& c : calls) {
        if (c.op == Collective::Recv) take(*c.out, c.peer, c.seq);
      }
      wait_taken(posted, posted_peer);
    } catch (...) {
      withdraw(posted, posted_peer);
      throw;
    }
  }

  // Receives seq from peer: waits for its posted send, copies from the sender's buffer.
  void take(const Tensor& t, int peer, std::uint64_t seq) {
    GroupState& g = *state_;
    const int peer_global = ranks()[std::size_t(peer)];
    std::unique_lock<std::mutex> lock(g.mu);
    std::deque<Posted*>& box = g.mail[{peer, rank()}];
    const auto deadline = deadline_from_now();
    BlockedScope blocked(backend_->waits(), global_rank_);
    while (box.empty()) {
      const std::string cycle = blocked.block(
          fmt::format("recv seq {} from rank {} on group '{}'", seq, peer_global, g.name),
          backend_->job().running());
      check_abort();
      COMMTRACE_CHECK(!backend_->job().finished(peer_global), ErrorCode::InvalidArgument,
                      "rank {} waits in recv seq {} from rank {} on group '{}', but rank {} "
                      "returned without sending it",
                      global_rank_, seq, peer_global, g.name, peer_global);
      COMMTRACE_CHECK(Clock::now() < deadline, ErrorCode::Aborted,
                      "rank {} timed out after {}s waiting for ranks {{{}}} at recv seq {} on "
                      "group '{}'",
                      global_rank_, backend_->timeout_s(), peer_global, seq, g.name);
      if (!cycle.empty()) throw Error(ErrorCode::InvalidArgument, cycle);
      g.cv.wait_until(lock, deadline);
    }
    Posted& p = *box.front();
    box.pop_front();
    const bool match = p.seq == seq && p.dtype == t.dtype() && p.shape == t.shape();
    if (!match) {
      p.error =
          p.seq != seq
              ? fmt::format("recv: rank {} expected seq {} from rank {} on group '{}', got seq {}",
                            global_rank_, seq, peer_global, g.name, p.seq)
              : fmt::format(
                    "send/recv mismatch on group '{}' seq {}: rank {} sent {}{}, rank {} "
                    "receives {}",
                    g.name, seq, peer_global, dtype_name(p.dtype), shape_str(p.shape), global_rank_,
                    describe(t));
      p.state = Posted::State::Taken;
      backend_->waits().unblock(peer_global);  // the sender's wait ends
      g.cv.notify_all();
      throw Error(p.seq != seq ? ErrorCode::Internal : ErrorCode::InvalidArgument, p.error);
    }
    p.state = Posted::State::Copying;
    lock.unlock();
    std::string failed;  // a device copy that fails fails both ends, never leaves one waiting
    if (p.bytes > 0) {
      try {
        const Kernels& k = kernels_for(t.device());
        k.copy(data_of(t), p.data, p.bytes);
        k.synchronize();  // done before the sender may free its buffer
      } catch (const std::exception& e) {
        failed = fmt::format("recv seq {} from rank {} on group '{}': {}", seq, peer_global, g.name,
                             e.what());
      }
    }
    lock.lock();
    p.error = failed;
    p.state = Posted::State::Taken;
    backend_->waits().unblock(peer_global);  // the sender's wait ends
    g.cv.notify_all();
    if (!failed.empty()) throw Error(ErrorCode::Backend, failed);
  }

  // Waits until every posted send was taken by its receiver.
  void wait_taken(std::vector<Posted>& posted, const std::vector<int>& peers) {
    GroupState& g = *state_;
    std::unique_lock<std::mutex> lock(g.mu);
    const auto deadline = deadline_from_now();
    BlockedScope blocked(backend_->waits(), global_rank_);
    for (std::size_t i = 0; i < posted.size(); ++i) {
      Posted& p = posted[i];
      const int peer_global = ranks()[std::size_t(peers[i])];
      while (p.state != Posted::State::Taken) {
        const std::string cycle = blocked.block(
            fmt::format("send seq {} to rank {} on group '{}'", p.seq, peer_global, g.name),
            backend_->job().running());
        check_abort();
        COMMTRACE_CHECK(!backend_->job().finished(peer_global), ErrorCode::InvalidArgument,
                        "rank {} waits in send seq {} to rank {} on group '{}', but rank {} "
                        "returned without receiving it",
                        global_rank_, p.seq, peer_global, g.name, peer_global);
        COMMTRACE_CHECK(Clock::now() < deadline, ErrorCode::Aborted,
                        "rank {} timed out after {}s waiting for ranks {{{}}} at send seq {} on "
                        "group '{}'",
                        global_rank_, backend_->timeout_s(), peer_global, p.seq, g.name);
        if (!cycle.empty()) throw Error(ErrorCode::InvalidArgument, cycle);
        g.cv.wait_until(lock, deadline);
      }
      if (!p.error.empty()) throw Error(ErrorCode::InvalidArgument, p.error);
    }
  }

  // On failure: sends still queued leave the mailboxes; one a receiver is copying finishes
  // first (a copy never blocks), so no peer reads a buffer after this returns.
  void withdraw(std::vector<Posted>& posted, const std::vector<int>& peers) {
    GroupState& g = *state_;
    std::unique_lock<std::mutex> lock(g.mu);
    for (std::size_t i = 0; i < posted.size(); ++i) {
      Posted& p = posted[i];
      if (p.state == Posted::State::Queued) {
        std::deque<Posted*>& box = g.mail[{rank(), peers[i]}];
        box.erase(std::remove(box.begin(), box.end(), &p), box.end());
        p.state = Posted::State::Taken;
      }
      while (p.state == Posted::State::Copying) g.cv.wait(lock);
    }
  }

  using Step = std::function<void(const std::vector<const void*>&, const std::vector<void*>&)>;

  // The tensor's elements on its device (checked by the Communicator: cpu or cuda).
  static void* data_of(const Tensor& t) { return t.data_ptr(); }

  Clock::time_point deadline_from_now() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(backend_->timeout_s()));
  }

  void check_abort() const {
    const Job& job = backend_->job();
    if (job.aborted()) throw PeerAborted(job.abort_message());
  }

  // The three phases of the file comment. step gets every rank's in and out buffer and runs
  // on k's queue; k.synchronize() before arrival (the buffers are ready for the peers) and after
  // the step (the peers' buffers are done with before anyone leaves).
  void collective(const Kernels& k, const CallDesc& d, const void* in, void* out, std::uint64_t seq,
                  const Step& step) {
    k.synchronize();
    GroupState& g = *state_;
    const std::size_t n = g.slots.size();
    Slot& me = g.slots[std::size_t(rank())];
    std::vector<const void*> ins(n);
    std::vector<void*> outs(n);
    std::unique_lock<std::mutex> lock(g.mu);
    me.posted = seq + 1;
    me.active = true;
    me.desc = d;
    me.in = in;
    me.out = out;
    if (g.arrive_seq != seq) {
      g.arrive_seq = seq;
      g.arrived = 0;
      g.first = std::size_t(rank());
    }
    // A call that differs from the first rank's never counts: the group cannot complete, and
    // wait_for_arrival reports the mismatch (every rank that differs from another does, so some
    // rank sees any mismatch here).
    const bool counted = g.slots[g.first].desc == d;
    if (counted && ++g.arrived == n) {  // the last to arrive wakes the others
      for (int r : g.ranks) backend_->waits().unblock(r);
      g.cv.notify_all();
    }
    try {
      wait_for_arrival(lock, d, seq);
    } catch (const std::exception& e) {
      // Withdraw under the same lock hold that saw the group incomplete: no peer can have seen
      // this rank's buffers as ready, so they may be freed. desc stays for mismatch reports;
      // the error tells the peers still waiting why this rank is gone.
      me.active = false;
      if (counted) --g.arrived;
      if (dynamic_cast<const PeerAborted*>(&e) == nullptr) {  // the abort flag tells them already
        me.left = seq + 1;
        me.left_error = e.what();
      }
      g.cv.notify_all();
      throw;
    }
    for (std::size_t j = 0; j < n; ++j) {
      ins[j] = g.slots[j].in;
      outs[j] = g.slots[j].out;
    }
    lock.unlock();

    std::exception_ptr error;
    try {
      step(ins, outs);
      k.synchronize();
    } catch (...) {
      error = std::current_exception();
    }

    lock.lock();
    me.done = seq + 1;
    if (g.done_seq != seq) {
      g.done_seq = seq;
      g.done = 0;
    }
    if (++g.done == n) g.cv.notify_all();
    // Every rank of the group arrived and a data step never blocks, so this wait ends. It does
    // not stop on the abort flag or a timeout: leaving early would let this rank free a buffer
    // a peer is still reading or writing.
    while (!(g.done_seq == seq && g.done == n)) g.cv.wait(lock);
    me.active = false;
    lock.unlock();
    if (error) std::rethrow_exception(error);
  }

  // REQUIRES: lock holds state_->mu and this rank posted d at seq.
  void wait_for_arrival(std::unique_lock<std::mutex>& lock, const CallDesc& d, std::uint64_t seq) {
    GroupState& g = *state_;
    const std::size_t n = g.slots.size();
    const auto deadline = deadline_from_now();
    std::vector<int> missing;
    BlockedScope blocked(backend_->waits(), global_rank_);
    for (;;) {
      // Complete: every rank posted a call equal to the first one's. Checked before the abort
      // flag: once every rank arrived, all of them go on together, so nobody frees a buffer a
      // peer is about to read.
      if (g.arrive_seq == seq && g.arrived == n) return;
      for (std::size_t j = 0; j < n; ++j) {
        const Slot& s = g.slots[j];
        if (int(j) == rank() || s.posted != seq + 1 || s.desc == d) continue;
        // Name the two calls in rank order so every involved rank reports the same text.
        const bool me_first = rank() < int(j);
        const int a = me_first ? global_rank_ : g.ranks[j];
        const int b = me_first ? g.ranks[j] : global_rank_;
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("collective mismatch on group '{}' seq {}: rank {} called {}, rank "
                                "{} called {}",
                                g.name, seq, a, call_str(me_first ? d : s.desc), b,
                                call_str(me_first ? s.desc : d)));
      }
      missing.clear();
      for (std::size_t j = 0; j < n; ++j) {
        const Slot& s = g.slots[j];
        if (!(s.posted == seq + 1 && s.active)) missing.push_back(g.ranks[j]);
      }
      // Registered before the checks below, so a peer that finished or failed is reported as
      // such rather than as a cycle.
      const std::string cycle = blocked.block(
          fmt::format("{} seq {} on group '{}' ({} ranks)", call_str(d), seq, g.name, n),
          backend_->job().running());
      check_abort();
      for (std::size_t j = 0; j < n; ++j) {
        const Slot& s = g.slots[j];
        if (s.left != seq + 1) continue;
        throw PeerAborted(fmt::format("rank {} left {} seq {} on group '{}': {}", g.ranks[j],
                                      collective_name(d.op), seq, g.name, s.left_error));
      }
      for (int r : missing) {
        COMMTRACE_CHECK(!backend_->job().finished(r), ErrorCode::InvalidArgument,
                        "rank {} waits in {} seq {} on group '{}', but rank {} returned without "
                        "calling it",
                        global_rank_, call_str(d), seq, g.name, r);
      }
      COMMTRACE_CHECK(Clock::now() < deadline, ErrorCode::Aborted,
                      "rank {} timed out after {}s waiting for ranks {} at {} seq {} on group "
                      "'{}'",
                      global_rank_, backend_->timeout_s(), rank_set(missing), collective_name(d.op),
                      seq, g.name);
      if (!cycle.empty()) throw Error(ErrorCode::InvalidArgument, cycle);
      g.cv.wait_until(lock, deadline);
    }
  }

  std::shared_ptr<ThreadsBackend> backend_;
  std::shared_ptr<GroupState> state_;
  int global_rank_;
};

std::shared_ptr<Communicator> ThreadsBackend::make_communicator(const std::string& group,
                                                                const std::vector<int>& ranks,
                                                                int global_rank) {
  std::shared_ptr<GroupState> state;
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    auto& slot = groups_[group + shape_str(Shape(ranks.begin(), ranks.end()))];
    if (!slot) slot = std::make_shared<GroupState>(group, ranks);
    state = slot;
  }
  return std::make_shared<ThreadsCommunicator>(group, ranks, global_rank, shared_from_this(),
                                               std::move(state));
}

}  // namespace

std::shared_ptr<CommBackend> make_threads_backend(std::shared_ptr<Job> job, double timeout_s) {
  auto backend = std::make_shared<ThreadsBackend>(job, timeout_s);
  // The Job wakes the backend's waits on an abort or a finished rank; a weak link, so the Job
  // does not keep its backend alive.
  job->on_wake([weak = std::weak_ptr<ThreadsBackend>(backend)] {
    if (auto b = weak.lock()) b->wake_all();
  });
  return backend;
}

}  // namespace commtrace
