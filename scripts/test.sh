#!/usr/bin/env bash
# Builds commtrace (scripts/setup.sh) and runs the whole test suite with ctest.
# The exit status is ctest's.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BUILD_DIR:-build}"
bash scripts/setup.sh

ctest --test-dir "$BUILD_DIR" --output-on-failure -j2
