// DTensor on the threads backend: every placement transition of DESIGN §2 issues exactly the
// collective of the table in forward and in backward, with exact values (small integers in f32),
// on even and uneven shards and on either dim of a 2-D mesh; from_local / to_local / full_tensor;
// sharded ops (matmul strategies, view, pointwise) against their single-device values.
// Catch2 is not thread-safe: ranks only store results; assertions run after launch().
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/dtensor/dtensor.h"
#include "parallel/dtensor/loss.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/ops.h"
#include "parallel/tensor/random.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"
#include "tracer/tracer.h"

using namespace commtrace;
using namespace commtrace::testing;

namespace {

// x[i][j] = 8 i + j + 1: distinct small integers.
Tensor full_8x8() {
  std::vector<double> v(64);
  for (int i = 0; i < 64; ++i) v[std::size_t(i)] = i + 1;
  return Tensor::from_vector(v, {8, 8});
}

// A DTensor of global value `full` with placements p: shards are chunks; a Partial value is
// split as full * (r + 1) / sum(1..W) ... kept exact by using rank 0 = full, others 0.
Tensor make(const Tensor& full, const std::shared_ptr<const DeviceMesh>& mesh,
            const Placements& p) {
  Placements base = p;
  for (Placement& x : base) {
    if (x.is_partial()) x = Placement::replicate();
  }
  Tensor d = distribute_tensor(full, mesh, base);
  Tensor local = dist_of(d).local;
  for (int m = 0; m < mesh->ndim(); ++m) {
    // Partial(sum) on mesh dim m: coordinate 0 holds 2x the value, coordinate 1 holds -x, the
    // rest 0: they sum to x exactly.
    if (!p[std::size_t(m)].is_partial()) continue;
    const int c = mesh->coordinate(m);
    local = mul(local, c == 0 ? 2.0 : c == 1 ? -1.0 : 0.0);
    if (mesh->size(m) == 1) local = mul(local, 0.5);
  }
  Tensor out = wrap_dtensor(local, mesh, p, full.shape());
  out.set_requires_grad(true);
  return out;
}

struct Collectives {
  std::vector<std::string> forward, backward;
};

Collectives collectives(const Trace& t) {
  Collectives c;
  for (const Record& r : t.records) {
    if (r.kind != EventKind::Collective) continue;
    (r.phase == Phase::Forward ? c.forward : c.backward).push_back(name_of(t, r));
  }
  return c;
}

struct TransitionResult {
  std::vector<double> full_out;   // full_tensor of the output (untraced)
  std::vector<double> full_grad;  // full value of x.grad (Partial summed)
  std::string grad_placements;
  Collectives coll;
};

// One transition src -> dst on mesh `shape`, traced; backward with gradient ones (in dst).
std::vector<TransitionResult> run_transition(std::vector<int> shape, const Placements& src,
                                             const Placements& dst) {
  int world = 1;
  for (int s : shape) world *= s;
  std::vector<TransitionResult> results(static_cast<std::size_t>(world));
  launch(world, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, shape);
    Tensor x = make(full_8x8(), mesh, src);
    Tracer tr(ctx.rank());
    Tensor y;
    {
      TracerActivation on(tr);
      y = redistribute(x, dst, "test");
      // The gradient: ones in the dst layout (a Partial gradient: rank 0 holds all of it).
      Tensor g = make(Tensor::full({8, 8}, 1.0), mesh, dst);
      y.backward(g);
    }
    TransitionResult& r = results[std::size_t(ctx.rank())];
    r.coll = collectives(tr.take());
    NoGradGuard ng;
    r.full_out =
        to_local(redistribute(y, Placements(shape.size(), Placement::replicate()))).to_vector();
    Tensor gr = x.grad();
    r.grad_placements = placements_str(dist_of(gr).placements);
    r.full_grad =
        to_local(redistribute(gr, Placements(shape.size(), Placement::replicate()))).to_vector();
  });
  return results;
}

}  // namespace

