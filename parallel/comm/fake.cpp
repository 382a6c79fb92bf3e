// The "fake" backend: collectives are validated and recorded by the Communicator front end like
// on any backend, then move no data and never wait for a peer: an in-place output keeps its
// contents, a separate output and a received buffer are zeroed (deterministic values, never
// uninitialized memory). Any world size, any subset of ranks, meta or cpu tensors: it is how a
// trace of a large run is made on one machine. It is not a simulator: no timing model, no values.
#include "kernels/backend.h"
#include "parallel/comm/backend.h"

namespace commtrace {

namespace {

void zero(const Tensor& t) {
  if (!t.defined() || t.is_meta()) return;
  kernels_for(t.device()).fill(t.dtype(), t.data_ptr(), 0.0, t.numel());
}

class FakeCommunicator final : public Communicator {
 public:
  using Communicator::Communicator;
  const char* backend_name() const override { return "fake"; }

 protected:
  void run(const CollectiveCall& c) override {
    if (c.out && c.out != c.in) zero(*c.out);
  }
  void run_p2p(std::span<const CollectiveCall> calls) override {
    for (const CollectiveCall& c : calls) {
      if (c.op == Collective::Recv && c.out) zero(*c.out);
    }
  }
};

class FakeBackend final : public CommBackend {
 public:
  explicit FakeBackend(std::shared_ptr<Job> job) : CommBackend(std::move(job), "fake") {}

 protected:
  std::shared_ptr<Communicator> make_communicator(const std::string& group,
                                                  const std::vector<int>& ranks,
                                                  int global_rank) override {
    return std::make_shared<FakeCommunicator>(group, ranks, global_rank);
  }
};

}  // namespace

std::shared_ptr<CommBackend> make_fake_backend(std::shared_ptr<Job> job) {
  return std::make_shared<FakeBackend>(std::move(job));
}

}  // namespace commtrace
