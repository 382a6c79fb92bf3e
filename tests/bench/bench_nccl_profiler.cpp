// The NCCL profiler plugin's cost per recorded call, through the entry table NCCL calls
// (dlopen of libcommtrace_nccl_profiler.so, as NCCL loads it): a collective's host events alone,
// and with its kernel channel events (started, stopped with their GPU times, as NCCL's proxy
// thread reports them). Time per iteration is the cost of one recorded call; each benchmark runs
// a fixed number of calls, every one kept in the trace. Run: build/tests/bench/bench_nccl_profiler
// [PLUGIN.so]
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/nccl_profiler/abi_v5.h"

using namespace commtrace::nccl_abi;

namespace {

const Profiler* plugin = nullptr;
void* comm = nullptr;

void BM_CollCall(benchmark::State& state) {
  const int channels = int(state.range(0));
  EventDescr d{};
  d.type = kProfileColl;
  d.coll.func = "AllReduce";
  d.coll.count = 1 << 20;
  d.coll.datatype = "ncclBfloat16";
  d.coll.nChannels = std::uint8_t(channels);
  EventDescr k{};
  k.type = kProfileKernelCh;
  EventStateArgs a{};
  std::uint64_t t = 0;
  for (auto _ : state) {
    void* h = nullptr;
    plugin->startEvent(comm, &h, &d);
    k.parentObj = h;
    for (int c = 0; c < channels; ++c) {
      void* kh = nullptr;
      k.kernelCh.channelId = std::uint8_t(c);
      k.kernelCh.pTimer = t;
      plugin->startEvent(comm, &kh, &k);
      a.kernelCh.pTimer = t + 1000;
      plugin->recordEventState(kh, kKernelChStop, &a);
      plugin->stopEvent(kh);
    }
    plugin->stopEvent(h);
    t += 2000;
  }
}
BENCHMARK(BM_CollCall)->Arg(0)->Arg(1)->Arg(8)->Iterations(300000);

void log_fn(int, unsigned long, const char*, int, const char*, ...) {}

}  // namespace

int main(int argc, char** argv) {
  std::string path = BENCH_PLUGIN_PATH;
  if (argc > 1 && argv[1][0] != '-') path = argv[1], --argc, ++argv;
  // Every call is recorded (no cap); the file written at exit goes to a temporary folder.
  char dir[] = "/tmp/commtrace-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  const std::string file = std::string(dir) + "/trace.json";
  setenv("COMMTRACE_NCCL_TRACE", file.c_str(), 1);
  setenv("COMMTRACE_NCCL_MAX_CALLS", "100000000", 1);
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "bench_nccl_profiler: %s\n", dlerror());
    return 1;
  }
  plugin = static_cast<const Profiler*>(dlsym(lib, "ncclProfiler_v5"));
  int mask = 0;
  if (!plugin || plugin->init(&comm, 42, &mask, "tp", 1, 8, 0, log_fn) != kSuccess) return 1;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  plugin->finalize(comm);  // writes the trace: the write is part of what a run pays once
  std::remove(file.c_str());
  rmdir(dir);
  return 0;
}
