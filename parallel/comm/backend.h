// Internal to parallel/: the World behind launch() that the communicator backends share (rank
// failures, the abort flag, finished ranks, the communicator cache) and the backend factories.
// Not a public header: users see launch.h and comm.h only.
#pragma once

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/comm.h"

namespace commtrace {

// Thrown by a wait that ends because another rank failed (the abort flag). launch() reports the
// original error in preference to these.
class PeerAborted : public Error {
 public:
  explicit PeerAborted(const std::string& msg) : Error(ErrorCode::Aborted, msg) {}
};

class World : public std::enable_shared_from_this<World> {
 public:
  World(int world_size, std::string backend);
  virtual ~World() = default;
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int world_size() const { return world_size_; }
  const std::string& backend() const { return backend_; }

  // The communicator of (group, ranks) for global_rank: made once per rank, then cached.
  std::shared_ptr<Communicator> new_group(const std::string& group, const std::vector<int>& ranks,
                                          int global_rank);

  // launch() reports each rank's end. A failure is recorded and, the first time, sets the abort
  // flag with "rank <r> failed: <message>" and wakes every waiter.
  void rank_failed(int rank, std::exception_ptr error);
  void rank_finished(int rank);

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // REQUIRES: aborted(). Immutable once the flag is set.
  const std::string& abort_message() const { return abort_message_; }
  bool finished(int rank) const {
    return finished_[std::size_t(rank)].load(std::memory_order_acquire);
  }

  // After every rank ended: throws the first original failure (else the first derived one) as an
  // Error with its code; returns when no rank failed.
  void rethrow_first_error() const;

 protected:
  virtual std::shared_ptr<Communicator> make_communicator(const std::string& group,
                                                          const std::vector<int>& ranks,
                                                          int global_rank) = 0;
  // Wakes every wait of the backend so it sees the abort flag or a finished rank now.
  virtual void wake_all() {}

 private:
  struct Failure {
    int rank;
    Error error;
    bool derived;  // a PeerAborted: the consequence of another rank's failure
  };

  int world_size_;
  std::string backend_;
  std::unique_ptr<std::atomic<bool>[]> finished_;
  std::atomic<bool> aborted_{false};
  std::string abort_message_;  // written once, before aborted_ is set

  mutable std::mutex mu_;  // guards failures_ and comms_
  std::vector<Failure> failures_;
  std::map<std::pair<int, std::string>, std::weak_ptr<Communicator>> comms_;
};

// REQUIRES: world_size >= 1, timeout_s > 0.
std::shared_ptr<World> make_threads_world(int world_size, double timeout_s);
std::shared_ptr<World> make_fake_world(int world_size);

}  // namespace commtrace
