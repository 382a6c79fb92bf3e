#!/usr/bin/env bash
# train_halves.sh COMMTRACE MODEL: `commtrace train --model MODEL --steps 30` must end with a
# loss below half of its first.
set -euo pipefail
out="$("$1" train --model "$2" --steps 30)"
printf '%s\n' "$out"
awk '/^step/ { if (!first) first = $4; last = $4 }
     END { if (!(last < first / 2)) { print "loss " last " is not below half of " first; exit 1 } }' \
  <<<"$out"
