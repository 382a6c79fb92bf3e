// PyTorch profiler traces in: the Chrome-trace JSON that torch.profiler writes
// (export_chrome_trace or tensorboard_trace_handler, one file per rank, plain or gzipped) read
// into commtrace traces, so that show, diff, check and --rank all work on a real PyTorch job.
//
// Collectives: every `record_param_comms` event (NCCL and the backends that record it: name,
// element counts, dtype, group size and description, sequence number), and the backend ops
// `c10d::allreduce_`, `c10d::_allgather_base_`, ... that contain none (gloo on the CPU: element
// counts and shapes from record_shapes, the dtype from the `_c10d_functional::` op around a
// TensorList, the group from distributedInfo when the run has one process group).
// Iterations: the `ProfilerStep#N` ranges; a trace without any is one iteration.
// Phases: inside `Optimizer.step#...` / `Optimizer.zero_grad#...`, optimizer; inside an
// `autograd::engine::evaluate_function: ...` range, backward; else forward.
// Modules, where the trace names them:
//   - `module: <FQN> (<Type>)` ranges (record_function, e.g. opened by forward pre-hooks and
//     closed by forward hooks; samples/python/annotate_modules.py) give commtrace's module tree;
//   - else `nn.Module: <Class>_<k>` ranges (with_stack=True) give a tree of instance names
//     (`Toy_0.Linear_1`), which are not FQNs;
//   - else every collective is filed under Global.
//   A forward collective belongs to the innermost module range around it. A backward one belongs
//   to the module whose forward created its autograd node (DESIGN §1): the forward op with the
//   evaluate_function range's "Sequence number". Optimizer collectives belong to Global.
// The trace's metadata and the import's notes say which of these the files allowed.
#pragma once

#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

struct KinetoImport {
  std::vector<Trace> traces;       // one per rank, by rank
  std::vector<std::string> notes;  // what the traces could not tell, and what was skipped
};

// `paths`: files, or folders whose *.json and *.json.gz files are read (sorted by name). Each
// file is one rank (distributedInfo.rank; files without it take their position). Throws
// InvalidArgument naming the file and the event on malformed input, and on two files of one
// rank or ranks that disagree on the world size or the iteration count.
KinetoImport import_kineto(const std::vector<std::string>& paths);

// One file's bytes (plain or gzip-compressed JSON; tests, fuzzing): its trace, with `position`
// as its rank when it names none. Notes are appended to `notes` when given.
Trace read_kineto_trace(const std::string& bytes, const std::string& source, int position,
                        std::vector<std::string>* notes = nullptr);

}  // namespace commtrace
