// A real NCCL program for the profiler plugin on a GPU machine (scripts/gpu_check.sh): one rank
// on GPU 0, ITERATIONS iterations of all_reduce, all_gather, reduce_scatter, broadcast and a
// grouped send/recv to itself, each iteration ended by commtrace_nccl_profiler_mark_iteration
// when NCCL_PROFILER_PLUGIN names the plugin's file. Exits non-zero naming the failed call.
//
// Usage: nccl_world1 [ITERATIONS] [ELEMENTS]
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                           \
  do {                                                                          \
    cudaError_t e = (x);                                                        \
    if (e != cudaSuccess) {                                                     \
      std::fprintf(stderr, "nccl_world1: %s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)
#define CHECK_NCCL(x)                                                           \
  do {                                                                          \
    ncclResult_t r = (x);                                                       \
    if (r != ncclSuccess) {                                                     \
      std::fprintf(stderr, "nccl_world1: %s: %s\n", #x, ncclGetErrorString(r)); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 3;
  const size_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (1u << 20);
  void (*mark)() = nullptr;
  if (const char* p = std::getenv("NCCL_PROFILER_PLUGIN")) {
    // NCCL has loaded (or will load) the plugin; the same file gives its iteration mark.
    if (void* lib = dlopen(p, RTLD_NOW | RTLD_LOCAL)) {
      mark = reinterpret_cast<void (*)()>(dlsym(lib, "commtrace_nccl_profiler_mark_iteration"));
    }
  }
  int dev = 0;
  CHECK_CUDA(cudaSetDevice(dev));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitAll(&comm, 1, &dev));
  float *a, *b;
  CHECK_CUDA(cudaMalloc(&a, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(a, 0, n * sizeof(float)));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  for (int it = 0; it < iterations; ++it) {
    CHECK_NCCL(ncclAllReduce(a, b, n, ncclFloat32, ncclSum, comm, s));
    CHECK_NCCL(ncclAllGather(a, b, n, ncclFloat32, comm, s));
    CHECK_NCCL(ncclReduceScatter(a, b, n, ncclFloat32, ncclSum, comm, s));
    CHECK_NCCL(ncclBroadcast(a, b, n, ncclFloat32, 0, comm, s));
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(a, n, ncclFloat32, 0, comm, s));
    CHECK_NCCL(ncclRecv(b, n, ncclFloat32, 0, comm, s));
    CHECK_NCCL(ncclGroupEnd());
    CHECK_CUDA(cudaStreamSynchronize(s));
    if (mark) mark();
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_NCCL(ncclCommFinalize(comm));
  CHECK_NCCL(ncclCommDestroy(comm));
  std::printf("nccl_world1: %d iterations of %zu floats done\n", iterations, n);
  return 0;
}
