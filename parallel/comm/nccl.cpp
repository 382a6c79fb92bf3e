// The "nccl" backend: one rank per GPU, collectives and point-to-point ops on NCCL, queued on
// the rank's stream (the CUDA backend's, so they order with its kernels). Built when CMake finds
// CUDA and NCCL (COMMTRACE_HAVE_NCCL).
//
// World communicators:
//   - threads launcher (one process): ncclCommInitAll over the ranks, rank r on cuda:r, so N
//     ranks need N visible GPUs (NCCL refuses two ranks on one device; several ranks on one GPU
//     run on the threads backend instead);
//   - mpi launcher (one process per rank): rank 0's ncclGetUniqueId is broadcast over MPI and
//     each process joins with ncclCommInitRank on the GPU of its local rank.
// Groups are ncclCommSplit of the rank's world communicator: color the group's first rank, key
// the position in the group. A split is collective over the world, which holds because every
// rank makes its groups in the same order (a DeviceMesh makes one group per dim on every rank).
//
// No silent desyncs: before a call is queued, the ranks of the group compare its description
// (CallCheck) over a side channel, a threads backend for ranks in one process and an mpi backend
// for one process per rank, so ranks that call different collectives (or sends that do not fit
// their receives) fail naming both ranks and both calls, as on those backends. NCCL itself
// would wait, or move the wrong bytes.
// No hangs: after queueing a call the rank polls its stream until the work completed, the job
// aborted (another rank failed) or the timeout passed; the last two abort the communicator
// (ncclCommAbort), which ends its pending kernels, and fail the rank naming the call.
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "parallel/comm/backend.h"

namespace commtrace {

namespace {

using Clock = std::chrono::steady_clock;

// NCCL's functions, loaded on first use: commtrace maps NCCL's ~200 MB library only when the nccl
// backend is asked for (every other run stays small, as under a memory limit). The library this
// build found is tried first, then the loader's search path (libnccl.so.2).
// clang-format off
#define COMMTRACE_NCCL_FUNCTIONS(X)                                                         \
  X(ncclGetErrorString) X(ncclGetLastError) X(ncclCommDestroy) X(ncclCommInitAll)           \
  X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommSplit) X(ncclCommAbort)                  \
  X(ncclCommGetAsyncError) X(ncclAllReduce) X(ncclAllGather) X(ncclReduceScatter)           \
  X(ncclBroadcast) X(ncclGroupStart) X(ncclGroupEnd) X(ncclSend) X(ncclRecv)
// clang-format on

struct NcclApi {
#define COMMTRACE_NCCL_POINTER(f) decltype(&::f) f = nullptr;
  COMMTRACE_NCCL_FUNCTIONS(COMMTRACE_NCCL_POINTER)
#undef COMMTRACE_NCCL_POINTER
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    const LoadedLibrary lib({COMMTRACE_NCCL_LIBRARY, "libnccl.so.2"}, "nccl backend", "NCCL",
                            "install NCCL or put libnccl.so.2 on LD_LIBRARY_PATH");
    NcclApi a;
#define COMMTRACE_NCCL_LOAD(f) a.f = lib.symbol<decltype(a.f)>(#f);
    COMMTRACE_NCCL_FUNCTIONS(COMMTRACE_NCCL_LOAD)
#undef COMMTRACE_NCCL_LOAD
    return a;
  }();
  return api;
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  throw Error(ErrorCode::Backend,
              fmt::format("nccl backend: {} failed: {} ({})", what, nccl().ncclGetErrorString(r),
                          nccl().ncclGetLastError(nullptr)));
}

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I64:
      return ncclInt64;
  }
  throw Error(ErrorCode::Internal, "nccl backend: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::None:
      break;
  }
  throw Error(ErrorCode::InvalidArgument, "nccl backend: a reduction needs sum, avg or max");
}

const Kernels& cuda() { return kernels_for(Device::CUDA); }
cudaStream_t rank_stream() { return static_cast<cudaStream_t>(cuda().native_stream()); }
void* data_of(const Tensor& t) { return t.data_ptr(); }

class NcclBackend final : public CommBackend, public std::enable_shared_from_this<NcclBackend> {
 public:
  NcclBackend(std::shared_ptr<Job> job, double timeout_s, bool one_process_per_rank)
      : CommBackend(job, "nccl"),
        timeout_s_(timeout_s),
        per_process_(one_process_per_rank),
        checks_(make_checks(std::move(job), timeout_s, one_process_per_rank)),
        worlds_(std::size_t(CommBackend::job().world_size()), nullptr) {}
  ~NcclBackend() override {
    for (ncclComm_t c : worlds_) {
      if (c) (void)nccl().ncclCommDestroy(c);
    }
  }

  double timeout_s() const { return timeout_s_; }

  // The rank's GPU, before anything of the rank touches the device.
  void start_rank(int rank) override {
    const int n = cuda().device_count(), world = job().world_size();
    if (per_process_) {
      cuda().set_current_ordinal(local_rank() % n);
      return;
    }
    COMMTRACE_CHECK(world <= n, ErrorCode::Unsupported,
                    "nccl backend: {} ranks in one process need {} GPUs (one rank per GPU: NCCL "
                    "refuses two ranks on one device) and {} {} visible; run several ranks on "
                    "one GPU with --backend threads",
                    world, world, n, n == 1 ? "is" : "are");
    cuda().set_current_ordinal(rank);
  }

