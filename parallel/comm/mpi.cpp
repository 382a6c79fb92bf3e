// The "mpi" launcher and backend: one process per rank, started by mpirun; collectives and
// point-to-point ops on MPI, in one communicator per group (MPI_Comm_create_group, collective
// over the group's ranks only). Built when CMake finds MPI (COMMTRACE_HAVE_MPI).
//
// No hangs, no silent desyncs:
//   - every collective first exchanges its call description over the group (one small
//     MPI_Allgather), so ranks that issue different calls at the same point fail together with
//     the message the threads backend gives, naming both ranks and both calls;
//   - a watchdog thread per process turns a call that does not complete within the timeout into
//     an error: it prints the call, its group and this rank's last collectives (as PyTorch's
//     Flight Recorder dumps them), then aborts the job (MPI_Abort);
//   - a rank that throws prints its error and aborts the job: its peers would otherwise wait.
// Reductions use the threads backend's arithmetic, so both backends give the same bits: rank r
// receives chunk r of every rank's buffer (MPI_Alltoallv), reduces the chunks with the CPU
// kernels' reduce in rank order, and the reduced chunks are gathered (MPI_Allgatherv).
#include <mpi.h>

#include <array>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <thread>

#include "kernels/backend.h"
#include "parallel/comm/backend.h"
#include "parallel/comm/launch.h"

namespace commtrace {

namespace {

using Clock = std::chrono::steady_clock;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw Error(ErrorCode::Backend,
              fmt::format("mpi backend: {} failed: {}", what, std::string(text, std::size_t(len))));
}

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

// An element of `bytes` bytes as an MPI type (data moves as opaque elements; reductions are the
// CPU kernels'), so counts are in elements.
MPI_Datatype element_type(std::size_t bytes) {
  switch (bytes) {
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    default:
      return MPI_BYTE;
  }
}

// MPI counts are ints.
int count_of(std::int64_t n, const CallDesc& d) {
  COMMTRACE_CHECK(n <= INT_MAX, ErrorCode::Unsupported,
                  "mpi backend: {} moves {} elements, more than MPI's int counts allow ({})",
                  call_str(d), n, INT_MAX);
  return int(n);
}

// ---- the watchdog: a call that does not complete in time ends the job ----

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
  void loop() {
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
          rank_, timeout_s_, current_.str(), current_.seq, current_.group,
          fmt::join(*ranks_, ", "));
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

// ---- the backend and its communicators ----

class MpiBackend final : public CommBackend, public std::enable_shared_from_this<MpiBackend> {
 public:
  MpiBackend(std::shared_ptr<Job> job, double timeout_s)
      : CommBackend(std::move(job), "mpi"), watchdog_(timeout_s, MpiProcess::get().rank()) {}
  Watchdog& watchdog() { return watchdog_; }

 protected:
  std::shared_ptr<Communicator> make_communicator(const std::string& group,
                                                  const std::vector<int>& ranks,
                                                  int global_rank) override;

 private:
  Watchdog watchdog_;
};

// A call description as it travels between ranks: fixed size, zero-filled.
struct WireDesc {
  std::int32_t op = 0, dtype = 0, reduce = 0, root = 0, ndim = 0, pad = 0;
  std::int64_t shape[8] = {};
  std::uint64_t seq = 0;

  static WireDesc of(const CallDesc& d, std::uint64_t seq) {
    COMMTRACE_CHECK(d.shape.size() <= 8, ErrorCode::Unsupported,
                    "mpi backend: {} has more than 8 dims", call_str(d));
    WireDesc w;
    w.op = std::int32_t(d.op);
    w.dtype = std::int32_t(d.dtype);
    w.reduce = std::int32_t(d.reduce);
    w.root = d.root;
    w.ndim = std::int32_t(d.shape.size());
    for (std::size_t i = 0; i < d.shape.size(); ++i) w.shape[i] = d.shape[i];
    w.seq = seq;
    return w;
  }
  CallDesc desc() const {
    CallDesc d;
    d.op = Collective(op);
    d.dtype = DType(dtype);
    d.reduce = ReduceOp(reduce);
    d.root = root;
    d.shape.assign(shape, shape + std::clamp(ndim, 0, 8));
    return d;
  }
  bool operator==(const WireDesc& o) const { return std::memcmp(this, &o, sizeof(o)) == 0; }
};

class MpiCommunicator final : public Communicator, public CallCheck {
 public:
  MpiCommunicator(const std::string& group, const std::vector<int>& ranks, int global_rank,
                  std::shared_ptr<MpiBackend> backend, MPI_Comm comm)
      : Communicator(group, ranks, global_rank), backend_(std::move(backend)), comm_(comm) {}
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  const char* backend_name() const override { return "mpi"; }

