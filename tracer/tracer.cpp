#include "tracer/tracer.h"

#include <utility>

namespace commtrace {

namespace {
thread_local Tracer* g_current = nullptr;

template <typename E, std::size_t N>
E parse_enum(const std::string& s, const char* (*name)(E), const E (&all)[N], const char* what) {
  for (E e : all) {
    if (s == name(e)) return e;
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("unknown {} '{}'", what, s));
}
}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Optimizer:
      return "optimizer";
    case Phase::Recompute:
      return "recompute";
  }
  return "?";
}

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::Collective:
      return "collective";
    case EventKind::Gemm:
      return "gemm";
    case EventKind::Compute:
      return "compute";
    case EventKind::Trivial:
      return "trivial";
  }
  return "?";
}

Phase parse_phase(const std::string& s) {
  static const Phase all[] = {Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Recompute};
  return parse_enum(s, phase_name, all, "phase");
}

EventKind parse_event_kind(const std::string& s) {
  static const EventKind all[] = {EventKind::Collective, EventKind::Gemm, EventKind::Compute,
                                  EventKind::Trivial};
  return parse_enum(s, event_kind_name, all, "event kind");
}

ReduceOp parse_reduce_op(const std::string& s) {
  static const ReduceOp all[] = {ReduceOp::None, ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};
  return parse_enum(s, reduce_op_name, all, "reduce op");
}

int Trace::find_module(const std::string& fqn) const {
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].fqn == fqn) return int(i);
  }
  return -1;
}

bool Trace::is_within(int module, int ancestor) const {
  for (int m = module; m >= 0; m = modules[std::size_t(m)].parent) {
    if (m == ancestor) return true;
  }
  return false;
}

Tracer::Tracer(int rank) {
  trace_.rank = rank;
  trace_.records.reserve(1024);
}

Tracer* Tracer::current() { return g_current; }

int Tracer::enter_module(const std::string& fqn, const std::string& type) {
  const int parent = stack_.back();
  for (int c : trace_.modules[std::size_t(parent)].children) {
    if (trace_.modules[std::size_t(c)].fqn == fqn) {
      stack_.push_back(c);
      return c;
    }
  }
  const int id = int(trace_.modules.size());
  ModuleNode node;
  node.fqn = fqn;
  node.type = type;
  node.parent = parent;
  node.depth = trace_.modules[std::size_t(parent)].depth + 1;
  trace_.modules.push_back(std::move(node));
  trace_.modules[std::size_t(parent)].children.push_back(id);
  stack_.push_back(id);
  return id;
}

void Tracer::exit_module() {
  COMMTRACE_CHECK(stack_.size() > 1, ErrorCode::Internal, "tracer: exit_module without enter");
  stack_.pop_back();
}

void Tracer::push_module(int module) {
  COMMTRACE_CHECK(module >= 0 && std::size_t(module) < trace_.modules.size(), ErrorCode::Internal,
                  "tracer: module {} out of range [0, {})", module, trace_.modules.size());
  stack_.push_back(module);
}

void Tracer::set_params(int module, std::vector<ParamInfo> params) {
  trace_.modules.at(std::size_t(module)).params = std::move(params);
}

void Tracer::record(OpRecord r) {
  r.index = trace_.records.size();
  r.phase = phase_;
  r.module = stack_.back();
  trace_.records.push_back(std::move(r));
}

Trace Tracer::take() {
  Trace out = std::move(trace_);
  trace_ = Trace{};
  trace_.rank = out.rank;
  stack_.assign(1, 0);
  phase_ = Phase::Forward;
  return out;
}

TracerActivation::TracerActivation(Tracer& t) : previous_(g_current) { g_current = &t; }
TracerActivation::~TracerActivation() { g_current = previous_; }

ModuleScope::ModuleScope(const std::string& fqn, const std::string& type) : tracer_(g_current) {
  if (tracer_) module_ = tracer_->enter_module(fqn, type);
}
ModuleScope::~ModuleScope() {
  if (tracer_) tracer_->exit_module();
}

AttributionScope::AttributionScope(const Tracer* owner, int module, Phase phase)
    : tracer_(g_current) {
  if (!tracer_) return;
  tracer_->push_module(owner == tracer_ && module >= 0 ? module : 0);
  previous_phase_ = tracer_->phase();
  tracer_->set_phase(phase);
}
AttributionScope::~AttributionScope() {
  if (!tracer_) return;
  tracer_->set_phase(previous_phase_);
  tracer_->exit_module();
}

PhaseScope::PhaseScope(Phase p) : tracer_(g_current) {
  if (!tracer_) return;
  previous_ = tracer_->phase();
  tracer_->set_phase(p);
}
PhaseScope::~PhaseScope() {
  if (tracer_) tracer_->set_phase(previous_);
}

}  // namespace commtrace
