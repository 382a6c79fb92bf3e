// A user's own model on commtrace's modules, parallelized with the user's own sequence-parallel
// plan and traced: TinyNet (2 residual blocks of LayerNorm → Linear → GELU → Linear) on 4 ranks
// (threads), 3 training iterations, every rank's trace written to the file given.
// Usage: tiny_net_sp TRACE.json
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/nn/nn.h"
#include "parallel/nn/optim.h"
#include "parallel/plans/style.h"
#include "parallel/tensor/ops.h"
#include "report/trace_json.h"
#include "tracer/tracer.h"

using namespace commtrace;

namespace {

constexpr std::int64_t kDim = 32, kBatch = 2, kSeq = 8;

// x + down(gelu(up(norm(x)))).
class Block : public Module {
 public:
  Block(Generator& gen, const ModuleOptions& o) : Module("Block") {
    norm = register_module("norm", std::make_shared<LayerNorm>(kDim, o));
    up = register_module("up", std::make_shared<Linear>(kDim, 4 * kDim, true, gen, o));
    act = register_module("act", std::make_shared<GELU>());
    down = register_module("down", std::make_shared<Linear>(4 * kDim, kDim, true, gen, o));
  }
  Tensor forward(const Tensor& x) override { return add(x, (*down)((*act)((*up)((*norm)(x))))); }
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> up, down;
  std::shared_ptr<GELU> act;
};

class TinyNet : public Module {
 public:
  TinyNet(Generator& gen, const ModuleOptions& o) : Module("TinyNet") {
    block0 = register_module("block0", std::make_shared<Block>(gen, o));
    block1 = register_module("block1", std::make_shared<Block>(gen, o));
  }
  Tensor forward(const Tensor& x) override { return (*block1)((*block0)(x)); }
  std::shared_ptr<Block> block0, block1;
};

// Megatron-style sequence parallelism: activations sharded on the sequence (dim 1) between the
// blocks' matmuls; `up` gathers them, `down` reduce-scatters them back.
Plan sequence_parallel_plan() {
  auto up = std::make_shared<ColwiseParallel>();
  up->input_layout = Placement::shard(1);
  auto down = std::make_shared<RowwiseParallel>();
  down->output_layout = Placement::shard(1);
  Plan plan;
  plan.name = "tiny-sp";
  plan.styles = {{"*.norm", std::make_shared<SequenceParallel>()}, {"*.up", up}, {"*.down", down}};
  return plan;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s TRACE.json\n", argv[0]);
    return 2;
  }
  constexpr int kWorld = 4, kIters = 3;
  std::vector<Trace> traces(kWorld);
  std::mutex mu;
  try {
    launch(kWorld, [&](RankContext& ctx) {
      auto mesh = std::make_shared<DeviceMesh>(ctx, std::vector<int>{kWorld});
      Generator init(0);  // the same weights on every rank
      auto model = std::make_shared<TinyNet>(init, ModuleOptions{});
      parallelize_module(*model, mesh, sequence_parallel_plan());
      AdamW optimizer(model->parameters(), 1e-3);
      Tracer tracer(ctx.rank());
      for (int i = 0; i < kIters; ++i) {
        // This rank's slice of the sequence.
        Generator data(std::uint64_t(i * kWorld + ctx.rank()));
        const Tensor x = rand_uniform({kBatch, kSeq / kWorld, kDim}, -1.0, 1.0, data);
        {
          const TracerActivation on(tracer);
          sum((*model)(x)).backward();
          optimizer.step();
          optimizer.zero_grad();
        }
        tracer.next_iteration();
      }
      Trace t = tracer.take();
      t.metadata = {{"model", "TinyNet"},
                    {"plan", "tiny-sp"},
                    {"world_size", std::to_string(kWorld)},
                    {"iterations", std::to_string(kIters)}};
      std::lock_guard<std::mutex> lock(mu);
      traces[std::size_t(ctx.rank())] = std::move(t);
    });
    write_trace_file(argv[1], traces);
  } catch (const Error& e) {
    std::fprintf(stderr, "tiny_net_sp: %s\n", e.what());
    return 1;
  }
  std::printf("wrote %s: TinyNet, plan tiny-sp, %d ranks, %d iterations\n", argv[1], kWorld,
              kIters);
  return 0;
}