TEST_CASE("each transition issues DESIGN §2's collective, forward and backward", "[dtensor]") {
  const Placement R = Placement::replicate(), P = Placement::partial();
  auto S = [](int d) { return Placement::shard(d); };
  struct Case {
    Placement src, dst;
    std::vector<std::string> fwd, bwd;
    std::string grad_placements;
  };
  const std::vector<Case> cases{
      {S(0), R, {"all_gather"}, {}, "(Shard(dim=0),)"},
      {S(1), R, {"all_gather"}, {}, "(Shard(dim=1),)"},
      {R, S(0), {}, {"all_gather"}, "(Replicate(),)"},
      {R, S(1), {}, {"all_gather"}, "(Replicate(),)"},
      {P, R, {"all_reduce"}, {}, "(Replicate(),)"},
      {P, S(0), {"reduce_scatter"}, {"all_gather"}, "(Replicate(),)"},
      {P, S(1), {"reduce_scatter"}, {"all_gather"}, "(Replicate(),)"},
      {S(0), S(1), {"all_to_all"}, {"all_to_all"}, "(Shard(dim=0),)"},
      {S(1), S(0), {"all_to_all"}, {"all_to_all"}, "(Shard(dim=1),)"},
      {R, P, {}, {"all_reduce"}, "(Replicate(),)"},
  };
  const std::vector<double> expected = full_8x8().to_vector();
  for (int world : {4, 3}) {  // 3 shards 8 rows unevenly (3, 3, 2)
    for (const Case& c : cases) {
      INFO("world " << world << ": " << c.src.str() << " -> " << c.dst.str());
      const auto res = run_transition({world}, {c.src}, {c.dst});
      for (const TransitionResult& r : res) {
        REQUIRE(r.coll.forward == c.fwd);
        REQUIRE(r.coll.backward == c.bwd);
        if (world == 3 && c.dst.is_partial()) {  // dividing by 3 rounds in f32
          for (std::size_t i = 0; i < 64; ++i) REQUIRE(r.full_out[i] == Approx(expected[i]));
        } else {
          REQUIRE(r.full_out == expected);
        }
        REQUIRE(r.full_grad == std::vector<double>(64, 1.0));
        REQUIRE(r.grad_placements == c.grad_placements);
      }
    }
  }
}

TEST_CASE("transitions on either dim of a 2x2 mesh use that dim's group", "[dtensor]") {
  const Placement R = Placement::replicate();
  auto S = [](int d) { return Placement::shard(d); };
  const std::vector<double> expected = full_8x8().to_vector();
  const auto on_dp = run_transition({2, 2}, {S(0), S(1)}, {R, S(1)});
  const auto on_tp = run_transition({2, 2}, {S(0), S(1)}, {S(0), S(0)});
  for (int rank = 0; rank < 4; ++rank) {
    REQUIRE(on_dp[std::size_t(rank)].coll.forward == std::vector<std::string>{"all_gather"});
    REQUIRE(on_dp[std::size_t(rank)].full_out == expected);
    REQUIRE(on_tp[std::size_t(rank)].coll.forward == std::vector<std::string>{"all_to_all"});
    REQUIRE(on_tp[std::size_t(rank)].full_out == expected);
    REQUIRE(on_tp[std::size_t(rank)].full_grad == std::vector<double>(64, 1.0));
  }
}

