#!/usr/bin/env bash
# report_fixes.sh COMMTRACE DATA_DIR: the fixes users hit first (issue 11, item 7), each of
# which failed before it: show on a PyTorch dump, baselines that pin bytes (and --tolerance), a
# dump's baseline checking a commtrace trace, diff/check --format json, --json -, --expect
# checked before the run, the progress line on a terminal, did-you-mean, ASCII minus in diffs.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/check.sh"
ct="$1"; data="$2"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
dump="$data/torch/golden_mlp_tp_comm_mode_log_noise3.json"

check show_dump 0 "counts only: no bytes, groups or times" -- "$ct" show "$dump"
"$ct" run --model toy --plan tp --world-size 4 --json tp.json >/dev/null
"$ct" check tp.json --baseline base.json --update >/dev/null
# A trace whose bytes doubled (a bf16 model cast to f32, say) fails a baseline that pins bytes.
python3 - tp.json tp2.json <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
for rank in t["ranks"]:
    for b in rank["blocks"]:
        for r in b["records"]:
            if r["kind"] == "collective":
                r["collective"]["bytes"] *= 2
json.dump(t, open(sys.argv[2], "w"))
PY
check bytes_pinned 1 "forward.all_reduce bytes: expected 400 B \(400 B\), got 800 B \(800 B\)" -- \
  "$ct" check tp2.json --baseline base.json
check tolerance 0 "^OK" -- "$ct" check tp2.json --baseline base.json --tolerance 100%
check tolerance_short 1 "bytes: expected 400 B" -- \
  "$ct" check tp2.json --baseline base.json --tolerance 99%
check tolerance_bad 2 "--tolerance: -5% must not be negative" -- \
  "$ct" check tp.json --baseline base.json --tolerance -5%
check check_json 1 '"what": "bytes"' -- "$ct" check tp2.json --baseline base.json --format json
"$ct" check "$dump" --baseline dump.baseline.json --update >/dev/null
"$ct" run --model mlp --plan tp --world-size 4 --json mlp.json >/dev/null
check dump_baseline 0 "^OK: mlp.json matches" -- "$ct" check mlp.json --baseline dump.baseline.json
"$ct" run --model toy --plan sp --world-size 4 --json sp.json >/dev/null
check diff_ascii_minus 1 "forward    all_reduce       1 → 0   \(-1\)" -- "$ct" diff tp.json sp.json
check diff_json 1 '"count_delta": -1' -- "$ct" diff tp.json sp.json --format json
# --json -: the trace alone on stdout, the report on stderr.
"$ct" run --model toy --plan tp --world-size 2 --json - >stdout.json 2>stderr.txt
if python3 -c "import json,sys; json.load(open('stdout.json'))" && grep -q "per iteration" stderr.txt; then
  echo "ok   json_stdout"
else
  echo "FAIL json_stdout"; head -c 300 stdout.json; fails=$((fails + 1))
fi
# A bad --expect fails before the run: no run header.
check expect_early 2 "^commtrace: error: expectation 'forward.allreduce=1': unknown collective 'allreduce' \(did you mean 'all_reduce'\?\)" -- \
  "$ct" run --model toy --expect forward.allreduce=1
out="$("$ct" run --model toy --expect forward.allreduce=1 2>/dev/null)"
[[ -z "$out" ]] && echo "ok   expect_before_run" || { echo "FAIL expect_before_run: $out"; fails=$((fails + 1)); }
check typo_model 2 "unknown model 'trasformer' \(did you mean 'transformer'\?\)" -- "$ct" run --model trasformer
check typo_option 2 "'--itres' \(did you mean '--iters'\?\)" -- "$ct" run --itres 3
check typo_command 2 "'rn' \(did you mean 'run'\?\)" -- "$ct" rn
check typo_value 2 "--backend: fak not in \{threads,fake,mpi,nccl\} \(did you mean 'fake'\?\)" -- "$ct" run --backend fak
# The progress line, on a terminal only (script gives the command one).
if command -v script >/dev/null; then
  script -qec "'$ct' run --model toy --world-size 2 --iters 20 >/dev/null" /dev/null >tty.txt
  grep -q "commtrace run: iteration 20/20" tty.txt && echo "ok   progress_tty" ||
    { echo "FAIL progress_tty"; cat -v tty.txt; fails=$((fails + 1)); }
fi
"$ct" run --model toy --world-size 2 --iters 20 >/dev/null 2>notty.txt
[[ ! -s notty.txt ]] && echo "ok   no_progress_off_tty" || { echo "FAIL no_progress_off_tty"; fails=$((fails + 1)); }

echo "report_fixes: $fails failed"
[[ $fails -eq 0 ]]
