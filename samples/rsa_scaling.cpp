// Answers a question from ColossalAI's tracker about its ring self-attention (RingQK / RingAV):
// backward all-reduces the gradient of the full k (v) over the sequence group, slices the local
// chunk and divides by the sequence world size, while column-parallel TP does not divide after
// its reduction. Is that right, and what would a reduce_scatter save? This program runs every
// variant of commtrace's `rsa` on the transformer (4 ranks on "cp", each rank's loss the mean
// over its own quarter of the sequence) against one device and prints, per variant, which
// gradients are off and by what factor. README's sequence-parallel section reads the answer from
// this output; `commtrace diff` of the two exact variants shows what the reduce_scatter saves.
#include <map>

#include "parallel/run/runner.h"

using namespace commtrace;

namespace {

constexpr int kWorld = 4;

ParallelConfig rsa(bool divide, const char* reduction, const char* params) {
  ParallelConfig cfg;
  cfg.model = "transformer";
  cfg.plan = "rsa";
  cfg.world_size = kWorld;
  ContextParallel cp;
  cp.family = "rsa";
  cp.divide_by_world_size = divide;
  cp.grad_reduction = reduction;
  cp.param_grad_reduction = params;
  cfg.context_parallel = cp;
  return cfg;
}

// "10 of 29 PASS", then the failures grouped by factor (named when at most 6).
std::string outcome(const VerifyReport& r) {
  int pass = 0;
  std::map<std::string, std::vector<std::string>> by_factor;
  for (const TensorCheck& c : r.checks) {
    if (c.pass) {
      ++pass;
      continue;
    }
    std::string name = c.name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".grad") == 0)
      name.resize(name.size() - 5);
    by_factor[c.factor.empty() ? "off by no constant factor" : c.factor].push_back(name);
  }
  std::string s = fmt::format("{} of {} PASS", pass, r.checks.size());
  for (const auto& [factor, names] : by_factor) {
    if (factor == "off by no constant factor" || names.size() > 6) {
      s += fmt::format("\n      {}: {} tensors", factor, names.size());
    } else {
      s += fmt::format("\n      {}: {}", factor, fmt::join(names, ", "));
    }
  }
  return s;
}

}  // namespace

int main() {
  try {
    fmt::print("rsa on the transformer, {} ranks on cp, against one device (tolerance 1e-5):\n",
               kWorld);
    for (const char* params : {"avg", "sum"}) {
      for (bool divide : {true, false}) {
        for (const char* reduction : {"all_reduce", "reduce_scatter"}) {
          const ParallelConfig cfg = rsa(divide, reduction, params);
          const VerifyReport r = verify(cfg);
          fmt::print("  {:<4} {}\n      {}\n", r.pass() ? "PASS" : "FAIL",
                     cfg.context_parallel->str(), outcome(r));
        }
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "rsa_scaling: {}\n", e.what());
    return 1;
  }
  return 0;
}
