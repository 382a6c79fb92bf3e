// commtrace_cp_core IN.json OUT.json: runs one sequence-parallel attention core (plans/context.h)
// alone, at world W on the threads backend, for the ColossalAI / DeepSpeed oracle
// (cp_oracle.py).
//   IN:  {"world": W, "shape": [B, H, T, D], "context_parallel": {...plan keys...},
//         "q", "k", "v", "grad": flat f64 values of the whole (B, H, T, D) tensors}
//   OUT: {"ranks": [{"grad_q", "grad_k", "grad_v": this rank's (B, H, T/W, D) chunk, "out"}],
//         "counts": {"forward": {op: n}, "backward": {op: n}}}  (rank 0's records)
// Rank r holds positions [r T/W, (r+1) T/W) of q, k and v; its output's gradient is grad's chunk.
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "parallel/comm/launch.h"
#include "parallel/plans/context.h"
#include "parallel/tensor/autograd.h"
#include "parallel/tensor/ops.h"
#include "tracer/tracer.h"

using namespace commtrace;
using nlohmann::json;

namespace {

json run(const json& in) {
  const int w = in.at("world").get<int>();
  const Shape shape = in.at("shape").get<Shape>();
  COMMTRACE_CHECK(shape.size() == 4 && shape[2] % w == 0, ErrorCode::InvalidArgument,
                  "cp_core: shape must be [B, H, T, D] with W dividing T");
  const json& cpj = in.at("context_parallel");
  ContextParallel opts;
  opts.family = cpj.at("family").get<std::string>();
  opts.divide_by_world_size = cpj.value("divide_by_world_size", true);
  opts.grad_reduction = cpj.value("grad_reduction", std::string("all_reduce"));
  auto whole = [&](const char* key) {
    return Tensor::from_vector(in.at(key).get<std::vector<double>>(), shape, DType::F64);
  };
  const Tensor q = whole("q"), k = whole("k"), v = whole("v"), g = whole("grad");
  const std::int64_t tl = shape[2] / w;

  json out;
  out["ranks"] = json::array();
  for (int r = 0; r < w; ++r) out["ranks"].push_back(json::object());
  std::mutex mu;
  launch(w, [&](RankContext& ctx) {
    const int r = ctx.rank();
    auto cp = std::make_shared<const DeviceMesh>(ctx, std::vector<int>{w},
                                                 std::vector<std::string>{"cp"});
    const auto core = make_context_core(cp, opts, r * tl);
    auto chunk = [&](const Tensor& x) { return clone(narrow(x, 2, r * tl, tl)); };
    Tensor lq = chunk(q), lk = chunk(k), lv = chunk(v);
    for (Tensor* t : {&lq, &lk, &lv}) t->set_requires_grad(true);
    Tracer tracer(r);
    Tensor o;
    {
      const TracerActivation active(tracer);
      o = (*core)(lq, lk, lv);
      run_backward(o, chunk(g));
    }
    const Trace trace = tracer.take();
    std::map<std::string, std::map<std::string, std::uint64_t>> counts;
    auto add = [&](const Record& rec, std::uint64_t n) {
      if (rec.kind == EventKind::Collective) {
        counts[phase_name(rec.phase)][std::string(trace.name(rec))] += n;
      }
    };
    if (trace.blocks.empty()) {
      for (const Record& rec : trace.records) add(rec, 1);
    }
    for (const Block& b : trace.blocks) {
      for (std::uint32_t i = b.first; i < b.first + b.count; ++i) add(trace.records[i], b.repeat);
    }
    const std::lock_guard lock(mu);
    json& mine = out["ranks"][std::size_t(r)];
    mine["out"] = o.to_vector();
    mine["grad_q"] = lq.grad().to_vector();
    mine["grad_k"] = lk.grad().to_vector();
    mine["grad_v"] = lv.grad().to_vector();
    if (r == 0) out["counts"] = counts;
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: commtrace_cp_core IN.json OUT.json\n");
    return 2;
  }
  try {
    std::ifstream f(argv[1]);
    const json out = run(json::parse(f));
    std::ofstream(argv[2]) << out.dump();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "commtrace_cp_core: %s\n", e.what());
    return 1;
  }
  return 0;
}
