#!/usr/bin/env bash
# mpi_matrix.sh COMMTRACE MPIRUN: under mpirun (one process per rank, oversubscribed), `verify
# --backend mpi` must PASS for every model and plan of the zoo at world sizes 2, 3 and 4 (and
# on a 2x2 dp × tp mesh), and the trace of every rank must equal the threads backend's trace of
# the same run: counts, shapes, bytes, reasons, everything but times and the backend's name.
# Each mpirun is wrapped in its own timeout.
set -uo pipefail
ct="$1"
mpirun="$2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

# The trace without what differs between backends by design: times and the backend's name.
strip() {
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
d["metadata"].pop("backend", None)
def walk(x):
    if isinstance(x, dict):
        for k in ("start_s", "duration_s"):
            x.pop(k, None)
        for v in x.values():
            walk(v)
    elif isinstance(x, list):
        for v in x:
            walk(v)
walk(d)
print(json.dumps(d, sort_keys=True, indent=1))' "$1"
}

fails=0 runs=0
fail() {
  fails=$((fails + 1))
  printf 'FAILED: %s\n' "$*"
}
# Ring attention's batched send/recv on MPI: the 6-head model's 12 tokens split over 2, 3 and 4.
six="$(dirname "$0")/../../samples/models/transformer_6h.json"
# A family beside TP (cp x tp, "... --context-parallel F") runs at 2x2 only.
for cfg in "toy tp" "toy sp" "mlp tp" "mlp sp" "mlp-stacked tp" "transformer tp" "transformer sp" \
  "$six ring" "transformer sp --context-parallel ulysses" "transformer tp --context-parallel ring"; do
  set -- $cfg
  worlds=(2 3 4 "4 --mesh 2x2")
  [[ $# -gt 2 ]] && worlds=("4 --mesh 2x2 ${*:3}")
  for world in "${worlds[@]}"; do
    np="${world%% *}"
    runs=$((runs + 1))
    # shellcheck disable=SC2086
    if ! out="$(timeout -k 5 120 "$mpirun" -np "$np" "$ct" verify --backend mpi --model "$1" --plan "$2" \
      --world-size $world 2>&1)" || ! grep -q '^PASS' <<<"$out"; then
      fail "mpirun -np $np verify --backend mpi --model $1 --plan $2 --world-size $world"
      echo "$out"
      continue
    fi
    # shellcheck disable=SC2086
    if ! timeout -k 5 120 "$mpirun" -np "$np" "$ct" run --backend mpi --model "$1" --plan "$2" \
      --world-size $world --rank all --iters 2 --json "$dir/mpi.json" >"$dir/out" 2>&1; then
      fail "mpirun -np $np run --backend mpi --model $1 --plan $2 --world-size $world"
      cat "$dir/out"
      continue
    fi
    # shellcheck disable=SC2086
    "$ct" run --model "$1" --plan "$2" --world-size $world --rank all --iters 2 \
      --json "$dir/threads.json" >/dev/null 2>&1 || { fail "threads run of $cfg $world"; continue; }
    if ! diff <(strip "$dir/mpi.json") <(strip "$dir/threads.json") >"$dir/diff"; then
      fail "the mpi trace of $cfg at world $world differs from the threads trace:"
      head -20 "$dir/diff"
    fi
  done
done
echo "mpi matrix: $((runs - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
