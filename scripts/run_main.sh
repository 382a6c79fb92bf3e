#!/usr/bin/env bash
# Builds commtrace (scripts/setup.sh) and runs the main job on its embedded default: one traced
# training iteration of the reference Transformer with the TP plan on 4 in-process ranks
# (threads backend, CPU, no GPU), printing the collectives per module and phase and the
# per-iteration summary. With arguments, runs `commtrace "$@"` instead (e.g. scripts/run_main.sh --help). Build output goes to stderr so that stdout
# carries only the program's output.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD_DIR="${BUILD_DIR:-build}"
bash scripts/setup.sh >&2

if (($# > 0)); then
  exec "$BUILD_DIR/commtrace" "$@"
fi
exec "$BUILD_DIR/commtrace" run --explain
