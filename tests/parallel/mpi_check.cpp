// mpi_check SCENARIO [TIMEOUT_S]: run under mpirun, one process per rank, on the mpi launcher and
// backend (tests/parallel/mpi_faults.sh drives it).
//   values  every collective and a send/recv ring give exact values in every dtype and reduce
//           op, the same on every rank; prints "mpi_check values: ok" on rank 0, exits 0.
//   throw   rank 1 throws before its first collective: the job must end non-zero, naming it.
//   desync  rank 1 calls all_gather where the others call all_reduce: a mismatch naming both.
//   stall   the last rank sleeps instead of calling: the others time out after TIMEOUT_S and
//           print their last collectives.
//   exit    the last rank returns without calling: the others time out likewise.
//   check   the call check (the nccl backend's side channel): equal calls and a send/recv ring
//           pass and move no data; prints "mpi_check check: ok".
//   check-desync  rank 1 describes a different all_reduce: a mismatch naming both.
//   check-p2p     rank 1 receives 8 elements where rank 0 sends 4: a mismatch naming both.
// Exit codes: 0 ok, 1 a wrong value (message on stderr), anything else from the job's abort.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/backend.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/launch.h"

using namespace commtrace;

namespace {

double value(int r, std::int64_t i) { return double((r + 1) * (i % 5 + 1)); }

Tensor filled(int r, std::int64_t n, DType dt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = value(r, i);
  return Tensor::from_vector(v, {n}, dt);
}

// Element k reduced over the ranks 0..world-1 in order.
double reduced(ReduceOp op, int world, std::int64_t k) {
  double acc = value(0, k);
  for (int j = 1; j < world; ++j) {
    acc = op == ReduceOp::Max ? std::max(acc, value(j, k)) : acc + value(j, k);
  }
  return op == ReduceOp::Avg ? acc / world : acc;
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw Error(ErrorCode::Internal, "wrong value: " + what);
}

void check_values(int rank, int world, Communicator& c) {
  const DType dtypes[] = {DType::F32, DType::F64, DType::BF16, DType::I64};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};
  for (DType dt : dtypes) {
    const std::string d = dtype_name(dt);
    for (ReduceOp op : ops) {
      if (dt == DType::I64 && op == ReduceOp::Avg) continue;
      for (std::int64_t n : {std::int64_t(7), std::int64_t(1000)}) {
        Tensor t = filled(rank, n, dt);
        c.all_reduce(t, op);
        const std::vector<double> got = t.to_vector();
        for (std::int64_t i = 0; i < n; ++i) {
          const double acc = reduced(op, world, i);
          expect(std::abs(got[std::size_t(i)] - acc) <= 1e-2 * std::abs(acc),
                 "all_reduce " + d + " element " + std::to_string(i));
        }
        Tensor in = filled(rank, n * world, dt), out = Tensor::zeros({n}, dt);
        c.reduce_scatter(in, out, op);
        const std::vector<double> rs = out.to_vector();
        for (std::int64_t i = 0; i < n; ++i) {
          const double acc = reduced(op, world, rank * n + i);
          expect(std::abs(rs[std::size_t(i)] - acc) <= 1e-2 * std::abs(acc),
                 "reduce_scatter " + d + " element " + std::to_string(i));
        }
      }
    }
    Tensor in = filled(rank, 6, dt), out = Tensor::zeros({6 * world}, dt);
    c.all_gather(in, out);
    const std::vector<double> g = out.to_vector();
    for (int j = 0; j < world; ++j) {
      for (int i = 0; i < 6; ++i) {
        expect(g[std::size_t(j * 6 + i)] == value(j, i), "all_gather " + d);
      }
    }
    // all_to_all: chunk j of rank r holds 10r + j; rank r receives 10j + r from rank j.
    std::vector<double> send(std::size_t(world) * 3);
    for (int j = 0; j < world; ++j) {
      for (int i = 0; i < 3; ++i) send[std::size_t(j * 3 + i)] = 10 * rank + j;
    }
    Tensor a2a = Tensor::from_vector(send, {std::int64_t(world) * 3}, dt);
    Tensor recv = Tensor::zeros({std::int64_t(world) * 3}, dt);
    c.all_to_all(a2a, recv);
    const std::vector<double> r = recv.to_vector();
    for (int j = 0; j < world; ++j) {
      expect(r[std::size_t(j * 3)] == 10 * j + rank, "all_to_all " + d);
    }
    Tensor b = filled(rank, 5, dt);
    c.broadcast(b, world - 1);
    expect(b.to_vector()[4] == value(world - 1, 4), "broadcast " + d);
  }
  c.barrier();
  if (world == 1) return;
  // A ring step: send right and receive left together.
  Tensor mine = Tensor::full({4}, double(rank + 1)), left = Tensor::zeros({4});
  const P2POp ring[] = {{P2POp::Kind::Send, mine, (rank + 1) % world},
                        {P2POp::Kind::Recv, left, (rank + world - 1) % world}};
  c.batch_p2p(ring);
  expect(left.to_vector()[0] == double((rank + world - 1) % world + 1), "ring send/recv");
}

