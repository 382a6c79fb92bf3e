// Helpers shared by the tests: substring checks and catching commtrace::Error.
#pragma once

#include <string>

#include "kernels/base.h"
#include "tests/catch_compat.h"

namespace commtrace::testing {

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

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

}  // namespace commtrace::testing