  void same_call(const CallDesc& d, std::uint64_t seq) override {
    Watchdog::Scope scope(backend_->watchdog(), d, seq, group(), ranks());
    check_same_call(d, seq);
  }

  // Each op trades descriptions with its peer: a send's goes out tagged kSendDesc and meets the
  // peer's recv, whose description comes back tagged kRecvDesc (MPI keeps the order of messages
  // with one tag between two ranks, so the k-th send to a peer meets its k-th recv).
  void same_p2p(std::span<const CollectiveCall> calls) override {
    Watchdog::Scope scope(backend_->watchdog(), call_desc(calls[0]), calls[0].seq, group(),
                          ranks());
    std::vector<WireDesc> mine(calls.size()), theirs(calls.size());
    std::vector<MPI_Request> requests(2 * calls.size(), MPI_REQUEST_NULL);
    int err = MPI_SUCCESS;
    std::size_t posted = 0;
    for (; posted < calls.size() && err == MPI_SUCCESS; ++posted) {
      const CollectiveCall& c = calls[posted];
      const bool send = c.op == Collective::Send;
      mine[posted] = WireDesc::of(call_desc(c), c.seq);
      err = MPI_Isend(&mine[posted], int(sizeof(WireDesc)), MPI_BYTE, c.peer,
                      send ? kSendDesc : kRecvDesc, comm_, &requests[2 * posted]);
      if (err == MPI_SUCCESS) {
        err = MPI_Irecv(&theirs[posted], int(sizeof(WireDesc)), MPI_BYTE, c.peer,
                        send ? kRecvDesc : kSendDesc, comm_, &requests[2 * posted + 1]);
      }
    }
    if (err == MPI_SUCCESS) {
      err = MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    } else {  // finish what was posted, so no request outlives its buffer
      MPI_Waitall(int(2 * posted), requests.data(), MPI_STATUSES_IGNORE);
    }
    check_mpi(err, "MPI_Waitall of the send/recv descriptions");
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const bool send = calls[i].op == Collective::Send;
      const WireDesc& s = send ? mine[i] : theirs[i];
      const WireDesc& r = send ? theirs[i] : mine[i];
      if (s.dtype == r.dtype && s.ndim == r.ndim && s.seq == r.seq &&
          std::memcmp(s.shape, r.shape, sizeof s.shape) == 0) {
        continue;
      }
      const int me = ranks()[std::size_t(rank())], peer = ranks()[std::size_t(calls[i].peer)];
      const CallDesc sd = s.desc(), rd = r.desc();
      throw Error(
          ErrorCode::InvalidArgument,
          fmt::format("send/recv mismatch on group '{}': rank {} sends {}{} at seq {}, "
                      "rank {} receives {}{} at seq {}",
                      group(), send ? me : peer, dtype_name(sd.dtype), shape_str(sd.shape), s.seq,
                      send ? peer : me, dtype_name(rd.dtype), shape_str(rd.shape), r.seq));
    }
  }

 protected:
  bool supports_device(Device d) const override { return d == Device::CPU; }

  void run(const CollectiveCall& c) override {
    if (c.op == Collective::Send || c.op == Collective::Recv) return run_p2p({&c, 1});
    const Tensor* t = c.op == Collective::Barrier ? nullptr : (c.out ? c.out : c.in);
    const CallDesc d = call_desc(c);
    Watchdog::Scope scope(backend_->watchdog(), d, c.seq, group(), ranks());
    check_same_call(d, c.seq);
    switch (c.op) {
      case Collective::AllReduce:
        return all_reduce(d, *t, c.reduce);
      case Collective::AllGather: {
        const int n = count_of(c.in->numel(), d);
        const MPI_Datatype ty = element_type(dtype_size(d.dtype));
        return check_mpi(MPI_Allgather(data_of(*c.in), n, ty, data_of(*c.out), n, ty, comm_),
                         "MPI_Allgather");
      }
      case Collective::ReduceScatter:
        return reduce_scatter(d, *c.in, *c.out, c.reduce);
      case Collective::AllToAll: {
        const int n = count_of(c.in->numel() / size(), d);
        const MPI_Datatype ty = element_type(dtype_size(d.dtype));
        return check_mpi(MPI_Alltoall(data_of(*c.in), n, ty, data_of(*c.out), n, ty, comm_),
                         "MPI_Alltoall");
      }
      case Collective::Broadcast:
        return check_mpi(MPI_Bcast(data_of(*t), count_of(t->numel(), d),
                                   element_type(dtype_size(d.dtype)), c.root, comm_),
                         "MPI_Bcast");
      case Collective::Barrier:
        return check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
      case Collective::Send:
      case Collective::Recv:
        return;  // handled above
    }
  }

