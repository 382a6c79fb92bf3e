#!/usr/bin/env bash
# Builds commtrace (scripts/setup.sh) and runs the main job: train the reference transformer
# on CPU for 30 steps, printing the loss per step. With arguments, runs `commtrace "$@"`
# instead (e.g. scripts/run_main.sh --help). Build output goes to stderr so that stdout
# carries only the program's output.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BUILD_DIR:-build}"
bash scripts/setup.sh >&2

if (($# > 0)); then
  exec "$BUILD_DIR/commtrace" "$@"
fi
exec "$BUILD_DIR/commtrace" train --model transformer --steps 30
