// The shared state of one group of the threads backend (threads.cpp): the rendezvous slots of
// its collectives and the mailboxes of its point-to-point sends, guarded by one mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "parallel/comm/backend.h"

namespace commtrace::threads {

using Clock = std::chrono::steady_clock;

struct Slot {
  std::uint64_t posted = 0;  // seq + 1 of the call last posted; 0: none yet
  bool active = false;       // inside that call: buffers valid, counts towards arrival
  std::uint64_t done = 0;    // seq + 1 of the last call whose data step this rank finished
  CallDesc desc;             // kept after a failed call so that peers still see a mismatch
  std::uint64_t left = 0;    // seq + 1 of a call this rank left with an error (timeout, ...)
  std::string left_error;    // that error, for the peers still waiting in the call
  const void* in = nullptr;
  void* out = nullptr;
};

// A send waiting in a mailbox: the sender's buffer, valid until the receiver marks it taken
// (the sender waits for that, and withdraws what is still queued when it fails).
struct Posted {
  std::uint64_t seq = 0;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  std::size_t bytes = 0;
  enum class State { Queued, Copying, Taken } state = State::Queued;
  std::string error;  // set by the receiver when the shapes do not match
};

struct GroupState {
  GroupState(std::string n, std::vector<int> r)
      : name(std::move(n)), ranks(std::move(r)), slots(ranks.size()) {}
  const std::string name;
  const std::vector<int> ranks;  // global ranks in group order
  std::mutex mu;                 // guards everything below
  // Notified when a collective's group becomes complete (all arrived, all done), when a rank
  // leaves a call with an error, on mailbox changes, and by the Job (abort, a finished rank).
  // Waits sleep until then or their deadline: no polling, and one wake-up per waiter and phase.
  std::condition_variable cv;
  std::vector<Slot> slots;
  // Ranks that arrived at (and finished the data step of) collective `seq`. One collective is in
  // flight per group: nobody arrives at seq + 1 before everyone left seq.
  std::uint64_t arrive_seq = ~std::uint64_t(0), done_seq = ~std::uint64_t(0);
  std::size_t arrived = 0, done = 0;
  std::size_t first = 0;  // the group rank that arrived first at arrive_seq
  std::map<std::pair<int, int>, std::deque<Posted*>> mail;  // (src, dst) group ranks
};

// Which ranks of the job are blocked in a wait, and on what. When every running rank is
// blocked no wait can end (each waits for a peer that waits elsewhere: ranks 0 and 3 in 'dp'
// while 1 and 2 wait in 'tp'), so the wait that completes the picture reports the cycle at
// once instead of at the timeout. A rank counts as blocked from block() until it leaves its
// wait or a peer that completes its call unblocks it. Lock order: a group's mutex, then this.
class WaitGraph {
 public:
  explicit WaitGraph(int world_size) : what_(std::size_t(world_size)) {}

  // Marks `rank` blocked on `what` ("all_reduce seq 3 on group 'tp' {0, 1}"). Returns the desync
  // message when all `running` ranks are blocked, else "".
  std::string block(int rank, const std::string& what, int running) {
    const std::lock_guard<std::mutex> lock(mu_);
    std::string& w = what_[std::size_t(rank)];
    if (w.empty()) ++blocked_;
    w = what;
    if (blocked_ < running) return {};
    std::string msg = fmt::format(
        "desync: every running rank waits for a peer that waits elsewhere ({} rank{}):", blocked_,
        blocked_ == 1 ? "" : "s");
    int listed = 0;
    for (std::size_t r = 0; r < what_.size(); ++r) {
      if (what_[r].empty()) continue;
      if (listed++ == kListed) {
        msg += fmt::format("; and {} more", blocked_ - kListed);
        break;
      }
      msg += fmt::format("{} rank {} in {}", listed == 1 ? "" : ";", r, what_[r]);
    }
    return msg;
  }
  void unblock(int rank) {
    const std::lock_guard<std::mutex> lock(mu_);
    std::string& w = what_[std::size_t(rank)];
    if (w.empty()) return;
    w.clear();
    --blocked_;
  }

 private:
  static constexpr int kListed = 8;  // ranks named in the message
  std::mutex mu_;
  std::vector<std::string> what_;  // per global rank; empty: not blocked
  int blocked_ = 0;
};

// Unblocks a rank when its wait ends, however it ends.
class BlockedScope {
 public:
  BlockedScope(WaitGraph& g, int rank) : graph_(g), rank_(rank) {}
  ~BlockedScope() { graph_.unblock(rank_); }
  BlockedScope(const BlockedScope&) = delete;
  BlockedScope& operator=(const BlockedScope&) = delete;
  // Marks the rank blocked on `what`; the desync message when every running rank is blocked.
  std::string block(const std::string& what, int running) {
    return graph_.block(rank_, what, running);
  }

 private:
  WaitGraph& graph_;
  int rank_;
};

inline std::string rank_set(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "{" + s + "}";
}

}  // namespace commtrace::threads
