// Internal to comm/'s mpi backend and launcher (mpi.cpp, mpi_process.cpp): the process's MPI, the
// check of an MPI call's result, and the watchdog that ends a job whose call does not complete in
// time.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/backend.h"

namespace commtrace::mpi {

using Clock = std::chrono::steady_clock;

// Throws a Backend error naming `what` unless `code` is MPI_SUCCESS.
void check_mpi(int code, const char* what);

// The process's MPI, initialized on first use (MPI_THREAD_MULTIPLE: the watchdog aborts from its
// own thread while the rank's thread waits in MPI) and finalized at exit. Errors are returned,
// not fatal, so that they become commtrace errors naming the call.
class MpiProcess {
 public:
  static MpiProcess& get() {
    static MpiProcess p;
    return p;
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Prints `message` (one line) to stderr and ends every process of the job with exit code 2.
  [[noreturn]] void abort_job(const std::string& message) const {
    std::fprintf(stderr, "commtrace: error: %s\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    std::_Exit(2);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  MpiProcess() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      owns_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiProcess() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  bool owns_ = false;
  int rank_ = 0, size_ = 1;
};

// A call that does not complete in time ends the job (MPI_Abort), printing the call, its group and
// this rank's last calls (as PyTorch's Flight Recorder dumps them).
class Watchdog {
 public:
  Watchdog(double timeout_s, int rank) : timeout_s_(timeout_s), rank_(rank) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // One call in flight, from construction to destruction: it must not take longer than the
  // timeout. `label`, when given, names a call that is not a collective of the table.
  class Scope {
   public:
    Scope(Watchdog& w, const CallDesc& d, std::uint64_t seq, const std::string& group,
          const std::vector<int>& ranks, const char* label = nullptr)
        : w_(w) {
      std::lock_guard<std::mutex> lock(w_.mu_);
      w_.active_ = true;
      w_.current_ = Entry{d, label, seq, group, Clock::now(), {}};
      w_.ranks_ = &ranks;
    }
    ~Scope() {
      std::lock_guard<std::mutex> lock(w_.mu_);
      w_.active_ = false;
      w_.current_.end = Clock::now();
      w_.history_[w_.recorded_++ % kHistory] = std::move(w_.current_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Watchdog& w_;
  };

 private:
  struct Entry {
    CallDesc desc;
    const char* label = nullptr;
    std::uint64_t seq = 0;
    std::string group;
    Clock::time_point start, end;
    std::string str() const { return label ? label : call_str(desc); }
  };
  static constexpr std::size_t kHistory = 8;

  // Checks a few times per timeout; a late call ends the job with what this rank knows.
  void loop();

  const double timeout_s_;
  const int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool active_ = false;
  Entry current_;
  const std::vector<int>* ranks_ = nullptr;  // of the call in flight; valid while active_
  std::array<Entry, kHistory> history_;
  std::size_t recorded_ = 0;
  std::thread thread_;
};

}  // namespace commtrace::mpi
