// Internal to tracer/: NVTX ranges, so an Nsight Systems timeline shows the module tree and the
// phases of a traced run. Compiled in where the CUDA toolkit's header-only NVTX 3 is found
// (COMMTRACE_HAVE_NVTX); without a profiler attached a range costs a call through a no-op
// pointer. Elsewhere these do nothing.
#pragma once

#ifdef COMMTRACE_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

#include <cstdlib>

namespace commtrace::nvtx {

// True when a tool (Nsight Systems) is injected through NVTX_INJECTION64_PATH, as NVTX itself
// decides on its first call; without one every range is a no-op, which callers may then skip.
inline bool attached() {
#ifdef COMMTRACE_HAVE_NVTX
  return std::getenv("NVTX_INJECTION64_PATH") != nullptr;
#else
  return false;
#endif
}

// Ranges nest per thread: every push is matched by a pop on the same thread.
inline void push(const char* name) {
#ifdef COMMTRACE_HAVE_NVTX
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

inline void pop() {
#ifdef COMMTRACE_HAVE_NVTX
  nvtxRangePop();
#endif
}

}  // namespace commtrace::nvtx
