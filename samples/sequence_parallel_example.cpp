// Sequence parallelism on PyTorch's ToyModel (pytorch/examples sequence_parallel_example.py):
// in_proj ColwiseParallel(input_layouts=Shard(0)), out_proj RowwiseParallel(output_layouts=
// Shard(0)); each rank holds its own 20 rows of an (80, 10) batch. Expect forward all_gather
// (in_proj input) + reduce_scatter (out_proj output), backward all_gather (out_proj output grad).
#include "samples/toy_example.h"

int main() {
  using namespace commtrace;
  auto in_proj = std::make_shared<ColwiseParallel>();
  in_proj->input_layout = Placement::shard(0);
  auto out_proj = std::make_shared<RowwiseParallel>();
  out_proj->output_layout = Placement::shard(0);
  Plan plan;
  plan.name = "sp";
  plan.styles = {{"in_proj", in_proj}, {"out_proj", out_proj}};
  return samples::run_toy_example("Sequence Parallel", plan, /*sharded_input=*/true);
}
