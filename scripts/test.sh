#!/usr/bin/env bash
# Builds commtrace (scripts/setup.sh, with chromium for the HTML report's test) and runs the
# whole test suite with ctest, then the same suite under AddressSanitizer +
# UndefinedBehaviorSanitizer in the fuzz build (build-fuzz/: clang, one build serves the suite and
# the libFuzzer targets), the threaded code's tests (communicators, DTensor, styles, the runner's
# verify, the NCCL profiler plugin) under ThreadSanitizer (build-tsan/), and last the libFuzzer
# targets of every reader (scripts/fuzz.sh, FUZZ_SECONDS each, default 30). SANITIZERS=0 skips
# the sanitizer and fuzz builds. Prints how long each step took. Exits non-zero on the first
# failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BUILD_DIR:-build}"
step_start=$SECONDS
took() {
  echo "test: $1 took $((SECONDS - step_start)) s (total $SECONDS s)"
  step_start=$SECONDS
}

# chromium: the HTML report's test loads the page in headless Chromium.
EXTRA_PACKAGES="chromium" bash scripts/setup.sh

took "release build"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j2
took "release tests"

if [[ "${SANITIZERS:-1}" != 0 ]]; then
  echo "test: ASan + UBSan build (build-fuzz, clang, with the libFuzzer targets)"
  CXX=clang++ CC=clang BUILD_DIR=build-fuzz CMAKE_ARGS="$(bash scripts/fuzz.sh --cmake-args)" \
    bash scripts/setup.sh
  took "ASan + UBSan build"
  ctest --test-dir build-fuzz --output-on-failure -j2 -E '^oracle:'
  took "ASan + UBSan tests"
  echo "test: TSan build (build-tsan)"
  BUILD_DIR=build-tsan \
    CMAKE_ARGS="-DCOMMTRACE_TSAN=ON -DCOMMTRACE_WITH_CUDA=OFF -DCOMMTRACE_WITH_MPI=OFF -DCOMMTRACE_BUILD_BENCH=OFF" \
    TARGETS="test_parallel commtrace_nccl_profiler nccl_profiler_driver" bash scripts/setup.sh
  took "TSan build"
  build-tsan/tests/parallel/test_parallel "[comm],[dtensor],[style],[verify]"
  # The NCCL profiler plugin's events from two threads (NCCL's caller and its proxy thread).
  tests/nccl_profiler/plugin.sh build-tsan/tests/nccl_profiler/nccl_profiler_driver \
    build-tsan/libcommtrace_nccl_profiler.so "$BUILD_DIR/commtrace"
  took "TSan tests"
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
  took "fuzzing"
fi
