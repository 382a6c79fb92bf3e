// launch(): runs a function once per rank. Who starts the ranks (the launcher) is separate
// from who moves their bytes (the backend); both are picked by name from their tables.
//   launchers: "threads" — one thread per rank in this process (joins all, rethrows the first
//              error). "mpi" — one process per rank, started by mpirun: this process runs its
//              own rank; the world size must be the number of processes.
//   backends:  "threads" — real data through shared memory; never hangs: a rank that throws
//              aborts the others, mismatched collectives fail naming both ranks and calls,
//              waits time out. "fake" — records, moves no data, any world size and any subset
//              of ranks (pairs with meta tensors). "mpi" — MPI between processes (builds with
//              MPI); a mismatch, a throwing rank or a call past the timeout ends the job.
//              "nccl" — one rank per GPU (builds with CUDA and NCCL), under either launcher;
//              mismatches are caught before NCCL sees them, waits time out.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/comm.h"

namespace commtrace {

struct LaunchOptions {
  std::string launcher = "threads";
  std::string backend = "threads";
  double timeout_s = 60.0;  // threads, mpi: longest wait for the other ranks of a group
  // Ranks to run (default: all). The threads backend needs every rank; fake runs any subset
  // (collectives never wait for a peer).
  std::vector<int> ranks;
};

class CommBackend;  // comm/backend.h

// The launcher a backend runs under: "mpi" for the mpi backend, else "threads".
std::string launcher_for(const std::string& backend);

// The processes of a launch: this process's index and how many run. {0, 1} for the threads
// launcher (every rank is a thread of this process); for "mpi" the MPI world (MPI starts here).
struct Processes {
  int rank = 0;
  int size = 1;
};
Processes processes_of(const std::string& launcher);
// Every process's `mine`, in process order, on process 0 (empty elsewhere); {mine} for one
// process. The processes must all call it; one that does not within timeout_s ends the job.
std::vector<std::string> gather_to_first(const std::string& launcher, const std::string& mine,
                                         double timeout_s);
// Process 0's value on every process.
std::string broadcast_from_first(const std::string& launcher, const std::string& value);

// What a rank sees of its launch.
class RankContext {
 public:
  RankContext(std::shared_ptr<CommBackend> backend, int rank);
  int rank() const { return rank_; }
  int world_size() const;
  const char* backend() const;
  // The communicator of `ranks` (global ranks, in group order; must contain this rank) named
  // `group`. Every rank of the group must ask for the same (group, ranks).
  std::shared_ptr<Communicator> new_group(const std::string& group, const std::vector<int>& ranks);

 private:
  std::shared_ptr<CommBackend> backend_;
  int rank_;
};

// REQUIRES: world_size >= 1. Throws the first rank's error (an Error keeps its code; the other
// ranks see ErrorCode::Aborted naming the failing rank). A rank that returns while others wait
// for it in a collective or recv fails them with an error naming it.
void launch(int world_size, const std::function<void(RankContext&)>& fn,
            const LaunchOptions& options = {});

// The names the tables know, for help texts and errors.
std::vector<std::string> launcher_names();
std::vector<std::string> backend_names();

}  // namespace commtrace
