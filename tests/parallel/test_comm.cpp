// Communicators and launch(): exact values of every collective on the threads backend at world
// sizes 1-4 (small integers, so every reduction order gives the same bits), the records they
// leave in a tracer, the no-hang guarantees (mismatch, failing rank, timeout, early return), the
// argument checks, and the fake backend at world size 64 on meta tensors.
// Catch2 is not thread-safe: rank functions only store results; assertions run after launch().
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/backend.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/launch.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"
#include "tracer/tracer.h"

using namespace commtrace;
using namespace commtrace::testing;

namespace {

std::vector<int> all_ranks(int n) {
  std::vector<int> r(std::size_t(n), 0);
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// Runs fn(rank, comm) on every rank with the group "tp" over all ranks.
template <class F>
void run_tp(int world, F fn, LaunchOptions options = {}) {
  launch(
      world,
      [&](RankContext& ctx) {
        auto comm = ctx.new_group("tp", all_ranks(world));
        fn(ctx.rank(), *comm);
      },
      options);
}

// Value of element i on rank r: a small integer, exact in every dtype.
double value(int r, std::int64_t i) { return double((r + 1) * (i % 5 + 1)); }

std::vector<double> values(int r, std::int64_t n) {
  std::vector<double> v(std::size_t(n), 0.0);
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = value(r, i);
  return v;
}

double reduce_expected(ReduceOp op, int n, std::int64_t i, int chunk_offset = 0) {
  double acc = value(0, i + chunk_offset);
  for (int j = 1; j < n; ++j) {
    const double v = value(j, i + chunk_offset);
    acc = op == ReduceOp::Max ? std::max(acc, v) : acc + v;
  }
  return op == ReduceOp::Avg ? acc / n : acc;
}

const DType kAllDTypes[] = {DType::F32, DType::F64, DType::BF16, DType::I64};
const ReduceOp kAllOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

// Per-rank error capture: each rank writes only its own entry.
struct RankErrors {
  explicit RankErrors(int n) : msg(std::size_t(n)), code(std::size_t(n), ErrorCode::Internal) {}
  template <class F>
  void run(int r, F f) {
    try {
      f();
    } catch (const Error& e) {
      msg[std::size_t(r)] = e.what();
      code[std::size_t(r)] = e.code();
      throw;
    }
  }
  std::vector<std::string> msg;
  std::vector<ErrorCode> code;
};

}  // namespace

// nccl runs under whichever launcher started the process: one process per GPU under mpirun,
// every rank of this process on its own GPU otherwise.
TEST_CASE("each backend names its launcher", "[comm]") {
  REQUIRE(launcher_for("threads") == "threads");
  REQUIRE(launcher_for("fake") == "threads");
  REQUIRE(launcher_for("mpi") == "mpi");
  const char* saved = std::getenv("OMPI_COMM_WORLD_SIZE");
  const std::string keep = saved ? saved : "";
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  const bool other_launcher = std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  if (!other_launcher) REQUIRE(launcher_for("nccl") == "threads");
  ::setenv("OMPI_COMM_WORLD_SIZE", "1", 1);  // what mpirun -np 1 sets
  REQUIRE(launcher_for("nccl") == "mpi");
  REQUIRE(launcher_for("threads") == "threads");
  if (saved) {
    ::setenv("OMPI_COMM_WORLD_SIZE", keep.c_str(), 1);
  } else {
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
  }
}

TEST_CASE("CollectiveScope nests and restores", "[comm]") {
  REQUIRE(CollectiveScope::current() == nullptr);
  {
    const std::vector<Placement> before{Placement::shard(0)}, after{Placement::replicate()};
    const Shape global{4};
    CollectiveScope outer(CollectiveContext{"outer", before, after, nullptr, 0, global});
    REQUIRE(CollectiveScope::current()->reason.str() == "outer");
    {
      CollectiveScope inner(CollectiveContext{"inner", {}, {}, nullptr, 0, {}});
      REQUIRE(CollectiveScope::current()->reason.str() == "inner");
    }
    REQUIRE(CollectiveScope::current()->reason.str() == "outer");
    REQUIRE(CollectiveScope::current()->global_shape[0] == 4);
    REQUIRE(Reason::op_input("mm", 1).str() == "mm input 1");
    // view() formats once: the same text at the same address for an equal reason.
    const std::string_view v = Reason::op_input("mm", 1).view();
    REQUIRE(v == "mm input 1");
    REQUIRE(Reason::op_input("mm", 1).view().data() == v.data());
    REQUIRE(Reason::op_input("mm", 0).view() == "mm input 0");
    REQUIRE(Reason("plain text").view() == "plain text");
    Reason later("out_proj output");
    later.prefix = "backward of ";
    REQUIRE(later.str() == "backward of out_proj output");
    bool other_thread_sees_none = false;
    std::thread([&] { other_thread_sees_none = CollectiveScope::current() == nullptr; }).join();
    REQUIRE(other_thread_sees_none);
  }
  REQUIRE(CollectiveScope::current() == nullptr);
}

TEST_CASE("all_reduce is exact at world sizes 1-4 for every dtype and reduce op", "[comm]") {
  for (int world = 1; world <= 4; ++world) {
    for (DType dt : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        if (op == ReduceOp::Avg && dt == DType::I64) continue;
        // 6 elements: one rank owns everything; 2500: chunks across ranks and blocks.
        for (std::int64_t numel : {std::int64_t(6), std::int64_t(2500)}) {
          std::vector<std::vector<double>> got(static_cast<std::size_t>(world));
          run_tp(world, [&](int r, Communicator& c) {
            Tensor t = Tensor::from_vector(values(r, numel), {numel}, dt);
            c.all_reduce(t, op);
            got[std::size_t(r)] = t.to_vector();
          });
          CAPTURE(world, dtype_name(dt), reduce_op_name(op), numel);
          for (int r = 0; r < world; ++r) {
            const auto& v = got[std::size_t(r)];
            REQUIRE(std::int64_t(v.size()) == numel);
            for (std::int64_t i = 0; i < numel; ++i) {
              CAPTURE(r, i);
              REQUIRE(v[std::size_t(i)] == reduce_expected(op, world, i));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("all_gather concatenates the inputs in group order", "[comm]") {
  for (int world = 1; world <= 4; ++world) {
    for (DType dt : kAllDTypes) {
      std::vector<std::vector<double>> got(static_cast<std::size_t>(world));
      run_tp(world, [&](int r, Communicator& c) {
        std::vector<double> in(6);
        for (int i = 0; i < 6; ++i) in[std::size_t(i)] = 10 * r + i;
        Tensor x = Tensor::from_vector(in, {2, 3}, dt);
        Tensor out = Tensor::full({2 * world, 3}, -1, dt);
        c.all_gather(x, out);
        got[std::size_t(r)] = out.to_vector();
      });
      CAPTURE(world, dtype_name(dt));
      std::vector<double> want;
      for (int j = 0; j < world; ++j) {
        for (int i = 0; i < 6; ++i) want.push_back(10 * j + i);
      }
      for (int r = 0; r < world; ++r) REQUIRE(got[std::size_t(r)] == want);
    }
  }
}

TEST_CASE("reduce_scatter reduces chunk rank() over the group", "[comm]") {
  for (int world = 1; world <= 4; ++world) {
    for (DType dt : kAllDTypes) {
      for (ReduceOp op : kAllOps) {
        if (op == ReduceOp::Avg && dt == DType::I64) continue;
        std::vector<std::vector<double>> got(static_cast<std::size_t>(world));
        run_tp(world, [&](int r, Communicator& c) {
          Tensor in = Tensor::from_vector(values(r, 6 * world), {2 * world, 3}, dt);
          Tensor out = Tensor::zeros({2, 3}, dt);
          c.reduce_scatter(in, out, op);
          got[std::size_t(r)] = out.to_vector();
        });
        CAPTURE(world, dtype_name(dt), reduce_op_name(op));
        for (int r = 0; r < world; ++r) {
          for (int i = 0; i < 6; ++i) {
            CAPTURE(r, i);
            REQUIRE(got[std::size_t(r)][std::size_t(i)] == reduce_expected(op, world, i, 6 * r));
          }
        }
      }
    }
  }
}

TEST_CASE("all_to_all sends chunk j to rank j", "[comm]") {
  for (int world = 1; world <= 4; ++world) {
    for (DType dt : kAllDTypes) {
      std::vector<std::vector<double>> got(static_cast<std::size_t>(world));
      run_tp(world, [&](int r, Communicator& c) {
        // in (2 * world, 2): chunk j holds elements 4j..4j+3; values 16 r + i.
        std::vector<double> in(std::size_t(4 * world));
        for (int i = 0; i < 4 * world; ++i) in[std::size_t(i)] = 16 * r + i;
        Tensor x = Tensor::from_vector(in, {2 * world, 2}, dt);
        Tensor out = Tensor::zeros({2 * world, 2}, dt);
        c.all_to_all(x, out);
        got[std::size_t(r)] = out.to_vector();
      });
      CAPTURE(world, dtype_name(dt));
      for (int r = 0; r < world; ++r) {
        std::vector<double> want;
        for (int j = 0; j < world; ++j) {
          for (int k = 0; k < 4; ++k) want.push_back(16 * j + 4 * r + k);
        }
        REQUIRE(got[std::size_t(r)] == want);
      }
    }
  }
}

TEST_CASE("broadcast copies the root's tensor to every rank", "[comm]") {
  for (int world = 1; world <= 4; ++world) {
    for (DType dt : kAllDTypes) {
      for (int root = 0; root < world; ++root) {
        std::vector<std::vector<double>> got(static_cast<std::size_t>(world));
        run_tp(world, [&](int r, Communicator& c) {
          Tensor t = r == root ? Tensor::from_vector({7, 8, 9, 10}, {2, 2}, dt)
                               : Tensor::full({2, 2}, -1, dt);
          c.broadcast(t, root);
          c.barrier();
          got[std::size_t(r)] = t.to_vector();
        });
        CAPTURE(world, dtype_name(dt), root);
        for (int r = 0; r < world; ++r)
          REQUIRE(got[std::size_t(r)] == std::vector<double>{7, 8, 9, 10});
      }
    }
  }
}

TEST_CASE("batched send/recv pass tensors around a ring without touching the group seq", "[comm]") {
  for (int world = 2; world <= 4; ++world) {
    std::vector<std::vector<double>> got(static_cast<std::size_t>(world));
    std::vector<std::uint64_t> next(static_cast<std::size_t>(world));
    run_tp(world, [&](int r, Communicator& c) {
      const int right = (r + 1) % world;
      const int left = (r + world - 1) % world;
      Tensor buf = Tensor::full({3}, r, DType::F32);
      for (int step = 0; step + 1 < world; ++step) {
        Tensor incoming = Tensor::zeros({3}, DType::F32);
        // One ring step: the send and the receive are issued together.
        const P2POp ops[] = {{P2POp::Kind::Send, buf, right}, {P2POp::Kind::Recv, incoming, left}};
        c.batch_p2p(ops);
        buf = incoming;
        got[std::size_t(r)].push_back(buf.to_vector()[0]);
      }
      next[std::size_t(r)] = c.next_seq();
    });
    CAPTURE(world);
    for (int r = 0; r < world; ++r) {
      std::vector<double> want;
      for (int step = 1; step < world; ++step) want.push_back((r - step + world) % world);
      REQUIRE(got[std::size_t(r)] == want);
      REQUIRE(next[std::size_t(r)] == 0);
    }
  }
}

TEST_CASE("sends are not eager: a ring of lone sends is reported as a desync at once", "[comm]") {
  LaunchOptions opts;
  opts.timeout_s = 60;  // the cycle is found when the last rank blocks, not at the timeout
  const Error e = error_of([&] {
    run_tp(
        3,
        [&](int r, Communicator& c) {
          Tensor t = Tensor::full({2}, 1.0);
          c.send(t, (r + 1) % 3);  // every rank waits for its receiver, who is sending too
          c.recv(t, (r + 2) % 3);
        },
        opts);
  });
  CAPTURE(e.what());
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(contains(e.what(),
                   "desync: every running rank waits for a peer that waits elsewhere "
                   "(3 ranks): rank 0 in send seq 0 to rank 1 on group 'tp'; rank 1 "
                   "in send seq 0 to rank 2 on group 'tp'; rank 2 in send seq 0 to "
                   "rank 0 on group 'tp'"));
}

TEST_CASE("a wait-for cycle across groups is reported as a desync naming ranks and groups",
          "[comm]") {
  // Mesh (2, 2): ranks 0 and 3 call dp first, 1 and 2 call tp first: 0 waits for 2 in dp, 2 for
  // 3 in tp, 3 for 1 in dp, 1 for 0 in tp. No group completes; nothing is slow.
  LaunchOptions opts;
  opts.timeout_s = 60;
  const Error e = error_of([&] {
    launch(
        4,
        [&](RankContext& ctx) {
          const int r = ctx.rank();
          auto tp = ctx.new_group("tp", r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
          auto dp =
              ctx.new_group("dp", r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3});
          Tensor t = Tensor::full({4}, 1.0);
          Communicator& first = (r == 0 || r == 3) ? *dp : *tp;
          Communicator& second = (r == 0 || r == 3) ? *tp : *dp;
          first.all_reduce(t, ReduceOp::Sum);
          second.all_reduce(t, ReduceOp::Sum);
        },
        opts);
  });
  CAPTURE(e.what());
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(contains(e.what(),
                   "desync: every running rank waits for a peer that waits elsewhere "
                   "(4 ranks): rank 0 in all_reduce(f32[4], sum) seq 0 on group 'dp' "
                   "(2 ranks); rank 1 in all_reduce(f32[4], sum) seq 0 on group 'tp' "
                   "(2 ranks); rank 2 in all_reduce(f32[4], sum) seq 0 on group 'tp' "
                   "(2 ranks); rank 3 in all_reduce(f32[4], sum) seq 0 on group 'dp' "
                   "(2 ranks)"));
}

TEST_CASE("a batch with a mismatched receive fails both sides and leaves no buffer behind",
          "[comm]") {
  RankErrors errs(2);
  const Error e = error_of([&] {
    run_tp(2, [&](int r, Communicator& c) {
      errs.run(r, [&] {
        Tensor out = Tensor::zeros({r == 0 ? 4 : 8});
        Tensor in = Tensor::full({4}, 1.0);
        const P2POp ops[] = {{P2POp::Kind::Send, in, 1 - r}, {P2POp::Kind::Recv, out, 1 - r}};
        c.batch_p2p(ops);
      });
    });
  });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(contains(e.what(),
                   "send/recv mismatch on group 'tp' seq 0: rank 0 sent f32[4], rank 1 "
                   "receives f32[8]"));
  REQUIRE(contains(errs.msg[0], "send/recv mismatch"));
  REQUIRE(contains(errs.msg[1], "send/recv mismatch"));
}

TEST_CASE("a receiver that returns fails the sender waiting for it", "[comm]") {
  const Error e = error_of([&] {
    run_tp(2, [&](int r, Communicator& c) {
      if (r == 0) c.send(Tensor::full({2}, 1.0), 1);
    });
  });
  REQUIRE(contains(e.what(),
                   "rank 0 waits in send seq 0 to rank 1 on group 'tp', but rank 1 "
                   "returned without receiving it"));
}

TEST_CASE("the groups of a 2-D mesh reduce independently", "[comm]") {
  // Mesh (2, 2): tp groups {0, 1}, {2, 3}; dp groups {0, 2}, {1, 3}.
  std::vector<std::vector<double>> got(4);
  std::vector<int> same(4, 0);  // not vector<bool>: ranks write their own entry concurrently
  launch(4, [&](RankContext& ctx) {
    const int r = ctx.rank();
    auto tp = ctx.new_group("tp", r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
    auto dp = ctx.new_group("dp", r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3});
    same[std::size_t(r)] = ctx.new_group("tp", tp->ranks()) == tp;
    Tensor t = Tensor::full({5}, r + 1);
    tp->all_reduce(t, ReduceOp::Sum);  // {3, 3, 7, 7}
    Tensor u = t.detach();
    dp->all_reduce(u, ReduceOp::Max);  // {7, 7, 7, 7}
    Tensor v = Tensor::full({1}, r + 1);
    dp->all_reduce(v, ReduceOp::Sum);  // {4, 6, 4, 6}
    got[std::size_t(r)] = {t.to_vector()[0], u.to_vector()[4], v.to_vector()[0], double(tp->rank()),
                           double(dp->rank())};
  });
  REQUIRE(got[0] == std::vector<double>{7, 7, 4, 0, 0});
  REQUIRE(got[1] == std::vector<double>{7, 7, 6, 1, 0});
  REQUIRE(got[2] == std::vector<double>{7, 7, 4, 0, 1});
  REQUIRE(got[3] == std::vector<double>{7, 7, 6, 1, 1});
  REQUIRE(same == std::vector<int>{1, 1, 1, 1});
}

TEST_CASE("collectives are recorded with seq, group, bytes and reason", "[comm]") {
  const int world = 4;
  std::vector<Trace> traces(world);
  run_tp(world, [&](int r, Communicator& c) {
    Tracer tr(r);
    TracerActivation on(tr);
    {
      const std::vector<Placement> before{Placement::partial()}, after{Placement::replicate()};
      const Shape global{8, 6};
      const MeshInfo mesh{{4}, {"tp"}, false, Device::CPU};
      CollectiveScope scope(
          CollectiveContext{"out_proj output: Partial(sum) → Replicate (RowwiseParallel)", before,
                            after, &mesh, 0, global});
      Tensor t = Tensor::full({8, 6}, 1.0);
      c.all_reduce(t, ReduceOp::Sum);
    }
    Tensor small = Tensor::full({2, 3}, 1.0);
    Tensor big = Tensor::zeros({8, 3});
    c.all_gather(small, big);
    c.reduce_scatter(big, small, ReduceOp::Avg);
    Tensor big2 = Tensor::zeros({8, 3});
    c.all_to_all(big, big2);
    Tensor b = Tensor::zeros({5}, DType::F64);
    c.broadcast(b, 1);
    c.barrier();
    Tensor p = Tensor::full({3}, 1.0);
    Tensor q = Tensor::zeros({3});
    const P2POp ring[] = {{P2POp::Kind::Send, p, (r + 1) % world},
                          {P2POp::Kind::Recv, q, (r + world - 1) % world}};
    c.batch_p2p(ring);
    Tensor h = Tensor::full({4}, 1.0, DType::BF16);
    c.all_reduce(h, ReduceOp::Max);
    traces[std::size_t(r)] = tr.take();
  });

  struct Want {
    Collective op;
    std::uint64_t seq;
    std::uint64_t bytes;
    ReduceOp reduce;
    DType dtype;
  };
  const Want want[] = {
      {Collective::AllReduce, 0, 8 * 6 * 4, ReduceOp::Sum, DType::F32},
      {Collective::AllGather, 1, 8 * 3 * 4, ReduceOp::None, DType::F32},
      {Collective::ReduceScatter, 2, 8 * 3 * 4, ReduceOp::Avg, DType::F32},
      {Collective::AllToAll, 3, 8 * 3 * 4, ReduceOp::None, DType::F32},
      {Collective::Broadcast, 4, 5 * 8, ReduceOp::None, DType::F64},
      {Collective::Barrier, 5, 0, ReduceOp::None, DType::F32},
      {Collective::Send, 0, 3 * 4, ReduceOp::None, DType::F32},
      {Collective::Recv, 0, 3 * 4, ReduceOp::None, DType::F32},
      {Collective::AllReduce, 6, 4 * 2, ReduceOp::Max, DType::BF16},
  };
  for (int r = 0; r < world; ++r) {
    const Trace& t = traces[std::size_t(r)];
    REQUIRE(t.rank == r);
    REQUIRE(t.records.size() == std::size(want));
    for (std::size_t i = 0; i < std::size(want); ++i) {
      const Record& rec = t.records[i];
      const CollectiveInfo& c = rec.collective;
      CAPTURE(r, i, name_of(t, rec));
      REQUIRE(rec.kind == EventKind::Collective);
      REQUIRE(c.op == want[i].op);
      REQUIRE(name_of(t, rec) == collective_name(want[i].op));
      REQUIRE(c.seq == want[i].seq);
      REQUIRE(c.bytes == want[i].bytes);
      REQUIRE(c.reduce_op == want[i].reduce);
      REQUIRE(rec.dtype == want[i].dtype);
      REQUIRE(t.str(c.group) == "tp");
      REQUIRE(c.group_size == world);
      REQUIRE(c.group_rank == r);
      REQUIRE(rec.duration_s >= 0.0);
      // Equal on every rank for one collective.
      REQUIRE(c.seq == traces[0].records[i].collective.seq);
      if (i > 0) {
        REQUIRE(rec.reason == 0);
        REQUIRE(c.before == 0);
      }
    }
    REQUIRE(t.records[4].collective.root == 1);
    REQUIRE(t.records[6].collective.peer == (r + 1) % world);  // send: the peer it sends to
    REQUIRE(t.records[7].collective.peer == (r + world - 1) % world);
    REQUIRE(t.records[0].collective.peer == -1);
    const Record& ar = t.records[0];
    REQUIRE(t.str(ar.reason) == "out_proj output: Partial(sum) → Replicate (RowwiseParallel)");
    REQUIRE(mesh_of(t, ar) == "DeviceMesh((4,), 'cpu', stride=(1,))");
    REQUIRE(placements_str(t.placements(ar.collective.before)) == "(Partial(sum),)");
    REQUIRE(placements_str(t.placements(ar.collective.after)) == "(Replicate(),)");
    REQUIRE(t.inputs(ar).size() == 1);
    REQUIRE(in_shape(t, ar, 0) == Shape{8, 6});
    REQUIRE(in_global(t, ar, 0) == Shape{8, 6});
    REQUIRE(in_placements(t, ar, 0) == "(Partial(sum),)");
    REQUIRE(out_placements(t, ar, 0) == "(Replicate(),)");
    const Record& ag = t.records[1];
    REQUIRE(t.inputs(ag).size() == 1);
    REQUIRE(in_shape(t, ag, 0) == Shape{2, 3});
    REQUIRE(in_global(t, ag, 0) == Shape{2, 3});
    REQUIRE(out_shape(t, ag, 0) == Shape{8, 3});
    REQUIRE(t.inputs(t.records[5]).empty());
    REQUIRE(t.outputs(t.records[6]).empty());
    REQUIRE(t.inputs(t.records[7]).empty());
    REQUIRE(out_shape(t, t.records[7], 0) == Shape{3});
  }
}

TEST_CASE("mismatched collectives fail on every involved rank, naming both calls", "[comm]") {
  SECTION("different ops at seq 3") {
    RankErrors errs(2);
    const Error e = error_of([&] {
      run_tp(2, [&](int r, Communicator& c) {
        Tensor t = Tensor::full({4, 4}, 1.0);
        for (int i = 0; i < 3; ++i) c.all_reduce(t, ReduceOp::Sum);
        errs.run(r, [&] {
          if (r == 0) {
            c.all_reduce(t, ReduceOp::Sum);
          } else {
            Tensor out = Tensor::zeros({8, 4});
            c.all_gather(t, out);
          }
        });
      });
    });
    const std::string want =
        "collective mismatch on group 'tp' seq 3: rank 0 called all_reduce(f32[4, 4], sum), "
        "rank 1 called all_gather(f32[4, 4])";
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE(std::string(e.what()) == want);
    REQUIRE(errs.msg[0] == want);
    REQUIRE(errs.msg[1] == want);
  }
  SECTION("same op, different shape, dtype, reduce op or root") {
    struct Case {
      std::function<void(int, Communicator&)> call;
      std::string rank0, rank1;
    };
    const std::vector<Case> cases = {
        {[](int r, Communicator& c) {
           Tensor t = Tensor::zeros({r == 0 ? 4 : 5});
           c.all_reduce(t, ReduceOp::Sum);
         },
         "all_reduce(f32[4], sum)", "all_reduce(f32[5], sum)"},
        {[](int r, Communicator& c) {
           Tensor t = Tensor::zeros({4}, r == 0 ? DType::F32 : DType::F64);
           c.all_reduce(t, ReduceOp::Sum);
         },
         "all_reduce(f32[4], sum)", "all_reduce(f64[4], sum)"},
        {[](int r, Communicator& c) {
           Tensor t = Tensor::zeros({4});
           c.all_reduce(t, r == 0 ? ReduceOp::Sum : ReduceOp::Max);
         },
         "all_reduce(f32[4], sum)", "all_reduce(f32[4], max)"},
        {[](int r, Communicator& c) {
           Tensor t = Tensor::zeros({4});
           c.broadcast(t, r);
         },
         "broadcast(f32[4], root 0)", "broadcast(f32[4], root 1)"},
        {[](int r, Communicator& c) {
           Tensor t = Tensor::zeros({4});
           if (r == 0)
             c.barrier();
           else
             c.broadcast(t, 0);
         },
         "barrier()", "broadcast(f32[4], root 0)"},
    };
    for (const Case& k : cases) {
      RankErrors errs(2);
      const Error e = error_of(
          [&] { run_tp(2, [&](int r, Communicator& c) { errs.run(r, [&] { k.call(r, c); }); }); });
      CAPTURE(e.what());
      REQUIRE(e.code() == ErrorCode::InvalidArgument);
      const std::string want = "collective mismatch on group 'tp' seq 0: rank 0 called " + k.rank0 +
                               ", rank 1 called " + k.rank1;
      REQUIRE(std::string(e.what()) == want);
      REQUIRE(errs.msg[0] == want);
      REQUIRE(errs.msg[1] == want);
    }
  }
  SECTION("three ranks, one odd call") {
    RankErrors errs(3);
    const Error e = error_of([&] {
      run_tp(3, [&](int r, Communicator& c) {
        errs.run(r, [&] {
          Tensor t = Tensor::zeros({2});
          if (r == 2)
            c.broadcast(t, 0);
          else
            c.all_reduce(t, ReduceOp::Sum);
        });
      });
    });
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r, errs.msg[std::size_t(r)]);
      REQUIRE(errs.code[std::size_t(r)] == ErrorCode::InvalidArgument);
      REQUIRE(contains(errs.msg[std::size_t(r)], "called broadcast(f32[2], root 0)"));
      REQUIRE(contains(errs.msg[std::size_t(r)], "called all_reduce(f32[2], sum)"));
    }
  }
}

TEST_CASE("a failing rank aborts the ranks waiting for it", "[comm]") {
  SECTION("commtrace::Error keeps its code and message") {
    RankErrors errs(4);
    const Error e = error_of([&] {
      run_tp(4, [&](int r, Communicator& c) {
        Tensor t = Tensor::full({16}, 1.0);
        c.all_reduce(t, ReduceOp::Sum);
        if (r == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          throw Error(ErrorCode::ShapeMismatch, "rank two broke");
        }
        errs.run(r, [&] { c.all_reduce(t, ReduceOp::Sum); });
      });
    });
    REQUIRE(e.code() == ErrorCode::ShapeMismatch);
    REQUIRE(std::string(e.what()) == "rank two broke");
    for (int r : {0, 1, 3}) {
      REQUIRE(errs.code[std::size_t(r)] == ErrorCode::Aborted);
      REQUIRE(errs.msg[std::size_t(r)] == "rank 2 failed: rank two broke");
    }
  }
  SECTION("other exceptions become Internal errors") {
    const Error e = error_of([&] {
      run_tp(3, [&](int r, Communicator& c) {
        if (r == 1) throw std::runtime_error("plain failure");
        Tensor t = Tensor::full({4}, 1.0);
        c.all_reduce(t, ReduceOp::Sum);
      });
    });
    REQUIRE(e.code() == ErrorCode::Internal);
    REQUIRE(std::string(e.what()) == "rank 1 threw: plain failure");
  }
  SECTION("a rank waiting in recv is aborted too") {
    RankErrors errs(2);
    const Error e = error_of([&] {
      run_tp(2, [&](int r, Communicator& c) {
        if (r == 1) throw Error(ErrorCode::Io, "no file");
        Tensor t = Tensor::zeros({4});
        errs.run(r, [&] { c.recv(t, 1); });
      });
    });
    REQUIRE(e.code() == ErrorCode::Io);
    REQUIRE(errs.code[0] == ErrorCode::Aborted);
  }
}

TEST_CASE("a wait times out naming the ranks it waits for", "[comm]") {
  LaunchOptions opts;
  opts.timeout_s = 0.2;
  std::atomic<int> failed{0};
  RankErrors errs(4);
  const Error e = error_of([&] {
    run_tp(
        4,
        [&](int r, Communicator& c) {
          Tensor t = Tensor::full({4}, 1.0);
          for (int i = 0; i < 5; ++i) c.all_reduce(t, ReduceOp::Sum);
          if (r >= 2) {
            // Never issue seq 5; stay alive until both waiters gave up (at most 2 s), so that
            // they see a timeout (or each other's abort) rather than a finished rank.
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            while (failed.load() < 2 && std::chrono::steady_clock::now() < until) {
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
            return;
          }
          try {
            errs.run(r, [&] { c.all_reduce(t, ReduceOp::Sum); });
          } catch (...) {
            failed.fetch_add(1);
            throw;
          }
        },
        opts);
  });
  CAPTURE(e.what());
  REQUIRE(e.code() == ErrorCode::Aborted);
  REQUIRE(contains(e.what(),
                   "timed out after 0.2s waiting for ranks {2, 3} at all_reduce seq 5 on group "
                   "'tp'"));
  REQUIRE((contains(e.what(), "rank 0 timed out") || contains(e.what(), "rank 1 timed out")));
}

TEST_CASE("a rank that returns early fails the ranks waiting for it", "[comm]") {
  SECTION("collective") {
    const Error e = error_of([&] {
      run_tp(3, [&](int r, Communicator& c) {
        if (r == 2) return;
        Tensor t = Tensor::full({4}, 1.0);
        c.all_reduce(t, ReduceOp::Sum);
      });
    });
    CAPTURE(e.what());
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE(contains(e.what(),
                     "waits in all_reduce(f32[4], sum) seq 0 on group 'tp', but rank 2 "
                     "returned without calling it"));
  }
  SECTION("recv") {
    const Error e = error_of([&] {
      run_tp(2, [&](int r, Communicator& c) {
        if (r == 0) return;
        Tensor t = Tensor::zeros({4});
        c.recv(t, 0);
      });
    });
    REQUIRE(e.code() == ErrorCode::InvalidArgument);
    REQUIRE(contains(e.what(),
                     "rank 1 waits in recv seq 0 from rank 0 on group 'tp', but rank 0 "
                     "returned without sending it"));
  }
}

TEST_CASE("send/recv check that the shapes match", "[comm]") {
  const Error e = error_of([&] {
    run_tp(2, [&](int r, Communicator& c) {
      if (r == 0) {
        c.send(Tensor::zeros({4}), 1);
      } else {
        Tensor t = Tensor::zeros({8});
        c.recv(t, 0);
      }
    });
  });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(std::string(e.what()) ==
          "send/recv mismatch on group 'tp' seq 0: rank 0 sent f32[4], rank 1 receives f32[8]");
}

// The side channel of the nccl backend (ranks in one process): the threads backend compares the
// calls' descriptions and moves no data.
TEST_CASE("a call check compares descriptions across the group and moves nothing", "[comm]") {
  auto run_checks = [](const std::function<void(int, CallCheck&)>& fn) {
    launch(2, [&](RankContext& ctx) {
      fn(ctx.rank(), *call_check_of(ctx.new_group("tp", {0, 1})));
    });
  };
  const CallDesc reduce4{Collective::AllReduce, DType::F32, {4}, ReduceOp::Sum, -1};
  std::vector<double> received;
  run_checks([&](int r, CallCheck& check) {
    check.same_call(reduce4, 0);
    check.same_call(CallDesc{}, 1);  // a barrier
    Tensor t = Tensor::full({3}, double(r + 1));
    CollectiveCall c;
    c.op = r == 0 ? Collective::Send : Collective::Recv;
    (r == 0 ? c.in : c.out) = &t;
    c.peer = 1 - r;
    check.same_p2p({&c, 1});
    if (r == 1) received = t.to_vector();
  });
  REQUIRE(received == std::vector<double>{2, 2, 2});  // the receive kept its own values

  const Error e = error_of([&] {
    run_checks([&](int r, CallCheck& check) {
      check.same_call(
          r == 0 ? reduce4 : CallDesc{Collective::AllReduce, DType::F32, {8}, ReduceOp::Sum, -1},
          0);
    });
  });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(std::string(e.what()) ==
          "collective mismatch on group 'tp' seq 0: rank 0 called all_reduce(f32[4], sum), rank 1 "
          "called all_reduce(f32[8], sum)");

  const Error p = error_of([&] {
    run_checks([&](int r, CallCheck& check) {
      Tensor t = Tensor::zeros({r == 0 ? 4 : 8});
      CollectiveCall c;
      c.op = r == 0 ? Collective::Send : Collective::Recv;
      (r == 0 ? c.in : c.out) = &t;
      c.peer = 1 - r;
      check.same_p2p({&c, 1});
    });
  });
  REQUIRE(std::string(p.what()) ==
          "send/recv mismatch on group 'tp' seq 0: rank 0 sent f32[4], rank 1 receives f32[8]");
}

TEST_CASE("only the threads and mpi communicators check calls", "[comm]") {
  LaunchOptions fake;
  fake.backend = "fake";
  const Error e = error_of([&] {
    launch(
        1, [&](RankContext& ctx) { call_check_of(ctx.new_group("tp", {0})); }, fake);
  });
  REQUIRE(e.code() == ErrorCode::Internal);
  REQUIRE(std::string(e.what()) == "the fake backend's communicators cannot check calls");
}

TEST_CASE("arguments are checked before a collective is numbered or recorded", "[comm]") {
  LaunchOptions fake;
  fake.backend = "fake";
  fake.ranks = {1};
  std::vector<std::pair<ErrorCode, std::string>> errs;
  std::uint64_t seq_after = 99;
  std::size_t records = 99;
  run_tp(
      4,
      [&](int, Communicator& c) {
        Tracer tr(1);
        TracerActivation on(tr);
        auto expect = [&](auto f) {
          try {
            f();
            errs.emplace_back(ErrorCode::Internal, "no error");
          } catch (const Error& e) {
            errs.emplace_back(e.code(), e.what());
          }
        };
        Tensor x = Tensor::zeros({32});
        Tensor x2 = Tensor::zeros({2, 3});
        expect([&] {
          Tensor out = Tensor::zeros({96});
          c.all_gather(x, out);
        });
        expect([&] {
          Tensor out = Tensor::zeros({2, 64});
          c.all_gather(x, out);
        });
        expect([&] {
          Tensor out = Tensor::zeros({128}, DType::F64);
          c.all_gather(x, out);
        });
        expect([&] {
          Tensor in = Tensor::zeros({6, 3});
          c.reduce_scatter(in, x2, ReduceOp::Sum);
        });
        expect([&] {
          Tensor in = Tensor::zeros({12, 3});
          c.reduce_scatter(in, x2, ReduceOp::Sum);
        });
        expect([&] { c.broadcast(x, 4); });
        expect([&] { c.broadcast(x, -1); });
        expect([&] { c.send(x, 1); });
        expect([&] { c.recv(x, 7); });
        expect([&] {
          Tensor i = Tensor::zeros({4}, DType::I64);
          c.all_reduce(i, ReduceOp::Avg);
        });
        expect([&] { c.all_reduce(x, ReduceOp::None); });
        expect([&] {
          Tensor out = Tensor::zeros({6, 3});
          c.all_to_all(x2, out);
        });
        expect([&] {
          Tensor undefined;
          c.all_reduce(undefined, ReduceOp::Sum);
        });
        seq_after = c.next_seq();
        records = tr.record_count();
      },
      fake);
  REQUIRE(seq_after == 0);
  REQUIRE(records == 0);
  const std::vector<std::pair<ErrorCode, std::string>> want = {
      {ErrorCode::ShapeMismatch,
       "all_gather: out has 96 elements, expected 4 ranks × 32 = 128 (in is f32[32])"},
      {ErrorCode::ShapeMismatch,
       "all_gather: out is f32[2, 64], expected shape [128] (4 ranks × in [32] along dim 0)"},
      {ErrorCode::InvalidArgument,
       "all_gather: in is f32[32] but out is f64[128]; dtypes must match"},
      {ErrorCode::ShapeMismatch,
       "reduce_scatter: in f32[6, 3] has 6 rows in dim 0, not divisible by 4 ranks"},
      {ErrorCode::ShapeMismatch,
       "reduce_scatter: out is f32[2, 3], expected shape [3, 3] (in [12, 3] split over 4 ranks "
       "along dim 0)"},
      {ErrorCode::InvalidArgument, "broadcast: root 4 out of range [0, 4) for group 'tp'"},
      {ErrorCode::InvalidArgument, "broadcast: root -1 out of range [0, 4) for group 'tp'"},
      {ErrorCode::InvalidArgument,
       "send: peer 1 is this rank (group 'tp' rank 1); send to another rank"},
      {ErrorCode::InvalidArgument, "recv: peer 7 out of range [0, 4) for group 'tp'"},
      {ErrorCode::InvalidArgument, "all_reduce: reduce op avg needs a floating dtype, got i64[4]"},
      {ErrorCode::InvalidArgument, "all_reduce: a reduce op is required (sum, avg or max)"},
      {ErrorCode::ShapeMismatch,
       "all_to_all: in f32[2, 3] has 2 rows in dim 0, not divisible by 4 ranks"},
      {ErrorCode::InvalidArgument, "all_reduce: t is an undefined tensor"},
  };
  REQUIRE(errs.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    REQUIRE(errs[i].second == want[i].second);
    REQUIRE(errs[i].first == want[i].first);
  }
}

TEST_CASE("the threads backend refuses meta tensors and overlapping buffers", "[comm]") {
  Error e = error_of([&] {
    run_tp(1, [&](int, Communicator& c) {
      Tensor t = Tensor::zeros({4}, DType::F32, Device::Meta);
      c.all_reduce(t, ReduceOp::Sum);
    });
  });
  REQUIRE(e.code() == ErrorCode::Unsupported);
  REQUIRE(std::string(e.what()) ==
          "all_reduce: the threads backend does not support meta tensors (t is f32[4] on meta)");
  e = error_of([&] {
    run_tp(1, [&](int, Communicator& c) {
      Tensor t = Tensor::zeros({4});
      c.all_gather(t, t);
    });
  });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(std::string(e.what()) ==
          "all_gather: in and out overlap in memory; use separate buffers");
}

TEST_CASE("launch and new_group check their arguments", "[comm]") {
  auto noop = [](RankContext&) {};
  REQUIRE(error_of([&] { launch(0, noop); }).code() == ErrorCode::InvalidArgument);
  LaunchOptions bad;
  bad.backend = "nccl2";
  Error e = error_of([&] { launch(2, noop, bad); });
  REQUIRE(e.code() == ErrorCode::Unsupported);
  REQUIRE(
      std::string(e.what()).starts_with("launch: unknown backend 'nccl2' (this build has "
                                        "threads, fake"));
  // The mpi backend runs under the mpi launcher only (one process per rank).
  LaunchOptions mixed;
  mixed.backend = "mpi";
  e = error_of([&] { launch(2, noop, mixed); });
  REQUIRE(contains(e.what(), "mpi"));
  LaunchOptions subset;
  subset.ranks = {0};
  e = error_of([&] { launch(2, noop, subset); });
  REQUIRE(std::string(e.what()) == "launch: the threads backend runs every rank; 1 of 2 requested");
  subset.backend = "fake";
  subset.ranks = {5};
  e = error_of([&] { launch(2, noop, subset); });
  REQUIRE(std::string(e.what()) == "launch: rank 5 out of range [0, 2)");

  e = error_of([&] { launch(2, [](RankContext& ctx) { ctx.new_group("tp", {0, 2}); }); });
  REQUIRE(e.code() == ErrorCode::InvalidArgument);
  REQUIRE(std::string(e.what()) == "new_group 'tp': rank 2 out of range [0, 2)");
  e = error_of([&] {
    launch(2, [](RankContext& ctx) {
      if (ctx.rank() == 1) ctx.new_group("solo", {0});
    });
  });
  REQUIRE(std::string(e.what()) == "new_group 'solo': ranks [0] do not contain this rank 1");
  e = error_of([&] { launch(2, [](RankContext& ctx) { ctx.new_group("tp", {0, 0, 1}); }); });
  REQUIRE(std::string(e.what()) == "new_group 'tp': rank 0 appears twice in [0, 0, 1]");

  std::vector<std::string> seen(3);
  launch(3, [&](RankContext& ctx) {
    seen[std::size_t(ctx.rank())] =
        fmt::format("{}/{}/{}", ctx.rank(), ctx.world_size(), ctx.backend());
  });
  REQUIRE(seen == std::vector<std::string>{"0/3/threads", "1/3/threads", "2/3/threads"});
}

TEST_CASE("the fake backend records every op at world size 64 on meta tensors", "[comm]") {
  const int world = 64;
  LaunchOptions fake;
  fake.backend = "fake";
  std::vector<Trace> traces(world);
  std::vector<std::string> backends(world);
  launch(
      world,
      [&](RankContext& ctx) {
        const int r = ctx.rank();
        Tracer tr(r);
        TracerActivation on(tr);
        auto c = ctx.new_group("tp", all_ranks(world));
        backends[std::size_t(r)] = c->backend_name();
        const Device m = Device::Meta;
        Tensor t = Tensor::empty({8, 16}, DType::BF16, m);
        c->all_reduce(t, ReduceOp::Avg);
        Tensor small = Tensor::empty({2, 16}, DType::F32, m);
        Tensor big = Tensor::empty({128, 16}, DType::F32, m);
        c->all_gather(small, big);
        c->reduce_scatter(big, small, ReduceOp::Sum);
        Tensor big2 = Tensor::empty({128, 16}, DType::F32, m);
        c->all_to_all(big, big2);
        Tensor b = Tensor::empty({8}, DType::F32, m);
        c->broadcast(b, 3);
        c->send(b, (r + 1) % world);
        c->recv(b, (r + world - 1) % world);
        c->barrier();
        traces[std::size_t(r)] = tr.take();
      },
      fake);
  const std::vector<std::pair<std::string, std::uint64_t>> want = {{"all_reduce", 8 * 16 * 2},
                                                                   {"all_gather", 128 * 16 * 4},
                                                                   {"reduce_scatter", 128 * 16 * 4},
                                                                   {"all_to_all", 128 * 16 * 4},
                                                                   {"broadcast", 8 * 4},
                                                                   {"send", 8 * 4},
                                                                   {"recv", 8 * 4},
                                                                   {"barrier", 0}};
  for (int r = 0; r < world; ++r) {
    const Trace& t = traces[std::size_t(r)];
    REQUIRE(backends[std::size_t(r)] == "fake");
    REQUIRE(t.records.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(r, i);
      REQUIRE(name_of(t, t.records[i]) == want[i].first);
      REQUIRE(t.records[i].collective.bytes == want[i].second);
      REQUIRE(t.records[i].collective.group_size == world);
      REQUIRE(t.records[i].collective.group_rank == r);
    }
    REQUIRE(t.records[7].collective.seq == 5);  // barrier: send/recv have their own counters
  }
}

TEST_CASE("the fake backend runs only the requested ranks, keeps in-place data, zeroes outputs",
          "[comm]") {
  LaunchOptions fake;
  fake.backend = "fake";
  fake.ranks = {3, 17};
  std::atomic<int> runs{0};
  std::vector<double> kept(64, 0.0);
  launch(
      64,
      [&](RankContext& ctx) {
        runs.fetch_add(1);
        auto c = ctx.new_group("tp", all_ranks(64));
        Tensor t = Tensor::full({4}, ctx.rank());
        c->all_reduce(t, ReduceOp::Sum);  // never waits for the 62 ranks that do not run
        Tensor out = Tensor::full({256}, -1.0);
        c->all_gather(t, out);
        Tensor got = Tensor::full({4}, -1.0);
        c->recv(got, ctx.rank() == 3 ? 17 : 3);  // never waits for the peer either
        kept[std::size_t(ctx.rank())] =
            t.to_vector()[0] + out.to_vector()[255] + out.to_vector()[0] + got.to_vector()[3];
      },
      fake);
  REQUIRE(runs.load() == 2);
  REQUIRE(kept[3] == 3.0);  // the all_reduce leaves the data alone; out and got are zeroed
  REQUIRE(kept[17] == 17.0);
}
