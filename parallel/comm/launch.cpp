// The launch tables and the Job: launchers start ranks, backends make communicators, the Job
// holds the fault state both read. The threads backend's waiting and data movement live in
// threads.cpp, the fake backend in fake.cpp.
#include "parallel/comm/launch.h"

#include <cstdlib>
#include <set>
#include <span>
#include <thread>

#include "parallel/comm/backend.h"

namespace commtrace {

namespace {

using RankFn = std::function<void(RankContext&)>;

template <class Table>
std::vector<std::string> names_of(const Table& table) {
  std::vector<std::string> out;
  for (const auto& e : table) out.emplace_back(e.name);
  return out;
}

// One thread per rank of this process. A rank that throws is failed in the Job (which aborts
// the others); a thread that cannot start fails its rank the same way.
void run_threads(const std::shared_ptr<CommBackend>& backend, std::span<const int> ranks,
                 const RankFn& fn, double /*timeout_s: the backend's*/) {
  Job& job = backend->job();
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (int r : ranks) {
    try {
      threads.emplace_back([&backend, &job, &fn, r] {
        RankContext ctx(backend, r);
        try {
          backend->start_rank(r);
          fn(ctx);
        } catch (...) {
          job.rank_failed(r, std::current_exception());
        }
        job.rank_finished(r);
      });
    } catch (...) {
      job.rank_failed(r, std::current_exception());
      job.rank_finished(r);
    }
  }
  for (std::thread& t : threads) t.join();
}

// A launcher with several processes has all three process functions; one that runs every rank
// in this process has none (one process: a gather or broadcast is the value itself).
struct LauncherEntry {
  const char* name;
  void (*run)(const std::shared_ptr<CommBackend>&, std::span<const int>, const RankFn&,
              double timeout_s);
  Processes (*processes)();
  std::vector<std::string> (*gather)(const std::string& mine, double timeout_s);
  std::string (*broadcast)(const std::string& value);
};
constexpr LauncherEntry kLaunchers[] = {
    {"threads", run_threads, nullptr, nullptr, nullptr},
#ifdef COMMTRACE_HAVE_MPI
    {"mpi",
     [](const std::shared_ptr<CommBackend>& b, std::span<const int>, const RankFn& fn,
        double timeout_s) { mpi::run_rank(b, fn, timeout_s); },
     mpi::processes, mpi::gather_to_first, mpi::broadcast_from_first},
#endif
};

const LauncherEntry& find_launcher(const std::string& name) {
  for (const LauncherEntry& e : kLaunchers) {
    if (name == e.name) return e;
  }
  throw Error(ErrorCode::Unsupported,
              fmt::format("unknown launcher '{}' (this build has {}{})", name,
                          fmt::join(names_of(kLaunchers), ", "),
                          name == "mpi" ? "; mpi needs a build with MPI: libopenmpi-dev" : ""));
}

struct BackendEntry {
  const char* name;
  bool needs_all_ranks;  // collectives wait for every rank of a group
  std::shared_ptr<CommBackend> (*make)(std::shared_ptr<Job>, const LaunchOptions&);
};
const BackendEntry kBackends[] = {
    {"threads", true,
     [](std::shared_ptr<Job> job, const LaunchOptions& o) {
       COMMTRACE_CHECK(o.timeout_s > 0, ErrorCode::InvalidArgument,
                       "launch: timeout_s {} must be > 0", o.timeout_s);
       return make_threads_backend(std::move(job), o.timeout_s);
     }},
    {"fake", false,
     [](std::shared_ptr<Job> job, const LaunchOptions&) {
       return make_fake_backend(std::move(job));
     }},
#ifdef COMMTRACE_HAVE_MPI
    {"mpi", true,
     [](std::shared_ptr<Job> job, const LaunchOptions& o) {
       COMMTRACE_CHECK(o.timeout_s > 0, ErrorCode::InvalidArgument,
                       "launch: timeout_s {} must be > 0", o.timeout_s);
       return mpi::make_backend(std::move(job), o.timeout_s);
     }},
#endif
#ifdef COMMTRACE_HAVE_NCCL
    {"nccl", true,
     [](std::shared_ptr<Job> job, const LaunchOptions& o) {
       COMMTRACE_CHECK(o.timeout_s > 0, ErrorCode::InvalidArgument,
                       "launch: timeout_s {} must be > 0", o.timeout_s);
       return make_nccl_backend(std::move(job), o.timeout_s, o.launcher == "mpi");
     }},
#endif
};

// Why a backend this build lacks is missing, for the error.
std::string missing_backend_hint(const std::string& name) {
  if (name == "mpi") return "; mpi needs a build with MPI: libopenmpi-dev";
  if (name == "nccl") return "; nccl needs a build with CUDA and NCCL (nvcc, libnccl)";
  return "";
}

// An MPI launcher (mpirun, srun) started this process: it set its environment.
bool started_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var)) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> launcher_names() { return names_of(kLaunchers); }
std::vector<std::string> backend_names() { return names_of(kBackends); }

