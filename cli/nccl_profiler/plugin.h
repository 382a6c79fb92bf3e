// What libcommtrace_nccl_profiler.so exports besides NCCL's `ncclProfiler_v5`: calls a program
// may make (through dlsym, or by linking the library) to shape its trace. C linkage.
#pragma once

#define COMMTRACE_NCCL_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

// Writes this rank's trace file now (COMMTRACE_NCCL_TRACE); 0 on success, -1 when the file
// cannot be written (the reason is printed on stderr). The file is also written at exit and when
// the last communicator is finalized.
COMMTRACE_NCCL_EXPORT int commtrace_nccl_profiler_dump(void);

// Ends the current iteration: later calls belong to the next one (as torch.profiler's
// prof.step()). Without marks the whole run is one iteration.
COMMTRACE_NCCL_EXPORT void commtrace_nccl_profiler_mark_iteration(void);

#ifdef __cplusplus
}
#endif
