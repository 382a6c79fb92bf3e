#!/usr/bin/env bash
# Builds commtrace (scripts/setup.sh, with chromium for the HTML report's test) and runs the
# whole test suite with ctest, then the same suite under AddressSanitizer +
# UndefinedBehaviorSanitizer and the threaded code's tests (communicators, DTensor, styles, the
# runner's verify, the NCCL profiler plugin) under ThreadSanitizer, each in its own build
# directory, and last the libFuzzer targets of every reader (scripts/fuzz.sh, FUZZ_SECONDS each,
# default 60). SANITIZERS=0 skips the sanitizer and fuzz builds. Exits non-zero on the first
# failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BUILD_DIR:-build}"
# chromium: the HTML report's test loads the page in headless Chromium.
EXTRA_PACKAGES="chromium" bash scripts/setup.sh

ctest --test-dir "$BUILD_DIR" --output-on-failure -j2

if [[ "${SANITIZERS:-1}" != 0 ]]; then
  common="-DCOMMTRACE_WITH_CUDA=OFF -DCOMMTRACE_WITH_MPI=OFF -DCOMMTRACE_BUILD_BENCH=OFF"
  echo "test: ASan + UBSan build (build-asan)"
  BUILD_DIR=build-asan CMAKE_ARGS="-DCOMMTRACE_ASAN=ON $common" bash scripts/setup.sh
  ctest --test-dir build-asan --output-on-failure -j2 -E '^oracle:'
  echo "test: TSan build (build-tsan)"
  BUILD_DIR=build-tsan CMAKE_ARGS="-DCOMMTRACE_TSAN=ON $common" \
    TARGETS="test_parallel commtrace_nccl_profiler nccl_profiler_driver" bash scripts/setup.sh
  build-tsan/tests/parallel/test_parallel "[comm],[dtensor],[style],[verify]"
  # The NCCL profiler plugin's events from two threads (NCCL's caller and its proxy thread).
  tests/nccl_profiler/plugin.sh build-tsan/tests/nccl_profiler/nccl_profiler_driver \
    build-tsan/libcommtrace_nccl_profiler.so "$BUILD_DIR/commtrace"
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
fi