 protected:
  std::shared_ptr<Communicator> make_communicator(const std::string& group,
                                                  const std::vector<int>& ranks,
                                                  int global_rank) override;

 private:
  // The side channel of the calls' descriptions.
  static std::shared_ptr<CommBackend> make_checks(std::shared_ptr<Job> job, double timeout_s,
                                                  bool per_process) {
    if (!per_process) return make_threads_backend(std::move(job), timeout_s);
#ifdef COMMTRACE_HAVE_MPI
    return mpi::make_backend(std::move(job), timeout_s);
#else
    return nullptr;  // world() refuses one process per rank without MPI
#endif
  }

  // This process's index among the processes of its machine (its GPU).
  static int local_rank() {
#ifdef COMMTRACE_HAVE_MPI
    return mpi::local_rank();
#else
    return 0;
#endif
  }

  ncclComm_t world(int global_rank) {
    if (per_process_) {
      std::call_once(init_, [&] {
#ifdef COMMTRACE_HAVE_MPI
        ncclUniqueId id;
        std::string bytes(sizeof id.internal, '\0');
        if (mpi::processes().rank == 0) {
          check_nccl(nccl().ncclGetUniqueId(&id), "ncclGetUniqueId");
          bytes.assign(id.internal, sizeof id.internal);
        }
        bytes = mpi::broadcast_from_first(bytes);
        std::memcpy(id.internal, bytes.data(), sizeof id.internal);
        check_nccl(nccl().ncclCommInitRank(&worlds_[std::size_t(global_rank)], job().world_size(),
                                           id, global_rank),
                   "ncclCommInitRank");
#else
        throw Error(ErrorCode::Unsupported,
                    "nccl backend: one process per rank needs a build with MPI (libopenmpi-dev)");
#endif
      });
    } else {
      std::call_once(init_, [&] {
        std::vector<int> devices(worlds_.size());
        for (std::size_t r = 0; r < devices.size(); ++r) devices[r] = int(r);
        check_nccl(nccl().ncclCommInitAll(worlds_.data(), int(worlds_.size()), devices.data()),
                   "ncclCommInitAll");
      });
    }
    return worlds_[std::size_t(global_rank)];
  }

