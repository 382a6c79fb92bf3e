#include "report/cost.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "report/counts.h"
#include "tracer/json_io.h"

namespace commtrace {

namespace {

// Constants (README, "Cost model", gives the sources): α per hop and the base latencies are
// NCCL 2.28's tuning constants for its LL protocol (src/graph/tuning.cc); β are the links' peak
// rates per GPU and direction.
constexpr double kUs = 1e-6, kGBps = 1e9;
const Link kNvlink4{"NVLink4 (NVSwitch)", 0.6 * kUs, 450 * kGBps};
const Link kPcie5{"PCIe Gen5 x16", 1.0 * kUs, 64 * kGBps};
const Link kNdrIb{"InfiniBand NDR 400 Gb/s (one NIC per GPU)", 2.7 * kUs, 50 * kGBps};

struct Preset {
  const char* name;
  const char* description;
  int gpus_per_node;
  const Link* intra;
  double tflops_bf16, tflops_f32, tflops_f64;  // dense: BF16 tensor, FP32, FP64 tensor
};
constexpr Preset kPresets[] = {
    {"h100", "8 H100/H200 SXM GPUs per node on NVLink4 and NVSwitch; NDR InfiniBand between nodes",
     8, &kNvlink4, 989, 67, 67},
    {"h200", "8 H100/H200 SXM GPUs per node on NVLink4 and NVSwitch; NDR InfiniBand between nodes",
     8, &kNvlink4, 989, 67, 67},
    {"pcie", "8 H100 PCIe GPUs per node on PCIe Gen5 x16; NDR InfiniBand between nodes", 8, &kPcie5,
     756, 51, 51},
    {"ib", "one H100 SXM GPU per node: every group spans nodes over NDR InfiniBand", 1, &kNdrIb,
     989, 67, 67},
};

Topology make(const Preset& p) {
  Topology t;
  t.name = p.name;
  t.description = p.description;
  t.gpus_per_node = p.gpus_per_node;
  t.intra = *p.intra;
  t.inter = kNdrIb;
  t.base_ring_s = 6.6 * kUs;
  t.base_tree_s = 6.8 * kUs;
  t.gemm_flops_bf16 = p.tflops_bf16 * 1e12;
  t.gemm_flops_f32 = p.tflops_f32 * 1e12;
  t.gemm_flops_f64 = p.tflops_f64 * 1e12;
  return t;
}

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

Link read_link(const JsonReader& rd, const Json& j, const JsonPath& p) {
  rd.object(j, p);
  rd.check_keys(j, p, {"name", "latency_us", "bandwidth_GBps"});
  Link l;
  if (const Json* n = rd.find(j, "name")) l.name = rd.str(*n, p.key("name"));
  l.latency_s = rd.number(rd.at(j, "latency_us", p), p.key("latency_us")) * kUs;
  l.bandwidth_Bps = rd.number(rd.at(j, "bandwidth_GBps", p), p.key("bandwidth_GBps")) * kGBps;
  if (l.latency_s < 0) rd.fail(p.key("latency_us"), "a negative latency");
  if (!(l.bandwidth_Bps > 0)) rd.fail(p.key("bandwidth_GBps"), "the bandwidth must be positive");
  return l;
}

}  // namespace

std::vector<std::string> topology_presets() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

Topology topology_from_json(const std::string& text, const std::string& source) {
  JsonReader rd(source);
  const Json root = rd.parse(text, "a topology (\"schema\": \"commtrace.topology\")");
  const JsonPath top;
  rd.check_header(root, "commtrace.topology", {{1, 0}}, "topology");
  rd.check_keys(root, top,
                {"schema", "version", "name", "description", "gpus_per_node", "intra", "inter",
                 "base_latency_us", "gemm_tflops"});
  Topology t;
  t.name = rd.str(rd.at(root, "name", top), top.key("name"));
  if (const Json* d = rd.find(root, "description"))
    t.description = rd.str(*d, top.key("description"));
  t.gpus_per_node =
      rd.int32(rd.at(root, "gpus_per_node", top), top.key("gpus_per_node"), 1, 1 << 20);
  t.intra = read_link(rd, rd.at(root, "intra", top), top.key("intra"));
  t.inter = read_link(rd, rd.at(root, "inter", top), top.key("inter"));
  t.base_ring_s = t.base_tree_s = 0;
  if (const Json* b = rd.find(root, "base_latency_us")) {
    const JsonPath bp = top.key("base_latency_us");
    rd.object(*b, bp);
    rd.check_keys(*b, bp, {"ring", "tree"});
    t.base_ring_s = rd.number(rd.at(*b, "ring", bp), bp.key("ring")) * kUs;
    t.base_tree_s = rd.number(rd.at(*b, "tree", bp), bp.key("tree")) * kUs;
    if (t.base_ring_s < 0 || t.base_tree_s < 0) rd.fail(bp, "a negative latency");
  }
  if (const Json* g = rd.find(root, "gemm_tflops")) {
    const JsonPath gp = top.key("gemm_tflops");
    rd.object(*g, gp);
    rd.check_keys(*g, gp, {"bf16", "f32", "f64"});
    for (auto [key, field] :
         {std::pair{"bf16", &t.gemm_flops_bf16}, std::pair{"f32", &t.gemm_flops_f32},
          std::pair{"f64", &t.gemm_flops_f64}}) {
      if (const Json* v = rd.find(*g, key)) {
        *field = rd.number(*v, gp.key(key)) * 1e12;
        if (*field < 0) rd.fail(gp.key(key), "a negative rate");
      }
    }
  }
  return t;
}

Topology load_topology(const std::string& name_or_file) {
  for (const Preset& p : kPresets) {
    if (name_or_file == p.name) return make(p);
  }
  std::error_code ec;
  if (std::filesystem::exists(name_or_file, ec)) {
    return topology_from_json(read_text_file(name_or_file, "topology file"), name_or_file);
  }
  const std::vector<std::string> names = topology_presets();
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("unknown topology '{}'{} (presets: {}; or a topology JSON file)",
                          name_or_file, did_you_mean(name_or_file, names), fmt::join(names, ", ")));
}

