#!/usr/bin/env bash
# readme_sequence_parallel.sh COMMTRACE RSA_SCALING README: the outputs README's
# sequence-parallel section shows are what the programs print today (README says "unedited").
set -uo pipefail
ct="$(realpath "$1")" sample="$(realpath "$2")" readme="$(realpath "$3")"
src="$(dirname "$readme")"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fails=0

# The lines of README's code block after the line "$ <command>", up to the block's end or the
# next "$ " line.
block_after() {
  awk -v cmd="\$ $1" '
    $0 == cmd { on = 1; next }
    on && (/^```/ || /^\$ /) { exit }
    on { print }' "$readme"
}

compare() {
  local name="$1" want="$2" got="$3"
  if [[ -z "$want" ]]; then
    echo "FAIL $name: README has no block after the command"; fails=$((fails + 1))
  elif [[ "$want" != "$got" ]]; then
    echo "FAIL $name: README differs from the output"
    diff <(echo "$want") <(echo "$got")
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

compare rsa_scaling "$(block_after build/samples/rsa_scaling)" "$("$sample")"

cd "$dir" || exit 1
ln -s "$src/samples" samples
"$ct" run --model transformer --plan samples/plans/rsa_exact.json --world-size 4 --json ar.json >/dev/null &&
  "$ct" run --model transformer --plan samples/plans/rsa_reduce_scatter.json --world-size 4 \
    --json rs.json >/dev/null || { echo "FAIL: the runs"; exit 1; }
compare rsa_diff "$(block_after 'commtrace diff --depth 0 ar.json rs.json')" \
  "$("$ct" diff --depth 0 ar.json rs.json)"
exit $((fails > 0))