std::string launcher_for(const std::string& backend) {
  if (backend == "mpi") return "mpi";
  // NCCL runs one process per GPU under mpirun, or every rank of one process on its own GPU.
  if (backend == "nccl" && started_by_mpi()) return "mpi";
  return "threads";
}

Processes processes_of(const std::string& launcher) {
  const LauncherEntry& e = find_launcher(launcher);
  return e.processes ? e.processes() : Processes{};
}

std::vector<std::string> gather_to_first(const std::string& launcher, const std::string& mine,
                                         double timeout_s) {
  const LauncherEntry& e = find_launcher(launcher);
  return e.gather ? e.gather(mine, timeout_s) : std::vector<std::string>{mine};
}

std::string broadcast_from_first(const std::string& launcher, const std::string& value) {
  const LauncherEntry& e = find_launcher(launcher);
  return e.broadcast ? e.broadcast(value) : value;
}

// ---------------------------------------------------------------- Job

Job::Job(int world_size, int launched)
    : world_size_(world_size),
      finished_(new std::atomic<bool>[std::size_t(world_size)]),
      running_(launched) {
  for (int r = 0; r < world_size; ++r) finished_[std::size_t(r)].store(false);
}

void Job::on_wake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
}

void Job::wake() const {
  std::function<void()> w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    w = wake_;
  }
  if (w) w();
}

void Job::rank_failed(int rank, std::exception_ptr error) {
  Failure f{rank, Error(ErrorCode::Internal, ""), false};
  try {
    std::rethrow_exception(error);
  } catch (const PeerAborted& e) {
    f.error = e;
    f.derived = true;
  } catch (const Error& e) {
    f.error = e;
  } catch (const std::exception& e) {
    f.error = Error(ErrorCode::Internal, fmt::format("rank {} threw: {}", rank, e.what()));
  } catch (...) {
    f.error = Error(ErrorCode::Internal, fmt::format("rank {} threw an unknown exception", rank));
  }
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.load(std::memory_order_relaxed)) {
      abort_message_ = fmt::format("rank {} failed: {}", rank, f.error.what());
      aborted_.store(true, std::memory_order_release);
      first = true;
    }
    failures_.push_back(std::move(f));
  }
  if (first) wake();
}

void Job::rank_finished(int rank) {
  finished_[std::size_t(rank)].store(true, std::memory_order_release);
  running_.fetch_sub(1, std::memory_order_acq_rel);
  wake();
}

void Job::rethrow_first_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Failure& f : failures_) {
    if (!f.derived) throw f.error;
  }
  if (!failures_.empty()) throw failures_.front().error;
}

// ---------------------------------------------------------------- backend and rank

std::shared_ptr<Communicator> CommBackend::new_group(const std::string& group,
                                                     const std::vector<int>& ranks,
                                                     int global_rank) {
  const int world = job_->world_size();
  COMMTRACE_CHECK(!ranks.empty(), ErrorCode::InvalidArgument,
                  "new_group '{}': a group needs at least one rank", group);
  std::set<int> seen;
  for (int r : ranks) {
    COMMTRACE_CHECK(r >= 0 && r < world, ErrorCode::InvalidArgument,
                    "new_group '{}': rank {} out of range [0, {})", group, r, world);
    COMMTRACE_CHECK(seen.insert(r).second, ErrorCode::InvalidArgument,
                    "new_group '{}': rank {} appears twice in {}", group, r,
                    shape_str(Shape(ranks.begin(), ranks.end())));
  }
  COMMTRACE_CHECK(seen.count(global_rank) == 1, ErrorCode::InvalidArgument,
                  "new_group '{}': ranks {} do not contain this rank {}", group,
                  shape_str(Shape(ranks.begin(), ranks.end())), global_rank);
  const auto key =
      std::make_pair(global_rank, group + shape_str(Shape(ranks.begin(), ranks.end())));
  std::lock_guard<std::mutex> lock(mu_);
  if (auto existing = comms_[key].lock()) return existing;
  auto comm = make_communicator(group, ranks, global_rank);
  comms_[key] = comm;
  return comm;
}