TEST_CASE("a 3-D mesh: coordinates, groups, repr, and transitions on each dim", "[dtensor]") {
  // (2, 2, 2) named (dp, sp, tp): rank 5 = (1, 0, 1).
  std::vector<std::vector<int>> coords(8);
  std::vector<std::vector<int>> groups(8);
  std::vector<std::string> reprs(8);
  launch(8, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx, {2, 2, 2}, {"dp", "sp", "tp"});
    const std::size_t r = std::size_t(ctx.rank());
    for (int d = 0; d < 3; ++d) {
      coords[r].push_back(mesh.coordinate(d));
      for (int g : mesh.comm(d).ranks()) groups[r].push_back(g);
    }
    reprs[r] = mesh.str() + " " + mesh.sub(1)->str();
  });
  REQUIRE(coords[5] == std::vector<int>{1, 0, 1});
  REQUIRE(groups[5] == std::vector<int>{1, 5, 5, 7, 4, 5});  // dp {1, 5}, sp {5, 7}, tp {4, 5}
  REQUIRE(reprs[0] ==
          "DeviceMesh((2, 2, 2), 'cpu', mesh_dim_names=('dp', 'sp', 'tp'), stride=(4, 2, 1)) "
          "DeviceMesh((2,), 'cpu', mesh_dim_names=('sp',), stride=(1,))");
  // A cuda run's mesh names its device as PyTorch's does (a label: no device needed), its
  // sub-meshes too.
  std::string cuda_repr;
  bool cuda_info = false;
  launch(2, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx, {2}, {}, Device::CUDA);
    if (ctx.rank() != 0) return;
    cuda_repr = mesh.str() + " " + mesh.sub(0)->str();
    cuda_info = mesh.info().device == Device::CUDA;
  });
  REQUIRE(cuda_info);
  REQUIRE(cuda_repr ==
          "DeviceMesh((2,), 'cuda', stride=(1,)) DeviceMesh((2,), 'cuda', stride=(1,))");
  REQUIRE(parse_mesh_shape("2x2x2") == std::vector<int>{2, 2, 2});
  REQUIRE_THROWS_AS(parse_mesh_shape("2x0x2"), Error);

  // A tensor sharded on all three dims (dim 0 over dp and sp, dim 1 over tp), gathered one dim
  // at a time: each step is an all_gather on that dim's group only, and values come back exact.
  const Placement R = Placement::replicate();
  auto S = [](int d) { return Placement::shard(d); };
  const std::vector<double> expected = full_8x8().to_vector();
  const auto on_tp = run_transition({2, 2, 2}, {S(0), S(0), S(1)}, {S(0), S(0), R});
  const auto on_sp = run_transition({2, 2, 2}, {S(0), S(0), S(1)}, {S(0), R, S(1)});
  const auto all = run_transition({2, 2, 2}, {S(0), S(0), S(1)}, {R, R, R});
  for (int rank = 0; rank < 8; ++rank) {
    REQUIRE(on_tp[std::size_t(rank)].coll.forward == std::vector<std::string>{"all_gather"});
    REQUIRE(on_sp[std::size_t(rank)].coll.forward == std::vector<std::string>{"all_gather"});
    REQUIRE(all[std::size_t(rank)].coll.forward ==
            std::vector<std::string>{"all_gather", "all_gather", "all_gather"});
    for (const auto* r : {&on_tp, &on_sp, &all}) {
      REQUIRE((*r)[std::size_t(rank)].full_out == expected);
      REQUIRE((*r)[std::size_t(rank)].full_grad == std::vector<double>(64, 1.0));
    }
  }
}

TEST_CASE("collectives of a redistribute name the group, the placements and the reason",
          "[dtensor]") {
  std::vector<Trace> traces(2);
  launch(2, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{2});
    Tensor x = make(full_8x8(), mesh, {Placement::partial()});
    Tracer tr(ctx.rank());
    TracerActivation on(tr);
    redistribute(x, {Placement::shard(0)}, "out_proj output");
    traces[std::size_t(ctx.rank())] = tr.take();
  });
  const Trace& t = traces[1];
  const Record& r = t.records.at(0);
  REQUIRE(name_of(t, r) == "reduce_scatter");
  REQUIRE(r.collective.op == Collective::ReduceScatter);
  REQUIRE(t.str(r.collective.group) == "tp");
  REQUIRE(r.collective.group_size == 2);
  REQUIRE(r.collective.group_rank == 1);
  REQUIRE(placements_str(t.placements(r.collective.before)) == "(Partial(sum),)");
  REQUIRE(placements_str(t.placements(r.collective.after)) == "(Shard(dim=0),)");
  REQUIRE(r.collective.bytes == 64 * 4);
  REQUIRE(t.str(r.reason) == "out_proj output");
  REQUIRE(mesh_of(t, r) == "DeviceMesh((2,), 'cpu', stride=(1,))");
  REQUIRE(out_shape(t, r, 0) == Shape{4, 8});
}

