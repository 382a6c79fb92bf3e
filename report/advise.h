// The plan advisor's ranking: plans (and meshes) of one model, each traced shape-only on every
// rank, ranked by the cost model's communication time per iteration (the slowest rank's) and
// by peak memory per rank (the largest). Plans that do not apply are listed with the reason.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/cost.h"
#include "tracer/trace.h"

namespace commtrace {

struct PlanCandidate {
  std::string plan;           // a built-in plan's name or a plan file
  std::string mesh;           // "8", "2x4"
  std::string data_parallel;  // "", "ddp", "fsdp"
  std::vector<Trace> traces;  // every rank's; empty when it does not apply
  std::string error;          // why it does not apply
};

struct PlanAdvice {
  std::string plan, mesh, data_parallel;
  bool applies = false;
  std::string error;
  double comm_s = 0;                   // estimated, per iteration, the slowest rank
  std::int64_t collectives = 0;        // per iteration, that rank
  std::uint64_t bus_bytes = 0;         // per iteration, that rank
  std::uint64_t peak_memory = 0;       // the largest rank's peak (report/tree.h memory_peak)
  std::uint64_t activations = 0;       // that rank's activations saved for backward
  int time_rank = 0, memory_rank = 0;  // 1 = best; 0 when it does not apply
};

// Applicable candidates by estimated time (then peak memory), the others after them.
std::vector<PlanAdvice> rank_plans(const std::vector<PlanCandidate>& candidates,
                                   const Topology& topo);
std::string render_advice(const std::vector<PlanAdvice>& advice, const std::string& title);
std::string advice_json(const std::vector<PlanAdvice>& advice, const std::string& model,
                        int world_size, const Topology& topo);

}  // namespace commtrace