RankContext::RankContext(std::shared_ptr<CommBackend> backend, int rank)
    : backend_(std::move(backend)), rank_(rank) {}

int RankContext::world_size() const { return backend_->job().world_size(); }

const char* RankContext::backend() const { return backend_->name(); }

CallDesc call_desc(const CollectiveCall& c) {
  CallDesc d{c.op, DType::F32, {}, c.reduce, c.root};
  if (const Tensor* t = c.in ? c.in : c.out) {
    d.dtype = t->dtype();
    d.shape = t->shape();
  }
  return d;
}

std::shared_ptr<CallCheck> call_check_of(const std::shared_ptr<Communicator>& c) {
  auto check = std::dynamic_pointer_cast<CallCheck>(c);
  COMMTRACE_CHECK(check != nullptr, ErrorCode::Internal,
                  "the {} backend's communicators cannot check calls", c->backend_name());
  return check;
}

std::shared_ptr<Communicator> RankContext::new_group(const std::string& group,
                                                     const std::vector<int>& ranks) {
  return backend_->new_group(group, ranks, rank_);
}

void launch(int world_size, const std::function<void(RankContext&)>& fn,
            const LaunchOptions& options) {
  COMMTRACE_CHECK(world_size >= 1, ErrorCode::InvalidArgument, "launch: world_size {} must be >= 1",
                  world_size);
  COMMTRACE_CHECK(bool(fn), ErrorCode::InvalidArgument, "launch: no function to run");
  const LauncherEntry* launcher = &find_launcher(options.launcher);
  const BackendEntry* backend = nullptr;
  for (const BackendEntry& e : kBackends) {
    if (options.backend == e.name) backend = &e;
  }
  COMMTRACE_CHECK(backend != nullptr, ErrorCode::Unsupported,
                  "launch: unknown backend '{}' (this build has {}{})", options.backend,
                  fmt::join(backend_names(), ", "), missing_backend_hint(options.backend));
  const bool nccl_fits = std::string(backend->name) == "nccl";  // either launcher
  COMMTRACE_CHECK(
      nccl_fits || launcher_for(backend->name) == launcher->name, ErrorCode::InvalidArgument,
      "launch: the {} backend does not run under the {} launcher", backend->name, launcher->name);
  if (launcher->processes) {
    const Processes p = launcher->processes();
    COMMTRACE_CHECK(p.size == world_size, ErrorCode::InvalidArgument,
                    "the world size is {} but {} process{} started (one rank per process: "
                    "mpirun -np {})",
                    world_size, p.size, p.size == 1 ? " was" : "es were", world_size);
  }
  std::vector<int> ranks = options.ranks;
  if (ranks.empty()) {
    for (int r = 0; r < world_size; ++r) ranks.push_back(r);
  }
  std::set<int> seen;
  for (int r : ranks) {
    COMMTRACE_CHECK(r >= 0 && r < world_size, ErrorCode::InvalidArgument,
                    "launch: rank {} out of range [0, {})", r, world_size);
    COMMTRACE_CHECK(seen.insert(r).second, ErrorCode::InvalidArgument,
                    "launch: rank {} listed twice", r);
  }
  COMMTRACE_CHECK(!backend->needs_all_ranks || int(ranks.size()) == world_size,
                  ErrorCode::InvalidArgument,
                  "launch: the {} backend runs every rank; {} of {} requested", backend->name,
                  ranks.size(), world_size);
  // One process per rank: this process runs its own.
  const int launched = launcher->processes ? 1 : int(ranks.size());
  auto job = std::make_shared<Job>(world_size, launched);
  launcher->run(backend->make(job, options), ranks, fn, options.timeout_s);
  job->rethrow_first_error();
}

}  // namespace commtrace