TEST_CASE("from_local backward all-reduces a Partial gradient of a Replicate input", "[dtensor]") {
  std::vector<std::vector<double>> grads(4);
  std::vector<std::vector<std::string>> bwd(4);
  launch(4, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{4});
    Tensor local = Tensor::full({2, 3}, 1.0);
    local.set_requires_grad(true);
    Tracer tr;
    {
      TracerActivation on(tr);
      Tensor d = from_local(local, mesh, {Placement::replicate()});
      // A Partial gradient: every rank contributes (rank + 1).
      Tensor g = wrap_dtensor(Tensor::full({2, 3}, double(ctx.rank() + 1)), mesh,
                              {Placement::partial()}, {2, 3});
      d.backward(g);
    }
    grads[std::size_t(ctx.rank())] = local.grad().to_vector();
    bwd[std::size_t(ctx.rank())] = collectives(tr.take()).backward;
  });
  for (int r = 0; r < 4; ++r) {
    REQUIRE(grads[std::size_t(r)] == std::vector<double>(6, 10.0));
    REQUIRE(bwd[std::size_t(r)] == std::vector<std::string>{"all_reduce"});
  }
}

TEST_CASE("from_local infers even global shapes, and wrap checks the local shape", "[dtensor]") {
  std::vector<Shape> shapes(3);
  std::vector<std::string> errors(3);
  launch(3, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{3});
    shapes[std::size_t(ctx.rank())] =
        from_local(Tensor::zeros({2, 5}), mesh, {Placement::shard(-1)}).shape();
    try {
      wrap_dtensor(Tensor::zeros({3, 5}), mesh, {Placement::shard(0)}, {8, 5});
    } catch (const Error& e) {
      errors[std::size_t(ctx.rank())] = e.what();
    }
  });
  REQUIRE(shapes[0] == Shape{2, 15});
  REQUIRE(errors[0].empty());  // rank 0 holds rows [0, 3) of 8
  REQUIRE(errors[2].find("needs [2, 5]") != std::string::npos);
}

TEST_CASE("sharded matmuls pick the cheapest strategy and match one device", "[dtensor]") {
  // x (8, 8) S(0) @ y (8, 8) S(0): all_gather y (lhs-free m), output S(0), as PyTorch.
  // x S(1) @ y S(0): contracting, output Partial, no collective.
  // x R @ y S(1): rhs-free n, output S(1).
  struct Out {
    std::string pl[3];
    std::vector<std::string> coll[3];
    std::vector<double> full[3];
  };
  std::vector<Out> outs(4);
  const Tensor x = full_8x8();
  const Tensor y = add(full_8x8(), -30.0);
  const std::vector<double> expected = mm(x, y).to_vector();
  launch(4, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{4});
    const Placement R = Placement::replicate();
    const std::pair<Placement, Placement> cases[3] = {{Placement::shard(0), Placement::shard(0)},
                                                      {Placement::shard(1), Placement::shard(0)},
                                                      {R, Placement::shard(1)}};
    Out& o = outs[std::size_t(ctx.rank())];
    for (int i = 0; i < 3; ++i) {
      Tensor a = distribute_tensor(x, mesh, {cases[i].first});
      Tensor b = distribute_tensor(y, mesh, {cases[i].second});
      Tracer tr;
      Tensor c;
      {
        TracerActivation on(tr);
        c = mm(a, b);
      }
      o.pl[i] = placements_str(dist_of(c).placements);
      o.coll[i] = collectives(tr.take()).forward;
      o.full[i] = full_tensor(c).to_vector();
    }
  });
  for (const Out& o : outs) {
    REQUIRE(o.pl[0] == "(Shard(dim=0),)");
    REQUIRE(o.coll[0] == std::vector<std::string>{"all_gather"});
    REQUIRE(o.pl[1] == "(Partial(sum),)");
    REQUIRE(o.coll[1].empty());
    REQUIRE(o.pl[2] == "(Shard(dim=1),)");
    REQUIRE(o.coll[2].empty());
    for (const auto& f : o.full) REQUIRE(f == expected);
  }
}

