#!/usr/bin/env bash
# Installs the Debian packages commtrace needs (only the missing ones), then configures and
# builds it with CMake + Ninja. Idempotent: a second run installs nothing and rebuilds only
# what changed. Works from any directory.
#
# Environment:
#   BUILD_DIR   build directory, relative to the repository root or absolute (default: build)
#   CMAKE_ARGS  extra arguments for the configure step, split on spaces
#               (e.g. CMAKE_ARGS="-DCOMMTRACE_WITH_CUDA=OFF -DCOMMTRACE_BUILD_BENCH=OFF")
#   TARGETS     targets to build, split on spaces (default: all)
#   EXTRA_PACKAGES  more Debian packages to install, split on spaces (the test script's chromium)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BUILD_DIR:-build}"
PACKAGES=(
  build-essential cmake ninja-build python3
  nlohmann-json3-dev libfmt-dev libcli11-dev catch2 libopenblas-dev libbenchmark-dev
  zlib1g-dev  # gzip-compressed PyTorch profiler traces (import kineto)
  clang libclang-rt-dev  # libFuzzer and the sanitizers' runtimes for scripts/fuzz.sh
  libopenmpi-dev openmpi-bin  # one process per rank: the mpi launcher and backend
)
read -r -a extra_packages <<<"${EXTRA_PACKAGES:-}"
PACKAGES+=("${extra_packages[@]}")

# True when dpkg reports the package fully installed (not just "config-files" left behind).
is_installed() {
  local status
  status="$(dpkg -s "$1" 2>/dev/null)" || return 1
  grep -qx 'Status: install ok installed' <<<"$status"
}

if command -v dpkg >/dev/null 2>&1; then
  missing=()
  for pkg in "${PACKAGES[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
  done
  if ((${#missing[@]} > 0)); then
    echo "setup: installing missing packages: ${missing[*]}"
    SUDO=()
    if [[ "$(id -u)" -ne 0 ]]; then
      if ! command -v sudo >/dev/null 2>&1; then
        echo "setup: not root and sudo is not available; install as root: ${missing[*]}" >&2
        exit 1
      fi
      SUDO=(sudo)
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y --no-install-recommends "${missing[@]}"
  else
    echo "setup: all required packages are installed"
  fi
else
  echo "setup: dpkg not found (not Debian?); skipping package installation" >&2
fi

read -r -a extra_args <<<"${CMAKE_ARGS:-}"
generator_args=(-G Ninja)
if [[ -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  # An existing build directory keeps its generator; passing a different -G would fail.
  generator_args=()
fi

cmake -S . -B "$BUILD_DIR" "${generator_args[@]}" -DCMAKE_BUILD_TYPE=Release "${extra_args[@]}"
read -r -a targets <<<"${TARGETS:-}"
target_args=()
if ((${#targets[@]} > 0)); then target_args=(--target "${targets[@]}"); fi
cmake --build "$BUILD_DIR" -j"$(nproc)" "${target_args[@]}"
