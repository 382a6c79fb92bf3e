// The "mpi" launcher and backend: one process per rank, started by mpirun; collectives and
// point-to-point ops on MPI, in one communicator per group (MPI_Comm_create_group, collective
// over the group's ranks only). Built when CMake finds MPI (COMMTRACE_HAVE_MPI); the launcher's
// side and the watchdog are in mpi_process.cpp.
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
#include <algorithm>
#include <climits>
#include <cstring>

#include "kernels/backend.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mpi_process.h"

namespace commtrace {

namespace {

using mpi::check_mpi;
using mpi::MpiProcess;
using mpi::Watchdog;

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

// The launcher's side of the backend (the rest of namespace mpi is in mpi_process.cpp).
std::shared_ptr<CommBackend> mpi::make_backend(std::shared_ptr<Job> job, double timeout_s) {
  return std::make_shared<MpiBackend>(std::move(job), timeout_s);
}

}  // namespace commtrace