TEST_CASE("sharded ops record global shapes and placements", "[dtensor]") {
  std::vector<Trace> traces(2);
  launch(2, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{2});
    Tensor a = distribute_tensor(full_8x8(), mesh, {Placement::shard(1)});
    Tensor w = distribute_tensor(full_8x8(), mesh, {Placement::shard(1)});  // Rowwise
    Tensor b = distribute_tensor(Tensor::full({8}, 1.0), mesh, {Placement::replicate()});
    Tracer tr;
    TracerActivation on(tr);
    linear(a, w, b);
    traces[std::size_t(ctx.rank())] = tr.take();
  });
  const Trace& t = traces[0];
  const Record* found = nullptr;
  for (const Record& r : t.records) {
    if (r.sharded && t.name(r) == "addmm") found = &r;
  }
  REQUIRE(found != nullptr);
  const Record& r = *found;
  REQUIRE(r.kind == EventKind::Gemm);
  REQUIRE(t.inputs(r).size() == 3);
  REQUIRE(in_global(t, r, 1) == Shape{8, 8});
  REQUIRE(in_shape(t, r, 1) == Shape{8, 4});
  REQUIRE(in_placements(t, r, 1) == "(Shard(dim=1),)");
  REQUIRE(in_placements(t, r, 0) == "(Replicate(),)");
  REQUIRE(out_placements(t, r, 0) == "(Partial(sum),)");
}

TEST_CASE("a sharded view keeps the shard or gathers first", "[dtensor]") {
  // (2, 4, 8) S(2) -> (2, 4, 2, 4): the shard moves to dim 2 (heads) when each rank holds whole
  // heads (world 2: 4 columns = 1 head), and is gathered when a rank holds part of one (world 4
  // has 2 columns per rank... still whole pieces of 4? no: 2 < 4).
  std::vector<std::string> pl(4);
  std::vector<std::vector<double>> full(4);
  std::vector<double> v(64);
  for (int i = 0; i < 64; ++i) v[std::size_t(i)] = i;
  const Tensor x = Tensor::from_vector(v, {2, 4, 8});
  for (int world : {2, 4}) {
    launch(world, [&](RankContext& ctx) {
      auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{world});
      Tensor d = distribute_tensor(x, mesh, {Placement::shard(2)});
      Tensor y = view(d, {2, 4, -1, 4});
      pl[std::size_t(ctx.rank())] = placements_str(dist_of(y).placements);
      full[std::size_t(ctx.rank())] = full_tensor(y).to_vector();
    });
    REQUIRE(pl[0] == (world == 2 ? "(Shard(dim=2),)" : "(Replicate(),)"));
    REQUIRE(full[0] == v);
  }
}

TEST_CASE("sharding plans are cached by everything they depend on", "[dtensor]") {
  // The same op on the same DTensor with other attrs (a view's shape, a reduced dim), other
  // placements or other shapes gets its own plan; a repeat reuses it, and its trace repeats.
  std::vector<std::vector<std::string>> seen(2);
  std::vector<Trace> traces(2);
  launch(2, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{2});
    const Tensor row = distribute_tensor(full_8x8(), mesh, {Placement::shard(0)});
    const Tensor col = distribute_tensor(full_8x8(), mesh, {Placement::shard(1)});
    auto describe = [](const Tensor& t) {
      return shape_str(t.shape()) + placements_str(dist_of(t).placements) +
             shape_str(dist_of(t).local.shape());
    };
    Tracer tr;
    TracerActivation on(tr);
    for (int it = 0; it < 2; ++it) {
      std::vector<std::string>& out = seen[std::size_t(ctx.rank())];
      out.push_back(describe(view(row, {4, 16})));
      out.push_back(describe(view(row, {16, 4})));
      out.push_back(describe(sum(row, 0)));
      out.push_back(describe(sum(row, 1)));
      out.push_back(describe(sum(col, 0)));
      tr.next_iteration();
    }
    traces[std::size_t(ctx.rank())] = tr.take();
  });
  const std::vector<std::string> want = {"[4, 16](Shard(dim=0),)[2, 16]",
                                         "[16, 4](Shard(dim=0),)[8, 4]", "[8](Partial(sum),)[8]",
                                         "[8](Shard(dim=0),)[4]", "[8](Shard(dim=0),)[4]"};
  for (int it = 0; it < 2; ++it) {
    for (std::size_t k = 0; k < want.size(); ++k) {
      REQUIRE(seen[0][std::size_t(it) * want.size() + k] == want[k]);
    }
  }
  REQUIRE(traces[0].blocks.size() == 1);
  REQUIRE(traces[0].blocks[0].repeat == 2);
}