// One send to the right and one recv from the left, descriptions only: the recv keeps its values.
void check_ring(int rank, int world, CallCheck& check, std::int64_t recv_n) {
  Tensor mine = Tensor::full({4}, double(rank + 1)), left = Tensor::full({recv_n}, -1.0);
  CollectiveCall calls[2];
  calls[0].op = Collective::Send;
  calls[0].in = &mine;
  calls[0].peer = (rank + 1) % world;
  calls[1].op = Collective::Recv;
  calls[1].out = &left;
  calls[1].peer = (rank + world - 1) % world;
  check.same_p2p(calls);
  expect(left.to_vector()[0] == -1.0, "a checked recv moved data");
}

void run_check(const std::string& scenario, int rank, int world, CallCheck& check) {
  const CallDesc reduce4{Collective::AllReduce, DType::F32, {4}, ReduceOp::Sum, -1};
  check.same_call(reduce4, 0);
  if (scenario == "check") {
    check.same_call(CallDesc{}, 1);
    if (world > 1) check_ring(rank, world, check, 4);
  } else if (scenario == "check-desync") {
    CallDesc d = reduce4;
    if (rank == 1) d.shape = {8};
    check.same_call(d, 1);
  } else if (scenario == "check-p2p") {
    check_ring(rank, world, check, rank == 1 ? 8 : 4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "values";
  LaunchOptions opts;
  opts.launcher = "mpi";
  opts.backend = "mpi";
  opts.timeout_s = argc > 2 ? std::stod(argv[2]) : 60.0;
  try {
    const Processes p = processes_of("mpi");
    const int world = p.size;
    launch(
        world,
        [&](RankContext& ctx) {
          std::vector<int> ranks(static_cast<std::size_t>(world));
          std::iota(ranks.begin(), ranks.end(), 0);
          auto c = ctx.new_group("tp", ranks);
          const int r = ctx.rank();
          Tensor t = Tensor::full({4}, 1.0);
          if (scenario == "values") return check_values(r, world, *c);
          if (scenario.rfind("check", 0) == 0)
            return run_check(scenario, r, world, *call_check_of(c));
          c->all_reduce(t, ReduceOp::Sum);  // seq 0 goes through on every rank
          if (scenario == "throw" && r == 1) {
            throw Error(ErrorCode::InvalidArgument, "rank 1 was told to throw");
          }
          if (scenario == "desync" && r == 1) {
            Tensor out = Tensor::zeros({4 * std::int64_t(world)});
            c->all_gather(t, out);
            return;
          }
          if ((scenario == "stall" || scenario == "exit") && r == world - 1) {
            // Long past the peers' timeout, short enough that a rank orphaned by a killed
            // mpirun does not outlive the test.
            if (scenario == "stall") std::this_thread::sleep_for(std::chrono::seconds(60));
            return;
          }
          c->all_reduce(t, ReduceOp::Sum);
        },
        opts);
    if (p.rank == 0) std::printf("mpi_check %s: ok\n", scenario.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_check %s: %s\n", scenario.c_str(), e.what());
    return 1;
  }
}
