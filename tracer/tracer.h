// The per-thread Tracer and its RAII scopes. A Tracer collects one rank's Trace; it is made
// current for a thread by TracerActivation. With no current tracer every hook is a null check.
// Not thread-safe: one tracer belongs to one thread (one rank) at a time.
#pragma once

#include <string>
#include <vector>

#include "tracer/trace.h"

namespace commtrace {

class Tracer {
 public:
  explicit Tracer(int rank = 0);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  static Tracer* current();  // null when no tracer is active on this thread

  // Module scopes: entering finds or creates the child `fqn` of the current module.
  int enter_module(const std::string& fqn, const std::string& type);
  void exit_module();
  int current_module() const { return stack_.back(); }
  // Backward attribution: run under `module` (an index of this trace) without the FQN lookup.
  void push_module(int module);

  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }

  void set_params(int module, std::vector<ParamInfo> params);

  // Stamps index, phase and module (unless module >= 0 is given), then stores the record.
  void record(OpRecord r);

  const Trace& trace() const { return trace_; }
  Trace& trace() { return trace_; }
  Trace take();  // moves the trace out and resets the tracer to an empty Global tree

 private:
  Trace trace_;
  std::vector<int> stack_{0};
  Phase phase_ = Phase::Forward;
};

// Makes `t` the current tracer of this thread for the scope; restores the previous one.
class TracerActivation {
 public:
  explicit TracerActivation(Tracer& t);
  ~TracerActivation();
  TracerActivation(const TracerActivation&) = delete;
  TracerActivation& operator=(const TracerActivation&) = delete;

 private:
  Tracer* previous_;
};

// Enters module `fqn` of the current tracer, if any, for the scope.
class ModuleScope {
 public:
  ModuleScope(const std::string& fqn, const std::string& type);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
  int module() const { return module_; }  // -1 when no tracer is active

 private:
  Tracer* tracer_;
  int module_ = -1;
};

// Runs the scope under a module index recorded earlier (backward attribution) and a phase.
// A module of another tracer (or -1) maps to Global.
class AttributionScope {
 public:
  AttributionScope(const Tracer* owner, int module, Phase phase);
  ~AttributionScope();
  AttributionScope(const AttributionScope&) = delete;
  AttributionScope& operator=(const AttributionScope&) = delete;

 private:
  Tracer* tracer_;
  Phase previous_phase_ = Phase::Forward;
};

// Sets the phase of the current tracer, if any, for the scope.
class PhaseScope {
 public:
  explicit PhaseScope(Phase p);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Tracer* tracer_;
  Phase previous_ = Phase::Forward;
};

}  // namespace commtrace
