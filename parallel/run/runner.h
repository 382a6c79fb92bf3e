// Running a zoo model in parallel: per rank, the mesh (named dims dp, cp, tp; see MeshDims), the
// model parallelized by a plan on the "tp" dim, a context-parallel family on "cp", this rank's
// slice of the global batch, the loss (on DTensors when the plan leaves the output sharded), and
// DDP's gradient all_reduce over "dp". verify() compares one such run with the same model on one
// device.
#pragma once

#include <functional>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/nn/models.h"
#include "parallel/plans/fsdp.h"
#include "parallel/plans/style.h"

namespace commtrace {

struct ParallelConfig {
  std::string model = "toy";
  std::string plan = "tp";  // a built-in plan name or a plan JSON file
  int world_size = 1;
  std::vector<int> mesh;  // empty: {world_size}; {dp, tp} for a 2-D mesh
  bool input_requires_grad = false;
  std::uint64_t seed = 0;
  ModuleOptions module;             // dtype and device of parameters and batch
  std::string backend = "threads";  // threads, fake (run only), mpi (one process per rank)
  double timeout_s = 60.0;          // threads, mpi: longest wait for the other ranks of a group
  // DDP's bucket cap in MiB (bucket_cap_mb); 0: PyTorch's default, a first bucket of 1 MiB and
  // then 25 MiB. Negative: one all_reduce per gradient (no buckets).
  double ddp_bucket_mb = 0;
  // The dp dim of a 2-D mesh: "ddp" (replicas, gradients all-reduced in buckets) or "fsdp"
  // (FSDP2's fully_shard per block and on the root; parallel/plans/fsdp.h).
  std::string data_parallel = "ddp";
  bool reshard_after_forward = true;  // fsdp: free after forward, all-gather again for backward
  // Replaces the plan's context_parallel (plans/context.h): a program picks a family's options,
  // or a deliberate fault, without a plan file.
  std::optional<ContextParallel> context_parallel;
};

// The config's plan, resolved for its model, with the config's context_parallel applied.
Plan config_plan(const ParallelConfig& cfg);
// Errors naming the problem when cfg's device cannot run here: meta moves no data (fake backend
// only); cuda needs this build's CUDA backend, a visible device and a backend that moves device
// buffers (threads, or fake).
void check_device(const ParallelConfig& cfg);
// The bytes of tensor storage rank 0 of cfg holds at its peak, measured shape-only (meta, fake
// backend): parameters, one training step's allocations and, with_optimizer, AdamW's state.
std::uint64_t rank_peak_bytes(const ParallelConfig& cfg, bool with_optimizer = true);
// On cpu, fails fast (Backend, the allocator's message) when `ranks_here` ranks of cfg in this
// process, each at rank_peak_bytes(cfg), would not fit the host memory limit
// (kernels/backend.h). An estimate (rank 0 for every rank): the allocator's check still holds the
// line. Nothing on other devices.
void check_host_memory(const ParallelConfig& cfg, int ranks_here);

// The mesh shape of a config (1 to 3 dims), checked against the world size (and a 2-D one for
// fsdp).
std::vector<int> mesh_shape(const ParallelConfig& cfg);

// The named dims of a run's mesh, by what the plan holds: styles alone, "tp" or "dp" × "tp"; a
// context-parallel family alone, "cp" or "dp" × "cp"; both, "cp" × "tp" or "dp" × "cp" × "tp"
// (the family on cp, the styles on tp, DDP on dp). A size is 1 where its dim is absent.
// InvalidArgument when the mesh's dims do not fit the plan.
struct MeshDims {
  int dp = 1, cp = 1, tp = 1;
  std::vector<std::string> names;  // one per mesh dim
};
MeshDims mesh_dims(const ParallelConfig& cfg, const Plan& plan);

// DDP's gradient buckets, as torch.nn.parallel.DistributedDataParallel forms them: the first
// iteration all-reduces every gradient in one bucket per dtype while recording the order in
// which gradients become ready; from the second on, buckets follow that order, each closed once
// it reaches its cap (the first bucket's cap, then the others').
struct DdpBuckets {
  double cap_mb = 0;  // ParallelConfig::ddp_bucket_mb
  bool rebuilt = false;
  std::vector<const TensorImpl*> ready;  // parameters in gradient-ready order
  std::vector<std::vector<const TensorImpl*>> buckets;
};

struct RankState {
  std::shared_ptr<DeviceMesh> mesh;  // the full mesh
  std::shared_ptr<DeviceMesh> tp;    // the plan's 1-D mesh
  // With the plan's context_parallel: the sequence's mesh dim "cp" (then also the plan's mesh).
  std::shared_ptr<DeviceMesh> cp;
  Communicator* dp = nullptr;  // the data-parallel group of a 2-D mesh
  const ModelEntry* entry = nullptr;
  Plan plan;
  std::shared_ptr<Module> model;
  Batch batch;  // this rank's slice; batch.input requires grad when asked (floating inputs)
  DdpBuckets ddp;
  std::shared_ptr<FullyShard> fsdp;   // set with data_parallel "fsdp"
  std::vector<std::string> warnings;  // what parallelize_module reported (untied weights)
};

// What the optimizer steps: the parameters, or FSDP's sharded chunks of them.
std::vector<Tensor> optimizer_parameters(const RankState& s);

// A parameter's gradient after finish_backward(), whole over "dp" (FSDP's chunks gathered, an
// untraced all_gather): a DTensor on the plan's mesh when the parameter is one.
Tensor parameter_grad(const RankState& s, const std::string& name, const Tensor& param);

// The global batch's rows per model batch: dp, times tp when the plan's input is Shard(0) (a
// context-parallel plan shards the sequence, not the rows). InvalidArgument for another input.
std::int64_t global_rows_scale(const Plan& plan, int dp, int tp);

// Builds the model from cfg.seed (identical on every rank), parallelizes it and slices the
// global batch: over "dp" along dim 0, then over "tp" when the plan's input is Shard(0), or
// along the sequence (dim 1) over "cp" with a context-parallel plan.
RankState setup_rank(RankContext& ctx, const ParallelConfig& cfg);

struct StepOut {
  Tensor output;  // the model's output, as a DTensor when the plan leaves it sharded
  Tensor loss;    // scalar; a DTensor (Partial) when computed on a sharded output
};
StepOut forward_loss(RankState& s);

// DDP: every parameter gradient averaged over "dp", bucket by bucket (DdpBuckets; recorded in
// the backward phase).
void sync_data_parallel_grads(RankState& s);

// With the plan's coalesce_partial_grads: every Partial(sum) gradient all-reduced over the plan's
// mesh in one call, left Replicate (recorded in the backward phase).
void coalesce_partial_grads(RankState& s);

// With a context-parallel plan: every parameter gradient reduced over "cp" in one flat
// all_reduce (the plan's param_grad_reduction; recorded in the backward phase).
void sync_context_parallel_grads(RankState& s);

// After loss.backward(): the plan's coalesced gradients, the context-parallel reduction, then
// DDP's all_reduces or FSDP's outstanding reduce_scatters.
void finish_backward(RankState& s);

class Optimizer;
// One training iteration: zero_grad, forward and loss, backward, finish_backward, the optimizer
// step.
// Returns the loss (this rank's view).
class MemoryLedger;
// With `mem`, its forward-end snapshot (the activations saved for backward) is taken between
// the loss and backward.
Tensor train_step(RankState& s, Optimizer& opt, MemoryLedger* mem = nullptr);

// The rank's memory per module of trace t (an index of t.modules): parameters as stored (FSDP:
// the padded local chunks), their gradients, AdamW's two moments, and the activations `mem`
// saw forward leave for backward.
std::vector<ModuleMemory> module_memory(const RankState& s, const Trace& t,
                                        const MemoryLedger& mem);

// Gathers x (plain or DTensor, a slice of dim 0 over "dp" when `dp_sliced`) to the full tensor.
Tensor gather_full(RankState& s, const Tensor& x, bool dp_sliced);

struct TraceOptions {
  ParallelConfig cfg;
  int iters = 1;
  std::vector<int> ranks;  // ranks to trace; empty: rank 0 only
  double lr = 1e-3;        // AdamW
  TimingPolicy timing;     // which repeated iterations the tracers time
  // Called after each iteration (done, of iters) by the first traced rank, on its thread.
  std::function<void(int, int)> on_iteration;
};

// Runs opts.iters training iterations (forward, loss, backward, DDP, AdamW step) on every rank
// (the fake backend runs only the traced ones) and returns the traced ranks' traces, with the
// run's metadata: those this process ran (with one process per rank, its own rank's, if
// traced). The losses (rank 0's view, on the process that runs rank 0) go to `losses`.
std::vector<Trace> trace_run(const TraceOptions& opts, std::vector<double>* losses = nullptr);

struct TensorCheck {
  std::string name;        // "output", "in_proj.weight.grad", "input.grad"
  double max_rel_err = 0;  // max |a - b| / max |b|
  bool pass = false;
  std::string factor;  // when a FAIL is a constant multiple of the reference: "×4 (world size)"
};

struct VerifyReport {
  bool reported = true;  // false on the processes other than rank 0's (mpi): nothing compared
  std::vector<TensorCheck> checks;
  bool pass() const;
  std::string note;  // e.g. why --input-requires-grad had no effect
};

// verify's tolerance when none is given: 1e-5 for f32 and f64; 5e-2 for bf16, whose 8-bit mantissa
// (relative step 2^-8) makes the parallel and single-device runs differ by up to ~1.3e-2 on the zoo
// at world 2 and 4 from the order of their sums alone; 1e-2 for f32 GEMMs in TF32 (10-bit
// mantissa inputs, four times bf16's precision). In f32 at least world_size × 2^-23: a sum over n
// ranks in rank order may be off by (n − 1)·2^-24 of its terms' magnitude (the toy at 4096 ranks
// differs by 5.6e-5), so past 83 ranks the bound grows with the world.
double default_tolerance(DType dt, bool tf32, int world_size = 1);

// Runs cfg on its backend (threads, or mpi: one process per rank) and on one device (same seed
// and batch); compares the output and every parameter's gradient (and the input's, when asked)
// after one forward + backward. With mpi, the process of rank 0 reports; the others return a
// report with `reported` false.
VerifyReport verify(const ParallelConfig& cfg, double tolerance = 1e-5);

}  // namespace commtrace