TEST_CASE("a redistribution repeats by everything its events depend on", "[dtensor]") {
  // Partial -> Replicate (a clone and an all_reduce) in untimed repeats, where the keyed region
  // implies them: another reason, shape or source placement is seen, not folded into the last.
  struct Step {
    const char* reason;
    std::int64_t rows;
    Placement src;
  };
  const std::vector<Step> steps = {{"a", 4, Placement::partial()},
                                   {"a", 4, Placement::partial()},
                                   {"b", 4, Placement::partial()},
                                   {"b", 2, Placement::partial()},
                                   {"b", 2, Placement::partial(ReduceOp::Max)},
                                   {"b", 2, Placement::partial(ReduceOp::Max)}};
  std::vector<Trace> traces(2);
  std::vector<std::vector<double>> values(2);  // checked after the ranks: Catch is one thread's
  launch(2, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{2});
    Tracer tr(ctx.rank(), TimingPolicy{1, 0});
    TracerActivation on(tr);
    for (const Step& st : steps) {
      const Tensor local = Tensor::full({st.rows, 3}, 1.0);
      const Placement src[] = {st.src}, dst[] = {Placement::replicate()};
      const Tensor out = redistribute_local(local, {st.rows, 3}, *mesh, src, dst, st.reason);
      values[std::size_t(ctx.rank())].push_back(out.to_vector().front());
      tr.next_iteration();
    }
    traces[std::size_t(ctx.rank())] = tr.take();
  });
  const std::vector<double> want_values = {2, 2, 2, 2, 1, 1};  // sums of two ones; maxima
  REQUIRE(values[0] == want_values);
  REQUIRE(values[1] == want_values);
  const Trace& t = traces[0];
  std::vector<std::string> seen;  // each all_reduce's reason, rows and reduce op, in order
  t.for_each_event([&](const Record& r, std::uint64_t) {
    if (r.kind != EventKind::Collective) return;
    seen.push_back(std::string(t.str(r.reason)) + " " +
                   std::to_string(t.shape(t.inputs(r)[0].shape)[0]) + " " +
                   reduce_op_name(r.collective.reduce_op));
  });
  REQUIRE(seen == std::vector<std::string>{"a 4 sum", "a 4 sum", "b 4 sum", "b 2 sum", "b 2 max",
                                           "b 2 max"});
  REQUIRE(t.blocks.size() == 4);
}

TEST_CASE("a redistribution's key is the same for the same arguments, whatever came before",
          "[dtensor]") {
  // Keys of different lengths in turn (a 2-d and a 3-d tensor): a word left over from a longer
  // key would give the 2-d move a new id each time, and its events would never match by key.
  std::vector<std::uint64_t> ids;
  launch(1, [&](RankContext& ctx) {
    const DeviceMesh mesh(ctx, std::vector<int>{1});
    const Placement src[] = {Placement::partial()}, dst[] = {Placement::replicate()};
    const Tensor a = Tensor::full({4, 3}, 1.0), b = Tensor::full({4, 3, 2}, 1.0);
    for (int i = 0; i < 2; ++i) {
      ids.push_back(redistribute_key(a, {4, 3}, mesh, src, dst, "r"));
      ids.push_back(redistribute_key(b, {4, 3, 2}, mesh, src, dst, "r"));
    }
    ids.push_back(redistribute_key(a, {4, 3}, mesh, src, dst, "s"));  // another reason
    ids.push_back(redistribute_key(a, {4, 3}, mesh, dst, src, "r"));  // the reverse move
  });
  REQUIRE(ids.size() == 6);
  CHECK(ids[0] == ids[2]);
  CHECK(ids[1] == ids[3]);
  CHECK(ids[0] != ids[1]);
  CHECK(ids[4] != ids[0]);
  CHECK(ids[5] != ids[0]);
}

