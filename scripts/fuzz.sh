#!/usr/bin/env bash
# fuzz.sh [SECONDS]: builds the libFuzzer targets of every reader (build-fuzz/, clang, ASan +
# UBSan; scripts/test.sh builds the test suite in the same directory) and runs each for SECONDS
# (default 30) on a seed corpus made from real outputs: traces,
# PyTorch dumps and baselines written by commtrace itself, the test data, the sample plans and
# models. Exits non-zero when a target finds an input that crashes, trips a sanitizer, hangs
# (10 s), or ends in anything but commtrace's own error; the input is kept in
# build-fuzz/fuzz-artifacts/. Run longer by hand: ./scripts/fuzz.sh 3600. Idempotent: the corpus
# keeps growing across runs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The fuzz build's configuration, shared with scripts/test.sh (fuzz.sh --cmake-args prints it).
cmake_args="-DCOMMTRACE_FUZZ=ON -DCOMMTRACE_BUILD_TESTS=ON -DCOMMTRACE_WITH_CUDA=OFF -DCOMMTRACE_WITH_MPI=OFF -DCOMMTRACE_BUILD_BENCH=OFF"
if [[ "${1:-}" == --cmake-args ]]; then
  echo "$cmake_args"
  exit 0
fi
seconds="${1:-30}"
build=build-fuzz
targets=(trace torch baseline plan model kineto topology)

CC=clang CXX=clang++ BUILD_DIR="$build" CMAKE_ARGS="$cmake_args" \
  TARGETS="commtrace ${targets[*]/#/fuzz_}" bash scripts/setup.sh

corpus="$build/corpus"
for t in "${targets[@]}"; do mkdir -p "$corpus/$t"; done
mkdir -p "$build/fuzz-artifacts"

# Seeds from real outputs (the fuzz build's own commtrace).
ct="$build/commtrace"
data=tests/report/data
for model in toy mlp; do
  for plan in tp sp; do
    base="$model-$plan"
    "$ct" run --model "$model" --plan "$plan" --world-size 2 --iters 2 --noise 3 \
      --json "$corpus/trace/$base.json" --torch-json "$corpus/torch/$base.json" >/dev/null
    "$ct" check "$corpus/trace/$base.json" --baseline "$corpus/baseline/$base.json" \
      --update >/dev/null
  done
done
cp "$data"/bad/trace_*.json "$data/bad/reference_trace.json.valid" "$corpus/trace/"
cp "$data"/torch/*.json "$corpus/torch/"
cp "$data"/bad/baseline_*.json "$data/bad/reference_baseline.json.valid" "$corpus/baseline/"
cp samples/plans/*.json "$corpus/plan/"
cp samples/models/*.json "$corpus/model/"
# PyTorch profiler traces: the fixtures cut to the events the importer reads (and a few others),
# small inputs fuzz faster; and one whole gzipped file.
for f in tests/kineto/data/*/rank0.json.gz; do
  python3 - "$f" "$corpus/kineto/$(basename "$(dirname "$f")").json" <<'PY'
import gzip, json, sys
d = json.load(gzip.open(sys.argv[1]))
read = ("ProfilerStep", "autograd::engine", "Optimizer.", "record_param_comms", "c10d::",
        "_c10d_functional::", "module: ", "nn.Module: ")
ev = d["traceEvents"]
keep = [e for e in ev if str(e.get("name", "")).startswith(read) or "Sequence number" in e.get("args", {})]
d["traceEvents"] = keep[:150] + ev[:20]
json.dump(d, open(sys.argv[2], "w"))
PY
done
cp tests/kineto/data/toy_tp_w2/rank0.json.gz "$corpus/kineto/"
cp samples/topologies/*.json "$corpus/topology/"

for t in "${targets[@]}"; do
  echo "fuzz: $t for ${seconds}s"
  log="$build/fuzz-$t.log"
  status=0
  "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$build/fuzz-artifacts/$t-" -print_final_stats=1 "$corpus/$t" \
    >"$log" 2>&1 || status=$?
  grep -E "^stat::(number_of_executed_units|new_units_added)" "$log" || true
  if [[ "$status" != 0 ]]; then
    tail -40 "$log" >&2
    echo "fuzz: $t failed (exit $status); the input is in $build/fuzz-artifacts/" >&2
    exit 1
  fi
done
echo "fuzz: all ${#targets[@]} targets clean"
