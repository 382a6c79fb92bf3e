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

#include "parallel/comm/comm.h"

namespace commtrace::threads {

using Clock = std::chrono::steady_clock;
// Longest a wait sleeps before it looks at the abort flag, finished ranks and its deadline again
// (state changes also notify the condvar, so most waits end sooner).
constexpr auto kWaitSlice = std::chrono::milliseconds(10);

// What a rank asks for at one sequence number; every rank of the group must ask for the same.
struct CallDesc {
  Collective op = Collective::Barrier;
  DType dtype = DType::F32;
  Shape shape;  // t for all_reduce and broadcast, in for the others; empty for barrier
  ReduceOp reduce = ReduceOp::None;
  int root = -1;

  bool operator==(const CallDesc& o) const {
    return op == o.op && dtype == o.dtype && shape == o.shape && reduce == o.reduce &&
           root == o.root;
  }
};

// "all_reduce(f32[4, 4], sum)", "broadcast(f32[4], root 0)", "barrier()".
inline std::string call_str(const CallDesc& d) {
  if (d.op == Collective::Barrier) return "barrier()";
  std::string s =
      fmt::format("{}({}{}", collective_name(d.op), dtype_name(d.dtype), shape_str(d.shape));
  if (d.reduce != ReduceOp::None) s += fmt::format(", {}", reduce_op_name(d.reduce));
  if (d.root >= 0) s += fmt::format(", root {}", d.root);
  return s + ")";
}

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
  std::condition_variable cv;    // notified on every change
  std::vector<Slot> slots;
  std::map<std::pair<int, int>, std::deque<Posted*>> mail;  // (src, dst) group ranks
};

inline std::string rank_set(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "{" + s + "}";
}

}  // namespace commtrace::threads
