// The mpi launcher's side (backend.h): one process per rank under mpirun; the ranks' traces
// gathered to the first, values broadcast from it; the check of MPI results and the watchdog
// (mpi_process.h).
#include <algorithm>
#include <climits>

#include "parallel/comm/launch.h"
#include "parallel/comm/mpi_process.h"

namespace commtrace::mpi {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw Error(ErrorCode::Backend,
              fmt::format("mpi backend: {} failed: {}", what, std::string(text, std::size_t(len))));
}

void Watchdog::loop() {
  const auto tick = std::chrono::duration<double>(std::min(1.0, timeout_s_ / 4));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, tick);
    if (stop_ || !active_) continue;
    const double waited = std::chrono::duration<double>(Clock::now() - current_.start).count();
    if (waited < timeout_s_) continue;
    std::string msg = fmt::format(
        "rank {} timed out after {}s in {} seq {} on group '{}' {{{}}}: a peer never joined "
        "(stalled, exited, or waiting in another call)",
        rank_, timeout_s_, current_.str(), current_.seq, current_.group, fmt::join(*ranks_, ", "));
    msg += fmt::format("\n  last collectives of rank {} (oldest first):", rank_);
    const std::size_t n = std::min(recorded_, kHistory);
    if (n == 0) msg += " none";
    for (std::size_t i = recorded_ - n; i < recorded_; ++i) {
      const Entry& e = history_[i % kHistory];
      msg += fmt::format("\n    seq {} {} on '{}' ({:.3f} ms)", e.seq, e.str(), e.group,
                         std::chrono::duration<double, std::milli>(e.end - e.start).count());
    }
    MpiProcess::get().abort_job(msg);
  }
}

Processes processes() {
  const MpiProcess& p = MpiProcess::get();
  return {p.rank(), p.size()};
}

namespace {

std::vector<int> world_ranks(const MpiProcess& p) {
  std::vector<int> world(std::size_t(p.size()));
  for (int i = 0; i < p.size(); ++i) world[std::size_t(i)] = i;
  return world;
}

// A rank that is done waits here for the others, watched like a collective but for twice the
// timeout, so that a peer stuck in a call (whose watchdog names the call) reports first.
// MPI_Finalize would wait for them too, but with no timeout, and Open MPI 4.1's mpirun can hang
// or crash when the peers fail meanwhile (3 runs in 30 of a rank that returns early while its
// peers time out).
void barrier_at_end(const MpiProcess& p, double timeout_s) {
  if (p.size() == 1) return;
  const std::vector<int> world = world_ranks(p);
  Watchdog watchdog(2 * timeout_s, p.rank());
  const Watchdog::Scope scope(watchdog, CallDesc{}, 0, "world", world,
                              "the barrier of the ranks that returned");
  check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier of the ranks that returned");
}

}  // namespace

void run_rank(const std::shared_ptr<CommBackend>& backend,
              const std::function<void(RankContext&)>& fn, double timeout_s) {
  const MpiProcess& p = MpiProcess::get();
  Job& job = backend->job();
  RankContext ctx(backend, p.rank());
  try {
    backend->start_rank(p.rank());
    fn(ctx);
    barrier_at_end(p, timeout_s);
  } catch (...) {
    // Alone, the error goes back to the caller; with peers waiting for this rank, the job ends.
    if (p.size() == 1) {
      job.rank_failed(p.rank(), std::current_exception());
    } else {
      std::string what = "unknown exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      p.abort_job(fmt::format("rank {} failed: {}", p.rank(), what));
    }
  }
  job.rank_finished(p.rank());
}

std::vector<std::string> gather_to_first(const std::string& mine, double timeout_s) {
  const MpiProcess& p = MpiProcess::get();
  if (p.size() == 1) return {mine};
  const std::vector<int> world = world_ranks(p);
  Watchdog watchdog(timeout_s, p.rank());
  const Watchdog::Scope scope(watchdog, CallDesc{}, 0, "world", world,
                              "the gather of every rank's trace to rank 0");
  COMMTRACE_CHECK(mine.size() <= std::size_t(INT_MAX), ErrorCode::Unsupported,
                  "mpi: {} bytes to gather from rank {}, more than MPI's int counts allow",
                  mine.size(), p.rank());
  const int len = int(mine.size());
  std::vector<int> lens(std::size_t(p.size())), displs(std::size_t(p.size()));
  check_mpi(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD),
            "MPI_Gather of the trace sizes");
  std::string all_bytes;
  if (p.rank() == 0) {
    std::int64_t total = 0;
    for (int i = 0; i < p.size(); ++i) {
      COMMTRACE_CHECK(total <= INT_MAX, ErrorCode::Unsupported,
                      "mpi: the gathered traces exceed MPI's int counts ({} bytes)", total);
      displs[std::size_t(i)] = int(total);
      total += lens[std::size_t(i)];
    }
    all_bytes.resize(std::size_t(total));
  }
  check_mpi(MPI_Gatherv(mine.data(), len, MPI_CHAR, all_bytes.data(), lens.data(), displs.data(),
                        MPI_CHAR, 0, MPI_COMM_WORLD),
            "MPI_Gatherv of the traces");
  std::vector<std::string> out;
  if (p.rank() == 0) {
    for (int i = 0; i < p.size(); ++i) {
      out.push_back(
          all_bytes.substr(std::size_t(displs[std::size_t(i)]), std::size_t(lens[std::size_t(i)])));
    }
  }
  return out;
}

int local_rank() {
  static const int local = [] {
    MpiProcess::get();
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    int r = 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    return r;
  }();
  return local;
}

std::string broadcast_from_first(const std::string& value) {
  const MpiProcess& p = MpiProcess::get();
  if (p.size() == 1) return value;
  int len = int(value.size());
  check_mpi(MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast of a length");
  std::string out = p.rank() == 0 ? value : std::string(std::size_t(len), '\0');
  check_mpi(MPI_Bcast(out.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  return out;
}

}  // namespace commtrace::mpi
