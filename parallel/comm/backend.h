// Internal to comm/: the two halves of a launch. A Job is the launcher's side: which ranks
// failed or finished, and the abort flag every wait checks. A CommBackend is who moves bytes: it
// makes the communicators of groups of ranks (cached per rank and group) and reads the Job to
// stop waiting when a peer failed or left. Launchers (threads today, one process per rank next)
// and backends (threads, fake; MPI and NCCL next) combine freely through launch(). Users see
// launch.h and comm.h only.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/launch.h"

namespace commtrace {

// Thrown by a wait that ends because another rank failed (the abort flag). launch() reports the
// original error in preference to these.
class PeerAborted : public Error {
 public:
  explicit PeerAborted(const std::string& msg) : Error(ErrorCode::Aborted, msg) {}
};

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

// What every rank of the group must agree on for `c`: the dtype and shape of `in` (of `out` for
// a recv), the reduce op and the root; no shape for barrier.
CallDesc call_desc(const CollectiveCall& c);

// Compares what the ranks of a group call before a backend that cannot tell issues it (NCCL
// would wait, or move the wrong bytes): ranks that differ fail with the message the threads and
// mpi backends give, naming both ranks and both calls. The threads and mpi communicators are
// checks for their group (call_check_of); their waits stop on the job's abort and at the
// timeout, as their collectives' do.
class CallCheck {
 public:
  virtual ~CallCheck() = default;
  // Every rank of the group passes an equal description at `seq`.
  virtual void same_call(const CallDesc& d, std::uint64_t seq) = 0;
  // Each send of the batch meets its peer's recv of the same dtype, shape and per-peer seq, and
  // each recv its peer's send (the buffers' descriptions only; no data moves).
  virtual void same_p2p(std::span<const CollectiveCall> calls) = 0;
};
// REQUIRES: `c` is a threads or mpi communicator (Internal error otherwise).
std::shared_ptr<CallCheck> call_check_of(const std::shared_ptr<Communicator>& c);

class Job {
 public:
  Job(int world_size, int launched);  // launched: how many ranks run
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  int world_size() const { return world_size_; }

  // A failure is recorded and, the first time, sets the abort flag with "rank <r> failed:
  // <message>" and wakes every waiter.
  void rank_failed(int rank, std::exception_ptr error);
  void rank_finished(int rank);

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // REQUIRES: aborted(). Immutable once the flag is set.
  const std::string& abort_message() const { return abort_message_; }
  bool finished(int rank) const {
    return finished_[std::size_t(rank)].load(std::memory_order_acquire);
  }
  // Ranks launched and not finished yet (a rank that is seen counted out is seen finished).
  int running() const { return running_.load(std::memory_order_acquire); }

  // Called on the abort and on every finish, so waits look at the state now (a backend
  // registers its waker here).
  void on_wake(std::function<void()> wake);

  // After every rank ended: throws the first original failure (else the first derived one) as an
  // Error with its code; returns when no rank failed.
  void rethrow_first_error() const;

 private:
  struct Failure {
    int rank;
    Error error;
    bool derived;  // a PeerAborted: the consequence of another rank's failure
  };
  void wake() const;

  int world_size_;
  std::unique_ptr<std::atomic<bool>[]> finished_;
  std::atomic<int> running_;
  std::atomic<bool> aborted_{false};
  std::string abort_message_;  // written once, before aborted_ is set
  mutable std::mutex mu_;      // guards failures_ and wake_
  std::vector<Failure> failures_;
  std::function<void()> wake_;
};

class CommBackend {
 public:
  CommBackend(std::shared_ptr<Job> job, const char* name) : job_(std::move(job)), name_(name) {}
  virtual ~CommBackend() = default;
  CommBackend(const CommBackend&) = delete;
  CommBackend& operator=(const CommBackend&) = delete;

  const char* name() const { return name_; }
  Job& job() const { return *job_; }

  // Called by the launcher on the rank's thread before the rank runs (a throw fails the rank):
  // where a backend binds the rank to its device.
  virtual void start_rank(int /*rank*/) {}

  // The communicator of (group, ranks) for global_rank: checked, made once per rank, cached.
  std::shared_ptr<Communicator> new_group(const std::string& group, const std::vector<int>& ranks,
                                          int global_rank);

 protected:
  virtual std::shared_ptr<Communicator> make_communicator(const std::string& group,
                                                          const std::vector<int>& ranks,
                                                          int global_rank) = 0;

 private:
  std::shared_ptr<Job> job_;
  const char* name_;
  std::mutex mu_;  // guards comms_
  std::map<std::pair<int, std::string>, std::weak_ptr<Communicator>> comms_;
};

// The backends. REQUIRES for threads: timeout_s > 0.
std::shared_ptr<CommBackend> make_threads_backend(std::shared_ptr<Job> job, double timeout_s);
std::shared_ptr<CommBackend> make_fake_backend(std::shared_ptr<Job> job);
// In builds with NCCL (COMMTRACE_HAVE_NCCL; nccl.cpp). REQUIRES: timeout_s > 0.
std::shared_ptr<CommBackend> make_nccl_backend(std::shared_ptr<Job> job, double timeout_s,
                                               bool one_process_per_rank);

// The one-process-per-rank launcher and its backend (mpi.cpp, mpi_process.cpp), in builds with MPI
// (COMMTRACE_HAVE_MPI). MPI is initialized on first use and finalized at exit.
namespace mpi {
Processes processes();
// REQUIRES: timeout_s > 0 (the watchdog's limit for one call).
std::shared_ptr<CommBackend> make_backend(std::shared_ptr<Job> job, double timeout_s);
// Runs this process's rank. A rank that throws with peers ends the job (MPI_Abort) after
// printing its error; alone, the error is failed in the Job like the threads launcher does. A
// rank that returns waits for its peers in a barrier that times out after 2 × timeout_s (not
// in MPI_Finalize, which has no timeout), so that a peer stuck in a collective reports first.
void run_rank(const std::shared_ptr<CommBackend>& backend,
              const std::function<void(RankContext&)>& fn, double timeout_s);
std::vector<std::string> gather_to_first(const std::string& mine, double timeout_s);
std::string broadcast_from_first(const std::string& value);
// This process's index among the job's processes on its machine (which GPU it takes).
int local_rank();
}  // namespace mpi

}  // namespace commtrace
