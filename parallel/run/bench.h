// Benchmarks a user can run (commtrace bench): the cost of tracing on a real training step
// (the same step untraced and traced, interleaved in one run, medians over rounds), and the
// threads backend's all_reduce bus bandwidth against a memcpy of the same bytes on this machine,
// with the bound the backend's data movement sets. Timings are ratios measured in one run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/run/runner.h"
#include "tracer/tracer.h"

namespace commtrace {

struct StepBenchOptions {
  ParallelConfig cfg;           // model, plan, world size, mesh, backend, device
  int steps = 40;               // traced steps per round (each beside an untraced one)
  int rounds = 15;              // rounds, each on a new tracer
  bool trace_all_ranks = true;  // false: rank 0 only (run's default)
  TimingPolicy timing;          // the tracer's timing sample
};

// A round runs `steps` pairs of steps, one traced and one untraced in turn (which first alternates
// by round), so the machine's drift hits both alike; the traced steps are consecutive iterations
// of one tracer. Its steps fall in three kinds: a new tracer's first iteration (which interns
// everything it sees), the repeats it times, and the repeats it does not time (each event only
// compared with the record at its position): a long run is almost all of the last kind.
struct StepBenchResult {
  struct Kind {
    double untraced_s = 0, traced_s = 0;  // medians of the kind's steps
    double ratio = 0;                     // median of its pairs' traced / untraced
    std::uint64_t steps = 0;              // traced steps of the kind (rank 0, all rounds)
  };
  double untraced_s = 0, traced_s = 0;           // medians of all steps
  double ratio = 0, ratio_q1 = 0, ratio_q3 = 0;  // the rounds' traced / untraced: median, quartiles
  Kind first, timed, untimed;
  // Rank 0's thread's CPU seconds per step (medians): its waits for the other ranks excluded (on
  // the threads backend, where the ranks share the cores, the wall time is largely the
  // scheduler's).
  double untraced_cpu_s = 0, traced_cpu_s = 0;
  std::uint64_t events_per_step = 0;  // records per traced rank and step
  int traced_ranks = 0;
  std::size_t record_bytes = 0;    // a stored record, its arguments and its share of the tables
  std::size_t stored_records = 0;  // of the last round (identical iterations folded)
  std::uint64_t recorded_events = 0;
  double ratio_cpu() const { return ratio_of(traced_cpu_s, untraced_cpu_s); }
  // traced / untraced; 0 when nothing untraced was measured.
  static double ratio_of(double traced, double untraced) {
    return untraced > 0 ? traced / untraced : 0.0;
  }
  // What tracing adds per event of one rank's stream, from a ratio and the untraced step:
  // (ratio - 1) x untraced / events; negative means within noise.
  double ns_per_event(double ratio, double untraced_s) const;
  double ns_per_event() const { return ns_per_event(ratio, untraced_s); }
  double ns_per_event(const Kind& k) const { return ns_per_event(k.ratio, k.untraced_s); }
};

StepBenchResult bench_step(const StepBenchOptions& o);

struct AllReduceBenchResult {
  bool reported = true;
  int world_size = 0;
  Device device = Device::CPU;
  std::uint64_t bytes = 0;
  double all_reduce_s = 0;  // median per all_reduce
  double memcpy_s = 0;      // median per memcpy of the same bytes (on the device: a device copy)
  double algbw_gbs = 0;     // bytes / all_reduce time
  double busbw_gbs = 0;     // nccl-tests' bus bandwidth of the all_reduce (0 at world 1)
  double memcpy_gbs = 0;    // bytes / memcpy time
  // The threads backend moves 2·n·S bytes per all_reduce of S (every rank reads its chunk from n
  // inputs and writes it to n outputs, cache-blocked) over min(n, cores) cores; a memcpy moves
  // 2·S on one core. Their ratio is what a user of this machine sees; it falls with load.
  unsigned cores = 0;
};

// The median of `rounds` all_reduces of `bytes` (f32) on `world_size` ranks, interleaved with
// copies of the same bytes on the same device.
// backend: threads (world >= 2; cpu or cuda), mpi (one process per rank under mpirun; the
// figures are on rank 0's process, `reported` false elsewhere), or nccl (cuda; world >= 1).
AllReduceBenchResult bench_all_reduce(int world_size, std::uint64_t bytes, int rounds,
                                      const std::string& backend = "threads",
                                      Device device = Device::CPU);

}  // namespace commtrace
