// A cheap monotonic clock for records: ticks, the TSC on x86 (about 10 ns a read against 30-50 ns
// for steady_clock on a VM), steady_clock nanoseconds elsewhere; converted to seconds against
// steady_clock over the span since the clock (re)started, so no calibration is needed up front.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace commtrace {

class TickClock {
 public:
  TickClock() { restart(); }

  static std::uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
    return __rdtsc();
#else
    return std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
  }

  void restart() {
    start_ticks_ = ticks();
    start_s_ = steady_seconds();
  }
  // Ticks since the clock (re)started.
  std::uint64_t now() const { return ticks() - start_ticks_; }
  // Seconds per tick, measured over the span so far (0 before any tick passed).
  double seconds_per_tick() const {
    const std::uint64_t span = now();
    return span > 0 ? (steady_seconds() - start_s_) / double(span) : 0.0;
  }

 private:
  static double steady_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  std::uint64_t start_ticks_ = 0;
  double start_s_ = 0;
};

}  // namespace commtrace
