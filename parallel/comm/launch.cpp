// launch(): one thread per rank, the backend-independent part of the World (failures, the abort
// flag, finished ranks, the communicator cache) and RankContext. The backends' waiting and data
// movement live in comm_threads.cpp and comm_fake.cpp.
#include "parallel/comm/launch.h"

#include <algorithm>
#include <set>
#include <thread>

#include "parallel/comm/backend.h"

namespace commtrace {

World::World(int world_size, std::string backend)
    : world_size_(world_size),
      backend_(std::move(backend)),
      finished_(new std::atomic<bool>[std::size_t(world_size)]) {
  for (int r = 0; r < world_size; ++r) finished_[std::size_t(r)].store(false);
}

std::shared_ptr<Communicator> World::new_group(const std::string& group,
                                               const std::vector<int>& ranks, int global_rank) {
  COMMTRACE_CHECK(!ranks.empty(), ErrorCode::InvalidArgument,
                  "new_group '{}': a group needs at least one rank", group);
  std::set<int> seen;
  for (int r : ranks) {
    COMMTRACE_CHECK(r >= 0 && r < world_size_, ErrorCode::InvalidArgument,
                    "new_group '{}': rank {} out of range [0, {})", group, r, world_size_);
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

void World::rank_failed(int rank, std::exception_ptr error) {
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
  if (first) wake_all();
}

void World::rank_finished(int rank) {
  finished_[std::size_t(rank)].store(true, std::memory_order_release);
  wake_all();
}

void World::rethrow_first_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Failure& f : failures_) {
    if (!f.derived) throw f.error;
  }
  if (!failures_.empty()) throw failures_.front().error;
}

RankContext::RankContext(std::shared_ptr<World> world, int rank)
    : world_(std::move(world)), rank_(rank) {}

int RankContext::world_size() const { return world_->world_size(); }

const std::string& RankContext::backend() const { return world_->backend(); }

std::shared_ptr<Communicator> RankContext::new_group(const std::string& group,
                                                     const std::vector<int>& ranks) {
  return world_->new_group(group, ranks, rank_);
}

void launch(int world_size, const std::function<void(RankContext&)>& fn,
            const LaunchOptions& options) {
  COMMTRACE_CHECK(world_size >= 1, ErrorCode::InvalidArgument, "launch: world_size {} must be >= 1",
                  world_size);
  COMMTRACE_CHECK(bool(fn), ErrorCode::InvalidArgument, "launch: no function to run");
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

  std::shared_ptr<World> world;
  if (options.backend == "threads") {
    COMMTRACE_CHECK(int(ranks.size()) == world_size, ErrorCode::InvalidArgument,
                    "launch: the threads backend runs every rank; {} of {} requested", ranks.size(),
                    world_size);
    COMMTRACE_CHECK(options.timeout_s > 0, ErrorCode::InvalidArgument,
                    "launch: timeout_s {} must be > 0", options.timeout_s);
    world = make_threads_world(world_size, options.timeout_s);
  } else if (options.backend == "fake") {
    world = make_fake_world(world_size);
  } else {
    throw Error(
        ErrorCode::Unsupported,
        fmt::format("launch: unknown backend '{}' (expected threads or fake)", options.backend));
  }

  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (int r : ranks) {
    try {
      threads.emplace_back([&world, &fn, r] {
        RankContext ctx(world, r);
        try {
          fn(ctx);
        } catch (...) {
          world->rank_failed(r, std::current_exception());
        }
        world->rank_finished(r);
      });
    } catch (...) {
      // No thread for rank r: fail it so the started ranks stop waiting for it.
      world->rank_failed(r, std::current_exception());
      world->rank_finished(r);
    }
  }
  for (std::thread& t : threads) t.join();
  world->rethrow_first_error();
}

}  // namespace commtrace
