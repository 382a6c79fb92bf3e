// Memory per rank from a traced run: the ledger's charges (cpu storage, or meta's logical sizes),
// the activations forward leaves for backward per module, and the parameters, gradients and
// AdamW state per module, checked by hand on the toy model and against each other across plans,
// devices and FSDP.
#include <string>

#include "kernels/backend.h"

#include "parallel/run/runner.h"
#include "parallel/tensor/memory.h"
#include "parallel/tensor/tensor.h"
#include "report/trace_json.h"
#include "report/tree.h"
#include "tests/catch_compat.h"
#include "tests/test_util.h"

using namespace commtrace;
using commtrace::testing::contains;
using commtrace::testing::error_of;

namespace {

Trace traced(const std::string& model, const std::string& plan, int world,
             const char* backend = "threads", Device device = Device::CPU,
             std::vector<int> mesh = {}, const char* dp = "ddp") {
  TraceOptions o;
  o.cfg.model = model;
  o.cfg.plan = plan;
  o.cfg.world_size = world;
  o.cfg.backend = backend;
  o.cfg.module.device = device;
  o.cfg.mesh = mesh;
  o.cfg.data_parallel = dp;
  return trace_run(o).at(0);
}

const ModuleMemory& of(const Trace& t, const std::string& fqn) {
  const int m = t.find_module(fqn);
  REQUIRE(m >= 0);
  REQUIRE(t.memory.size() == t.modules.size());
  return t.memory[std::size_t(m)];
}

}  // namespace

TEST_CASE("memory: the ledger charges allocations and discharges the last holder", "[memory]") {
  MemoryLedger mem;
  Tensor kept;
  {
    MemoryActivation on(mem);
    mem.begin_iteration();
    kept = Tensor::empty({4, 8});  // 128 B
    Tensor view = kept.detach();   // shares the charge
    { Tensor gone = Tensor::empty({10}); }
    Tensor meta = Tensor::empty({1000}, DType::BF16, Device::Meta);  // 2000 B that would be
    mem.mark_forward_end();
    REQUIRE(mem.saved_by_module().at(0) == 128 + 2000);
  }
  REQUIRE(mem.iteration_peak() == 128 + 2000);  // the 40 B were gone before the meta tensor
  Tensor outside = Tensor::empty({100});        // no ledger active: not charged
  REQUIRE(outside.impl()->charge == nullptr);
  mem.begin_iteration();
  mem.mark_forward_end();
  REQUIRE(mem.saved_by_module().at(0) == 0);  // kept is from the iteration before
}

TEST_CASE("memory: the toy model at TP 4, by hand", "[memory]") {
  const Trace t = traced("toy", "tp", 4);
  // in_proj: Colwise weight (8, 10) and bias (8) of f32 per rank; out_proj: Rowwise weight
  // (5, 8) and the replicated bias (5).
  CHECK(of(t, "ToyModel.in_proj") == ModuleMemory{352, 352, 704, 640});   // saves (20, 8)
  CHECK(of(t, "ToyModel.relu") == ModuleMemory{0, 0, 0, 640});            // its (20, 8) output
  CHECK(of(t, "ToyModel.out_proj") == ModuleMemory{180, 180, 360, 400});  // (20, 5) all-reduced
  const ModuleMemory total = memory_total(t);
  CHECK(total.params == 532);
  CHECK(total.optimizer == 1064);
  CHECK(memory_peak(t) >= total.params + total.optimizer + total.activations);
  const std::string s = render_memory(t);
  CHECK(s.find("      ToyModel.in_proj         352 B        352 B        704 B        640 B") !=
        std::string::npos);
  // Written and read back (trace 2.1).
  const Trace back = read_trace_json(trace_json_string({t}), "t.json").at(0);
  CHECK(back.memory == t.memory);
  CHECK(back.memory_peak == t.memory_peak);
}

TEST_CASE("memory: SP saves activations over TP, and meta gives the cpu run's figures",
          "[memory]") {
  const Trace tp = traced("transformer", "tp", 4), sp = traced("transformer", "sp", 4);
  CHECK(memory_total(sp).params == memory_total(tp).params);
  CHECK(memory_total(sp).activations < memory_total(tp).activations);
  const Trace meta = traced("transformer", "sp", 4, "fake", Device::Meta);
  CHECK(meta.memory == sp.memory);
}

TEST_CASE("memory: FSDP stores a dp chunk of each parameter", "[memory]") {
  const Trace ddp = traced("decoder", "tp", 4, "threads", Device::CPU, {2, 2});
  const Trace fsdp = traced("decoder", "tp", 4, "threads", Device::CPU, {2, 2}, "fsdp");
  const ModuleMemory d = memory_total(ddp), f = memory_total(fsdp);
  CHECK(f.params < d.params);
  CHECK(f.params * 2 >= d.params);  // half, padded up
  CHECK(f.optimizer == 2 * f.params);
}

TEST_CASE("memory: a cpu run too large for the host limit fails before it allocates", "[memory]") {
  // The preflight's figure is the meta run's peak per rank (parameters, optimizer, one step).
  const Trace meta = traced("transformer", "tp", 2, "fake", Device::Meta);
  const std::uint64_t per_rank = memory_peak(meta), held = host_memory_held();
  REQUIRE(per_rank > 0);
  TraceOptions o;
  o.cfg.model = "transformer";
  o.cfg.plan = "tp";
  o.cfg.world_size = 2;
  struct Unlimit {
    ~Unlimit() { set_host_memory_limit(0); }
  } unlimit;
  set_host_memory_limit(held + per_rank);  // one rank's worth, for two threads' ranks
  const Error e = error_of([&] { trace_run(o); });
  CHECK(e.code() == ErrorCode::Backend);
  CHECK(contains(e.what(), "transformer on cpu: "));
  CHECK(contains(e.what(), "(rank 0's peak, measured shape-only) for 2 ranks in this process"));
  CHECK(host_memory_held() == held);  // refused up front: nothing was allocated
  o.cfg.backend = "fake";             // runs rank 0 alone: fits, with a little slack (its batch)
  set_host_memory_limit(held + per_rank + per_rank / 4);
  CHECK(trace_run(o).size() == 1);
  // The estimate is not far below what the run holds: with 1/4 slack both ranks run.
  o.cfg.backend = "threads";
  set_host_memory_limit(held + 2 * per_rank + per_rank / 2);
  CHECK(trace_run(o).size() == 1);
  // verify counts no optimizer state, but the reference step and the values it compares.
  CHECK(rank_peak_bytes(o.cfg, false) < rank_peak_bytes(o.cfg, true));
  set_host_memory_limit(held + per_rank);
  const Error v = error_of([&] { verify(o.cfg); });
  CHECK(v.code() == ErrorCode::Backend);
  CHECK(contains(v.what(), "verify transformer on cpu: "));
  CHECK(contains(v.what(), " of compared values would hold "));
  INFO(v.what());
  set_host_memory_limit(held + 4 * per_rank);
  CHECK(verify(o.cfg).pass());
}