CostEstimate estimate_collective(Collective op, std::uint64_t bytes, int n, bool spans_nodes,
                                 const Topology& topo) {
  COMMTRACE_CHECK(n >= 1, ErrorCode::InvalidArgument, "cost model: group size {} must be >= 1", n);
  CostEstimate e;
  e.spans_nodes = spans_nodes;
  if (n == 1) return e;  // no communication
  // A group that spans nodes moves at the slower link's pace and latency.
  const double a =
      spans_nodes ? std::max(topo.intra.latency_s, topo.inter.latency_s) : topo.intra.latency_s;
  const double b = spans_nodes ? std::min(topo.intra.bandwidth_Bps, topo.inter.bandwidth_Bps)
                               : topo.intra.bandwidth_Bps;
  const double s = double(bytes), dn = double(n), steps = dn - 1, logn = ceil_log2(n);
  auto pick = [&](double ring, double tree) {
    e.seconds = std::min(ring, tree);
    e.algorithm = tree < ring ? "tree" : "ring";
  };
  switch (op) {
    case Collective::AllReduce:
      pick(topo.base_ring_s + 2 * steps * a + 2 * steps / dn * s / b,
           topo.base_tree_s + 2 * logn * a + 2 * s / b);
      break;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
      e.seconds = topo.base_ring_s + steps * a + steps / dn * s / b;
      e.algorithm = "ring";
      break;
    case Collective::Broadcast:
      pick(topo.base_ring_s + steps * a + s / b, topo.base_tree_s + logn * a + s / b);
      break;
    case Collective::Send:
    case Collective::Recv:
      e.seconds = topo.base_ring_s + a + s / b;
      e.algorithm = "p2p";
      break;
    case Collective::Barrier:
      e.seconds = topo.base_tree_s + 2 * logn * a;
      e.algorithm = "tree";
      break;
  }
  return e;
}

double estimate_gemm(const Trace& t, const Record& r, const Topology& topo) {
  if (r.kind != EventKind::Gemm || r.n_inputs < 2) return 0;
  const auto ins = t.inputs(r);
  const auto a = t.shape(ins[ins.size() - 2].shape), b = t.shape(ins.back().shape);
  if (a.empty() || b.empty()) return 0;
  double elements = 1;
  for (const std::int64_t d : a) elements *= double(d);
  const double flops = 2 * elements * double(b.back());
  const double rate = r.dtype == DType::BF16  ? topo.gemm_flops_bf16
                      : r.dtype == DType::F64 ? topo.gemm_flops_f64
                                              : topo.gemm_flops_f32;
  return rate > 0 ? flops / rate : 0;
}

TraceCost::TraceCost(const Trace& t, const Topology& topo) : t_(t), topo_(topo) {
  const std::string m = metadata_of(t, "mesh");
  if (!m.empty()) {
    try {
      mesh_ = parse_mesh_str(m);
      has_mesh_ = !mesh_.shape.empty();
    } catch (const Error&) {
      has_mesh_ = false;  // an unparsable mesh: the fallback below
    }
  }
}

bool TraceCost::spans(std::string_view group, int n) const {
  const int g = topo_.gpus_per_node;
  const int rank = t_.rank;
  if (has_mesh_) {
    const auto it = std::find(mesh_.dim_names.begin(), mesh_.dim_names.end(), group);
    if (it != mesh_.dim_names.end() &&
        mesh_.shape[std::size_t(it - mesh_.dim_names.begin())] == n) {
      // Row-major ranks: the group varies the one coordinate, strided by the dims after it.
      const std::size_t d = std::size_t(it - mesh_.dim_names.begin());
      long stride = 1;
      for (std::size_t k = d + 1; k < mesh_.shape.size(); ++k) stride *= mesh_.shape[k];
      const long coord = (rank / stride) % n;
      const long first = rank - coord * stride;
      const long last = first + long(n - 1) * stride;
      return first / g != last / g;
    }
  }
  const long first = long(rank / n) * n;
  return first / g != (first + n - 1) / g;
}

CostEstimate TraceCost::of(const Record& r) const {
  const int n = std::max(1, r.collective.group_size);
  return estimate_collective(r.collective.op, r.collective.bytes, n,
                             spans(t_.str(r.collective.group), n), topo_);
}

}  // namespace commtrace