  double timeout_s_;
  bool per_process_;
  std::shared_ptr<CommBackend> checks_;
  std::once_flag init_;
  std::vector<ncclComm_t> worlds_;  // by global rank; this process's only, with one per process
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const std::string& group, const std::vector<int>& ranks, int global_rank,
                   std::shared_ptr<NcclBackend> backend, ncclComm_t comm,
                   std::shared_ptr<CallCheck> check)
      : Communicator(group, ranks, global_rank),
        backend_(std::move(backend)),
        comm_(comm),
        check_(std::move(check)) {}
  ~NcclCommunicator() override {
    if (scratch_) cuda().deallocate(scratch_, sizeof(float), cuda().current_ordinal());
    if (comm_) (void)nccl().ncclCommDestroy(comm_);
  }

  const char* backend_name() const override { return "nccl"; }

 protected:
  bool supports_device(Device d) const override { return d == Device::CUDA; }

  void run(const CollectiveCall& c) override {
    if (c.op == Collective::Send || c.op == Collective::Recv) return run_p2p({&c, 1});
    check_->same_call(call_desc(c), c.seq);
    const cudaStream_t s = rank_stream();
    const Tensor* t = c.out ? c.out : c.in;
    switch (c.op) {
      case Collective::AllReduce:
        check_nccl(nccl().ncclAllReduce(data_of(*t), data_of(*t), std::size_t(t->numel()),
                                        nccl_type(t->dtype()), nccl_op(c.reduce), comm(), s),
                   "ncclAllReduce");
        break;
      case Collective::AllGather:
        check_nccl(nccl().ncclAllGather(data_of(*c.in), data_of(*c.out), std::size_t(c.in->numel()),
                                        nccl_type(c.in->dtype()), comm(), s),
                   "ncclAllGather");
        break;
      case Collective::ReduceScatter:
        check_nccl(
            nccl().ncclReduceScatter(data_of(*c.in), data_of(*c.out), std::size_t(c.out->numel()),
                                     nccl_type(c.in->dtype()), nccl_op(c.reduce), comm(), s),
            "ncclReduceScatter");
        break;
      case Collective::AllToAll: {
        // Chunk j of in to group rank j, chunk i of out from group rank i: grouped send/recv.
        const std::size_t chunk = std::size_t(c.in->numel() / size());
        const std::size_t bytes = chunk * dtype_size(c.in->dtype());
        const ncclDataType_t ty = nccl_type(c.in->dtype());
        check_nccl(nccl().ncclGroupStart(), "ncclGroupStart");
        ncclResult_t r = ncclSuccess;
        for (int j = 0; j < size() && r == ncclSuccess; ++j) {
          r = nccl().ncclSend(static_cast<const char*>(data_of(*c.in)) + std::size_t(j) * bytes,
                              chunk, ty, j, comm(), s);
          if (r == ncclSuccess) {
            r = nccl().ncclRecv(static_cast<char*>(data_of(*c.out)) + std::size_t(j) * bytes, chunk,
                                ty, j, comm(), s);
          }
        }
        const ncclResult_t end = nccl().ncclGroupEnd();
        check_nccl(r, "ncclSend/ncclRecv of all_to_all");
        check_nccl(end, "ncclGroupEnd of all_to_all");
        break;
      }
      case Collective::Broadcast:
        check_nccl(nccl().ncclBroadcast(data_of(*t), data_of(*t), std::size_t(t->numel()),
                                        nccl_type(t->dtype()), c.root, comm(), s),
                   "ncclBroadcast");
        break;
      case Collective::Barrier:
        // PyTorch's barrier on NCCL: an all_reduce of one element.
        if (!scratch_) {
          scratch_ = cuda().allocate(sizeof(float), cuda().current_ordinal());
          cuda().fill(DType::F32, scratch_, 0.0, 1);
        }
        check_nccl(nccl().ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm(), s),
                   "ncclAllReduce of the barrier");
        break;
      case Collective::Send:
      case Collective::Recv:
        return;  // handled above
    }
    wait(c);
  }

  // The batch in one NCCL group: its sends and receives progress together.
  void run_p2p(std::span<const CollectiveCall> calls) override {
    check_->same_p2p(calls);
    const cudaStream_t s = rank_stream();
    check_nccl(nccl().ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (const CollectiveCall& c : calls) {
      if (r != ncclSuccess) break;
      const bool send = c.op == Collective::Send;
      const Tensor& t = *(send ? c.in : c.out);
      r = send ? nccl().ncclSend(data_of(t), std::size_t(t.numel()), nccl_type(t.dtype()), c.peer,
                                 comm(), s)
               : nccl().ncclRecv(data_of(t), std::size_t(t.numel()), nccl_type(t.dtype()), c.peer,
                                 comm(), s);
    }
    const ncclResult_t end = nccl().ncclGroupEnd();
    check_nccl(r, "ncclSend/ncclRecv");
    check_nccl(end, "ncclGroupEnd of a send/recv batch");
    wait(calls[0]);
  }

 private:
  ncclComm_t comm() const {
    COMMTRACE_CHECK(comm_ != nullptr, ErrorCode::Aborted,
                    "nccl backend: group '{}' was aborted by an earlier failure", group());
    return comm_;
  }

  // Until the queued call completed; the job's abort, an asynchronous NCCL error or the timeout
  // abort the communicator and fail the rank.
  void wait(const CollectiveCall& c) {
    const cudaStream_t s = rank_stream();
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(backend_->timeout_s()));
    for (;;) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) return;
      COMMTRACE_CHECK(q == cudaErrorNotReady, ErrorCode::Backend,
                      "nccl backend: {} seq {} on group '{}': {}", collective_name(c.op), c.seq,
                      group(), cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      (void)nccl().ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        check_nccl(async, "an asynchronous NCCL operation");
      }
      if (backend_->job().aborted()) {
        abort();
        throw PeerAborted(backend_->job().abort_message());
      }
      if (Clock::now() > deadline) {
        abort();
        throw Error(ErrorCode::Aborted,
                    fmt::format("nccl backend: {} seq {} on group '{}' (ranks {}) did not complete "
                                "within {} s: a rank stopped calling or called something else",
                                collective_name(c.op), c.seq, group(), fmt::join(ranks(), ", "),
                                backend_->timeout_s()));
      }
      // Spin briefly (a collective takes microseconds), then poll without burning the core.
      if (Clock::now() - t0 < std::chrono::milliseconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  void abort() {
    if (comm_) (void)nccl().ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  std::shared_ptr<NcclBackend> backend_;
  ncclComm_t comm_;
  std::shared_ptr<CallCheck> check_;  // the group's on the side channel
  void* scratch_ = nullptr;           // the barrier's element
};

std::shared_ptr<Communicator> NcclBackend::make_communicator(const std::string& group,
                                                             const std::vector<int>& ranks,
                                                             int global_rank) {
  const ncclComm_t w = world(global_rank);
  int key = 0;
  while (ranks[std::size_t(key)] != global_rank) ++key;
  // The check first: nothing is left to free when making it fails.
  std::shared_ptr<CallCheck> check = call_check_of(checks_->new_group(group, ranks, global_rank));
  ncclComm_t comm = nullptr;
  check_nccl(nccl().ncclCommSplit(w, ranks.front(), key, &comm, nullptr), "ncclCommSplit");
  return std::make_shared<NcclCommunicator>(group, ranks, global_rank, shared_from_this(), comm,
                                            std::move(check));
}

}  // namespace

std::shared_ptr<CommBackend> make_nccl_backend(std::shared_ptr<Job> job, double timeout_s,
                                               bool one_process_per_rank) {
  return std::make_shared<NcclBackend>(std::move(job), timeout_s, one_process_per_rank);
}

}  // namespace commtrace
