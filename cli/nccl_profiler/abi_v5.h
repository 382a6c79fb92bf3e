// NCCL's profiler plugin interface, version 5 (NCCL 2.28), declared here as NCCL asks plugins to
// (ext-profiler/README.md, "Headers management"): the plugin builds without NCCL's headers or
// CUDA. Only layouts and values matter to the ABI; they follow NCCL's profiler_v5.h field by
// field. NCCL looks up the symbol `ncclProfiler_v5` (a Profiler) in the loaded library.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace commtrace::nccl_abi {

enum Result : int {
  kSuccess = 0,
  kInternalError = 3,  // from init: NCCL disables the plugin
};

// NCCL's logger: (level, subsystem flags, file, line, printf format, ...). Levels: 2 warn,
// 3 info.
using Logger = void (*)(int level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...);

// Event types (the eActivationMask bits and EventDescr::type).
enum : std::uint64_t {
  kProfileGroup = 1 << 0,
  kProfileColl = 1 << 1,  // a collective of a kernel plan: its host enqueue (start to stop)
  kProfileP2p = 1 << 2,
  kProfileProxyOp = 1 << 3,
  kProfileProxyStep = 1 << 4,
  kProfileProxyCtrl = 1 << 5,
  kProfileKernelCh = 1 << 6,  // one channel of a Coll/P2p's kernel; parentObj is that event
  kProfileNetPlugin = 1 << 7,
  kProfileGroupApi = 1 << 8,
  kProfileCollApi = 1 << 9,
  kProfileP2pApi = 1 << 10,
  kProfileKernelLaunch = 1 << 11,
};

// recordEventState's states; only this one is read here.
enum EventState : int { kKernelChStop = 22 };

struct EventDescr {
  std::uint64_t type;
  void* parentObj;  // the parent event's handle, as this plugin returned it
  int rank;
  union {
    struct {
      int graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      std::size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      std::size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      std::uint64_t seqNumber;  // per function and communicator
      const char* func;         // "AllReduce", "AllGather", "ReduceScatter", "AlltoAll", ...
      const void* sendBuff;
      void* recvBuff;
      std::size_t count;  // elements per rank: AllGather's send, ReduceScatter's receive count
      int root;
      const char* datatype;  // "ncclFloat32", "ncclBfloat16", ...
      std::uint8_t nChannels;
      std::uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;  // "Send", "Recv"
      void* buff;
      const char* datatype;
      std::size_t count;
      int peer;  // rank in the communicator
      std::uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;
      std::uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      std::uint8_t channelId;
      std::uint64_t pTimer;  // the kernel's start on this channel: GPU globaltimer, ns
    } kernelCh;
    struct {
      std::int64_t id;
      void* data;
    } netPlugin;
  };
};

union EventStateArgs {
  struct {
    std::size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    std::uint64_t pTimer;  // kKernelChStop: the kernel's end on this channel (globaltimer, ns)
  } kernelCh;
};

struct Profiler {
  const char* name;
  Result (*init)(void** context, std::uint64_t commId, int* eActivationMask, const char* commName,
                 int nNodes, int nranks, int rank, Logger logfn);
  Result (*startEvent)(void* context, void** eHandle, EventDescr* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, EventState eState, EventStateArgs* eStateArgs);
  Result (*finalize)(void* context);
};

}  // namespace commtrace::nccl_abi
