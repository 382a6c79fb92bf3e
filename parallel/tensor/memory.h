// Memory accounting per rank: while a MemoryLedger is active on a thread, every tensor allocated
// there (Tensor::empty: on cpu its storage, on meta the size it would have) is charged to the
// ledger with the module the thread's tracer is in, and discharged when the tensor's last holder
// (views and detached copies share the charge) goes. mark_forward_end() takes what forward left
// alive per module: the activations saved for backward (and the loss). Counters are atomic: a
// tensor may die on another rank's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace commtrace {

struct MemoryCharge;

class MemoryLedger {
 public:
  MemoryLedger();
  ~MemoryLedger();
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  static MemoryLedger* current();  // null when none is active on this thread

  // A charge for `bytes` allocated now by `module` (an index of the thread's tracer, 0 without).
  std::shared_ptr<MemoryCharge> charge(std::uint64_t bytes, int module);

  // An iteration begins: its forward's allocations are those after this call.
  void begin_iteration();
  // Forward is done: the bytes its allocations still hold, per module (grown as needed).
  void mark_forward_end();
  const std::vector<std::uint64_t>& saved_by_module() const { return saved_; }
  // The most bytes that allocations since begin_iteration held at once (activations, their
  // gradients, temporaries, the parameters' gradients): the iteration's peak above what it
  // started with.
  std::uint64_t iteration_peak() const;

 private:
  friend struct MemoryCharge;
  struct State;
  std::shared_ptr<State> state_;
  std::vector<std::uint64_t> saved_;
};

// Makes `l` the current ledger of this thread for the scope; restores the previous one.
class MemoryActivation {
 public:
  explicit MemoryActivation(MemoryLedger& l);
  ~MemoryActivation();
  MemoryActivation(const MemoryActivation&) = delete;
  MemoryActivation& operator=(const MemoryActivation&) = delete;

 private:
  MemoryLedger* previous_;
};

// The most bytes the tensors `body` allocates on this thread hold at once, those it keeps
// included (on meta, the bytes they would have): run on meta, a shape-only measure of what a
// cpu run needs.
std::uint64_t peak_bytes(const std::function<void()>& body);

// One allocation's charge; its destructor gives the bytes back (the ledger's state outlives it).
struct MemoryCharge {
  ~MemoryCharge();
  std::shared_ptr<MemoryLedger::State> state;
  std::uint64_t bytes = 0;
  int module = 0;
  std::uint64_t epoch = 0;                        // the iteration it was allocated in
  MemoryCharge *prev = nullptr, *next = nullptr;  // the ledger's live list
};

}  // namespace commtrace
