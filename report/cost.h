// The cost model: an α–β estimate of each collective's time on a topology, from its bytes
// (nccl-tests' S), its group size n and whether the group spans nodes (priced by the slower link
// then). Algorithms as NCCL runs them: ring for every collective, a tree for all_reduce and
// broadcast where it is faster (small messages). With α the per-hop latency, β the link's
// bandwidth per GPU and direction, and a base latency per call (NCCL's):
//   all_reduce     ring: base + 2(n−1)α + 2(n−1)/n · S/β    tree: base + 2⌈log2 n⌉α + 2S/β
//   all_gather, reduce_scatter, all_to_all: base + (n−1)α + (n−1)/n · S/β
//   broadcast      ring: base + (n−1)α + S/β                tree: base + ⌈log2 n⌉α + S/β
//   send, recv     base + α + S/β        barrier  base + 2⌈log2 n⌉α        n = 1: 0
// Topologies are presets (README states their constants and sources) or JSON files
// ("schema": "commtrace.topology").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

struct Link {
  std::string name;          // "NVLink4"
  double latency_s = 0;      // α: per hop
  double bandwidth_Bps = 0;  // β: per GPU and direction
};

struct Topology {
  std::string name;  // the preset's name, or the file's "name"
  std::string description;
  int gpus_per_node = 8;   // ranks r and s share a node when r / gpus_per_node == s / ...
  Link intra, inter;       // within a node; between nodes
  double base_ring_s = 0;  // per call, ring algorithms
  double base_tree_s = 0;  // per call, tree algorithms
  // A GPU's dense GEMM rate per dtype (FLOP/s): laying out a timeline of a run that measured no
  // time (fake backend, meta device).
  double gemm_flops_bf16 = 0, gemm_flops_f32 = 0, gemm_flops_f64 = 0;
};

// The built-in presets' names, and a preset or a topology JSON file by name (InvalidArgument
// naming the known presets, with a suggestion, or the file's problem).
std::vector<std::string> topology_presets();
Topology load_topology(const std::string& name_or_file);
Topology topology_from_json(const std::string& text, const std::string& source);

struct CostEstimate {
  double seconds = 0;
  const char* algorithm = "";  // "ring", "tree", "p2p", "" when n = 1
  bool spans_nodes = false;
};

// REQUIRES n >= 1.
CostEstimate estimate_collective(Collective op, std::uint64_t bytes, int n, bool spans_nodes,
                                 const Topology& topo);

// A GEMM record's time: 2·(the elements of its left operand)·(its right operand's last dim)
// FLOPs at the topology's rate for its dtype; 0 for another record or an unknown rate.
double estimate_gemm(const Trace& t, const Record& r, const Topology& topo);

// Estimates for a trace's records: whether a collective's group spans nodes comes from the run's
// mesh (metadata "mesh": row-major ranks, this trace's rank) and the group's mesh dim; without a
// mesh, the group is taken as n consecutive ranks holding this rank.
class TraceCost {
 public:
  TraceCost(const Trace& t, const Topology& topo);
  CostEstimate of(const Record& r) const;
  const Topology& topology() const { return topo_; }

 private:
  bool spans(std::string_view group, int n) const;
  const Trace& t_;
  Topology topo_;
  MeshInfo mesh_;
  bool has_mesh_ = false;
};

}  // namespace commtrace
