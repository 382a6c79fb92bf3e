// The "fake" backend: collectives are validated and recorded by the Communicator front end like
// on any backend, then move no data (outputs keep their contents) and never wait for a peer. Any
// world size, any subset of ranks, meta or cpu tensors: it is how a trace of a large run is made
// on one machine. It is not a simulator: no timing model, no values.
#include "parallel/comm/backend.h"

namespace commtrace {

namespace {

class FakeCommunicator final : public Communicator {
 public:
  using Communicator::Communicator;
  const char* backend_name() const override { return "fake"; }

 protected:
  void run(const CollectiveCall&) override {}
  void run_p2p(std::span<const CollectiveCall>) override {}
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
