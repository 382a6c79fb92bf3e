// launch(): runs a function once per rank, each rank on its own thread, with a backend that
// makes communicators for groups of ranks. Joins every thread and rethrows the first error.
// Backends: "threads" (real data through shared memory; never hangs: a rank that throws aborts
// the others, mismatched collectives fail naming both ranks and calls, waits time out) and
// "fake" (records, moves no data, any world size; pairs with meta tensors).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/comm.h"

namespace commtrace {

struct LaunchOptions {
  std::string backend = "threads";  // "threads" or "fake"
  double timeout_s = 60.0;          // threads: longest wait for the other ranks of a group
  // Ranks to run (default: all). With "threads" every rank must run; with "fake" any subset
  // may (collectives never wait for a peer).
  std::vector<int> ranks;
};

class World;  // the state shared by the ranks of one launch (backend-specific)

// What a rank sees of its launch.
class RankContext {
 public:
  RankContext(std::shared_ptr<World> world, int rank);
  int rank() const { return rank_; }
  int world_size() const;
  const std::string& backend() const;
  // The communicator of `ranks` (global ranks, in group order; must contain this rank) named
  // `group`. Every rank of the group must ask for the same (group, ranks).
  std::shared_ptr<Communicator> new_group(const std::string& group, const std::vector<int>& ranks);

 private:
  std::shared_ptr<World> world_;
  int rank_;
};

// REQUIRES: world_size >= 1. Throws the first rank's error (an Error keeps its code; the other
// ranks see ErrorCode::Aborted naming the failing rank). A rank that returns while others wait
// for it in a collective or recv fails them with an error naming it.
void launch(int world_size, const std::function<void(RankContext&)>& fn,
            const LaunchOptions& options = {});

}  // namespace commtrace
