#!/usr/bin/env bash
# external.sh BUILD_DIR SOURCE_DIR: installs the build into BUILD_DIR/package-test/prefix
# (cmake --install), configures and builds samples/external against it with find_package
# (a project outside this tree), runs it, and checks its trace with the installed CLI against
# the checked-in baseline. Exits non-zero on the first failure.
set -euo pipefail
build="$(cd "$1" && pwd)" src="$(cd "$2" && pwd)"
work="$build/package-test"
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src/samples/external" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log"
cmake --build "$work/build" >"$work/build.log"
"$work/build/tiny_net_sp" "$work/trace.json"
"$work/prefix/bin/commtrace" check "$work/trace.json" \
  --baseline "$src/samples/external/tiny_net_sp.baseline.json"
# The headers live under include/commtrace, not loose in include/.
test -f "$work/prefix/include/commtrace/parallel/nn/nn.h"
test ! -e "$work/prefix/include/parallel"
echo "package: samples/external built against the installed package; its trace matches the baseline"
