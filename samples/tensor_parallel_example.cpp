// Tensor parallelism on PyTorch's ToyModel (pytorch/examples tensor_parallel_example.py):
// in_proj ColwiseParallel, out_proj RowwiseParallel. Expect one all_reduce per iteration, in
// out_proj's forward (its Partial output becomes Replicate).
#include "samples/toy_example.h"

int main() {
  using namespace commtrace;
  Plan plan;
  plan.name = "tp";
  plan.styles = {{"in_proj", std::make_shared<ColwiseParallel>()},
                 {"out_proj", std::make_shared<RowwiseParallel>()}};
  return samples::run_toy_example("Tensor Parallel", plan, /*sharded_input=*/false);
}
