// Ids for what a key (a list of words) determines, made once per distinct key: a sharding plan,
// a redistribution. The id (new_trace_key(), never reused) lets the tracer match what the key
// determines by the key alone (EventHead::key, Tracer::begin_region). Internal to parallel/dtensor.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tracer/tracer.h"

namespace commtrace {

// Values by key, for one thread; entries never move or go.
template <class V>
class KeyedCache {
 public:
  static constexpr std::size_t kMaxEntries = 4096;  // then values are made per call, uncached
  struct Entry {
    std::uint64_t id = 0;  // 0: not cached (no key)
    V value;
  };

  // The entry of `key`, its value made by make(scratch.value) when new (and left in `scratch`,
  // with id 0, past kMaxEntries).
  template <class Make>
  const Entry& get(const std::vector<std::int64_t>& key, Entry& scratch, Make&& make) {
    std::uint64_t h = 0x9e3779b97f4a7c15ull;
    for (std::int64_t v : key) h = (h ^ std::uint64_t(v)) * 0x100000001b3ull;
    const auto [first, last] = entries_.equal_range(h);
    for (auto it = first; it != last; ++it) {
      if (it->second.key == key) return it->second.entry;
    }
    make(scratch.value);
    if (entries_.size() >= kMaxEntries) return scratch;
    Keyed& e = entries_.emplace(h, Keyed())->second;
    e.key = key;
    e.entry.value = std::move(scratch.value);
    e.entry.id = new_trace_key();
    return e.entry;
  }

 private:
  struct Keyed {
    std::vector<std::int64_t> key;
    Entry entry;
  };
  std::unordered_multimap<std::uint64_t, Keyed> entries_;
};

}  // namespace commtrace
