// Helpers shared by the tests: substring checks, catching commtrace::Error, files for a test.
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/base.h"
#include "tests/catch_compat.h"
#include "tracer/trace.h"

namespace commtrace::testing {

// n values drawn uniformly from [lo, hi), the same for the same seed.
inline std::vector<double> random(std::int64_t n, std::uint64_t seed, double lo = -1.0,
                                  double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
inline bool contains(const Error& e, const std::string& part) {
  INFO(e.what());
  return contains(std::string(e.what()), part);
}

// `text` in the file `path` (in the working folder) until the scope ends.
struct TempFile {
  std::string path;
  TempFile(std::string name, const std::string& text) : path(std::move(name)) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  ~TempFile() { std::remove(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

// Runs f and returns the Error it throws; fails the test when it throws nothing.
template <class F>
Error error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected commtrace::Error");
  return Error(ErrorCode::Internal, "unreachable");
}

// Readable views of a record's data for assertions.
inline Shape shape_of(const Trace& t, ShapeId id) {
  const auto s = t.shape(id);
  return Shape(s.begin(), s.end());
}
inline Shape in_shape(const Trace& t, const Record& r, std::size_t i) {
  return shape_of(t, t.inputs(r)[i].shape);
}
inline Shape in_global(const Trace& t, const Record& r, std::size_t i) {
  return shape_of(t, t.inputs(r)[i].global_shape);
}
inline std::string in_placements(const Trace& t, const Record& r, std::size_t i) {
  return placements_str(t.placements(t.inputs(r)[i].placements));
}
inline Shape out_shape(const Trace& t, const Record& r, std::size_t i) {
  return shape_of(t, t.outputs(r)[i].shape);
}
inline Shape out_global(const Trace& t, const Record& r, std::size_t i) {
  return shape_of(t, t.outputs(r)[i].global_shape);
}
inline std::string out_placements(const Trace& t, const Record& r, std::size_t i) {
  return placements_str(t.placements(t.outputs(r)[i].placements));
}
inline std::string mesh_of(const Trace& t, const Record& r) {
  return r.mesh == kNoMesh ? "" : mesh_str(t.pools.mesh(r.mesh));
}
inline std::string name_of(const Trace& t, const Record& r) { return std::string(t.name(r)); }

}  // namespace commtrace::testing
