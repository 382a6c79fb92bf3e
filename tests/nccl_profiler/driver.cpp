// Drives libcommtrace_nccl_profiler.so as NCCL does, through the symbol NCCL looks up: per
// communicator init, Coll and P2p events started and stopped on the calling thread, their kernel
// channel events on a second thread (NCCL's proxy thread), finalize. The scenario is an SPMD
// rank of a 4-rank job with a 2-rank sub-communicator, so the ranks' files merge and agree.
//
// Usage: nccl_profiler_driver PLUGIN.so RANK ITERATIONS [bad]
//   bad: also feed calls NCCL never makes (null descriptors and handles, unknown event types and
//        functions, a finalize of an unknown context); the plugin must ignore them.
// Exits 0 after the last finalize (which writes the trace file), 1 when the plugin misbehaves.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cli/nccl_profiler/abi_v5.h"

using namespace commtrace::nccl_abi;

namespace {

const Profiler* plugin = nullptr;

#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "driver: %s failed at line %d\n", #cond, __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// One call: host enqueue on this thread, then `channels` kernel channel events on another
// thread (start at gpu_t, 1000 ns apart, each 2000 ns long).
void coll(void* comm, const char* func, std::size_t count, const char* type, int channels,
          std::uint64_t gpu_t, int root = 0) {
  EventDescr d{};
  d.type = kProfileColl;
  d.coll.func = func;
  d.coll.count = count;
  d.coll.datatype = type;
  d.coll.root = root;
  d.coll.nChannels = std::uint8_t(channels);
  void* h = nullptr;
  EXPECT(plugin->startEvent(comm, &h, &d) == kSuccess);
  std::thread proxy([&] {
    for (int c = 0; c < channels && h; ++c) {
      EventDescr k{};
      k.type = kProfileKernelCh;
      k.parentObj = h;
      k.kernelCh.channelId = std::uint8_t(c);
      k.kernelCh.pTimer = gpu_t + 1000 * c;
      void* kh = nullptr;
      EXPECT(plugin->startEvent(comm, &kh, &k) == kSuccess);
      EXPECT(kh != nullptr);
      EventStateArgs a{};
      a.kernelCh.pTimer = gpu_t + 1000 * c + 2000;
      EXPECT(plugin->recordEventState(kh, kKernelChStop, &a) == kSuccess);
      EXPECT(plugin->stopEvent(kh) == kSuccess);
    }
  });
  // NCCL stops the host event once the kernel is enqueued: here before or after the channels.
  if (channels % 2 == 0) proxy.join();
  if (h) EXPECT(plugin->stopEvent(h) == kSuccess);
  if (proxy.joinable()) proxy.join();
}

void p2p(void* comm, const char* func, int peer, std::size_t count) {
  EventDescr d{};
  d.type = kProfileP2p;
  d.p2p.func = func;
  d.p2p.count = count;
  d.p2p.datatype = "ncclFloat32";
  d.p2p.peer = peer;
  void* h = nullptr;
  EXPECT(plugin->startEvent(comm, &h, &d) == kSuccess);
  EXPECT(h != nullptr);
  EXPECT(plugin->stopEvent(h) == kSuccess);
}

void log_fn(int, unsigned long, const char*, int, const char*, ...) {}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s PLUGIN.so RANK ITERATIONS [bad]\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "driver: %s\n", dlerror());
    return 1;
  }
  plugin = static_cast<const Profiler*>(dlsym(lib, "ncclProfiler_v5"));
  EXPECT(plugin && std::strcmp(plugin->name, "commtrace") == 0);
  auto mark = reinterpret_cast<void (*)()>(dlsym(lib, "commtrace_nccl_profiler_mark_iteration"));
  EXPECT(mark != nullptr);
  EXPECT(dlsym(lib, "commtrace_nccl_profiler_dump") != nullptr);
  EXPECT(dlsym(lib, "_ZN9commtrace5ErrorD0Ev") == nullptr);  // commtrace's symbols stay local

  const int rank = std::atoi(argv[2]);
  const int iterations = std::atoi(argv[3]);
  const bool bad = argc > 4 && std::strcmp(argv[4], "bad") == 0;
  void* world = nullptr;
  void* tp = nullptr;
  int mask = 0;
  EXPECT(plugin->init(&world, 0xabcdef, &mask, "", 1, 4, rank, log_fn) == kSuccess);
  EXPECT(world != nullptr);
  EXPECT((mask & kProfileColl) && (mask & kProfileP2p));
  EXPECT(plugin->init(&tp, 0x100 + rank / 2, &mask, "", 1, 2, rank % 2, log_fn) == kSuccess);
  if (bad) {
    void* x = nullptr;
    EXPECT(plugin->init(&x, 1, &mask, "", 1, 2, 5, log_fn) == kInternalError);  // rank >= nranks
    void* h = &h;
    EXPECT(plugin->startEvent(world, &h, nullptr) == kSuccess && h == nullptr);
    EventDescr d{};
    d.type = kProfileProxyStep;
    EXPECT(plugin->startEvent(world, &h, &d) == kSuccess && h == nullptr);
    d.type = kProfileColl;  // no function name, no datatype
    EXPECT(plugin->startEvent(world, &h, &d) == kSuccess && h == nullptr);
    d.type = kProfileKernelCh;  // a channel of no call
    d.parentObj = &d;
    EXPECT(plugin->startEvent(world, &h, &d) == kSuccess && h == nullptr);
    EXPECT(plugin->stopEvent(nullptr) == kSuccess);
    EXPECT(plugin->recordEventState(nullptr, kKernelChStop, nullptr) == kSuccess);
    EXPECT(plugin->finalize(&d) == kSuccess);
    coll(world, "Reduce", 64, "ncclFloat32", 0, 0);  // no row: counted, not recorded
  }
  for (int it = 0; it < iterations; ++it) {
    const std::uint64_t t = 1000000ull * (it + 1);
    coll(tp, "AllReduce", 1024, "ncclFloat32", 2, t);           // 4 KiB, 3 µs on the GPU
    coll(tp, "AllGather", 256, "ncclBfloat16", 1, t + 10000);   // 1 KiB gathered
    coll(world, "ReduceScatter", 128, "ncclFloat32", 0, 0);     // 2 KiB scattered
    coll(world, "Broadcast", 8, "ncclInt64", 3, t + 20000, 2);  // 64 B from rank 2
    p2p(world, "Send", (rank + 1) % 4, 32);
    p2p(world, "Recv", (rank + 3) % 4, 32);
    mark();
  }
  EXPECT(plugin->finalize(tp) == kSuccess);
  EXPECT(plugin->finalize(world) == kSuccess);  // the last: writes the file
  return 0;
}