TEST_CASE("past the plan cache's size, ops are planned per call and traced the same", "[dtensor]") {
  // 4200 shapes: more distinct plans than a thread caches (4096); the last ones run uncached.
  launch(1, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{1});
    std::vector<Tensor> xs;
    for (std::int64_t n = 1; n <= 4200; ++n) {
      xs.push_back(distribute_tensor(Tensor::full({n}, 2.0), mesh, {Placement::replicate()}));
    }
    Tracer tr;
    TracerActivation on(tr);
    for (int it = 0; it < 2; ++it) {
      for (const Tensor& x : xs) {
        const Tensor y = mul(x, 3.0);
        REQUIRE(dist_of(y).local.to_vector().back() == 6.0);
      }
      tr.next_iteration();
    }
    const Trace t = tr.take();
    REQUIRE(t.blocks.size() == 1);
    REQUIRE(t.blocks[0].repeat == 2);
  });
}

TEST_CASE("loss parallel: three forward all_reduces, none backward, and one device's values",
          "[dtensor][loss_parallel]") {
  // logits (2, 3, 7) over 3 ranks: uneven class shards 3, 3, 1. In f64 the loss and gradient
  // equal plain cross_entropy to rounding.
  Generator gen(5);
  const Tensor logits = randn({2, 3, 7}, gen, DType::F64);
  const Tensor targets = Tensor::from_indices({0, 6, 3, 2, 4, 6}, {2, 3});
  Tensor ref_in = logits.detach();
  ref_in.set_requires_grad(true);
  const Tensor ref_loss = cross_entropy(ref_in, targets);
  ref_loss.backward();
  const double want = ref_loss.item();
  const std::vector<double> want_grad = ref_in.grad().to_vector();

  struct Out {
    double loss = 0;
    std::string placements;
    std::vector<double> grad;
    Collectives coll;
    std::string bad_layout, bad_targets;
  };
  std::vector<Out> outs(3);
  launch(3, [&](RankContext& ctx) {
    auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{3});
    Out& o = outs[std::size_t(ctx.rank())];
    Tensor x = distribute_tensor(logits, mesh, {Placement::shard(2)});
    x.set_requires_grad(true);
    Tracer tr(ctx.rank());
    {
      TracerActivation on(tr);
      Tensor loss = loss_parallel_cross_entropy(x, targets);
      o.placements = placements_str(dist_of(loss).placements);
      o.loss = dist_of(loss).local.item();
      loss.backward();
    }
    o.coll = collectives(tr.take());
    o.grad = full_tensor(x.grad()).to_vector();
    try {
      loss_parallel_cross_entropy(distribute_tensor(logits, mesh, {Placement::shard(1)}), targets);
    } catch (const Error& e) {
      o.bad_layout = e.what();
    }
    try {
      loss_parallel_cross_entropy(x, Tensor::from_indices({0, 1}, {2}));
    } catch (const Error& e) {
      o.bad_targets = e.what();
    }
  });
  for (const Out& o : outs) {
    REQUIRE(o.placements == "(Replicate(),)");
    REQUIRE(o.loss == Approx(want).epsilon(1e-12));
    REQUIRE(o.grad.size() == want_grad.size());
    for (std::size_t i = 0; i < o.grad.size(); ++i) {
      REQUIRE(o.grad[i] == Approx(want_grad[i]).margin(1e-12));
    }
    REQUIRE(o.coll.forward == std::vector<std::string>{"all_reduce", "all_reduce", "all_reduce"});
    REQUIRE(o.coll.backward.empty());
    REQUIRE(contains(o.bad_layout, "must be Shard(2) on one mesh dim"));
    REQUIRE(contains(o.bad_targets, "targets must be a plain i64 tensor of 6 rows"));
  }
}