  // Sends and receives posted together (MPI_Isend / MPI_Irecv), then completed together; the
  // tag is the op's per-peer sequence number, so the k-th send to a peer meets its k-th recv.
  void run_p2p(std::span<const CollectiveCall> calls) override {
    std::vector<MPI_Request> requests(calls.size(), MPI_REQUEST_NULL);
    std::vector<MPI_Status> statuses(calls.size());
    // A send reads `in`, a recv writes `out`.
    auto buffer = [](const CollectiveCall& c) -> const Tensor& {
      return *(c.op == Collective::Send ? c.in : c.out);
    };
    Watchdog::Scope scope(backend_->watchdog(), call_desc(calls[0]), calls[0].seq, group(),
                          ranks());
    int err = MPI_SUCCESS;
    std::size_t posted = 0;
    for (; posted < calls.size() && err == MPI_SUCCESS; ++posted) {
      const CollectiveCall& c = calls[posted];
      const Tensor& t = buffer(c);
      const int n = count_of(t.numel(), call_desc(c));
      const MPI_Datatype ty = element_type(dtype_size(t.dtype()));
      const int tag = int(c.seq % kTagRange);
      err = c.op == Collective::Send
                ? MPI_Isend(data_of(t), n, ty, c.peer, tag, comm_, &requests[posted])
                : MPI_Irecv(data_of(t), n, ty, c.peer, tag, comm_, &requests[posted]);
    }
    if (err == MPI_SUCCESS) {
      err = MPI_Waitall(int(requests.size()), requests.data(), statuses.data());
    } else {
      // A failed post: finish what was posted, so no request outlives its buffer.
      MPI_Waitall(int(posted), requests.data(), MPI_STATUSES_IGNORE);
    }
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const CollectiveCall& c = calls[i];
      if (c.op != Collective::Recv) continue;
      const Tensor& t = buffer(c);
      int got = 0;
      MPI_Get_count(&statuses[i], element_type(dtype_size(t.dtype())), &got);
      const bool truncated = err != MPI_SUCCESS && statuses[i].MPI_ERROR == MPI_ERR_TRUNCATE;
      COMMTRACE_CHECK(!truncated && (err != MPI_SUCCESS || got == t.numel()),
                      ErrorCode::InvalidArgument,
                      "recv seq {} from rank {} on group '{}': rank {} sent {} elements, the "
                      "receiving {}{} holds {}",
                      c.seq, ranks()[std::size_t(c.peer)], group(), ranks()[std::size_t(c.peer)],
                      truncated ? "more" : std::to_string(got), dtype_name(t.dtype()),
                      shape_str(t.shape()), t.numel());
    }
    check_mpi(err, "MPI_Waitall of a send/recv batch");
  }

 private:
  static constexpr std::uint64_t kTagRange = 32768;  // MPI guarantees tags up to 32767
  // same_p2p's tags, on a communicator that a check owns (no data shares it).
  static constexpr int kSendDesc = 1, kRecvDesc = 2;

  static void* data_of(const Tensor& t) { return t.raw_data(dtype_size(t.dtype())); }

  // Every rank of the group must issue the same call at the same sequence number; all of them
  // see every description, so all fail with the same message.
  void check_same_call(const CallDesc& d, std::uint64_t seq) {
    const WireDesc mine = WireDesc::of(d, seq);
    std::vector<WireDesc> all(static_cast<std::size_t>(size()));
    check_mpi(MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine),
                            MPI_BYTE, comm_),
              "MPI_Allgather of the call descriptions");
    for (std::size_t j = 1; j < all.size(); ++j) {
      if (all[j] == all[0]) continue;
      const int a = ranks()[0], b = ranks()[j];
      const std::string ca = call_str(all[0].desc()), cb = call_str(all[j].desc());
      if (all[0].seq == all[j].seq) {
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("collective mismatch on group '{}' seq {}: rank {} called {}, "
                                "rank {} called {}",
                                group(), all[0].seq, a, ca, b, cb));
      }
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("collective mismatch on group '{}': rank {} called {} at seq {}, "
                              "rank {} called {} at seq {}",
                              group(), a, ca, all[0].seq, b, cb, all[j].seq));
    }
  }

  // Rank r owns elements [bound(r), bound(r + 1)), multiples of 64 as on the threads backend.
  std::int64_t bound(std::int64_t n, int r) const {
    const int w = size();
    return r >= w ? n : std::min(n, (n * r / w) / 64 * 64);
  }

  void all_reduce(const CallDesc& d, const Tensor& t, ReduceOp op) {
    const int w = size(), me = rank();
    const std::int64_t n = t.numel();
    const std::size_t es = dtype_size(t.dtype());
    const MPI_Datatype ty = element_type(es);
    const auto nw = static_cast<std::size_t>(w);
    std::vector<int> counts(nw), displs(nw), mine_counts(nw), mine_displs(nw);
    const int mine = count_of(bound(n, me + 1) - bound(n, me), d);
    for (int j = 0; j < w; ++j) {
      counts[std::size_t(j)] = count_of(bound(n, j + 1) - bound(n, j), d);
      displs[std::size_t(j)] = count_of(bound(n, j), d);
      mine_counts[std::size_t(j)] = mine;
      mine_displs[std::size_t(j)] = count_of(std::int64_t(j) * mine, d);
    }
    char* buf = static_cast<char*>(data_of(t));
    scratch_.resize(std::size_t(w) * std::size_t(mine) * es);
    check_mpi(MPI_Alltoallv(buf, counts.data(), displs.data(), ty, scratch_.data(),
                            mine_counts.data(), mine_displs.data(), ty, comm_),
              "MPI_Alltoallv of the all_reduce chunks");
    reduce_chunks(t.dtype(), op, w, mine, buf + std::size_t(bound(n, me)) * es);
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, ty, buf, counts.data(), displs.data(), ty, comm_),
              "MPI_Allgatherv of the reduced chunks");
  }

  void reduce_scatter(const CallDesc& d, const Tensor& in, const Tensor& out, ReduceOp op) {
    const int w = size();
    const int chunk = count_of(out.numel(), d);
    const std::size_t es = dtype_size(in.dtype());
    const MPI_Datatype ty = element_type(es);
    scratch_.resize(std::size_t(w) * std::size_t(chunk) * es);
    check_mpi(MPI_Alltoall(data_of(in), chunk, ty, scratch_.data(), chunk, ty, comm_),
              "MPI_Alltoall of the reduce_scatter chunks");
    reduce_chunks(in.dtype(), op, w, chunk, data_of(out));
  }

  // dst = the w chunks of `chunk` elements in scratch_, reduced in rank order.
  void reduce_chunks(DType dt, ReduceOp op, int w, std::int64_t chunk, void* dst) {
    std::vector<const void*> srcs(static_cast<std::size_t>(w));
    for (int j = 0; j < w; ++j) {
      srcs[std::size_t(j)] = scratch_.data() + std::size_t(j) * std::size_t(chunk) * dtype_size(dt);
    }
    kernels_for(Device::CPU).reduce(dt, op, srcs.data(), w, &dst, 1, 0, chunk);
  }

  std::shared_ptr<MpiBackend> backend_;
  MPI_Comm comm_;
  std::vector<char> scratch_;  // the chunks a reduction receives, reused across calls
};

