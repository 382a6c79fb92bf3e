#!/usr/bin/env bash
# verify_matrix.sh COMMTRACE: `commtrace verify` must PASS for every model and plan of the zoo at
# world sizes 1, 2, 3, 4 and 8, with and without --input-requires-grad, and on a 2x2 dp × tp mesh;
# in bf16 at world 2 and 4.
set -uo pipefail
ct="$1"
fails=0 runs=0
for cfg in "toy tp" "toy sp" "mlp tp" "mlp sp" "mlp-stacked tp" "transformer tp" "transformer sp"; do
  set -- $cfg
  for world in "1" "2" "3" "4" "8" "4 --mesh 2x2"; do
    for grad in "" "--input-requires-grad"; do
      runs=$((runs + 1))
      # shellcheck disable=SC2086
      if ! out="$("$ct" verify --model "$1" --plan "$2" --world-size $world $grad 2>&1)"; then
        fails=$((fails + 1))
        printf 'FAILED: verify --model %s --plan %s --world-size %s %s\n%s\n' "$1" "$2" "$world" "$grad" "$out"
      fi
    done
  done
done
# bf16 (verify's bf16 tolerance) for every model and plan at world 2 and 4.
for cfg in "toy tp" "toy sp" "mlp tp" "mlp sp" "mlp-stacked tp" "transformer tp" "transformer sp" \
  "decoder tp" "decoder sp"; do
  set -- $cfg
  for world in 2 4; do
    runs=$((runs + 1))
    if ! out="$("$ct" verify --model "$1" --plan "$2" --world-size $world --dtype bf16 2>&1)"; then
      fails=$((fails + 1))
      printf 'FAILED: verify --model %s --plan %s --world-size %s --dtype bf16\n%s\n' "$1" "$2" "$world" "$out"
    fi
  done
done
echo "verify matrix: $((runs - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
