#include "parallel/tensor/memory.h"

#include <algorithm>

namespace commtrace {

namespace {
thread_local MemoryLedger* g_current = nullptr;
}  // namespace

struct MemoryLedger::State {
  std::mutex mu;
  MemoryCharge* live = nullptr;             // every live charge
  std::uint64_t bytes = 0;                  // every live charge
  std::uint64_t epoch_bytes = 0, peak = 0;  // the current iteration's allocations
  std::uint64_t epoch = 0;
  bool forward = false;  // between begin_iteration and mark_forward_end
};

MemoryLedger::MemoryLedger() : state_(std::make_shared<State>()) {}
MemoryLedger::~MemoryLedger() = default;

MemoryLedger* MemoryLedger::current() { return g_current; }

std::shared_ptr<MemoryCharge> MemoryLedger::charge(std::uint64_t bytes, int module) {
  auto c = std::make_shared<MemoryCharge>();
  c->state = state_;
  c->bytes = bytes;
  c->module = std::max(0, module);
  std::lock_guard lock(state_->mu);
  c->epoch = state_->epoch;
  c->next = state_->live;
  if (state_->live) state_->live->prev = c.get();
  state_->live = c.get();
  state_->bytes += bytes;
  state_->epoch_bytes += bytes;
  state_->peak = std::max(state_->peak, state_->epoch_bytes);
  return c;
}

MemoryCharge::~MemoryCharge() {
  std::lock_guard lock(state->mu);
  (prev ? prev->next : state->live) = next;
  if (next) next->prev = prev;
  state->bytes -= bytes;
  if (epoch == state->epoch) state->epoch_bytes -= bytes;
}

void MemoryLedger::begin_iteration() {
  std::lock_guard lock(state_->mu);
  ++state_->epoch;
  state_->epoch_bytes = state_->peak = 0;
  state_->forward = true;
}

void MemoryLedger::mark_forward_end() {
  std::lock_guard lock(state_->mu);
  std::fill(saved_.begin(), saved_.end(), 0);
  for (const MemoryCharge* c = state_->live; c; c = c->next) {
    if (c->epoch != state_->epoch) continue;
    if (std::size_t(c->module) >= saved_.size()) saved_.resize(std::size_t(c->module) + 1, 0);
    saved_[std::size_t(c->module)] += c->bytes;
  }
  state_->forward = false;
}

std::uint64_t MemoryLedger::iteration_peak() const {
  std::lock_guard lock(state_->mu);
  return state_->peak;
}

std::uint64_t peak_bytes(const std::function<void()>& body) {
  MemoryLedger ledger;
  const MemoryActivation on(ledger);
  ledger.begin_iteration();
  body();
  return ledger.iteration_peak();
}

MemoryActivation::MemoryActivation(MemoryLedger& l) : previous_(g_current) { g_current = &l; }
MemoryActivation::~MemoryActivation() { g_current = previous_; }

}  // namespace commtrace