std::shared_ptr<Communicator> MpiBackend::make_communicator(const std::string& group,
                                                            const std::vector<int>& ranks,
                                                            int global_rank) {
  MPI_Group world = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  const int incl = MPI_Group_incl(world, int(ranks.size()), ranks.data(), &members);
  MPI_Group_free(&world);
  check_mpi(incl, "MPI_Group_incl");
  // Groups made at the same time by different members are told apart by their tag.
  const int tag =
      int(std::hash<std::string>{}(group + shape_str(Shape(ranks.begin(), ranks.end()))) % 32768);
  MPI_Comm comm = MPI_COMM_NULL;
  const int made = MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &comm);
  MPI_Group_free(&members);
  check_mpi(made, "MPI_Comm_create_group");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_shared<MpiCommunicator>(group, ranks, global_rank, shared_from_this(), comm);
}

}  // namespace

// ---- the launcher side (backend.h) ----

namespace mpi {

Processes processes() {
  const MpiProcess& p = MpiProcess::get();
  return {p.rank(), p.size()};
}

std::shared_ptr<CommBackend> make_backend(std::shared_ptr<Job> job, double timeout_s) {
  return std::make_shared<MpiBackend>(std::move(job), timeout_s);
}

void run_rank(const std::shared_ptr<CommBackend>& backend,
              const std::function<void(RankContext&)>& fn) {
  const MpiProcess& p = MpiProcess::get();
  Job& job = backend->job();
  RankContext ctx(backend, p.rank());
  try {
    backend->start_rank(p.rank());
    fn(ctx);
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
  std::vector<int> world(std::size_t(p.size()));
  for (int i = 0; i < p.size(); ++i) world[std::size_t(i)] = i;
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

}  // namespace mpi

}  // namespace commtrace
